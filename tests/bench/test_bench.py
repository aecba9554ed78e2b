"""The benchmark's promises: the governed arm wins honestly, results are reproducible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from loop_governor.bench.runner import run_bench
from loop_governor.cli import app

ARMS = ("baseline", "builtins", "governed")


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
    failed = [t for t in bench_result["tasks"] if t["arm"] == "governed" and t["failed"]]
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
    batch = [t for t in bench_result["tasks"] if t["scenario"] == "batch_crash_at_18"]
    assert all(t["restarts"] == 1 for t in batch)
    by_arm = {arm: [t["tool_calls"] for t in batch if t["arm"] == arm] for arm in ARMS}
    # a restarted baseline redoes the 17 items it had finished; the governor replays them
    assert min(by_arm["baseline"]) >= 30 + 17
    assert max(by_arm["governed"]) < min(by_arm["baseline"])


def test_same_seed_same_json_and_another_seed_differs(bench_result: dict[str, Any]) -> None:
    again = run_bench(seed=bench_result["seed"], runs=2)
    assert json.dumps(again, sort_keys=True) == json.dumps(bench_result, sort_keys=True)
    other = run_bench(seed=bench_result["seed"] + 1, runs=1, frameworks=["langchain"])
    assert [t["duration_s"] for t in other["tasks"]] != [
        t["duration_s"] for t in bench_result["tasks"] if t["framework"] == "langchain"
    ][: len(other["tasks"])]


def test_retry_rate_is_reported_per_arm_framework_and_task(bench_result: dict[str, Any]) -> None:
    assert "peak_retry_rate_per_s" in bench_result["metric_definitions"]
    summaries = [bench_result[arm] for arm in ARMS]
    summaries += [arms[arm] for arms in bench_result["per_framework"].values() for arm in ARMS]
    for summary in summaries:
        assert isinstance(summary["peak_retry_rate_per_s"], int)
        # retries only: the first wave of 5 concurrent first attempts cannot set it
        assert 0 < summary["peak_retry_rate_per_s"] <= 5
        assert 0 < summary["mean_peak_retry_rate_per_s"] <= summary["peak_retry_rate_per_s"]
    concurrent = [t for t in bench_result["tasks"] if t["scenario"] == "concurrent_flaky"]
    assert max(t["peak_retry_rate_per_s"] for t in concurrent) == max(s["peak_retry_rate_per_s"] for s in summaries)


def test_cli_writes_json_and_html(tmp_path: Path) -> None:
    out, page = tmp_path / "bench.json", tmp_path / "bench.html"
    result = CliRunner().invoke(
        app,
        ["bench", "--runs", "1", "--frameworks", "langchain", "--seed", "5", "--json", str(out), "--html", str(page)],
    )
    assert result.exit_code == 0, result.output
    assert "not a real model" in result.output
    data = json.loads(out.read_text())
    assert data["frameworks"] == ["langchain"]
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
    assert "<script" not in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_cli_rejects_an_unknown_framework() -> None:
    result = CliRunner().invoke(app, ["bench", "--frameworks", "autogen"])
    assert result.exit_code != 0


def test_importing_the_core_and_cli_loads_no_agent_framework() -> None:
    code = (
        "import sys, loop_governor, loop_governor.cli, loop_governor.bench.cli, loop_governor.bench.world;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'langchain', 'langgraph', 'crewai'});"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
