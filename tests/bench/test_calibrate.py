"""`loop-governor bench calibrate`: the measurement on a small generated corpus (never ../shared)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loop_governor.bench.calibrate import calibrate, failure_kind
from loop_governor.bench.policy import Calibrated, load_calibration
from loop_governor.cli import app


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _shell_run() -> dict[str, Any]:
    """mini-swe-agent: one bash tool; two failing commands (the second a variant), then one that passes."""
    steps = [("ls src", 1), ("ls -la src", 2), ("cat setup.py", 0)]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "shell"}, {"role": "user", "content": "fix"}]
    for i, (command, code) in enumerate(steps):
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [_call(f"c{i}", "bash", {"command": command})]}
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"<returncode>{code}</returncode>\n<output/>"}
        )
    messages.append({"role": "assistant", "content": "done"})
    return {"source": "fixture", "model": "m", "exit_status": "Submitted", "messages": messages}


def _api_traj(n: int) -> list[dict[str, Any]]:
    """tau-bench: tool calls stored as a Python repr string, as in the real files.

    lookup ok; book(card) not found; book(card) again (identical); lookup (switch); book(cert)
    refused; then no further tool call (give up).
    """
    calls = [
        ("get_user", {"user_id": "u1"}, '{"name": "Mia"}'),
        ("book", {"pay": "card_1"}, "Error: payment method not found"),
        ("book", {"pay": "card_1"}, "Error: payment method not found"),
        ("get_user", {"user_id": "u1"}, '{"name": "Mia"}'),
        ("book", {"pay": "cert_9"}, "Error: not enough seats on flight HAT1"),
    ]
    traj: list[dict[str, Any]] = [{"role": "system", "content": "policy"}, {"role": "user", "content": "book"}]
    for i, (name, args, result) in enumerate(calls):
        call_id = f"t{n}-{i}"
        traj.append({"role": "assistant", "content": "None", "tool_calls": repr([_call(call_id, name, args)])})
        traj.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result})
    traj.append({"role": "assistant", "content": "Sorry, that flight is full."})
    return traj


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "shell").mkdir(parents=True)
    (root / "api").mkdir()
    with gzip.open(root / "shell" / "run-1.json.gz", "wt", encoding="utf-8") as fh:
        json.dump(_shell_run(), fh)
    runs = [{"task_id": n, "trial": 0, "reward": 0.0, "info": {}, "traj": _api_traj(n)} for n in range(5)]
    (root / "api" / "runs.json").write_text(json.dumps(runs), encoding="utf-8")
    return root


def test_failure_kinds() -> None:
    assert failure_kind("<returncode>2</returncode>") == "command_failed"
    assert failure_kind("<returncode>0</returncode>\nError: in the output") is None
    assert failure_kind("Error: payment method not found") == "not_found"
    assert failure_kind("Error: not enough seats") == "invalid"
    assert failure_kind('{"error": "json bodies are results"}') is None


def test_calibrate_counts_moves_positions_and_streaks(corpus: Path) -> None:
    params = calibrate(corpus)
    shell, api = params["sources"]["shell"], params["sources"]["api"]
    assert (shell["runs"], shell["tools"], shell["failures"]) == (1, 1, 2)
    assert shell["moves"] == {"identical": 0, "changed": 2, "switch": 0, "give_up": 0}
    assert shell["streak_lengths"] == {"3": 1}  # fail, fail, then the passing command: 3 calls of bash
    assert (api["runs"], api["tools"], api["failures"], api["failures_followed_by_a_call"]) == (5, 2, 15, 10)
    assert api["moves"] == {"identical": 5, "changed": 0, "switch": 5, "give_up": 5}
    assert api["identical_next"] == 5 and api["identical_next_rate"] == 0.5
    assert api["streak_lengths"] == {"1": 5, "2": 5} and api["longest_streak"] == 2
    not_found = params["kinds"]["not_found"]["positions"]
    assert not_found[0] == {"n": 5, "identical": 5, "changed": 0, "switch": 0, "give_up": 0}
    assert not_found[1] == {"n": 5, "identical": 0, "changed": 0, "switch": 5, "give_up": 0}
    assert params["kinds"]["invalid"]["positions"][0]["give_up"] == 5
    assert params["kinds"]["command_failed"]["sources"] == ["shell"]
    # only the multi-tool source informs the default (switching is impossible with one tool)
    assert params["default"]["sources"] == ["api"]
    assert params["default"]["positions"][0] == {"n": 10, "identical": 5, "changed": 0, "switch": 0, "give_up": 5}
    assert params["default"]["longest_streak"] == 2
    assert json.dumps(calibrate(corpus), sort_keys=True) == json.dumps(params, sort_keys=True)


def test_calibrate_command_writes_parameters_the_bench_loads(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "params.json"
    result = CliRunner().invoke(app, ["bench", "calibrate", str(corpus), "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "50.0% (5/10)" in result.output and str(out) in result.output
    params = load_calibration(out)
    policy = Calibrated(params)
    assert policy.row("not_found", 1)["identical"] == 5
    assert policy.row("timeout", 2)["switch"] == 5  # an unseen kind: the pooled default (position 2: n=5)
    assert policy.row("invalid", 2) == params["default"]["positions"][1]  # too few of its own at 2: pooled


def test_calibrate_rejects_a_missing_or_empty_corpus(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "calibrate", str(tmp_path / "nope")])
    assert result.exit_code != 0 and "corpus not found" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, ["bench", "calibrate", str(tmp_path / "empty")])
    assert result.exit_code != 0 and "no runs" in result.output


def test_the_shipped_calibration_loads() -> None:
    params = load_calibration()
    assert params["default"]["positions"][0]["n"] >= 5
    assert set(params["kinds"]) >= {"invalid", "not_found"}
    Calibrated(params).row("default", 1)
