"""``make compat``: the frameworks' own test suites, unchanged and with the governor in.

A plugin is judged by what it breaks in its host. This script takes the test suites that
ship inside the sdists of the *installed* langchain, langgraph-prebuilt and crewai
releases, runs each one unchanged, then with the governor injected in every position a
user may put it (see ``governor_inject.py``), and fails when a test that passes
unchanged fails injected -- unless ``allowlist.py`` names it with the reason (tests
that assert exactly what the governor changes on purpose).

The memory wrappers are judged by their peers' suites the same way: LangGraph's own
``BaseStore`` tests (they ship in the langgraph-checkpoint sdist) with every
``InMemoryStore`` they build wrapped in ``GovernedStore``, and the StorageBackend contract
of crewai-memory-core (18 tests, its sdist's own provider module for its dict-backed
``InMemoryBackend`` plus ours for crewAI's ``LanceDBStorage``) with each backend wrapped
in ``GovernedStorage``.

    python compat/run.py fetch        # download + unpack the sdists (pip download; cached)
    python compat/run.py run [SUITE]  # run; a table per suite and mode; exit 1 on a regression
    python compat/run.py run langchain-agents -k test_jump_to_is_ephemeral   # a selection only

An allow-listed test that passes again with the governor in fails the run too: the entry
is stale, and a stale entry would hide the next regression of that test.

Downloads happen in ``fetch`` only; ``run`` is offline (crewAI's cassettes are replayed
with record mode "none" and sockets refused). Everything lives under ``build/compat``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE.parent / "build" / "compat"

sys.path.insert(0, str(HERE))
from allowlist import ALLOWED  # noqa: E402


@dataclass(frozen=True)
class Suite:
    name: str
    dist: str  # the distribution whose sdist ships the tests
    paths: tuple[str, ...]  # test files / folders inside the unpacked sdist
    modes: tuple[str, ...]
    extra_args: tuple[str, ...] = ()
    conftest: str | None = None  # our own root conftest copied next to tests/
    ini: str | None = None  # our own pytest settings, for an sdist that ships none
    # our own test modules copied into the sdist: (file in compat/, path in the sdist)
    extra_files: tuple[tuple[str, str], ...] = ()


SUITES = (
    Suite(
        "langchain-agents",
        "langchain",
        ("tests/unit_tests/agents",),
        ("lc-first", "lc-last", "lc-tools"),
    ),
    Suite("langgraph-toolnode", "langgraph-prebuilt", ("tests",), ("toolnode",)),
    Suite(
        "crewai",
        "crewai",
        (
            # agent / crew / task / tool suites that replay VCR cassettes (or need no model)
            "tests/tools/test_base_tool.py",
            "tests/tools/test_structured_tool.py",
            "tests/tools/test_tool_failure.py",
            "tests/tools/test_tool_usage.py",
            "tests/tools/test_tool_usage_error_attribution.py",
            "tests/tools/test_tool_usage_limit.py",
            "tests/tools/test_async_tools.py",
            "tests/agents/test_agent.py",
            "tests/agents/test_native_tool_calling.py",
            "tests/agents/test_native_tool_hook_contract.py",
            "tests/agents/test_react_tool_hook_contract.py",
            "tests/test_crew.py",
            "tests/test_task.py",
            "tests/hooks/test_tool_hooks.py",
            "tests/test_tool_cache_default.py",
        ),
        ("crewai",),
        conftest="crewai_conftest.py",
        ini="crewai_pytest.ini",
    ),
    # LangGraph's BaseStore suite; mode "store": every InMemoryStore is a GovernedStore around one
    Suite("langgraph-store", "langgraph-checkpoint", ("tests/test_store.py",), ("store",)),
    # crewai-memory-core's StorageBackend contract on its InMemoryBackend and on crewAI's
    # LanceDBStorage; mode "memory": each backend is a GovernedStorage around one
    Suite(
        "crewai-memory-core",
        "crewai-memory-core",
        ("tests",),
        ("memory",),
        conftest="crewai_conftest.py",
        ini="memory_pytest.ini",
        extra_files=(("memory_contract_lancedb.py", "tests/test_lancedb_backend.py"),),
    ),
)


# -- fetch ------------------------------------------------------------------------------------


def sdist_dir(dist: str) -> Path:
    return BUILD / f"{dist.replace('-', '_')}-{version(dist)}"


def fetch(suites: Sequence[Suite]) -> None:
    downloads = BUILD / "sdists"
    downloads.mkdir(parents=True, exist_ok=True)
    for dist in dict.fromkeys(s.dist for s in suites):
        target = sdist_dir(dist)
        if (target / "tests").is_dir():
            continue
        wanted = f"{dist}=={version(dist)}"
        archive = _find_archive(downloads, dist)
        if archive is None:
            pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
            subprocess.run([*pip, wanted, "-d", str(downloads)], check=True)
            archive = _find_archive(downloads, dist)
        if archive is None:
            raise SystemExit(f"pip download {wanted} left no sdist in {downloads}")
        tmp = target.with_name(target.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        (unpacked,) = list(tmp.iterdir())
        if not (unpacked / "tests").is_dir():
            raise SystemExit(f"the {wanted} sdist ships no tests/ folder")
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)
        tmp.rmdir()
        print(f"unpacked {archive.name} -> {target.relative_to(HERE.parent)}")


def _find_archive(folder: Path, dist: str) -> Path | None:
    stem = f"{dist.replace('-', '_')}-{version(dist)}"
    for name in (stem, f"{dist}-{version(dist)}"):
        path = folder / f"{name}.tar.gz"
        if path.exists():
            return path
    return None


# -- run --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    suite: str
    mode: str
    results: dict[str, str] = field(default_factory=dict)  # test id -> passed|failed|skipped
    seconds: float = 0.0
    exit_code: int = 0


def pytest_command(suite: Suite, mode: str, junit: Path, select: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *suite.paths, "-p", "no:cacheprovider", "-q", "--tb=short"]
    if select:
        cmd += ["-k", select]
    cmd += ["--continue-on-collection-errors", "--timeout=300", f"--junitxml={junit}", "-o", "junit_family=xunit2"]
    if suite.ini:
        # without it pytest would settle on the nearest ini upwards: this project's
        cmd += ["-c", str(HERE / suite.ini), f"--rootdir={sdist_dir(suite.dist)}"]
    if mode != "unchanged":
        cmd += ["-p", "governor_inject", f"--governor-inject={mode}"]
    return cmd + list(suite.extra_args)


def run_one(suite: Suite, mode: str, select: str | None = None) -> Outcome:
    root = sdist_dir(suite.dist)
    if suite.conftest:
        shutil.copyfile(HERE / suite.conftest, root / "conftest.py")
    for ours, there in suite.extra_files:
        shutil.copyfile(HERE / ours, root / there)
    logs = BUILD / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    junit = logs / f"{suite.name}.{mode}.xml"
    junit.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env.setdefault("LANGGRAPH_TEST_FAST", "true")
    started = time.monotonic()
    with open(logs / f"{suite.name}.{mode}.log", "w") as log:
        proc = subprocess.run(pytest_command(suite, mode, junit, select), cwd=root, env=env, stdout=log, stderr=log)
    outcome = Outcome(suite.name, mode, seconds=time.monotonic() - started, exit_code=proc.returncode)
    if junit.exists():
        outcome.results = parse_junit(junit)
    return outcome


def parse_junit(path: Path) -> dict[str, str]:
    results: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
                break
            if child.tag == "skipped":
                status = "skipped"
        # a test can be reported twice (a teardown error after a pass): failure wins
        if results.get(test_id) != "failed":
            results[test_id] = status
    return results


def compare(base: Outcome, injected: Outcome) -> tuple[list[str], list[str]]:
    """(regressions, allowed): tests that pass unchanged and fail (or vanish) injected."""
    allowed_here = {**ALLOWED.get((base.suite, "*"), {}), **ALLOWED.get((base.suite, injected.mode), {})}
    broken = sorted(
        t for t, status in base.results.items() if status == "passed" and injected.results.get(t) != "passed"
    )
    allowed = [t for t in broken if t in allowed_here]
    return [t for t in broken if t not in allowed_here], allowed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fetch", "run"])
    parser.add_argument("suites", nargs="*", help="suite names (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="pytest processes at once (default 2: one per core)")
    parser.add_argument("-k", dest="select", default=None, help="run only the tests pytest -k EXPR selects")
    args = parser.parse_args(argv)
    suites = [s for s in SUITES if not args.suites or s.name in args.suites]
    if not suites:
        parser.error(f"unknown suite; choose from {', '.join(s.name for s in SUITES)}")
    if args.command == "fetch":
        fetch(suites)
        return 0
    for suite in suites:
        if not (sdist_dir(suite.dist) / "tests").is_dir():
            raise SystemExit(f"{suite.dist} {version(suite.dist)} not fetched: run `python compat/run.py fetch`")
    jobs = [(s, m) for s in suites for m in ("unchanged", *s.modes)]
    started = time.monotonic()
    # longest first, so two processes finish together
    jobs.sort(key=lambda job: job[0].name != "crewai")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = {(o.suite, o.mode): o for o in pool.map(lambda job: run_one(*job, args.select), jobs)}
    return report(suites, outcomes, time.monotonic() - started, selected=args.select is not None)


def report(
    suites: Sequence[Suite], outcomes: dict[tuple[str, str], Outcome], seconds: float, *, selected: bool = False
) -> int:
    failed = False
    totals = {"kept": 0, "broken": 0, "allowed": 0}
    print(f"\n{'suite':<20} {'mode':<10} {'tests':>6} {'passed':>7} {'broken':>7} {'allowed':>8} {'time':>7}")
    for suite in suites:
        base = outcomes[(suite.name, "unchanged")]
        if not base.results:
            print(f"{suite.name}: the unchanged run reported nothing (exit {base.exit_code}); see build/compat/logs")
            failed = True
            continue
        passed = sum(1 for s in base.results.values() if s == "passed")
        tests = len(base.results)
        print(f"{suite.name:<20} {'unchanged':<10} {tests:>6} {passed:>7} {'':>7} {'':>8} {base.seconds:>6.0f}s")
        for mode in suite.modes:
            injected = outcomes[(suite.name, mode)]
            regressions, allowed = compare(base, injected)
            ok = sum(1 for s in injected.results.values() if s == "passed")
            totals["broken"] += len(regressions)
            totals["allowed"] += len(allowed)
            totals["kept"] += sum(1 for t, s in base.results.items() if s == "passed" and injected.results.get(t) == s)
            print(
                f"{'':<20} {mode:<10} {len(injected.results):>6} {ok:>7} {len(regressions):>7} {len(allowed):>8}"
                f" {injected.seconds:>6.0f}s"
            )
            for test in regressions:
                print(f"    BROKEN  {test}")
            failed = failed or bool(regressions)
    names = {s.name for s in suites}
    stale: list[tuple[tuple[str, str], str]] = []
    for key, tests in ALLOWED.items():
        for test in tests:
            if key[0] not in names:
                continue
            verdict = _allowed_entry(key, test, outcomes)
            if verdict == "passes":
                stale.append((key, test))
            elif verdict == "not run" and not selected:
                print(f"    note: allow-listed but not run ({key[0]}/{key[1]}): {test}")
    for (suite_name, mode), test in stale:
        print(f"    STALE   allow-listed but passing again ({suite_name}/{mode}): {test}")
    failed = failed or bool(stale)
    print(f"\nmake compat: {seconds:.0f} s; logs and JUnit files in build/compat/logs")
    if regressions_seen := totals["broken"]:
        print(f"the {regressions_seen} tests marked BROKEN pass unchanged and fail with the governor in")
    if stale:
        print("the tests marked STALE pass with the governor in: remove them from compat/allowlist.py")
    # per injected run: tests that pass unchanged and still pass / now fail / fail as allow-listed
    print(
        f"compat: {totals['kept']} passed, {totals['broken']} failed, "
        f"{totals['allowed']} allow-listed failures, {len(stale)} stale allow-list entries"
    )
    return 1 if failed else 0


def _allowed_entry(key: tuple[str, str], test: str, outcomes: dict[tuple[str, str], Outcome]) -> str:
    """An allow-list entry's standing: "fails" (as allowed, in some mode it names),
    "passes" (passes unchanged and in every mode it names: stale) or "not run"."""
    suite, mode = key
    base = outcomes.get((suite, "unchanged"))
    modes = [m for (s, m) in outcomes if s == suite and m != "unchanged" and (mode == "*" or m == mode)]
    seen = [outcomes[(suite, m)].results.get(test) for m in modes]
    if base is None or base.results.get(test) is None or not modes or None in seen:
        return "not run"
    if any(status != "passed" for status in seen):
        return "fails"
    return "passes" if base.results[test] == "passed" else "fails"


if __name__ == "__main__":
    raise SystemExit(main())
