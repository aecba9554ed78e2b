"""Issue 35: a conventional command line -- ``--version``, ``--flag/--no-flag`` booleans whose
help shows no value placeholder, and input that is not what a command reads (a file that is no
trace, a store that does not exist) exits 2 with one line saying what was expected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import loop_governor as lg
from loop_governor.cli import app

runner = CliRunner()


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _commands(sub, (*path, name))


ALL = list(_commands(typer.main.get_command(app)))


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"loop-governor {lg.__version__}"
    bare = runner.invoke(app, [])
    assert "Usage: loop-governor" in bare.output and "--version" in bare.output  # no args: the help


@pytest.mark.parametrize("path", [p for p, _ in ALL], ids=lambda p: " ".join(p) or "loop-governor")
def test_help_shows_no_value_placeholder_for_a_flag(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output


def test_every_boolean_setting_is_a_flag_pair() -> None:
    settings = [
        (path, option)
        for path, command in ALL
        for option in command.params
        if getattr(option, "is_flag", False) and option.name not in ("help", "version")
    ]
    assert settings  # --json, --yes, --full...
    for path, option in settings:
        longs = [o for o in option.opts if o.startswith("--")]
        assert [f"--no-{o[2:]}" for o in longs] == option.secondary_opts, (path, option.opts)
    shown = runner.invoke(app, ["checkpoints", "rm", "--help"], terminal_width=120).output
    assert "--yes" in shown and "--no-yes" in shown and "-y" in shown


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("loop-governor: error: ")
    return str(lines[0])


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ('{"a": 1}\n{"b": 2}\n', "2 line(s), none of them a trace record"),
        ("meeting notes\n", "1 line(s), none of them a trace record"),
        ("", "empty"),
    ],
)
def test_report_on_a_file_that_is_not_a_trace_exits_2_and_writes_nothing(
    tmp_path: Path, content: str, found: str
) -> None:
    notes = tmp_path / "notes.jsonl"
    notes.write_text(content, encoding="utf-8")
    out = tmp_path / "report.html"
    line = _one_error_line(runner.invoke(app, ["report", str(notes), "-o", str(out)]))
    assert f"notes.jsonl is not a trace ({found}): expected a JSONL trace written by loop-governor" in line
    assert not out.exists()


def test_report_on_a_missing_path_or_a_directory_exits_2(tmp_path: Path) -> None:
    assert "does not exist: expected a JSONL trace" in _one_error_line(runner.invoke(app, ["report", "nope.jsonl"]))
    assert "is a directory: expected a JSONL trace" in _one_error_line(runner.invoke(app, ["report", str(tmp_path)]))


def test_a_store_or_run_files_that_do_not_exist_exit_2(tmp_path: Path) -> None:
    typo = f"sqlite:///{tmp_path / 'typo.db'}"
    line = _one_error_line(runner.invoke(app, ["checkpoints", "ls", "--store", typo]))
    assert "no checkpoint store at" in line and "expected an existing checkpoint store" in line
    line = _one_error_line(runner.invoke(app, ["breakers", "--store", typo]))
    assert "no store at" in line and "expected the agents' shared store" in line
    line = _one_error_line(runner.invoke(app, ["replay", str(tmp_path / "runs")]))
    assert "runs does not exist: expected recorded agent runs" in line
    (tmp_path / "notes.txt").write_text("not a run\n")
    result = runner.invoke(app, ["replay", str(tmp_path / "notes.txt")])
    assert result.exit_code == 2 and "no runs found in" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "typo.db").exists()
