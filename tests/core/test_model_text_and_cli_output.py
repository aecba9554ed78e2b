"""Issue 17, small ones: the model reads the exception type; CLI output cannot drive the terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import loop_governor as lg
from loop_governor.checkpoint import FileCheckpointStore, TaskCheckpoint
from loop_governor.cli import app
from loop_governor.state.breaker import BreakerPolicy
from loop_governor.stores.sqlite import SQLiteStore
from loop_governor.terminal import cell, printable

runner = CliRunner()


def _lookup(d: dict[str, int], key: str) -> int:
    return d[key]


def test_the_model_reads_the_exception_type_and_signatures_stay_as_they_were(gov: lg.Governor) -> None:
    # Regression: the model read a KeyError as "'foo'".
    info = lg.classify(KeyError("foo"), tool="lookup")
    assert info.message == "KeyError: 'foo'"
    assert info.signature == "lookup:KeyError:<q>"  # from the text alone, as before: stored signatures still match
    assert lg.classify(IndexError("list index out of range")).message == "IndexError: list index out of range"
    assert lg.classify(TimeoutError()).message == "TimeoutError"  # no "TimeoutError: TimeoutError"
    texts = []
    for _ in range(2):
        with gov.task(f"t{len(texts)}"), pytest.raises(lg.PermanentError) as err:
            gov.call("lookup", _lookup, {}, "foo")
        texts.append(err.value.info.to_model_text())
    assert texts[0] == texts[1]  # identical failures, identical bytes (prompt cache)
    assert texts[0].startswith("Error: KeyError: 'foo'\nPermanent failure: ")


EVIL = "db\x1b[2J\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\u202ecod.exe[red]x[/red]"


def test_printable_shows_control_characters_as_escapes() -> None:
    assert printable("a\x1b[31mb\x9bc\u202ed\n") == "a\\x1b[31mb\\x9bc\\u202ed\\x0a"
    assert cell("[bold]x[/bold]\x07") == "\\[bold]x\\[/bold]\\x07"
    assert printable("plain ü 日本") == "plain ü 日本"


def test_breakers_table_prints_no_raw_escape_sequences(tmp_path: Path) -> None:
    # Regression: a tool name with terminal escapes reached `loop-governor breakers` raw.
    store = SQLiteStore(tmp_path / "state.db")
    store.breaker_record(EVIL, False, False, 1.0, BreakerPolicy(1, 60))
    store.close()
    result = runner.invoke(app, ["breakers", "--store", f"sqlite:///{tmp_path / 'state.db'}"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output and "\u202e" not in result.output
    assert "\\x1b[2J" in result.output and "[red]x[/red]" in result.output  # shown, escaped, not interpreted
    closed = runner.invoke(app, ["breakers", "close", EVIL, "--store", f"sqlite:///{tmp_path / 'state.db'}"])
    assert closed.exit_code == 0 and "\x1b" not in closed.output


def test_checkpoints_ls_prints_no_raw_escape_sequences(tmp_path: Path) -> None:
    FileCheckpointStore(tmp_path / "ck").save(TaskCheckpoint(task_id=EVIL, step=1))
    result = runner.invoke(app, ["checkpoints", "ls", "--store", f"file://{tmp_path / 'ck'}"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output and "\u202e" not in result.output
    assert "\\x1b[2J" in result.output
