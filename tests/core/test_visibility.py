"""Issue 25: the user sees what the governor did -- logs, outcomes, exceptions, partial
results, no stale resumes, programming errors and misuse surfacing at once."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.checkpoint import FileCheckpointStore
from loop_governor.config import warn_unknown_env
from loop_governor.logs import logger as lg_logger
from loop_governor.task import PARTIAL_RESULT_CHARS, PARTIAL_RESULTS_MAX

SECRET = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD"


def _gov(clock: VirtualClock, **settings: Any) -> lg.Governor:
    return lg.Governor(
        lg.GovernorConfig(**settings), clock=clock, sleep=clock.sleep, asleep=clock.asleep, random=lambda: 0.5
    )


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, dict[str, Any]]]:
    return [
        (r.levelno, r.getMessage(), getattr(r, "lg_event", {})) for r in caplog.records if r.name == "loop_governor"
    ]


# -- the logger ------------------------------------------------------------------------------


def test_the_library_installs_only_a_null_handler() -> None:
    assert lg_logger.name == "loop_governor"
    assert [type(h) for h in lg_logger.handlers] == [logging.NullHandler]


def test_retries_waits_and_breaker_transitions_are_info_stops_and_refusals_warnings(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    gov = _gov(clock, breaker_failure_threshold=3, task_retry_budget=10)
    caplog.set_level(logging.INFO, logger="loop_governor")
    # no subscriber: the logger alone hears the governor
    assert not gov.emitting
    with pytest.raises(lg.TransientError):
        gov.call("search", Backend(forever=HTTPError(503, f"upstream down, key {SECRET}")))
    with pytest.raises(lg.CircuitOpenError):
        gov.call("search", Backend())
    with gov.task("job"), pytest.raises(lg.FatalError):
        gov.call("crm", Backend(forever=HTTPError(401, "token expired")))
    records = _records(caplog)
    infos = [m for level, m, _ in records if level == logging.INFO]
    warns = [m for level, m, _ in records if level == logging.WARNING]
    # each retry: the tool, why (its own message), and the wait
    assert any(
        m.startswith("search failed (transient, HTTP 503): HTTPError: upstream down, key ")
        and m.endswith("; retrying in 0.60s (attempt 2 of 3)")
        for m in infos
    ), infos
    assert any(m.endswith("; retrying in 1.20s (attempt 3 of 3)") for m in infos)
    assert any(m.startswith("circuit breaker of search: closed -> open for 60s after: HTTPError:") for m in infos)
    assert any(m.startswith("refused a call to search without making it (circuit breaker open)") for m in warns), warns
    assert any(
        m.startswith('task "job": loop-governor stopped the run: crm (unauthorized, 401): HTTPError: token expired')
        for m in warns
    )
    assert all(SECRET not in m and SECRET not in json.dumps(e, default=str) for _, m, e in records)
    stop = next(e for _, _, e in records if e.get("event") == "run_stopped")
    assert stop["tool"] == "crm" and stop["error_class"] == "FatalError" and stop["task_id"] == "job"


def test_a_disabled_logger_formats_nothing(clock: VirtualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    formatted: list[str] = []
    import loop_governor.events as events

    monkeypatch.setattr(events, "log_event", lambda level, record, task: formatted.append(record["event"]))
    monkeypatch.setattr(lg_logger, "level", logging.WARNING)
    gov = _gov(clock)
    with pytest.raises(lg.TransientError):
        gov.call("search", Backend(forever=HTTPError(503)))
    # retries and breaker changes are INFO: not even built; the retries running out is a WARNING
    assert formatted == ["tool_call"]
    formatted.clear()
    with gov.task("t"), pytest.raises(lg.FatalError):
        gov.call("crm", Backend(forever=HTTPError(401)))
    assert formatted == ["tool_call", "run_stopped"]  # (the fatal call renders no line of its own: the stop's)


# -- the outcome -----------------------------------------------------------------------------


def test_task_end_says_how_the_task_ended(gov: lg.Governor) -> None:
    ends: list[dict[str, Any]] = []
    gov.subscribe(lambda e: ends.append(e) if e["event"] == "task_end" else None)
    with gov.task("ok"):
        gov.call("search", Backend())
    with gov.task("stopped"), pytest.raises(lg.FatalError):
        gov.call("billing", Backend(forever=HTTPError(402, f"payment required for {SECRET}")))
    with pytest.raises(KeyError), gov.task("failed"):
        raise KeyError("the agent's own bug")
    by_task = {e["task_id"]: e for e in ends}
    assert by_task["ok"]["outcome"] == "completed"
    stopped = by_task["stopped"]
    assert stopped["outcome"] == "stopped" and stopped["error_class"] == "FatalError"
    assert (
        stopped["reason"].startswith("billing (payment_required, 402): HTTPError: payment required for ")
        and SECRET not in stopped["reason"]
    )
    failed = by_task["failed"]
    assert failed["outcome"] == "failed" and failed["error_class"] == "KeyError"
    assert "the agent's own bug" in failed["reason"]


# -- exceptions ------------------------------------------------------------------------------


def test_every_run_ending_error_is_fatal_and_never_permanent() -> None:
    for cls in (lg.FatalError, lg.BudgetExhaustedError, lg.NoProgressError):
        assert issubclass(cls, lg.FatalError) and not issubclass(cls, lg.PermanentError)
    assert not issubclass(lg.NoProgressError, lg.LoopDetectedError)


def test_except_permanent_first_does_not_swallow_a_stop(gov: lg.Governor) -> None:
    calls = []
    with gov.task("t"):
        for _ in range(20):
            try:
                calls.append(gov.call("critic", lambda draft: "still weak: add the numbers section", "the draft"))
            except lg.PermanentError:  # written first, as users do
                continue
            except lg.FatalError as stop:
                assert stop.code == "no_progress"
                assert str(stop).startswith("loop-governor stopped the run: critic (no_progress): ")
                break
        else:
            pytest.fail("the stop was swallowed by except PermanentError")
    assert len(calls) < 20


# -- partial results -------------------------------------------------------------------------


def test_partial_results_hold_the_successful_tool_results_bounded_and_redacted(gov: lg.Governor) -> None:
    with gov.task("t") as scope:
        scope.add_result({"section": 1})
        for i in range(30):
            gov.call("fetch", lambda i: f"page {i} token={SECRET} " + "x" * 5000, i)
        with pytest.raises(lg.FatalError) as err:
            gov.call("crm", Backend(forever=HTTPError(401)))
    results = err.value.partial_results
    assert results[0] == {"section": 1}
    tools = results[1:]
    assert len(tools) == PARTIAL_RESULTS_MAX  # the latest ones
    assert tools[0]["result"].startswith("page 10 ") and tools[-1]["result"].startswith("page 29 ")
    assert all(r["tool"] == "fetch" and len(r["result"]) <= PARTIAL_RESULT_CHARS for r in tools)
    assert all(SECRET not in r["result"] for r in tools)


# -- no stale resumes -------------------------------------------------------------------------


def test_a_finished_task_does_not_answer_a_new_run(tmp_path: Path, clock: VirtualClock) -> None:
    url = f"file://{tmp_path / 'cps'}"
    weather = Backend()
    with _gov(clock, checkpoint_url=url).task("t1"):
        assert _gov(clock).call("get_weather", weather, "Paris") == "ok"  # another governor: not recorded
    gov = _gov(clock, checkpoint_url=url)
    with gov.task("t1"):
        gov.call("get_weather", weather, "Paris")
    stored = FileCheckpointStore(tmp_path / "cps").load("t1")
    assert stored is not None and stored.metadata.get("finished_at") is not None  # kept, marked finished
    events: list[dict[str, Any]] = []
    again = _gov(clock, checkpoint_url=url)
    again.subscribe(events.append)
    with again.task("t1"):
        again.call("get_weather", weather, "Paris")
    assert weather.calls == 3  # the finished run's result did not answer
    assert not any(e.get("resumed") for e in events)
    with _gov(clock, checkpoint_url=url).task("t1", resume=True) as scope:
        scope.governor.call("get_weather", weather, "Paris")
    assert weather.calls == 3  # asked for explicitly: resumed
    # resumed, then stopped: no longer finished, so the next run resumes it
    gov = _gov(clock, checkpoint_url=url)
    with gov.task("t1", resume=True), pytest.raises(lg.FatalError):
        gov.call("crm", Backend(forever=HTTPError(401)))
    stored = FileCheckpointStore(tmp_path / "cps").load("t1")
    assert stored is not None and "finished_at" not in stored.metadata
    with _gov(clock, checkpoint_url=url).task("t1") as scope:
        scope.governor.call("get_weather", weather, "Paris")
    assert weather.calls == 3


def test_a_task_that_did_not_finish_resumes(tmp_path: Path, clock: VirtualClock) -> None:
    url = f"file://{tmp_path / 'cps'}"
    search = Backend()
    gov = _gov(clock, checkpoint_url=url)
    with gov.task("job"), pytest.raises(lg.FatalError):
        gov.call("search", search, "q")
        gov.call("crm", Backend(forever=HTTPError(401)))
    again = _gov(clock, checkpoint_url=url)
    with again.task("job"):
        again.call("search", search, "q")
    assert search.calls == 1
    with _gov(clock, checkpoint_url=url).task("job", resume=False) as scope:
        scope.governor.call("search", search, "q")
    assert search.calls == 2


# -- programming errors ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_programming_errors_propagate_as_without_the_governor(gov: lg.Governor, mode: str) -> None:
    def lookup(city: str) -> str:
        return city

    def not_yet(city: str) -> str:
        raise NotImplementedError("lookup has no sync implementation")

    def broken(city: str) -> str:
        return city + 1  # type: ignore[operator]  # a TypeError inside the tool is its failure

    def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if mode == "sync":
            return gov.call("lookup", fn, *args, **kwargs)
        import asyncio

        return asyncio.run(gov.acall("lookup", fn, *args, **kwargs))

    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    with gov.task("t"):
        with pytest.raises(TypeError, match="unexpected keyword argument 'town'") as bound:
            run(lookup, town="Paris")
        assert not isinstance(bound.value, lg.AgentToolError)
        with pytest.raises(NotImplementedError) as missing:
            run(not_yet, "Paris")
        assert not isinstance(missing.value, lg.AgentToolError)
        with pytest.raises(lg.PermanentError):
            run(broken, "Paris")
    assert [e["status"] for e in events if e["event"] == "tool_call"] == ["error"]  # only the tool's own failure


# -- misuse ----------------------------------------------------------------------------------


def test_governor_takes_a_mapping_of_settings_and_refuses_other_types() -> None:
    gov = lg.Governor({"retry_max_attempts": 2})
    assert gov.config.retry_max_attempts == 2
    with pytest.raises(TypeError, match=r"config must be a loop_governor\.GovernorConfig"):
        lg.Governor(["retry_max_attempts"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_max_attempts"):
        lg.Governor({"retry_max_attempts": 0})
    with pytest.raises(TypeError, match="sleep must be callable"):
        lg.Governor(sleep=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rules must be a list"):
        lg.Governor(rules=lg.Rule("transient", status=404))  # type: ignore[arg-type]


def test_lens_close_without_a_trace_path_does_nothing() -> None:
    gov = lg.Governor()
    assert not gov.lens
    gov.lens.flush()
    gov.lens.close()


def test_an_unknown_env_variable_warns_with_a_did_you_mean() -> None:
    env = {"LOOP_GOVERNOR_MAX_STEP": "2", "LOOP_GOVERNOR_MAX_STEPS": "3", "LOOP_GOVERNOR_TOOLS__SEARCH__MAX_CALLS": "1"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_unknown_env(lg.GovernorConfig.model_fields, env) == ["LOOP_GOVERNOR_MAX_STEP"]
    assert [str(w.message) for w in caught] == [
        "unknown environment variable LOOP_GOVERNOR_MAX_STEP is ignored by loop-governor; "
        "did you mean LOOP_GOVERNOR_MAX_STEPS?"
    ]


def test_governor_config_warns_about_a_typo_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOP_GOVERNOR_RETRY_MAX_ATTEMPT", "2")
    with pytest.warns(UserWarning, match="did you mean LOOP_GOVERNOR_RETRY_MAX_ATTEMPTS"):
        lg.GovernorConfig()


# -- what the model reads ------------------------------------------------------------------


def test_the_model_reads_that_retries_are_spent_counting_real_attempts(gov: lg.Governor) -> None:
    texts = []
    for _ in range(2):
        backend = Backend(forever=HTTPError(503, "service unavailable"))
        with pytest.raises(lg.TransientError) as err:
            gov.call(f"search{_}", backend)
        texts.append(err.value.info.to_model_text().replace(f"search{_}", "search"))
        body = json.loads(err.value.info.to_model_text("json"))["error"]
        assert backend.calls == body["attempts"] == 3
        assert body["outcome"] == "retries exhausted: 3 attempts" and "retryable" not in body
        assert "retries exhausted after 3 attempts" in texts[-1]
    assert texts[0] == texts[1]  # byte-stable: the prompt cache holds
