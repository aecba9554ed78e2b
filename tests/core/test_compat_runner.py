"""``make compat``'s verdict (compat/run.py): a stale allow-list entry fails the run, and
allow-listed failures are reported as such, never as "skipped" (issue 27, item 11)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

COMPAT = Path(__file__).resolve().parents[2] / "compat"


@pytest.fixture(scope="module")
def run() -> ModuleType:
    sys.path.insert(0, str(COMPAT))
    try:
        spec = importlib.util.spec_from_file_location("compat_run", COMPAT / "run.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["compat_run"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(COMPAT))


SUITE = "langgraph-toolnode"
ALLOWED = "tests.test_tool_node::test_tool_node_error_handling"  # allow-listed for mode "toolnode"


def _outcomes(run: ModuleType, injected_status: str) -> dict[tuple[str, str], object]:
    tests = {ALLOWED: "passed", "tests.test_tool_node::test_other": "passed"}
    injected = {**tests, ALLOWED: injected_status}
    return {
        (SUITE, "unchanged"): run.Outcome(SUITE, "unchanged", tests),
        (SUITE, "toolnode"): run.Outcome(SUITE, "toolnode", injected),
    }


def _report(
    run: ModuleType, outcomes: dict[tuple[str, str], object], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    suites = [s for s in run.SUITES if s.name == SUITE]
    code = run.report(suites, outcomes, 1.0, selected=True)
    return code, capsys.readouterr().out


def test_an_allow_listed_failure_passes_the_run_and_is_not_called_skipped(
    run: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _report(run, _outcomes(run, "failed"), capsys)
    assert code == 0
    assert "skipped" not in out and "1 allow-listed failures" in out and "0 stale" in out


def test_an_allow_listed_test_that_passes_again_fails_the_run_as_stale(
    run: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _report(run, _outcomes(run, "passed"), capsys)
    assert code == 1
    assert f"STALE   allow-listed but passing again ({SUITE}/toolnode): {ALLOWED}" in out


def test_a_regression_still_fails_the_run(run: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = _outcomes(run, "failed")
    outcomes[(SUITE, "toolnode")].results["tests.test_tool_node::test_other"] = "failed"  # type: ignore[attr-defined]
    code, out = _report(run, outcomes, capsys)
    assert code == 1 and "BROKEN  tests.test_tool_node::test_other" in out


def test_a_selection_passes_pytest_k(run: ModuleType) -> None:
    (suite,) = [s for s in run.SUITES if s.name == "langchain-agents"]
    cmd = run.pytest_command(suite, "lc-first", Path("j.xml"), "test_jump_to_is_ephemeral")
    assert cmd[cmd.index("-k") + 1] == "test_jump_to_is_ephemeral"


# -- the memory wrappers' peer suites (issue 34) -------------------------------------------------


def test_the_memory_peer_suites_run_unwrapped_and_wrapped(run: ModuleType) -> None:
    suites = {s.name: s for s in run.SUITES}
    store, contract = suites["langgraph-store"], suites["crewai-memory-core"]
    assert (store.dist, store.paths, store.modes) == ("langgraph-checkpoint", ("tests/test_store.py",), ("store",))
    assert (contract.dist, contract.modes) == ("crewai-memory-core", ("memory",))
    for ours, _ in contract.extra_files:
        assert (COMPAT / ours).is_file()
    # no allow-list entry: every test that passes unwrapped must pass wrapped
    assert not [key for key in run.ALLOWED if key[0] in ("langgraph-store", "crewai-memory-core")]
    # (tests/memory/test_peer_suites.py: the modes wrap every backend the suites build)
