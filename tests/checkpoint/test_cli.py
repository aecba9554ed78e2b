"""``loop-governor checkpoints ls | show | rm`` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import loop_governor as lg
from loop_governor.checkpoint import FileCheckpointStore, SQLiteCheckpointStore, TaskCheckpoint
from loop_governor.cli import app
from loop_governor.errors import ErrorType, GovernedError

runner = CliRunner()


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    store = FileCheckpointStore(tmp_path / "ck")
    cp = TaskCheckpoint(task_id="resume-me", step=2)
    cp.record_success('search:{"q":"cats"}', {"hits": 3})
    cp.record_failure(
        'fetch:{"u":"x"}',
        GovernedError(error_type=ErrorType.PERMANENT, tool="fetch", status=404, message="page gone"),
    )
    cp.add_result("summary of part one")
    store.save(cp)
    store.save(TaskCheckpoint(task_id="other"))
    return f"file://{tmp_path}/ck"


def test_ls_lists_every_task_with_its_progress(store_url: str) -> None:
    result = runner.invoke(app, ["checkpoints", "ls", "--store", store_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    row = next(line for line in lines if "resume-me" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert cells[1:7] == ["resume-me", "1", "2", "1", "1", "1"]  # version step completed known-bad results
    assert any("other" in line for line in lines)
    assert "2 checkpoint(s)" in result.output


def test_ls_marks_a_corrupt_checkpoint_instead_of_hiding_it(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "ck" / "other.ckpt.json").write_bytes(b"{broken")
    result = runner.invoke(app, ["checkpoints", "ls", "--store", store_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "CORRUPT" in result.output and "1 corrupt" in result.output
    assert "resume-me" in result.output


def test_show_prints_calls_errors_and_results(store_url: str) -> None:
    result = runner.invoke(app, ["checkpoints", "show", "resume-me", "--store", store_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in ('search:{"q":"cats"}', '{"hits": 3}', "page gone", "404", "summary of part one", "step 2"):
        assert text in result.output


def test_show_json_is_the_checkpoint(store_url: str) -> None:
    result = runner.invoke(app, ["checkpoints", "show", "resume-me", "--json", "--store", store_url])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["task_id"] == "resume-me" and doc["completed"] == {'search:{"q":"cats"}': {"hits": 3}}
    assert doc["known_bad"]['fetch:{"u":"x"}']["status"] == 404


def test_show_missing_and_corrupt_exit_non_zero(store_url: str, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["checkpoints", "show", "nope", "--store", store_url])
    assert missing.exit_code == 1 and "no checkpoint" in missing.output
    (tmp_path / "ck" / "other.ckpt.json").write_bytes(b"{broken")
    corrupt = runner.invoke(app, ["checkpoints", "show", "other", "--store", store_url], env={"COLUMNS": "300"})
    assert corrupt.exit_code == 2 and "corrupted" in corrupt.output


def test_rm_asks_then_removes(store_url: str, tmp_path: Path) -> None:
    declined = runner.invoke(app, ["checkpoints", "rm", "other", "--store", store_url], input="n\n")
    assert declined.exit_code == 1
    assert FileCheckpointStore(tmp_path / "ck").load("other") is not None
    accepted = runner.invoke(app, ["checkpoints", "rm", "other", "--store", store_url], input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert FileCheckpointStore(tmp_path / "ck").list() == ["resume-me"]
    again = runner.invoke(app, ["checkpoints", "rm", "other", "--yes", "--store", store_url])
    assert again.exit_code == 1 and "no checkpoint" in again.output


def test_store_url_from_the_environment_and_sqlite(tmp_path: Path) -> None:
    SQLiteCheckpointStore(tmp_path / "c.db").save(TaskCheckpoint(task_id="in-sqlite"))
    result = runner.invoke(
        app,
        ["checkpoints", "ls"],
        env={"LOOP_GOVERNOR_CHECKPOINT_URL": f"sqlite:///{tmp_path}/c.db", "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "in-sqlite" in result.output


def test_bad_store_url_is_a_usage_error() -> None:
    result = runner.invoke(app, ["checkpoints", "ls", "--store", "ftp://nowhere"])
    assert result.exit_code == 2


def test_a_store_that_does_not_exist_is_a_usage_error_not_an_empty_list(tmp_path: Path) -> None:
    for url in (f"file://{tmp_path}/typo", f"sqlite:///{tmp_path}/typo.db"):
        result = runner.invoke(app, ["checkpoints", "ls", "--store", url], env={"COLUMNS": "1000"})
        assert result.exit_code == 2, result.output
        assert "does not exist" in result.output and "0 checkpoint(s)" not in result.output
    assert not (tmp_path / "typo").exists() and not (tmp_path / "typo.db").exists()  # nothing created


def test_ls_reads_the_checkpoint_url_the_governor_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the same config as the governor: LOOP_GOVERNOR_CHECKPOINT_URL (not the fleet store's URL)
    url = f"file://{tmp_path}/cps"
    monkeypatch.setenv("LOOP_GOVERNOR_CHECKPOINT_URL", url)
    with lg.Governor().task("written-by-the-governor"):
        pass
    result = runner.invoke(app, ["checkpoints", "ls"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "written-by-the-governor" in result.output and "1 checkpoint(s)" in result.output
    monkeypatch.delenv("LOOP_GOVERNOR_CHECKPOINT_URL")
    missing = runner.invoke(app, ["checkpoints", "ls"], env={"COLUMNS": "200"})
    assert missing.exit_code == 2 and "LOOP_GOVERNOR_CHECKPOINT_URL" in missing.output


def test_ls_shows_a_corrupt_long_id_checkpoint(store_url: str, tmp_path: Path) -> None:
    # Regression: a torn checkpoint whose file name is hashed (long task id) was missing.
    # Its id cannot be read back, so it is listed by file name (never as a task id that
    # load or rm would take: that name is another valid id, see test_file_store).
    store = FileCheckpointStore(tmp_path / "ck")
    long_id = "Customer-Onboarding-Run-" + "X" * 70
    store.save(TaskCheckpoint(task_id=long_id))
    path = store.path_for(long_id)
    data = path.read_bytes()
    path.write_bytes(data[:20])
    result = runner.invoke(app, ["checkpoints", "ls", "--store", store_url], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "3 checkpoint(s)" in result.output and "1 corrupt" in result.output
    assert "CORRUPT" in result.output and path.name in result.output
    assert "resume-me" in result.output and "other" in result.output
    rm = runner.invoke(app, ["checkpoints", "rm", long_id, "--yes", "--store", store_url])
    assert rm.exit_code == 0, rm.output
    assert not path.exists()


def test_ls_never_prints_the_store_password(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: the table title showed the raw --store URL, password included.
    from loop_governor.checkpoint import MemoryCheckpointStore
    from loop_governor.cli import checkpoints as checkpoint_cli

    backend = MemoryCheckpointStore()
    backend.save(TaskCheckpoint(task_id="t"))
    monkeypatch.setattr(checkpoint_cli, "checkpoint_store_from_url", lambda url: backend)
    url = "redis://:SuperSecretPw123@127.0.0.1:6379/0"
    result = runner.invoke(app, ["checkpoints", "ls", "--store", url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "SuperSecretPw123" not in result.output
    assert "redis://:[REDACTED]@127.0.0.1:6379/0" in result.output
