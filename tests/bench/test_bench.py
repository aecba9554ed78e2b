"""The benchmark's promises: the governed arm wins honestly, where it loses the README says
why (and these tests pin the reason), results are reproducible."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loop_governor.bench import policy
from loop_governor.bench.harness import run_world
from loop_governor.bench.lc_runner import LangChainRunner
from loop_governor.bench.runner import run_bench
from loop_governor.bench.world import SCENARIO_BY_NAME
from loop_governor.cli import app

ARMS = ("baseline", "builtins", "governed")
POLICIES = ("obedient", "stubborn", "calibrated")
PER_PASS = 19  # tasks in one pass over every scenario


def test_governed_meets_the_seed_column(bench_result: dict[str, Any]) -> None:
    governed = bench_result["governed"]
    assert governed["tasks"] == 2 * 12 * 2  # runs x tasks per pass x frameworks
    assert governed["tool_calls_per_task"] <= 11
    assert governed["failure_rate"] <= 0.30


def test_baseline_makes_at_least_twice_the_governed_calls(bench_result: dict[str, Any]) -> None:
    assert bench_result["baseline"]["tool_calls_per_task"] >= 2 * bench_result["governed"]["tool_calls_per_task"]


def test_governed_beats_framework_builtins(bench_result: dict[str, Any]) -> None:
    governed, builtins = bench_result["governed"], bench_result["builtins"]
    assert governed["tool_calls_per_task"] < builtins["tool_calls_per_task"]
    assert governed["failure_rate"] < builtins["failure_rate"]


def test_failed_governed_tasks_keep_their_sub_results(bench_result: dict[str, Any]) -> None:
    seed_incidents = set(bench_result["per_scenario"])
    failed = [
        t
        for t in bench_result["tasks"]
        if t["arm"] == "governed" and t["failed"] and t["policy"] == "obedient" and t["scenario"] in seed_incidents
    ]
    assert failed, "the credentials scenario cannot succeed: some governed task must fail"
    assert all(t["delivered"] > 0 for t in failed)
    assert (
        bench_result["governed"]["subtasks_delivered_on_failure"]
        > bench_result["baseline"]["subtasks_delivered_on_failure"]
    )


def test_both_frameworks_ran_every_arm(bench_result: dict[str, Any]) -> None:
    assert bench_result["frameworks"] == ["langchain", "crewai"]
    for framework in ("langchain", "crewai"):
        for arm in ARMS:
            summary = bench_result["per_framework"][framework][arm]
            assert summary["tasks"] == 24
            assert summary["tool_calls_per_task"] > 0
    # each framework's own stop signals show up: crewAI's REPEATED_CALL guard aborts a plain
    # crew, LangChain's tool-call limit ends a builtins run with an incomplete answer
    crew_reasons = bench_result["per_framework"]["crewai"]["baseline"]["failure_reasons"]
    assert "ToolExecutionFailedError" in crew_reasons
    assert "incomplete" in bench_result["per_framework"]["langchain"]["builtins"]["failure_reasons"]


def test_the_crashed_batch_resumes_only_when_governed(bench_result: dict[str, Any]) -> None:
    batch = [t for t in bench_result["tasks"] if t["scenario"] == "batch_crash_at_18" and t["policy"] == "obedient"]
    assert all(t["restarts"] == 1 for t in batch)
    by_arm = {arm: [t["tool_calls"] for t in batch if t["arm"] == arm] for arm in ARMS}
    # a restarted baseline redoes the 17 items it had finished; the governor replays them
    assert min(by_arm["baseline"]) >= 30 + 17
    assert max(by_arm["governed"]) < min(by_arm["baseline"])


def test_same_seed_same_json_and_another_seed_differs() -> None:
    # both frameworks, the seeded calibrated draws, provider faults and the jitter ablation
    def run(seed: int) -> dict[str, Any]:
        return run_bench(seed=seed, runs=1, policies=["calibrated"])

    first = run(3)
    assert json.dumps(run(3), sort_keys=True) == json.dumps(first, sort_keys=True)
    other = run(4)
    assert [t["duration_s"] for t in other["tasks"]] != [t["duration_s"] for t in first["tasks"]]
    assert other["jitter_ablation"] != first["jitter_ablation"]


def test_retry_rate_is_reported_per_arm_framework_and_task(bench_result: dict[str, Any]) -> None:
    assert "peak_retry_rate_per_s" in bench_result["metric_definitions"]
    summaries = [bench_result[arm] for arm in ARMS]
    summaries += [arms[arm] for arms in bench_result["per_framework"].values() for arm in ARMS]
    for summary in summaries:
        assert isinstance(summary["peak_retry_rate_per_s"], int)
        # retries only: the first wave of 5 concurrent first attempts cannot set it
        assert 0 < summary["peak_retry_rate_per_s"] <= 5
        assert 0 < summary["mean_peak_retry_rate_per_s"] <= summary["peak_retry_rate_per_s"]
    concurrent = [t for t in bench_result["tasks"] if t["scenario"] == "concurrent_flaky" and t["policy"] == "obedient"]
    assert max(t["peak_retry_rate_per_s"] for t in concurrent) == max(s["peak_retry_rate_per_s"] for s in summaries)


def test_cli_writes_json_and_html(tmp_path: Path) -> None:
    out, page = tmp_path / "bench.json", tmp_path / "bench.html"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--runs",
            "1",
            "--frameworks",
            "langchain",
            "--model-policy",
            "stubborn",
            "--seed",
            "5",
            "--json",
            str(out),
            "--html",
            str(page),
        ],
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "not a real model" in said
    assert str(out) in said and str(page) in said  # where the full tables are
    data = json.loads(out.read_text())
    assert data["frameworks"] == ["langchain"]
    assert list(data["model_policies"]) == ["stubborn"] and data["headline_policy"] == "stubborn"
    for arm in ARMS:
        assert set(data[arm]) >= {
            "tasks",
            "failed_tasks",
            "tool_calls_per_task",
            "mean_duration_s",
            "failed_duration_s",
            "subtasks_delivered_on_failure",
            "peak_retry_rate_per_s",
        }
    text = page.read_text()
    assert text.count("<svg") >= 5 and "not a real model" in text
    assert "Where governance does not win" in text and "Jitter ablation" in text
    assert "<script" not in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_make_demo_prints_a_summary_and_writes_the_full_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``make demo`` runs ``loop-governor bench`` with no arguments: a short summary in plain
    words, the full tables in the HTML report and JSON in the working directory."""
    monkeypatch.chdir(tmp_path)
    args = ["bench", "--runs", "1", "--scenarios", "missing_document,provider_429_storm"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) <= 40, result.output
    for policy_name in POLICIES:
        assert policy_name in result.output
    for label in ("plain agent", "framework built-ins", "loop-governor"):
        assert label in result.output
    for internal in ("seed 004", "ungoverned", "seed's"):
        assert internal not in result.output
    data = json.loads((tmp_path / "loop-governor-bench.json").read_text())
    assert data["scenarios"] == ["missing_document", "provider_429_storm"]
    html_text = (tmp_path / "loop-governor-bench.html").read_text()
    assert "per framework" in html_text.lower() or "Tool calls per task" in html_text
    assert "seed 004" not in html_text
    full = CliRunner().invoke(app, [*args, "--full"])
    assert full.exit_code == 0 and "where governance does not win" in full.output
    assert len(full.output.splitlines()) > len(lines)


def test_cli_rejects_an_unknown_framework_policy_or_calibration(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "--frameworks", "autogen"])
    assert result.exit_code != 0
    result = CliRunner().invoke(app, ["bench", "--model-policy", "obedient,reckless"])
    assert result.exit_code != 0 and "reckless" in result.output
    bogus = tmp_path / "params.json"
    bogus.write_text('{"format": "something else"}')
    result = CliRunner().invoke(app, ["bench", "--calibration", str(bogus)])
    assert result.exit_code != 0 and "bench calibrate" in result.output


def test_importing_the_core_and_cli_loads_no_agent_framework() -> None:
    code = (
        "import sys, loop_governor, loop_governor.cli, loop_governor.cli.bench, loop_governor.bench.world;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'langchain', 'langgraph', 'crewai'});"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the model policies -------------------------------------------------------------------


def test_every_policy_reports_every_arm_and_metric(bench_result: dict[str, Any]) -> None:
    assert bench_result["model_policies_run"] == list(POLICIES)
    for name in POLICIES:
        per_policy = bench_result["model_policies"][name]
        for arm in ARMS:
            summary = per_policy[arm]
            assert summary["tasks"] == 2 * PER_PASS * 2
            assert {"tool_calls_per_task", "model_calls_per_task", "failure_rate", "prompt_tokens_per_task"} <= set(
                summary
            )
            assert summary["model_calls_per_task"] > summary["tool_calls_per_task"] / 2 > 0
            for framework in ("langchain", "crewai"):
                assert per_policy["per_framework"][framework][arm]["tasks"] == 2 * PER_PASS
        assert set(per_policy["per_scenario"]) == set(SCENARIO_BY_NAME)


def test_governed_makes_the_fewest_tool_and_model_calls_under_every_policy(bench_result: dict[str, Any]) -> None:
    for name in POLICIES:
        per_policy = bench_result["model_policies"][name]
        for arms in (per_policy, *per_policy["per_framework"].values()):
            for metric in ("tool_calls_per_task", "model_calls_per_task"):
                assert arms["governed"][metric] <= min(arms["baseline"][metric], arms["builtins"][metric]), (
                    name,
                    metric,
                )


def test_the_stubborn_model_is_bounded(bench_result: dict[str, Any]) -> None:
    governed = bench_result["model_policies"]["stubborn"]["governed"]
    assert governed["tool_calls_per_task"] <= 12
    assert governed["model_calls_per_task"] <= 16
    # a model that ignores every warning gets the failing tool withdrawn from its tool list:
    # like the bare LangChain agent after 30 identical failures, it then takes its next option
    # and finishes -- at a fraction of the calls (crewAI's own REPEATED_CALL guard aborts its
    # bare crew at the 5th identical call)
    governed_tasks = [
        t
        for t in bench_result["tasks"]
        if t["policy"] == "stubborn" and t["arm"] == "governed" and t["scenario"] == "missing_document"
    ]
    assert governed_tasks and all(not t["failed"] and t["delivered"] == 3 for t in governed_tasks)
    assert all(t["tool_calls"] <= 6 and t["model_calls"] <= 8 for t in governed_tasks)
    bare = [
        t
        for t in bench_result["tasks"]
        if t["policy"] == "stubborn" and t["arm"] == "baseline" and t["scenario"] == "missing_document"
    ]
    langchain = [t for t in bare if t["framework"] == "langchain"]
    assert all(t["tool_calls"] > 30 and not t["failed"] for t in langchain)
    assert all(t["reason"] == "ToolExecutionFailedError" for t in bare if t["framework"] == "crewai")


def test_obedient_and_stubborn_differ_only_where_the_governor_speaks(bench_result: dict[str, Any]) -> None:
    policies = bench_result["model_policies"]
    for arm in ("baseline", "builtins"):
        assert policies["obedient"][arm] == policies["stubborn"][arm]
    assert policies["obedient"]["governed"] != policies["stubborn"]["governed"]


def test_runs_shared_between_policies_equal_separate_runs() -> None:
    """run_bench runs a world once where the policy cannot matter: check that against real runs."""
    runner = LangChainRunner()
    for arm, scenario, a, b in (
        ("baseline", "missing_document", "obedient", "stubborn"),
        ("builtins", "downstream_outage", "obedient", "stubborn"),
        ("governed", "provider_overloaded_529", "obedient", "calibrated"),
    ):
        runs = [
            [
                {**asdict(o), "policy": "-"}
                for o in run_world(
                    runner, arm, SCENARIO_BY_NAME[scenario], 7, 0, policy.delivered_in, policy.make_behaviour(name)
                )
            ]
            for name in (a, b)
        ]
        assert runs[0] == runs[1], (arm, scenario)


def test_a_fatal_provider_error_reaches_the_provider_once_only_when_governed(bench_result: dict[str, Any]) -> None:
    quota = [t for t in bench_result["tasks"] if t["scenario"] == "quota_exhausted_mid_task"]
    refused: dict[tuple[str, str], set[int]] = {}
    for t in quota:
        refused.setdefault((t["framework"], t["arm"]), set()).add(t["failed_model_calls"])
    assert refused["langchain", "governed"] == refused["crewai", "governed"] == {1}
    assert refused["langchain", "baseline"] == {3}  # the SDK's own 2 retries
    assert refused["langchain", "builtins"] == {9}  # ModelRetryMiddleware x the SDK
    assert refused["crewai", "baseline"] == refused["crewai", "builtins"] == {27}  # agent retry x LLM retry x SDK
    assert all(t["failed"] for t in quota)
    assert {t["delivered"] for t in quota if t["arm"] == "governed"} == {6}  # what it finished, checkpointed
    assert {t["delivered"] for t in quota if t["arm"] != "governed"} == {0}


def test_governed_survives_provider_faults_at_fewer_model_calls(bench_result: dict[str, Any]) -> None:
    """A 429 storm on one key and a 529 burst: the governed model call waits its turns
    (throttles and overloads spend no attempts, 429s trip no breaker), so it fails no more
    often than the frameworks' longer retry chains, at fewer requests than the built-ins."""
    for name in POLICIES:
        scenarios = bench_result["model_policies"][name]["per_scenario"]
        assert scenarios["provider_429_storm"]["governed"]["failure_rate"] == 0  # every throttle waited out
        for scenario in ("provider_429_storm", "provider_overloaded_529"):
            arms = scenarios[scenario]
            governed = arms["governed"]
            assert governed["model_calls_per_task"] < arms["builtins"]["model_calls_per_task"]
            # a 529 burst can outlast model_max_wait_s (a failed probe re-opens the breaker)
            assert set(governed["failure_reasons"]) <= {"TransientError"}
    # Where the obedient model's governed arm is not best, it is in a provider fault: on
    # failures only where a 529 burst outlasted the wait, on cost against an arm that gave
    # up more often (fewer calls because its tasks ended early).
    per_scenario = bench_result["model_policies"]["obedient"]["per_scenario"]
    for loss in bench_result["model_policies"]["obedient"]["governed_not_best"]:
        assert "provider" in loss["scenario"], loss
        if loss["metric"] == "failure_rate":
            assert loss["scenario"] in ("provider-fault scenarios", "provider_overloaded_529"), loss
            continue
        better = next(arm for arm in ("baseline", "builtins") if arm in loss)
        if loss["scenario"] in per_scenario and loss["framework"] == "all":
            arms = per_scenario[loss["scenario"]]
            assert arms[better]["failure_rate"] > arms["governed"]["failure_rate"], loss


def test_jitter_ablation(bench_result: dict[str, Any]) -> None:
    ablation = bench_result["jitter_ablation"]
    fast, default, slow = ablation["fast_errors"], ablation["default_breaker"], ablation["slow_errors"]
    assert ablation["with_jitter"] == fast["with_jitter"] and ablation["without_jitter"] == fast["without_jitter"]
    # lock-step without jitter: all five retries in flight together, every time
    assert fast["without_jitter"]["mean_peak_concurrent_retries"] == ablation["tasks"]
    assert fast["with_jitter"]["mean_peak_concurrent_retries"] < fast["without_jitter"]["mean_peak_concurrent_retries"]
    assert fast["with_jitter"]["retries_per_world"] == fast["without_jitter"]["retries_per_world"] > 0
    # with the default breaker, five failures at once open it: no retry is sent at all
    assert default["with_jitter"]["retries_per_world"] == default["without_jitter"]["retries_per_world"] == 0
    # 1.5-second errors overlap in flight whatever the spread
    assert slow["mean_peak_reduction"] == 0


def test_every_column_of_the_html_page_is_explained_on_it(bench_result: dict[str, Any]) -> None:
    """Issue 35: the page had "published incident" columns nothing explained."""
    from lg_browser import assert_columns_explained

    from loop_governor.bench.report import html_report

    page = html_report(bench_result)
    assert_columns_explained(page, at_least=3)
    assert "published incident" not in page
    assert "incident report: no governor" in page and "20 controlled runs" in page
    assert "Rows — <b>tool calls per task</b>: requests that reached the simulated services" in page
