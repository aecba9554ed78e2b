"""The core write filter (loop_governor.memory), framework-free: what is kept out, what is
changed, what is merged, and how a backend failure is governed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import loop_governor as lg
from loop_governor.memory import MemoryGuard, failure_reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ('{"error":{"type":"transient","retryable":false,"message":"x","attempts":3}}', "governed_error"),
        ('search said: {"error":{"type":"fatal","retryable":false}} so I stopped', "governed_error"),
        ('{"note": "{\\"error\\":{\\"type\\":\\"permanent\\",\\"retryable\\":false}}"}', "governed_error"),
        ("Error: HTTP 404: not found\nPermanent failure: fix the arguments.", "governed_error"),
        ("The search said: Error: quota\nFatal: stop and report.\nThen I gave up.", "governed_error"),
        ({"error": {"message": "x", "type": "permanent", "outcome": "will fail again if repeated"}}, "governed_error"),
        ('Traceback (most recent call last):\n  File "a.py", line 1, in <module>\nValueError', "traceback"),
        ({"log": "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyError: 'k'"}, "traceback"),
    ],
)
def test_failures_are_recognized(value: Any, reason: str) -> None:
    assert failure_reason(value) == reason


@pytest.mark.parametrize(
    "value",
    [
        "The user prefers dark mode.",
        "We discussed error handling: retries with backoff help.",
        '{"error_rate": 0.1}',
        {"status": "ok", "text": "Paris is the capital of France"},
        ["a", {"b": 1}],
        # records about errors, not failures: kept
        "Error executing tool: connection refused",
        "Error: ToolException('boom')",
        {"content": "fine", "status": "error"},
        {"notes": ["ok", {"deep": "Traceback (most recent call last):\n"}]},
        '{"error": {"type": "permanent", "code": 12}}',  # someone else's error shape
    ],
)
def test_ordinary_records_pass(value: Any) -> None:
    assert failure_reason(value) is None


def test_failure_objects_are_read_by_their_text() -> None:
    class ToolMessageLike:
        status = "error"
        content = "Error: boom\nPermanent failure: fix the input."

    class ToolFailureLike:
        message = "quota exceeded"
        reason = "tool_reported"

    assert failure_reason(ToolMessageLike()) == "governed_error"
    assert failure_reason(ToolFailureLike()) is None  # crewAI's own failure text: kept


def test_drop_is_counted_and_reported(governor: lg.Governor, events: list[dict[str, Any]], mk: Any) -> None:
    guard = MemoryGuard(governor, "Dict")

    write = guard.admit("/", "r1", mk.GOVERNED_JSON)

    assert write.action == "drop" and write.reason == "governed_error"
    assert guard.stats.dropped == 1
    (event,) = mk.named(events, "memory_dropped")
    assert event["tool"] == "memory:Dict" and event["reason"] == "governed_error"
    assert "404" not in str(event)  # the record's content is not copied into the event


def test_secrets_are_redacted_with_the_shared_rules(governor: lg.Governor, mk: Any) -> None:
    guard = MemoryGuard(governor, "Dict")

    text = guard.admit("/", "r1", f"deploy with OPENAI_API_KEY={mk.SECRET} tomorrow").value
    value = guard.admit(("u",), "k", {"password": "hunter2 with spaces", "note": f"key {mk.SECRET}"}).value

    assert mk.SECRET not in text and lg.redact(f"OPENAI_API_KEY={mk.SECRET}") in text
    assert value == {"password": "[REDACTED]", "note": "key [REDACTED]"}
    nested = guard.admit(("u",), "t", {"pair": ("login", f"api_key={mk.SECRET}"), "n": [1, None]}).value
    assert nested == {"pair": ("login", "api_key=[REDACTED]"), "n": [1, None]}
    assert guard.stats.redacted == 3


def test_blobs_are_stripped_and_long_records_cut_head_and_tail(governor: lg.Governor) -> None:
    guard = MemoryGuard(governor, "Dict")
    blob = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUg" * 200
    long = "HEAD " + "x" * 20_000 + " TAIL"

    assert guard.admit("/", "a", f"screenshot {blob} taken").value == (
        "screenshot [image/png data removed: 4,422 chars base64] taken"
    )
    cut = guard.admit("/", "b", long).value
    assert cut.startswith("HEAD ") and cut.endswith(" TAIL") and "chars trimmed" in cut
    assert len(cut) < 3100
    assert guard.stats.trimmed == 2


def test_a_repeat_is_the_same_content_and_is_still_written_under_its_own_key(governor: lg.Governor) -> None:
    guard = MemoryGuard(governor, "Dict")

    first = guard.admit("/team", "r1", "Build 1412 passed at 2026-11-30T10:00:00Z")
    again = guard.admit("/team", "r2", "  Build 1412   passed at\n2026-11-30T10:00:00Z ")  # whitespace only
    other_build = guard.admit("/team", "r3", "Build 1413 passed at 2026-12-01T09:12:44Z")
    other_scope = guard.admit("/other", "r4", "Build 1412 passed at 2026-11-30T10:00:00Z")

    assert first.action == again.action == other_build.action == other_scope.action == "store"
    assert again.repeat_of == "r1" and again.value == "  Build 1412   passed at\n2026-11-30T10:00:00Z "
    assert first.repeat_of is None and other_build.repeat_of is None and other_scope.repeat_of is None
    assert guard.stats.repeats == 1


def test_dict_records_keep_their_keys_apart(governor: lg.Governor) -> None:
    guard = MemoryGuard(governor, "Store")

    assert guard.admit(("u",), "a", {"theme": "dark"}).repeat_of is None
    assert guard.admit(("u",), "b", {"lang": "en"}).repeat_of is None
    assert guard.admit(("u",), "c", {"theme": "dark"}).repeat_of == "a"
    assert guard.admit(("u",), "d", {"theme": "dark", "n": 2}).repeat_of is None
    assert guard.admit(("u",), "a", {"theme": "light"}).repeat_of is None  # a's content changed
    assert guard.admit(("u",), "e", {"theme": "dark"}).repeat_of == "c"


def test_forgotten_records_are_stored_again(governor: lg.Governor) -> None:
    guard = MemoryGuard(governor, "Dict")
    guard.admit("/", "r1", "fact")
    guard.forget_ids(["r1"])
    assert guard.admit("/", "r2", "fact").action == "store"
    guard.forget()
    assert guard.admit("/", "r3", "fact").action == "store"


def test_a_failed_write_degrades_to_an_event(
    governor: lg.Governor, events: list[dict[str, Any]], mk: Any, clock: Any
) -> None:
    guard = MemoryGuard(governor, "Dict")
    calls: list[int] = []

    def down(_records: list[str]) -> None:
        calls.append(1)
        raise mk.HTTPError(503, "vector db unavailable")

    assert guard.write(down, ["r"], keys=[("/", "r")]) is False

    assert len(calls) == governor.config.retry_max_attempts  # retried as a governed tool
    assert clock.sleeps  # with backoff, on virtual time
    (failed,) = mk.named(events, "memory_save_failed")
    assert failed["tool"] == "memory:Dict" and failed["error_type"] == "transient"
    assert failed["keys"] == ["r"] and failed["records"] == 1
    assert guard.stats.save_failures == 1 and guard.stats.lost == 1 and guard.stats.written == 0


def test_a_failed_read_raises_the_typed_error(governor: lg.Governor, mk: Any) -> None:
    guard = MemoryGuard(governor, "Dict")

    def gone() -> None:
        raise mk.HTTPError(404, "no such collection")

    with pytest.raises(lg.PermanentError) as info:
        guard.read(gone)
    assert info.value.info.tool == "memory:Dict"


def test_backend_calls_stay_out_of_the_callers_task(
    governor: lg.Governor, events: list[dict[str, Any]], mk: Any
) -> None:
    """A memory write is not a step of the agent: it spends none of the task's retry budget."""
    guard = MemoryGuard(governor, "Dict")
    seen: list[Any] = []

    def down(_: Any) -> None:
        seen.append(lg.Governor.current_task())
        raise mk.HTTPError(503, "down")

    with governor.task("t1") as task, governor.call_context(tool_call_id="call_7"):
        guard.write(down, "r")
        assert lg.Governor.current_task() is task
    assert seen and all(s is None for s in seen)
    assert task.tool_calls == 0 and task.steps == 0  # not a step of the task
    # the trace still shows the call inside the caller's task
    calls = [e for e in events if e["event"] == "tool_call" and e["tool"] == "memory:Dict"]
    assert calls and all(e["task_id"] == "t1" and e["tool_call_id"] == "call_7" for e in calls)


def test_async_twins_share_the_decisions(governor: lg.Governor, mk: Any) -> None:
    guard = MemoryGuard(governor, "Dict")
    attempts: list[int] = []

    async def flaky(_: Any) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise mk.HTTPError(503, "blip")

    async def main() -> bool:
        return await guard.awrite(flaky, "r", keys=[("/", "r")])

    assert asyncio.run(main()) is True
    assert len(attempts) == 2 and guard.stats.written == 1


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"backend": ""}, "backend"), ({"trim_threshold": 10}, "trim_threshold"), ({"index_size": 0}, "index_size")],
)
def test_misuse_fails_at_construction(governor: lg.Governor, kwargs: dict[str, Any], param: str) -> None:
    args = {"backend": "Dict", **kwargs}
    with pytest.raises(ValueError, match=param):
        MemoryGuard(governor, args.pop("backend"), **args)


def test_cancellation_is_not_a_failed_write(governor: lg.Governor) -> None:
    guard = MemoryGuard(governor, "Dict")

    def interrupted(_: Any) -> None:
        raise KeyboardInterrupt

    async def cancelled(_: Any) -> None:
        raise asyncio.CancelledError

    with governor.task("t1") as task:
        with pytest.raises(KeyboardInterrupt):
            guard.write(interrupted, "r")
        assert lg.Governor.current_task() is task  # the caller's task scope is back
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(guard.awrite(cancelled, "r"))
    assert guard.stats.save_failures == 0
