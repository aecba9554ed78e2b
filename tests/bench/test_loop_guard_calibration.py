"""The loop-guard benchmark's machinery on tiny generated trajectories (no corpus needed).

``benchmarks/loop_guard_calibration.py`` judges issue 16's detectors; if its replay, its
splicing or its loop finder broke silently, its figures would be wrong without anyone
noticing. These tests run each piece, and the whole script, on runs made here.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import random
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import loop_governor as lg

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the script imports its sibling loop_replay
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


lr = _load("loop_replay")


def _swe_out(body: str, rc: int = 0) -> str:
    return f"<returncode>{rc}</returncode>\n<output>\n{body}</output>"


def _swe_run(status: str, calls: list[tuple[str, str]]) -> dict[str, Any]:
    """A mini-swe-agent run: one bash call per assistant message, then a closing message."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    for i, (command, output) in enumerate(calls):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": output})
    messages.append({"role": "assistant", "content": "done"})
    return {"source": "test", "model": "m", "exit_status": status, "messages": messages}


def _tau_run(reward: float, calls: list[tuple[str, dict[str, Any], str]]) -> dict[str, Any]:
    traj: list[dict[str, Any]] = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"}]
    for i, (name, args, result) in enumerate(calls):
        call = {"id": f"t{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        traj.append({"role": "assistant", "content": None, "tool_calls": [call]})
        traj.append({"role": "tool", "tool_call_id": f"t{i}", "name": name, "content": result})
    traj.append({"role": "assistant", "content": "anything else?"})
    return {"task_id": 0, "reward": reward, "info": {}, "traj": traj, "trial": 0}


HEALTHY_SWE = [
    ("ls", _swe_out("README.md\nsrc\n")),
    ("grep -n 'def load' src/pkg/core.py", _swe_out("12:def load(x):\n")),
    ("grep -n nothing src/pkg/core.py", _swe_out("", 1)),
    ("python reproduce.py", _swe_out("Traceback (most recent call last):\nKeyError: 'x'\n", 1)),
    ("sed -i 's/a/b/' src/pkg/core.py", _swe_out("")),
    ("python reproduce.py", _swe_out("fixed\n")),
    ("git diff", _swe_out("diff --git a/src/pkg/core.py b/src/pkg/core.py\n-a\n+b\n")),
]
LOOPING_SWE = [
    *HEALTHY_SWE[:2],
    *[("python -m pytest -q", _swe_out("1 failed, 3 passed in 0.52s\n", 1))] * 6,
]
HEALTHY_TAU = [
    ("get_user_details", {"user_id": "mia_li_3668"}, json.dumps({"name": "Mia", "reservations": ["ZFA04Y"]})),
    (
        "get_reservation_details",
        {"reservation_id": "ZFA04Y"},
        json.dumps({"reservation_id": "ZFA04Y", "cabin": "economy"}),
    ),
    ("update_reservation_flights", {"reservation_id": "ZFA04Y", "amount": 29}, "Error: payment amount does not add up"),
    ("search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}, "[]"),
    ("update_reservation_flights", {"reservation_id": "ZFA04Y", "amount": 375}, json.dumps({"status": "ok"})),
]
AB_TAU = [
    *HEALTHY_TAU[:2],
    *[HEALTHY_TAU[0], HEALTHY_TAU[3]] * 4,
]


def _write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(data, fh)
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path]:
    swe = tmp_path / "swe-mini"
    _write(swe / "a.json.gz", _swe_run("Submitted", HEALTHY_SWE))
    _write(swe / "b.json.gz", _swe_run("Submitted", HEALTHY_SWE[::-1]))
    _write(swe / "c.json.gz", _swe_run("Timeout", LOOPING_SWE))
    tau = tmp_path / "tau-mini"
    _write(tau / "runs.json.gz", [_tau_run(1.0, HEALTHY_TAU), _tau_run(0.0, AB_TAU), _tau_run(1.0, [])])
    return swe, tau


def test_runs_load_with_the_documented_failure_definition(corpus: tuple[Path, Path]) -> None:
    swe, tau = corpus
    runs = lr.load_runs(swe)
    assert [(r.name, r.kind, r.success) for r in runs] == [
        ("a.json.gz", "swe", True),
        ("b.json.gz", "swe", True),
        ("c.json.gz", "swe", False),
    ]
    # one turn per assistant message (the closing one asks for no tool)
    assert len(runs[0].turns) == len(HEALTHY_SWE) + 1 and runs[0].turns[-1] == []
    assert [s.failure for s in runs[0].steps] == [None, None, "error", "error", None, None, None]
    assert runs[0].steps[1].args == {"command": "grep -n 'def load' src/pkg/core.py"}
    assert lr.swe_failure("<exception>Command 'x' timed out after 60 seconds</exception>") == "timeout"
    assert lr.swe_failure(_swe_out("", -1)) == "error" and lr.swe_failure(_swe_out("ok")) is None

    tau_runs = lr.load_runs(tau)
    assert [r.success for r in tau_runs] == [True, False, True]
    assert [s.failure for s in tau_runs[0].steps] == [None, None, "error", None, None]
    assert tau_runs[2].steps == [] and len(tau_runs[2].turns) == 1


def test_replayed_tools_raise_what_the_model_read() -> None:
    failed = lr.Step("bash", {"command": "x"}, _swe_out("boom\n", 2), "error")
    with pytest.raises(lr.CommandFailed, match="boom"):
        lr.tool_fn(failed, "swe")({})
    timeout = lr.Step("bash", {}, "<exception>timed out after 30 seconds</exception>", "timeout")
    waited: list[float] = []
    with pytest.raises(TimeoutError):
        lr.tool_fn(timeout, "swe", sleep=waited.append)({})
    assert waited == [30.0]  # every attempt at a timed-out command takes its timeout again
    tau = lr.Step("book_reservation", {}, "Error: not enough seats on flight HAT290", "error")
    with pytest.raises(lr.ToolError) as info:
        lr.tool_fn(tau, "tau")({})
    assert str(info.value) == "not enough seats on flight HAT290"
    assert lr.tool_fn(tau, "tau", raise_failures=False)({}) == tau.result
    # the governor classifies the replayed failure like a tool's own: a permanent error
    gov = lr.new_governor(lr.VirtualClock(), 0)
    with gov.task("t"), pytest.raises(lg.PermanentError):
        gov.call("book_reservation", lr.tool_fn(tau, "tau"), {})


def test_replay_feeds_both_guards_the_same_steps_and_records_their_stops(corpus: tuple[Path, Path]) -> None:
    swe, tau = corpus
    looping = lr.load_runs(swe)[2]
    replay = lr.replay(looping.turns, looping.kind, run_on=True)
    # the identical failing check six times: trajectory-fuse's direct repeat trips on the third
    assert replay.fuse is not None and (replay.fuse.step, replay.fuse.detector) == (4, "direct_repeat")
    # the governor: one outcome per step until it stops; a known-bad replay is "refused"
    assert len(replay.outcomes) == (len(replay.steps) if replay.governor is None else replay.governor.step + 1)
    assert replay.outcomes[:2] == ["ok", "ok"] and replay.outcomes[2] == "PermanentError"
    assert any(o.startswith("refused") for o in replay.outcomes[3:])
    # the escalation told the model, then withdrew the tool (the ladder's step before a stop)
    assert any(s.event == "escalation" and s.action == "warn" for s in replay.signals)
    assert replay.withdrawals and replay.withdrawals[0].detector == "withdrawn:repeated_failure"

    healthy = lr.load_runs(tau)[0]
    clean = lr.replay(healthy.turns, healthy.kind, model_calls=True)
    assert clean.governor is None and clean.fuse is None and clean.model_calls == len(healthy.turns)
    assert clean.outcomes == ["ok", "ok", "PermanentError", "ok", "ok"]


def test_a_governor_stop_is_recorded_at_the_step_that_raised() -> None:
    # the identical call with the identical non-trivial result, 8 times: every version of
    # the governor stops this (today the no-progress guard, after one warning)
    step = lr.Step("get_reservation_details", {"reservation_id": "ZFA04Y"}, json.dumps({"reservation_id": "ZFA04Y"}))
    replay = lr.replay([[step]] * 8, "tau")
    assert replay.governor is not None and 0 < replay.governor.step < 8 and replay.governor.detector
    assert replay.outcomes[-1].startswith("STOP ") and len(replay.outcomes) == replay.governor.step + 1


def test_both_guards_are_timed_on_every_call_even_after_they_stop(corpus: tuple[Path, Path]) -> None:
    runs = lr.load_runs(corpus[0]) + lr.load_runs(corpus[1])
    steps = sum(len(run.steps) for run in runs)
    gov_us, fuse_us = lr.time_calls(runs)
    # the looping runs stop both guards part-way; each goes on in a fresh task / fuse
    assert len(gov_us) == len(fuse_us) == steps
    assert all(v > 0 for v in gov_us + fuse_us)


@pytest.mark.parametrize("kind", ["swe", "tau"])
def test_spliced_patterns_are_what_their_names_say(kind: str) -> None:
    run_steps = [lr.Step(t, a, r) for t, a, r in HEALTHY_TAU] if kind == "tau" else []
    lengths = {
        "failure_x10": 10,
        "ab_x10": 20,
        "abc_x10": 30,
        "critic_x10": 10,
        "page_walk_x10": 10,
        "near_failure_x10": 10,
        "edit_check_x10": 20,
        "think_failure_x10": 20,
        "critic_revised_x10": 10,
    }
    assert set(lengths) == {*lr.PATTERNS, *lr.EXTRA_PATTERNS}
    for pattern, n in lengths.items():
        steps = lr.pattern_steps(pattern, kind, run_steps, random.Random(3))
        assert len(steps) == n and {s.origin for s in steps} == {pattern}
        keys = [(s.tool, json.dumps(s.args, sort_keys=True), s.result) for s in steps]
        if pattern == "failure_x10":
            assert len(set(keys)) == 1 and steps[0].failure == "error"
        if pattern == "think_failure_x10":
            # the identical failing call every other step, a call that differs each time between
            assert len(set(keys[::2])) == 1 and steps[0].failure == "error"
            assert len(set(keys[1::2])) == 10 and all(s.failure is None for s in steps[1::2])
        if pattern == "critic_revised_x10":
            # a new draft every time, a verdict that differs only in a score or a timestamp
            assert len({k[1] for k in keys}) == 10
            assert len({re.sub(r"\d+", "#", s.result) for s in steps}) == 1
        if pattern in ("ab_x10", "abc_x10"):
            width = 2 if pattern == "ab_x10" else 3
            assert len(set(keys[:width])) == width and keys == keys[:width] * 10
            assert all(s.failure is None for s in steps)
        if pattern == "critic_x10":
            # the same draft every time (a new draft is a new question), a verdict that
            # differs only in its numbers
            assert len({k[1] for k in keys}) == 1 and len({k[2] for k in keys}) > 1
            assert len({re.sub(r"\d", "#", k[2]) for k in keys}) == 1
        if pattern == "page_walk_x10":
            assert len({k[1] for k in keys}) == 10 and len({k[2] for k in keys}) == 1
            assert len({re.sub(r"\d+", "#", k[1]) for k in keys}) == 1  # only a number walks
        if pattern == "near_failure_x10":
            assert all(s.failure for s in steps) and len({k[1] for k in keys}) == 10
            assert len({re.sub(r"\d+", "#", k[2]) for k in keys}) == 1
        if pattern == "edit_check_x10":
            checks = keys[1::2]
            assert len({re.sub(r"\d+", "#", k[2]) for k in checks}) == 1


def test_splice_inserts_one_turn_per_call_at_a_seeded_position(corpus: tuple[Path, Path]) -> None:
    run = lr.load_runs(corpus[0])[0]
    cuts = [lr.splice(run, "ab_x10", random.Random(f"7:{i}")) for i in range(20)]
    again = lr.splice(run, "ab_x10", random.Random("7:0"))
    assert (again.start, again.turns) == (cuts[0].start, cuts[0].turns)  # deterministic
    assert len({c.start for c in cuts}) > 1  # and the position does vary
    for cut in cuts:
        steps = [s for turn in cut.turns for s in turn]
        assert cut.length == 20 and len(cut.turns) == len(run.turns) + 20
        assert [s.origin for s in steps[cut.start : cut.start + 20]] == ["ab_x10"] * 20
        assert [s for s in steps if s.origin == "run"] == run.steps  # the run itself is intact


def test_the_loop_finder_finds_repeats_cycles_and_failing_retries_only() -> None:
    a, b, c = (lr.Step("bash", {"command": x}, _swe_out(x + "\n")) for x in ("a", "b", "c"))
    assert lr.find_loops([a, b, c, a, c, b]) == []  # repeats, but no loop
    [loop] = lr.find_loops([c, a, b, a, a, c])
    assert (loop.start, loop.end, loop.rules) == (1, 4, ["repeat"])  # a three times within 8
    [loop] = lr.find_loops([a, a, a, a])
    assert (loop.start, loop.end, loop.rules) == (0, 3, ["repeat"])  # a cycle has two different calls
    [loop] = lr.find_loops([c, a, b, a, b, c])
    assert (loop.start, loop.end, loop.rules) == (1, 4, ["cycle2"])
    fails = [lr.Step("book", {"amount": n}, f"Error: paid {n}", "error") for n in (29, 30, 31)]
    [loop] = lr.find_loops([a, *fails, b])
    assert (loop.start, loop.end, loop.rules) == (1, 3, ["failing"])


def test_the_whole_benchmark_runs_on_generated_corpora(corpus: tuple[Path, Path], tmp_path: Path, capsys: Any) -> None:
    calibration = _load("loop_guard_calibration")
    out = tmp_path / "report.json"
    report = calibration.main([str(corpus[0]), str(corpus[1]), "--seed", "5", "--positions", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report, default=str))
    text = capsys.readouterr().out
    assert "swe-mini" in text and "tau-mini" in text and "spliced patterns" in text
    swe, tau = report["corpora"]["swe-mini"], report["corpora"]["tau-mini"]
    assert (swe["runs"], swe["successful"], tau["runs"], tau["successful"]) == (3, 2, 3, 2)
    for corpus_report in (swe, tau):
        spliced = corpus_report["spliced"]
        assert set(spliced) == {*calibration.lr.PATTERNS, *calibration.lr.EXTRA_PATTERNS}
        for result in spliced.values():
            for guard in ("governor", "fuse"):
                g = result[guard]
                assert g["stopped"] + g["false"] + g["late"] + g["missed"] == result["n"] == 2
            assert len(result["governor_misses"]) == result["n"] - result["governor"]["stopped"]
        assert corpus_report["timing"]["governor"]["median_us"] > 0 and corpus_report["timing"]["fuse"]["median_us"] > 0
    # trajectory-fuse stops the identical failing check and the A-B ping-pong of the failed runs
    fuse_stops = {
        (s["run"][:9], s["detector"])
        for s in swe["recorded"]["stops"] + tau["recorded"]["stops"]
        if s["guard"] == "fuse"
    }
    assert ("c.json.gz", "direct_repeat") in fuse_stops and ("runs.json", "n_cycle") in fuse_stops
    loops = {lp["run"][:9]: lp for lp in swe["recorded"]["loops"] + tau["recorded"]["loops"]}
    assert loops["c.json.gz"]["steps"] == [2, 7] and loops["c.json.gz"]["fuse"]["status"] == "stopped"
    assert "cycle2" in loops["runs.json"]["rules"]
    # same seed, same report (timings aside)
    again = calibration.evaluate([corpus[0], corpus[1]], calibration.Settings(seed=5, positions=1))
    for name in ("swe-mini", "tau-mini"):
        assert again["corpora"][name]["spliced"] == report["corpora"][name]["spliced"]
        assert again["corpora"][name]["recorded"] == report["corpora"][name]["recorded"]


# -- tau2-bench runs, per-source reports, generated suites ----------------------------------------


def _tau2_run(outcome: str, turns: list[list[tuple[str, dict[str, Any], str]]], run_id: str) -> dict[str, Any]:
    """A tau2-bench run as the corpus stores it: one file per run, OpenAI chat messages, an
    error result starting with "Error" and flagged ``"error": true``; parallel calls share
    one assistant message."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"}]
    n = 0
    for turn in turns:
        calls, results = [], []
        for name, args, result in turn:
            calls.append({"id": f"x{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}})
            tool_msg: dict[str, Any] = {"role": "tool", "tool_call_id": f"x{n}", "content": result}
            if result.startswith("Error"):
                tool_msg["error"] = True
            results.append(tool_msg)
            n += 1
        messages.append(
            {"role": "assistant", "content": "" if calls else "anything else?", "tool_calls": calls or None}
        )
        messages += results
    reward = 1.0 if outcome == "success" else 0.0
    meta = {"run_id": run_id, "task_id": "0", "reward": reward, "termination_reason": "user_stop"}
    return {"source": "test", "model": "m", "outcome": outcome, "messages": messages, "meta": meta}


LOOKUP = ("get_details_by_id", {"id": "L1002"}, json.dumps({"line_id": "L1002", "status": "Active", "plan": "P1002"}))
FAILING = ("update_reservation_passengers", {"reservation_id": "4OG6T3"}, "Error: Number of passengers does not match")


@pytest.fixture
def tau2(tmp_path: Path) -> Path:
    root = tmp_path / "tau2"
    ok = [
        [("get_user_details", {"user_id": "mia_li_3668"}, json.dumps({"user_id": "mia_li_3668", "name": "Mia"}))],
        [LOOKUP, ("get_details_by_id", {"id": "P1002"}, json.dumps({"plan_id": "P1002", "data_gb": 15}))],
        [FAILING],
        [("update_reservation_passengers", {"reservation_id": "4OG6T3", "n": 2}, json.dumps({"status": "ok"}))],
        [],
    ]
    _write(root / "model-a" / "r1.json.gz", _tau2_run("success", ok, "r1"))
    _write(root / "model-a" / "r2.json.gz", _tau2_run("failure", [[LOOKUP]] * 12 + [[]], "r2"))
    transfer = ("transfer_to_human_agents", {"summary": "user wants a refund"}, "Transfer successful")
    _write(root / "model-b" / "r3.json.gz", _tau2_run("failure", [[transfer]] * 10 + [[]], "r3"))
    _write(root / "model-b" / "r4.json.gz", _tau2_run("failure", [[FAILING]] * 6 + [[]], "r4"))
    return root


def test_tau2_runs_load_per_model_folder_with_errors_as_failures(tau2: Path) -> None:
    runs = lr.load_runs(tau2)
    assert [(r.corpus, r.name, r.kind, r.success) for r in runs] == [
        ("tau2/model-a", "r1", "tau", True),
        ("tau2/model-a", "r2", "tau", False),
        ("tau2/model-b", "r3", "tau", False),
        ("tau2/model-b", "r4", "tau", False),
    ]
    first = runs[0]
    # one turn per assistant message; the parallel pair stays one turn
    assert [len(t) for t in first.turns] == [1, 2, 1, 1, 0]
    assert [s.failure for s in first.steps] == [None, None, None, "error", None]
    assert first.steps[1].args == {"id": "L1002"} and first.outcome.startswith("success, reward 1.0")
    # the replayed tool raises what the tool said, the way tau2's environment caught it
    with pytest.raises(lr.ToolError) as info:
        lr.tool_fn(first.steps[3], first.kind)({})
    assert str(info.value) == "Number of passengers does not match"
    # a file (not a folder) is its own corpus
    single = lr.load_runs(tau2 / "model-b" / "r3.json.gz")
    assert [(r.corpus, r.success) for r in single] == [("r3", False)]


def test_tool_policies_keep_known_fields_and_report_unknown_ones() -> None:
    built, dropped = lr.tool_policies({"lookup": {"stateless": True, "no_such_field": 1}, "poll": {"max_calls": 9}})
    assert built == {"lookup": lg.ToolPolicy(stateless=True), "poll": lg.ToolPolicy(max_calls=9)}
    assert dropped == ["lookup.no_such_field"]
    # the policies reach the replayed governor: max_calls=2 ends the third call of the tool
    tools, _ = lr.tool_policies({"get_job_status": {"max_calls": 2}})
    step = lr.Step("get_job_status", {"job_id": "J-1"}, json.dumps({"job_id": "J-1", "state": "running"}))
    limited = lr.replay([[step]] * 3, "tau", config=lg.GovernorConfig(tools=tools))
    assert limited.governor is not None and limited.governor.step == 2
    assert lr.replay([[step]] * 3, "tau").governor is None  # the default: no limit


def _norm(args: Any) -> str:
    return json.dumps({k: " ".join(str(v).split()) for k, v in args.items()}, sort_keys=True)


def test_generated_suites_are_deterministic_and_what_their_names_say() -> None:
    gen = _load("loop_patterns")
    healthy, loops = gen.healthy_cases(6, seed=3), gen.loop_cases(6, seed=3)
    assert [(c.run.name, c.run.turns) for c in healthy] == [(c.run.name, c.run.turns) for c in gen.healthy_cases(6, 3)]
    assert [c.run.turns for c in loops] != [c.run.turns for c in gen.loop_cases(6, 4)]  # the seed matters
    assert {c.pattern for c in healthy} == set(gen.HEALTHY) and {c.pattern for c in loops} == set(gen.LOOPS)
    for case in healthy:
        steps = case.run.steps
        assert case.run.success and case.must_run, case.run.name
        # the last call that must run worked in the run: the pattern ends well
        assert steps[case.must_run[-1]].failure is None, case.run.name
        keys = [(s.tool, json.dumps(s.args, sort_keys=True)) for s in steps]
        if case.pattern in ("precondition_fix_retry", "login_then_retry", "fix_then_rerun"):
            retried = case.must_run[-1]
            first = keys.index(keys[retried])
            # the same call failed before, and another tool succeeded in between
            assert first < retried and steps[first].failure == "error"
            assert any(steps[i].tool != steps[retried].tool and not steps[i].failure for i in range(first, retried))
        if case.pattern == "multi_entity_lookup":
            answers = [re.sub(r"-?[\d.]+", "#", steps[i].result) for i in case.must_run]
            assert len(set(keys)) == len(keys) >= 5 and len(set(answers)) == 1  # alike but for numbers
        if case.pattern == "poll":
            polls = [steps[i] for i in case.must_run]
            assert (
                len({(s.tool, str(s.args), s.result) for s in polls[:-1]}) == 1 and polls[-1].result != polls[0].result
            )
            assert case.policies == {"get_job_status": {"poll": True, "max_calls": 30}}
        if case.pattern == "parallel_same_id":
            turn = next(t for t in case.run.turns if len(t) > 1)
            assert len({json.dumps(s.args) for s in turn}) == 1
        if case.pattern == "recheck_after_fixes":
            checks = [steps[0], *(steps[i] for i in case.must_run)]
            assert {(s.tool, str(s.args)) for s in checks} == {("can_send_mms", "{}")}
            assert len({s.result for s in checks[:-1]}) == 1 and checks[-1].result != checks[0].result
            assert all(steps[i - 1].tool != "can_send_mms" for i in case.must_run)  # a fix before each check
        if case.pattern == "cursor_pagination":
            assert len({s.result for s in steps}) == len(steps) and "cursor" not in steps[0].args
            assert all(s.args["cursor"] == json.loads(p.result)["next_cursor"] for p, s in itertools.pairwise(steps))
    for case in loops:
        steps = case.run.steps
        loop = steps[case.loop_start :]
        assert not case.run.success and 0 < case.loop_start and len(loop) >= 10, case.run.name
        keys = [(s.tool, _norm(s.args), s.result) for s in loop]
        if case.pattern in ("same_failure", "same_success", "varied_args", "repeat_after_nothing"):
            assert len(set(keys)) == 1
        if case.pattern == "varied_args":
            assert len({json.dumps(s.args) for s in loop}) > 1  # raw arguments do differ
        if case.pattern == "repeat_after_nothing":
            tail = case.run.turns[len(case.run.turns) - 2 * len(loop) - 1 :]
            assert [len(t) for t in tail[:-1]] == [1, 0] * len(loop)  # a turn without tools between
        if case.pattern in ("ab_cycle", "abc_cycle"):
            width = 2 if case.pattern == "ab_cycle" else 3
            assert len(set(keys[:width])) == width and keys == (keys[:width] * 10)[: len(keys)]
        if case.pattern == "critic":
            assert len({k[1] for k in keys}) == 1 and len({k[2] for k in keys}) > 1
            assert len({re.sub(r"\d", "#", k[2]) for k in keys}) == 1
        if case.pattern == "page_walk_same":
            assert len({k[1] for k in keys}) == len(keys) and len({k[2] for k in keys}) == 1


def test_suites_count_false_stops_blocked_retries_and_catches() -> None:
    calibration = _load("loop_guard_calibration")
    gen = calibration.gen
    [case] = [c for c in gen.healthy_cases(1, seed=0) if c.pattern == "precondition_fix_retry"]
    retried = case.must_run[0]
    tool = case.run.steps[retried].tool
    # stateless=True keeps a known-bad answer whatever else succeeded: the fixed retry is
    # answered from memory, which the suite counts as a blocked retry
    pinned = gen.Case(
        "healthy", "pinned", case.run, 0, case.must_run, {tool: {"stateless": True}, "other": {"no_such": 1}}
    )
    loops = [c for c in gen.loop_cases(2, seed=0) if c.pattern == "same_failure"]
    res = calibration.suites(calibration.Settings(), [pinned, *loops])
    assert res["healthy"]["pinned"]["blocked_retries"] == 1 and res["dropped_policy_fields"] == ["other.no_such"]
    same = res["loop"]["same_failure"]
    assert same["n"] == 2
    for guard in ("governor", "fuse"):  # every version of either guard stops the identical failing call
        assert same[guard]["caught"] == 2 and same[guard]["false"] == 0 and same[guard]["missed"] == 0
        assert 1 <= same[guard]["median_spent"] <= 10
    # a loop case whose prefix is long enough to be stopped before the loop is a false stop
    early = gen.Case("loop", "late", loops[0].run, len(loops[0].run.steps) - 1)
    late = calibration.suites(calibration.Settings(), [early])["loop"]["late"]
    assert late["governor"]["false"] == 1 and late["false_stops"][0]["context"]


def test_the_benchmark_reports_tau2_per_source_and_the_suites(tau2: Path, tmp_path: Path, capsys: Any) -> None:
    calibration = _load("loop_guard_calibration")
    out = tmp_path / "report.json"
    report = calibration.main([str(tau2), "--positions", "1", "--suite-cases", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report, default=str))
    assert set(report["corpora"]) == set(report["summary"]) == {"tau2/model-a", "tau2/model-b"}
    a, b = report["summary"]["tau2/model-a"], report["summary"]["tau2/model-b"]
    assert (a["runs"], a["successful"], b["runs"], b["successful"]) == (2, 1, 2, 0)
    for guard in ("governor", "fuse"):
        # the 12 identical lookups, the 10 transfers and the 6 identical failures: all real loops
        assert a[guard]["loops_failed_runs"]["found"] == 1 and b[guard]["loops_failed_runs"]["found"] == 2
        assert b[guard]["loops_failed_runs"]["stopped"] == 2  # every version of either guard stops these
        assert a[guard]["false_stops"] == 0
    suites = report["suites"]
    assert set(suites["healthy"]) == set(calibration.gen.HEALTHY) and set(suites["loop"]) == set(calibration.gen.LOOPS)
    assert all(r["n"] == 2 for s in ("healthy", "loop") for r in suites[s].values())
    for r in suites["loop"].values():
        for guard in ("governor", "fuse"):
            assert r[guard]["false"] + r[guard]["caught"] + r[guard]["missed"] == 2
    text = capsys.readouterr().out
    assert "tau2/model-a" in text and "per source" in text and "healthy patterns" in text and "real loops" in text
    # only the suites, no corpus
    alone = calibration.evaluate([], calibration.Settings(suite_cases=1))
    assert alone["corpora"] == {} and alone["suites"]["loop"]["same_failure"]["n"] == 1
    assert calibration.evaluate([tau2], calibration.Settings(positions=1, suite_cases=0))["suites"] is None
