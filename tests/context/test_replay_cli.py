"""`loop-governor replay` on small generated runs in both corpus formats."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from loop_governor.cli import replay as context_cli
from loop_governor.context.replay import load_runs


def _swe_run(steps: int) -> dict[str, object]:
    msgs: list[dict[str, object]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Fix the issue " + "spec " * 200},
    ]
    for s in range(steps):
        msgs.append(
            {
                "role": "assistant",
                "content": f"step {s}",
                "tool_calls": [
                    {
                        "id": f"c{s}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"command": f"cat f{s}.py"})},
                    }
                ],
                "usage": {"prompt_tokens": 1000 + s},
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{s}", "content": f"file {s}\n" + "code line\n" * 600})
    msgs.append({"role": "exit", "content": "done"})
    return {"source": "test", "model": "m", "exit_status": "Submitted", "messages": msgs}


def _tau(n: int) -> list[dict[str, object]]:
    traj = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "book a flight"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "get_user", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "x", "name": "get_user", "content": '{"name": "Mia"}'},
        {"role": "assistant", "content": "Done."},
    ]
    return [{"task_id": k, "reward": 1.0, "info": {}, "traj": traj, "trial": 0} for k in range(n)]


def _app() -> typer.Typer:
    app = typer.Typer()
    context_cli.register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer's sub-command layout
        pass

    return app


def test_replay_both_formats_and_directory(tmp_path: Path) -> None:
    swe = tmp_path / "swe"
    swe.mkdir()
    for k in range(2):
        with gzip.open(swe / f"run{k}.json.gz", "wt") as f:
            json.dump(_swe_run(40), f)
    tau = tmp_path / "tau.json"
    tau.write_text(json.dumps(_tau(3)))
    runs = load_runs([swe, tau])
    assert len(runs) == 5 and runs[0].provider_prompt_tokens[:2] == [1000, 1001]
    assert all(m["role"] != "exit" for r in runs for m in r.messages)

    out_json = tmp_path / "figures.json"
    result = CliRunner().invoke(_app(), ["replay", str(swe), "--cache-price", "0.1", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    assert "ours" in result.output and "seed-headtail" in result.output
    rows = {r["policy"]: r for r in json.loads(out_json.read_text())["policies"]}
    assert rows["raw"]["requests"] == 80
    assert rows["ours"]["tokens_per_request"] < 0.6 * rows["raw"]["tokens_per_request"]
    assert rows["ours"]["bill_vs_raw"] < 1.0
    assert rows["ours"]["tokens_at_turn_30"] < rows["raw"]["tokens_at_turn_30"]

    result = CliRunner().invoke(_app(), ["replay", str(tau), "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    rows = {r["policy"]: r for r in json.loads(out_json.read_text())["policies"]}
    assert rows["ours"]["tokens_per_request"] == rows["raw"]["tokens_per_request"]


def test_replay_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["replay", str(tmp_path / "nope")])
    assert result.exit_code != 0
