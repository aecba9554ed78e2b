"""``loop-governor breakers``: list, open and close breakers in a shared store."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loop_governor.cli import app
from loop_governor.state.breaker import BreakerPolicy, BreakerState
from loop_governor.stores.redis import RedisStore
from loop_governor.stores.sqlite import SQLiteStore

runner = CliRunner()


@pytest.mark.redis
def test_list_open_close_on_redis(redis_server: Any, namespace: str) -> None:
    url = f"{redis_server.url}?namespace={namespace}"
    agent = RedisStore(url, server_time=False)  # the virtual times below are what the CLI lists
    for t in (1.0, 2.0):
        agent.breaker_record("flaky", False, False, t, BreakerPolicy(2, 60))
    agent.breaker_record("slow", False, False, 3.0, BreakerPolicy(5, 60))

    listed = runner.invoke(app, ["breakers", "--store", url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output) == [
        {"tool": "flaky", "state": "open", "failures": 2, "opened_at": 2.0},
        {"tool": "slow", "state": "closed", "failures": 1, "opened_at": 0.0},
    ]
    table = runner.invoke(app, ["breakers", "--store", url])
    assert table.exit_code == 0 and "flaky" in table.output and "open" in table.output

    closed = runner.invoke(app, ["breakers", "close", "flaky", "--store", url])
    assert closed.exit_code == 0 and closed.output.strip() == "flaky: closed"
    assert agent.breaker_get("flaky").state is BreakerState.CLOSED

    opened = runner.invoke(app, ["breakers", "--store", url, "open", "slow"])
    assert opened.exit_code == 0 and opened.output.strip() == "slow: open"
    rec = agent.breaker_get("slow")
    assert rec.state is BreakerState.OPEN and rec.opened_at > 1e9  # wall clock, like the governor's


def test_store_from_environment_and_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("LOOP_GOVERNOR_STORE_URL", url)
    SQLiteStore(tmp_path / "state.db").close()  # the agents' store, as their first run creates it
    assert runner.invoke(app, ["breakers", "open", "db_tool"]).exit_code == 0
    assert SQLiteStore(tmp_path / "state.db").breaker_get("db_tool").state is BreakerState.OPEN
    SQLiteStore(tmp_path / "other.db").close()
    empty = runner.invoke(app, ["breakers", "--store", f"sqlite:///{tmp_path / 'other.db'}"])
    assert empty.exit_code == 0 and "no breakers" in empty.output


@pytest.mark.parametrize("command", [[], ["open", "db_tool"], ["close", "db_tool"]])
def test_a_store_that_does_not_exist_is_a_usage_error_not_a_new_empty_store(
    tmp_path: Path, command: list[str]
) -> None:
    """Issue 35: a typo in --store must not create a store no agent reads and report it empty."""
    typo = tmp_path / "stat.db"
    result = runner.invoke(app, ["breakers", "--store", f"sqlite:///{typo}", *command])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()  # one line saying what was expected
    assert line.startswith("loop-governor: error: no store at ") and "expected the agents' shared store" in line
    assert not typo.exists()


def test_unreachable_redis_and_memory_store_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOP_GOVERNOR_STORE_URL", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = runner.invoke(app, ["breakers", "--store", f"redis://:hunter2secret@127.0.0.1:{port}/0"])
    assert down.exit_code == 1
    assert "cannot reach" in down.output and "hunter2secret" not in down.output
    mem = runner.invoke(app, ["breakers", "--store", "memory://"])
    assert mem.exit_code == 2 and "memory://" in mem.output
