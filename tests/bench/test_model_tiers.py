"""``loop-governor bench --model --tier 1``: the one-goal tier against the local
OpenAI-compatible test server (127.0.0.1), with three scripted models -- one that does
each task, one that never calls a tool, one whose tool calls cannot be run.

What a user relies on: the summary gives each agent's success rate with a true 95%
interval and the other figures per tier; where every agent fails, the table says the
model is too weak for the tier instead of ranking the agents; each run samples with its
own seed at a temperature above 0; ``--error-format both`` runs the governed agent with
each rendering of the failure text, side by side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lg_browser import assert_columns_explained
from lg_openai_server import OpenAIServer, RecordedRequest, Reply, ToolCall, deny_remote_connections
from typer.testing import CliRunner

from loop_governor.bench.clock import VirtualClock
from loop_governor.bench.determinism import CURRENT_TASK
from loop_governor.bench.model_bench import Plan, arms_for, run_model_bench, select
from loop_governor.bench.real_model import ModelSettings
from loop_governor.bench.stats import wilson
from loop_governor.bench.tiers import BRAKE_MESSAGE, CITIES, DOWNLOAD_URL, JOB_ID, STATUS_URL, TIERS, GoalTask
from loop_governor.bench.world import Downstream, ServiceError, identical_repeats
from loop_governor.cli import app
from loop_governor.errors import read_model_text

TIER_1 = [s.name for s in TIERS[1].scenarios]
_FAILED = re.compile(r"error|fail|HTTP [45]\d\d|exceeded|no job|not a valid tool", re.I)


def _failed(text: str) -> bool:
    """Whether a tool result reads as a failure, in any agent's rendering."""
    return read_model_text(text) is not None or bool(_FAILED.search(text))


def _exchange(request: RecordedRequest) -> tuple[str, list[tuple[str, dict[str, Any], str]]]:
    """The task prompt and each tool call so far with its result."""
    prompt = next(str(m["content"]) for m in request.messages if m.get("role") == "user")
    results = {
        str(m.get("tool_call_id")): str(m.get("content") or "") for m in request.messages if m.get("role") == "tool"
    }
    calls = []
    for m in request.messages:
        for call in m.get("tool_calls") or () if m.get("role") == "assistant" else ():
            function = call["function"]
            args = json.loads(function.get("arguments") or "{}")
            calls.append((function["name"], args, results.get(str(call.get("id")), "")))
    return prompt, calls


def _call(name: str, **args: Any) -> Reply:
    return Reply(tool_calls=(ToolCall(name, args),))


def able_model(request: RecordedRequest) -> Reply | str:
    """Does each tier-1 task as a capable model would: reads the result, fixes the
    precondition, retries a failing service a few times, polls until done, stops after
    three verdicts of a critic that is never satisfied."""
    prompt, calls = _exchange(request)
    last = calls[-1][2] if calls else ""
    tries = len(calls)
    if "refund" in prompt:
        return _call("search_docs", query="refund policy") if not calls else "There is no refund policy on file."
    if "engine" in prompt:
        if "Engine started" in last:
            return "The engine is running."
        if "brake" in last.lower() and "pressed." not in last:
            return _call("press_brake")
        return _call("start_engine") if tries < 4 else "I could not start the engine."
    for tool, args, word in (
        ("fetch_url", {"url": STATUS_URL}, f"Fetch {STATUS_URL}"),
        ("search_news", {"query": "solar power"}, "with search_news"),
    ):
        if word in prompt:
            if calls and not _failed(last):
                return f"Summary: {last}"
            return _call(tool, **args) if tries < 6 else "The service kept failing."
    if "slogan" in prompt:
        return _call("critic", draft=f"Fresh bread, v{tries}") if tries < 3 else "Final slogan: Fresh bread, v2."
    if "weather" in prompt:
        done = {args.get("city") for tool, args, result in calls if not _failed(result)}
        todo = [c for c in CITIES if c not in done]
        return (
            _call("get_weather", city=todo[0])
            if todo and tries < 10
            else "Weather: " + "; ".join(r for _, _, r in calls)
        )
    if "export" in prompt:
        if not calls or ("start" in last.lower() and "no job" in last):
            return _call("start_export")
        if DOWNLOAD_URL in last:
            return f"The export is ready: {DOWNLOAD_URL}"
        return _call("job_status", job_id=JOB_ID) if tries < 12 else "The export did not finish."
    raise AssertionError(f"unknown task: {prompt}")


def toolless_model(request: RecordedRequest) -> str:
    """Answers every task at once, in words, and never calls a tool."""
    return "Sure! I have taken care of that for you."


def malformed_model(request: RecordedRequest) -> Reply:
    """Asks for tools that cannot run: an unknown tool, then arguments that are not JSON."""
    if request.turn == 0:
        return Reply(tool_calls=(ToolCall("do_the_task", {"now": True}),))
    return Reply(tool_calls=(ToolCall("get_weather", raw_arguments='{"city": "Paris"'),))


CAP = 12


def _flat(output: str) -> str:
    """Terminal output without rich's boxes and line breaks."""
    return " ".join(re.sub(r"[│╭╮╰╯─┃━┏┓┗┛]", " ", output).split())


def _run(
    script: Any,
    *,
    runs: int,
    formats: tuple[str, ...] = ("text",),
    frameworks: tuple[str, ...] = ("langchain",),
    scenarios: list[str] | None = None,
) -> tuple[dict[str, Any], OpenAIServer]:
    with OpenAIServer(script) as server, deny_remote_connections() as attempts:
        settings = ModelSettings.parse("openai:lg-test-model", base_url=server.url, max_model_calls=CAP)
        plan = Plan(settings, tuple(select((1,), scenarios)), tuple(arms_for(formats)), frameworks, runs, seed=3)
        result = run_model_bench(plan)
        assert not server.errors and not attempts
    return result, server


@pytest.fixture(scope="module")
def able_run() -> Iterator[tuple[dict[str, Any], OpenAIServer]]:
    """The able model, tier 1, LangChain, the governed agent with both renderings, 2 runs."""
    yield _run(able_model, runs=2, formats=("text", "json"))


@pytest.fixture(scope="module")
def toolless() -> dict[str, Any]:
    return _run(toolless_model, runs=1)[0]


@pytest.fixture(scope="module")
def malformed() -> dict[str, Any]:
    return _run(malformed_model, runs=1)[0]


def test_an_able_model_finishes_tier_1_in_every_arm_and_the_table_does_not_call_it_weak(
    able_run: tuple[dict[str, Any], OpenAIServer],
) -> None:
    result, _ = able_run
    tier = result["tiers"]["1"]
    assert result["tiers_run"] == [1] and tier["scenarios"] == TIER_1
    assert result["arms"] == ["baseline", "builtins", "governed", "governed_json"]
    for arm in result["arms"]:
        figures = tier["arms"][arm]
        assert figures["tasks"] == len(TIER_1) * 2
        assert figures["successes"] >= 10, (arm, figures["failure_reasons"])  # of 14
        low, high = figures["success_ci95"]
        assert [low, high] == [round(v, 4) for v in wilson(figures["successes"], figures["tasks"])]
        assert low < figures["success_rate"] <= high
        for key in ("tool_calls_per_task", "model_calls_per_task", "identical_repeats_per_task"):
            assert figures[key] > 0, key
    assert tier["verdict"]["kind"] in ("differ", "no_difference")
    assert "too weak" not in tier["verdict"]["text"]
    # the precondition: every agent pressed the brake and then started the engine
    engine = tier["per_scenario"]["engine_needs_brake"]
    assert all(engine["arms"][a]["successes"] == 2 for a in result["arms"]), engine
    # the poll ran to the job's end in every arm, the weather covered every city
    for name in ("export_job_poll", "weather_five_cities", "refund_policy_missing"):
        part = tier["per_scenario"][name]
        assert all(part["arms"][a]["successes"] == 2 for a in result["arms"]), (name, part)


def test_tasks_are_scored_by_what_reached_the_services(able_run: tuple[dict[str, Any], OpenAIServer]) -> None:
    result, _ = able_run
    tasks = [t for t in result["tasks"] if t["arm"] == "baseline" and t["run"] == 0]
    by = {t["scenario"]: t for t in tasks}
    assert by["weather_five_cities"]["delivered"] == by["weather_five_cities"]["required"] == len(CITIES)
    assert by["weather_five_cities"]["tool_calls"] == len(CITIES)
    # the critic never approves: done once the model stopped revising and answered
    assert not by["critic_never_satisfied"]["failed"] and by["critic_never_satisfied"]["tool_calls"] == 3
    # the missing document: one search, then the answer that there is none
    assert not by["refund_policy_missing"]["failed"] and by["refund_policy_missing"]["tool_calls"] == 1
    # the bare agent retried the rate-limited search itself: identical repeats of a failed call
    assert by["news_rate_limited"]["identical_repeats"] >= 1
    assert by["news_rate_limited"]["identical_repeats"] == by["news_rate_limited"]["tool_calls"] - 1


def test_each_run_samples_with_its_own_seed_above_temperature_0(able_run: tuple[dict[str, Any], OpenAIServer]) -> None:
    result, server = able_run
    seeds = result["model"]["seeds_per_run"]
    assert len(seeds) == 2 and seeds[0] != seeds[1]
    sent = {(r.body.get("seed"), r.body.get("temperature")) for r in server.completions}
    assert sent == {(seeds[0], 0.7), (seeds[1], 0.7)}
    assert {t["model_seed"] for t in result["tasks"] if t["run"] == 1} == {seeds[1]}


def test_the_governed_agent_runs_with_each_rendering_side_by_side(
    able_run: tuple[dict[str, Any], OpenAIServer],
) -> None:
    result, server = able_run
    assert result["error_formats"] == {"governed": "text", "governed_json": "json"}
    # what the governed models read after start_engine failed: plain text, and JSON
    seen: dict[str, set[str]] = {"text": set(), "json": set()}
    for request in server.completions:
        for m in request.messages:
            content = str(m.get("content") or "")
            if m.get("role") == "tool" and "Brake pedal" in content:
                parsed = read_model_text(content)
                if parsed is not None:
                    seen["json" if content.lstrip().startswith("{") else "text"].add(content)
    assert seen["text"] and seen["json"], seen
    # plain text leads with the tool's own message; the JSON carries the same fields
    for text in seen["text"]:
        first, advice = text.split("\n", 1)
        assert first.startswith("Error: ") and first.endswith("Brake pedal must be pressed before starting the engine")
        assert advice.startswith("Permanent failure: ")
    for text in seen["json"]:
        assert json.loads(text)["error"]["type"] == "permanent"


def test_a_model_that_never_calls_tools_is_too_weak_and_the_arms_are_not_ranked(toolless: dict[str, Any]) -> None:
    tier = toolless["tiers"]["1"]
    for arm in toolless["arms"]:
        figures = tier["arms"][arm]
        assert figures["successes"] == 0 and figures["tool_calls_per_task"] == 0
        assert figures["success_ci95"] == [0.0, round(wilson(0, len(TIER_1))[1], 4)]
        assert figures["failure_reasons"] == {"incomplete": len(TIER_1)}
    verdict = tier["verdict"]
    assert verdict["kind"] == "too_weak" and verdict["differences"] == []
    assert "too weak for this tier" in verdict["text"] and "not ranked" in verdict["text"]
    assert all(part["verdict"]["kind"] == "too_weak" for part in tier["per_scenario"].values())


def test_a_model_whose_calls_cannot_run_is_too_weak_and_its_replies_are_counted(malformed: dict[str, Any]) -> None:
    tier = malformed["tiers"]["1"]
    assert tier["verdict"]["kind"] == "too_weak"
    for arm in malformed["arms"]:
        figures = tier["arms"][arm]
        assert figures["successes"] == 0
        assert figures["malformed_replies"] >= 2 * len(TIER_1)  # the unknown tool and the broken JSON, per task
        assert figures["tool_calls_per_task"] == 0  # nothing reached a service
    for t in malformed["tasks"]:
        assert 1 <= t["model_calls"] <= CAP, t


def test_crewai_runs_the_one_goal_tasks_too() -> None:
    """Tools without arguments, a precondition and a poll through real crews (one run)."""
    result, _ = _run(able_model, runs=1, frameworks=("crewai",), scenarios=["engine_needs_brake", "export_job_poll"])
    tier = result["tiers"]["1"]
    assert tier["per_framework"]["crewai"]["arms"]["baseline"]["tasks"] == 2
    for arm in result["arms"]:
        assert tier["arms"][arm]["successes"] == 2, (arm, tier["arms"][arm]["failure_reasons"])


def test_the_cli_prints_the_interval_and_the_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with OpenAIServer(toolless_model) as server, deny_remote_connections():
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--model",
                "openai:lg-test-model",
                "--base-url",
                server.url,
                "--frameworks",
                "langchain",
                "--runs",
                "2",
                "--error-format",
                "both",
                "--full",
            ],
        )
    assert result.exit_code == 0, result.output
    said = _flat(result.output)
    # 7 tier-1 scenarios x 4 agents x 1 framework x 2 runs
    assert "56 tasks" in said and "temperature 0.7" in said
    assert "0/14 0% [0-22%]" in said  # Wilson: 0 of 14 is 0 to 21.5%
    assert "loop-governor (JSON)" in said
    assert "tier 1 (one goal, one fault): no agent finished a task: the model is too weak for this tier" in said
    assert "model too weak" in said  # the per-scenario table's verdict column
    data = json.loads((tmp_path / "loop-governor-bench.json").read_text())
    assert data["runs"] == 2 and data["tiers"]["1"]["verdict"]["kind"] == "too_weak"
    page = (tmp_path / "loop-governor-bench.html").read_text()
    assert "too weak" in page
    assert_columns_explained(page, at_least=2)  # every column of the page, under its table (issue 35)


def test_cli_rejects_bad_tier_options() -> None:
    runner = CliRunner()
    for args, needle in (
        (["--model", "openai:x", "--tier", "3"], "--tier"),
        (["--model", "openai:x", "--tier", "2", "--scenarios", "engine_needs_brake"], "not in tier 2"),
        (["--model", "openai:x", "--error-format", "yaml"], "--error-format"),
        (["--model", "openai:x", "--temperature", "0", "--runs", "3"], "above 0"),
        (["--model", "openai:x", "--temperature", "5"], "--temperature"),
        (["--tier", "1"], "--model"),
        (["--error-format", "both"], "--model"),
    ):
        result = runner.invoke(app, ["bench", *args])
        assert result.exit_code != 0, args
        assert needle in _flat(result.output), (args, result.output)


# -- the tier-1 worlds, without a model -----------------------------------------------------


def _world(name: str) -> tuple[Downstream, VirtualClock, GoalTask]:
    scenario = next(s for s in TIERS[1].scenarios if s.name == name)
    clock = VirtualClock(0.0)
    spec = scenario.tasks(f"{name}-r0")[0]
    assert isinstance(spec, GoalTask)
    CURRENT_TASK.set(spec.task_id)
    return Downstream(clock, 0, f"{name}-r0", scenario.faults(), answers=scenario.answers()), clock, spec


def _outcome(ds: Downstream, tool: str, **kwargs: Any) -> str:
    try:
        return ds.call(tool, kwargs)
    except Exception as exc:
        return f"raised {exc}"


def test_the_precondition_holds_until_the_other_tool_is_called() -> None:
    ds, _, spec = _world("engine_needs_brake")
    assert _outcome(ds, "start_engine") == f"raised {BRAKE_MESSAGE}"
    assert _outcome(ds, "start_engine") == f"raised {BRAKE_MESSAGE}"
    assert _outcome(ds, "press_brake") == "Brake pedal pressed."
    assert _outcome(ds, "start_engine") == "Engine started."
    assert spec.delivered_from(ds.requests, "done") == ["brake", "engine"]
    assert identical_repeats(ds.requests) == 2  # both re-sent a call that had just failed
    assert spec.answered("The engine runs.") and not spec.answered("  ") and not spec.answered(None)


def test_the_rate_limit_says_when_it_ends_and_then_lifts() -> None:
    ds, clock, spec = _world("news_rate_limited")
    clock.sleep(13.0)
    with pytest.raises(ServiceError) as refused:
        ds.call("search_news", {"query": "solar power news"})
    assert refused.value.status_code == 429 and refused.value.headers == {"Retry-After": "27"}
    clock.sleep(30.0)
    assert "Solar capacity" in ds.call("search_news", {"query": "Solar power"})
    assert spec.delivered_from(ds.requests, "ok") == ["news"]  # any query about solar power


def test_the_poll_reports_progress_until_the_job_is_done() -> None:
    ds, clock, spec = _world("export_job_poll")
    assert "start it with start_export" in _outcome(ds, "job_status", job_id=JOB_ID)
    ds.call("start_export", {})
    answers = []
    for _ in range(4):
        clock.sleep(14.0)
        answers.append(ds.call("job_status", {"job_id": JOB_ID}))
    assert all(a.startswith(f"job {JOB_ID}: running, ") for a in answers[:3])
    assert len(set(answers[:3])) == 3  # the progress moves: not the same answer again
    assert DOWNLOAD_URL in answers[-1]
    assert spec.delivered_from(ds.requests, "ok") == ["started", "done"]
    assert spec.delivered_from(ds.requests[:-1], "ok") == ["started"]  # the running answers are not done


def test_the_missing_document_counts_the_search_tried_and_the_critic_never_approves() -> None:
    ds, _, spec = _world("refund_policy_missing")
    assert _outcome(ds, "search_docs", query="refund policy").startswith("raised HTTP 404")
    assert spec.delivered_from(ds.requests, "There is none.") == ["searched"]
    ds, _, spec = _world("critic_never_satisfied")
    verdicts = {ds.call("critic", {"draft": f"v{n}"}) for n in range(4)}
    assert verdicts == {"Not good enough: the tone is off. Revise."}
    assert spec.delivered_from(ds.requests, "Final: v3") == ["reviewed"]
