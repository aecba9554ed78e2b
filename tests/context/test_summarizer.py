"""IncrementalSummarizer with a scripted model: requests survive, DONE marks stick,
each round only sends the previous summary and the new turns."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from loop_governor.context import IncrementalSummarizer


class ScriptedModel:
    """A chat model stand-in: ``invoke(messages)`` returns an object with ``.content``."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.prompts: list[str] = []
        self.threads: list[int] = []
        self.async_calls = 0

    def invoke(self, messages: list[dict[str, str]]) -> Any:
        self.prompts.append(messages[-1]["content"])
        self.threads.append(threading.get_ident())
        reply = self.replies.pop(0)
        return type("Reply", (), {"content": reply})()


class AsyncScriptedModel(ScriptedModel):
    """Also has ``ainvoke``, which ``asummarize`` must prefer."""

    async def ainvoke(self, messages: list[dict[str, str]]) -> Any:
        self.async_calls += 1
        return self.invoke(messages)


def _fold(summ: IncrementalSummarizer, msgs: list[Any], mode: str) -> list[Any]:
    return summ.summarize(msgs) if mode == "sync" else asyncio.run(summ.asummarize(msgs))


def _turn(kind: Any, tag: str, request: str | None, size: int = 2000) -> list[Any]:
    out: list[Any] = []
    if request:
        out.append(kind.user(request))
    out.append(kind.ai(f"working on {tag}", [(f"{tag}-call", "bash", {"cmd": tag})]))
    out.append(kind.tool(f"{tag}-call", f"{tag} output " + "x" * size))
    return out


def _all_text(kind: Any, msgs: list[Any]) -> str:
    return "\n".join(str(kind.text(m)) for m in msgs)


def _no_orphans(kind: Any, msgs: list[Any]) -> None:
    calls, results = set(), set()
    for m in msgs:
        if kind.kind == "dict":
            calls |= {c["id"] for c in m.get("tool_calls") or ()}
            if m.get("role") == "tool":
                results.add(m["tool_call_id"])
        else:
            calls |= {c["id"] for c in getattr(m, "tool_calls", ())}
            if m.type == "tool":
                results.add(m.tool_call_id)
    assert calls == results


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pending_requests_survive_three_rounds(kind: Any, mode: str) -> None:
    model = AsyncScriptedModel(
        [
            "Explored the repo.\nDONE: none",
            "Wrote the CSV export.\nDONE: R2",
            "Renamed tests; chart and email still to do.\nDONE: R5, R99",
        ]
    )
    summ = IncrementalSummarizer(model, trigger_tokens=1000, keep_tokens=600)
    msgs = [kind.system("You are an agent."), kind.user("Build the report tool")]
    requests = {
        "a": "R2 please add a CSV export",
        "b": "also add a PNG chart of the totals",
        "c": "and email the report to ops@example.com",
        "d": "rename the tests folder",
    }
    msgs += _turn(kind, "t1", requests["a"]) + _turn(kind, "t2", None)
    msgs = _fold(summ, msgs, mode)
    msgs += _turn(kind, "t3", requests["b"]) + _turn(kind, "t4", requests["c"])
    msgs = _fold(summ, msgs, mode)
    msgs += _turn(kind, "t5", requests["d"]) + _turn(kind, "t6", None) + _turn(kind, "t7", None)
    msgs = _fold(summ, msgs, mode)

    assert summ.rounds == 3
    assert model.async_calls == (3 if mode == "async" else 0)
    text = _all_text(kind, msgs)
    by_text = {r.text: r for r in summ.requests}
    assert by_text[requests["a"]].done and by_text[requests["d"]].done
    assert not by_text[requests["b"]].done and not by_text[requests["c"]].done
    for key in ("b", "c"):
        assert f"[PENDING] R{by_text[requests[key]].id}: {requests[key]}" in text
    assert f"[DONE] R{by_text[requests['a']].id}" in text
    assert "Renamed tests; chart and email still to do." in text and "DONE: R5" not in text
    # protected head untouched, one summary message, no orphaned tool exchanges
    assert kind.text(msgs[0]) == "You are an agent." and kind.text(msgs[1]) == "Build the report tool"
    assert sum("[Conversation summary" in str(kind.text(m)) for m in msgs) == 1
    _no_orphans(kind, msgs)
    # incremental: round 3 sees round 2's summary, not the turns folded in round 1
    assert "Wrote the CSV export." in model.prompts[2]
    assert "t1 output" not in model.prompts[2] and "t1 output" in model.prompts[0]


def test_callable_model_and_restart_from_summary_message(kind: Any) -> None:
    seen: list[str] = []

    def model(prompt: str) -> str:
        seen.append(prompt)
        return "Summary so far.\nDONE: none"

    summ = IncrementalSummarizer(model, trigger_tokens=1000, keep_tokens=600)
    msgs = [kind.system("s"), kind.user("main task")]
    msgs += _turn(kind, "t1", "first extra request") + _turn(kind, "t2", None)
    msgs = summ.summarize(msgs)
    assert summ.pending and "first extra request" in _all_text(kind, msgs)
    # A new summarizer (process restart) picks the ledger up from the summary message.
    fresh = IncrementalSummarizer(model, trigger_tokens=1000, keep_tokens=600)
    msgs += _turn(kind, "t3", "second request") + _turn(kind, "t4", None)
    msgs = fresh.summarize(msgs)
    texts = [r.text for r in fresh.pending]
    assert "first extra request" in texts and "second request" in texts
    assert "Summary so far." in seen[-1]


def test_under_trigger_returns_messages_unchanged(kind: Any) -> None:
    model = ScriptedModel([])
    msgs = [kind.system("s"), kind.user("hi"), *_turn(kind, "t1", None, size=10)]
    out = IncrementalSummarizer(model, trigger_tokens=10_000, keep_tokens=1000).summarize(msgs)
    assert out == msgs and all(a is b for a, b in zip(out, msgs, strict=True)) and not model.prompts


def test_request_with_any_line_separator_survives_a_restart(kind: Any) -> None:
    # CRLF-pasted text, a lone CR, U+2028 and friends: str.splitlines() splits on all of
    # them, so the ledger line must hold none or the reloaded request loses its tail.
    request = "deploy to staging\r\nthen run the migration\rand\u2028notify\x1cops\u2029now"
    first = "main task\rsecond line of the first message"

    def model(prompt: str) -> str:
        return "Narrative.\nDONE: none"

    summ = IncrementalSummarizer(model, trigger_tokens=1000, keep_tokens=600)
    msgs = [kind.system("s"), kind.user(first)]
    msgs += _turn(kind, "t1", request) + _turn(kind, "t2", None)
    msgs = summ.summarize(msgs)
    before = [r.text for r in summ.requests]
    assert all(len(t.splitlines()) == 1 for t in before)
    assert "deploy to staging then run the migration and notify ops now" in before

    fresh = IncrementalSummarizer(model, trigger_tokens=1000, keep_tokens=600)
    msgs += _turn(kind, "t3", None) + _turn(kind, "t4", None)
    msgs = fresh.summarize(msgs)
    assert fresh.rounds == 1
    assert [r.text for r in fresh.requests] == before
    assert "then run the migration" not in fresh.summary


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failed_model_call_then_retry_adds_each_request_once(kind: Any, mode: str) -> None:
    calls: list[str] = []

    def flaky(prompt: str) -> str:
        calls.append(prompt)
        if len(calls) == 1:
            raise TimeoutError("model timed out")
        return "Summary.\nDONE: R2"

    async def flaky_async(prompt: str) -> str:  # an async callable is awaited, not threaded
        return flaky(prompt)

    summ = IncrementalSummarizer(flaky if mode == "sync" else flaky_async, trigger_tokens=1000, keep_tokens=600)
    msgs = [kind.system("s"), kind.user("main task")]
    msgs += _turn(kind, "t1", "please also email Bob") + _turn(kind, "t2", None)
    with pytest.raises(TimeoutError):
        _fold(summ, msgs, mode)
    assert summ.requests == [] and summ.rounds == 0
    out = _fold(summ, msgs, mode)
    assert [(r.id, r.done) for r in summ.requests] == [(1, False), (2, True)]
    assert summ.requests[1].text == "please also email Bob"
    assert calls[0] == calls[1]  # the retry sends the very same prompt
    assert _all_text(kind, out).count("please also email Bob") == 1


def test_async_summarize_runs_a_sync_only_model_off_the_event_loop(kind: Any) -> None:
    # A model with only .invoke would block every other task on the loop for the whole
    # summary call: it runs on a worker thread instead.
    model = ScriptedModel(["Summary.\nDONE: none"])
    summ = IncrementalSummarizer(model, trigger_tokens=1000, keep_tokens=600)
    msgs = [kind.system("s"), kind.user("main task"), *_turn(kind, "t1", "and then X"), *_turn(kind, "t2", None)]

    async def run() -> tuple[list[Any], int]:
        return await summ.asummarize(msgs), threading.get_ident()

    out, loop_thread = asyncio.run(run())
    assert summ.rounds == 1 and model.threads and model.threads[0] != loop_thread
    assert "[PENDING] R2: and then X" in _all_text(kind, out)


def test_a_model_returning_an_awaitable_is_awaited_or_refused_never_summarized_as_text(kind: Any) -> None:
    async def real_model(prompt: str) -> str:
        return "Did things.\nDONE: R2"

    msgs = [kind.system("s"), kind.user("main task"), *_turn(kind, "t1", "and then X"), *_turn(kind, "t2", None)]
    # a plain lambda around an async model: asummarize awaits what it returns
    summ = IncrementalSummarizer(lambda prompt: real_model(prompt), trigger_tokens=1000, keep_tokens=600)
    asyncio.run(summ.asummarize(msgs))
    assert summ.summary == "Did things." and [r.done for r in summ.requests] == [False, True]
    # the sync path cannot await it: a clear error, and nothing is adopted
    summ = IncrementalSummarizer(real_model, trigger_tokens=1000, keep_tokens=600)
    with pytest.raises(TypeError, match="asummarize"):
        summ.summarize(msgs)
    assert summ.rounds == 0 and summ.requests == [] and summ.summary == ""
