"""Loop guards head to head on real agent runs: the governor against trajectory-fuse.

    python benchmarks/loop_guard_calibration.py ../shared/corpus/swe-dev ../shared/corpus/tau-airline \\
        ../shared/corpus/tau2 [--seed 0] [--json loop_guards.json] [--positions 2] [--model-calls] \\
        [--no-raise] [--suite-cases 20]

Every recorded tool call of every run is replayed through ``Governor.call`` inside one task
per run (default configuration, virtual time; a recorded failure *raises*, see
``benchmarks/loop_replay.py`` for what counts as one), and the same call is fed to a
trajectory-fuse ``AgentFuse`` (its default ``FuseConfig``) in the same loop. A guard
"stops" a run when it refuses a call for good: a ``lg.FatalError`` out of ``g.call``
(detector = ``info.code``), or ``DeadlockDetected`` (detector = its kind). Per corpus (a
folder of folders, such as tau2's one folder per model, is one corpus per sub-folder):

1. stops on successful runs (mini-swe-agent ``Submitted``, tau-bench reward 1.0, tau2
   outcome ``success``): every one is a false stop -- listed with the steps around it;
2. loops the recorded runs contain, found by a simple rule of our own
   (``loop_replay.find_loops``), with the detector that stopped each and the calls spent
   in the loop up to the stop;
3. loop patterns spliced into each successful run at a seeded random turn: the share
   stopped inside the pattern, the median calls spent in the pattern up to and including
   the refused one ("wasted"), stops before the splice point (false), and every miss of the
   governor with what it did instead;
4. microseconds per call (median), ``g.call`` in a task against ``AgentFuse.observe``, on
   the same recorded steps in the same process.

Then a summary per source (false stops; loops in failed and in successful runs, stopped or
not), and the generated suites of ``benchmarks/loop_patterns.py``: healthy patterns (false
stops, and retries the governor answered without running the tool; goal 0) and real loops
(false stops before the loop, catches and calls spent; goal: all caught), replayed the same
way with every turn also a model call and the per-tool policies each case declares.

Deterministic for a given ``--seed`` (except the timings). The governor's configuration is
``GovernorConfig()``: environment variables try another setting, e.g.
``LOOP_GOVERNOR_ESCALATION_REPEATS=3`` or, with ``--model-calls``, ``LOOP_GOVERNOR_MAX_STEPS=30``
(the report's JSON records the configuration it ran with).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import statistics
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loop_patterns as gen
import loop_replay as lr
from rich import box
from rich.console import Console
from rich.table import Table

import loop_governor as lg


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    positions: int = 2  # splice positions per run and pattern
    model_calls: bool = False  # each turn is also a g.call_model of a stub
    raise_failures: bool = True  # recorded failures raise (off: every result is returned)
    suite_cases: int = 20  # cases per generated pattern (0: no generated suites)
    read_only: tuple[str, ...] = ()  # tools of the recorded runs declared ToolPolicy(read_only=True)

    def replay(self, turns: Any, run: lr.Run, *, run_on: bool = False) -> lr.Replay:
        config = None
        if self.read_only:
            config = lg.GovernorConfig(tools={t: lg.ToolPolicy(read_only=True) for t in self.read_only})
        return lr.replay(
            turns,
            run.kind,
            task_id=run.name,
            seed=self.seed,
            model_calls=self.model_calls,
            run_on=run_on,
            raise_failures=self.raise_failures,
            config=config,
        )


GUARDS = ("governor", "fuse")
GUARD_NAMES = {"governor": "loop-governor", "fuse": "trajectory-fuse"}
CONTEXT = 3  # steps shown before a stop (and 1 after)
LOOP_ROWS = 25  # recorded loops printed per corpus (the JSON has all)


def _stop(replay: lr.Replay, guard: str) -> lr.Stop | None:
    return replay.governor if guard == "governor" else replay.fuse


def _ended(replay: lr.Replay, guard: str, start: int) -> lr.Stop | None:
    """Where a guard ended a loop starting at step ``start``: its stop, or for the governor
    the earlier of its stop and its first withdrawal of a tool from ``start`` on (in a live
    run the model is no longer offered the tool there; a later call of it is the stop)."""
    stop = _stop(replay, guard)
    if guard != "governor":
        return stop
    withdrawn = next((w for w in replay.withdrawals if w.step >= start), None)
    if withdrawn is None:
        return stop
    return withdrawn if stop is None or withdrawn.step < stop.step else stop


def _context(replay: lr.Replay, at: int) -> list[str]:
    lines = []
    for i in range(max(0, at - CONTEXT), min(len(replay.steps), at + 2)):
        said = replay.outcomes[i] if i < len(replay.outcomes) else "-"
        mark = ">>" if i == at else "  "
        origin = "" if replay.steps[i].origin == "run" else f" <{replay.steps[i].origin}>"
        lines.append(f"{mark} {i:>3} {lr.describe(replay.steps[i])}  | governor: {said}{origin}")
    return lines


def _subject(replay: lr.Replay, stop: lr.Stop) -> str | None:
    for signal in reversed(replay.signals):
        if signal.step == stop.step and signal.action == "stop":
            return str(signal.fields.get("subject") or signal.event)
    return None


def _squeeze(outcomes: list[str]) -> str:
    """``ok, ok, ok, PermanentError`` -> ``ok x3, PermanentError``."""
    parts = []
    for value, group in groupby(outcomes):
        n = len(list(group))
        parts.append(value if n == 1 else f"{value} x{n}")
    return ", ".join(parts) or "-"


def _tally(outcomes: list[str]) -> str:
    """``ok, E, ok, E`` -> ``ok x2, E x2`` (in order of first appearance)."""
    counts = Counter(outcomes)
    return ", ".join(value if n == 1 else f"{value} x{n}" for value, n in counts.items()) or "-"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- 1 and 2: the recorded runs ------------------------------------------------------------


def recorded(runs: list[lr.Run], settings: Settings) -> dict[str, Any]:
    stops: list[dict[str, Any]] = []
    loops: list[dict[str, Any]] = []
    flagged: dict[str, Counter[str]] = {"successful": Counter(), "unsuccessful": Counter()}
    # what the governor's warnings on successful runs were about: event -> subject -> runs
    subjects: dict[str, Counter[str]] = {}
    for run in runs:
        replay = settings.replay(run.turns, run, run_on=True)
        for guard in GUARDS:
            stop = _stop(replay, guard)
            if stop is not None:
                stops.append(
                    {
                        "run": run.name,
                        "successful": run.success,
                        "outcome": run.outcome,
                        "guard": guard,
                        "step": stop.step,
                        "of_steps": len(replay.steps),
                        "detector": stop.detector,
                        # what the stop was about (the governor's escalation subject, if any)
                        "subject": _subject(replay, stop) if guard == "governor" else None,
                        # the recorded outcome of the refused call: "ok" means it worked in the real run
                        "recorded": replay.steps[stop.step].failure or "ok",
                        "message": stop.message[:300],
                        "context": _context(replay, stop.step),
                    }
                )
        flagged["successful" if run.success else "unsuccessful"].update({s.label for s in replay.signals})
        if run.success:
            seen: set[tuple[str, str]] = set()
            for s in replay.signals:
                subject = str(s.fields.get("signature") or s.fields.get("subject") or s.tool)
                seen.add((s.label, subject))
            for label, subject in seen:
                subjects.setdefault(label, Counter())[subject] += 1
        for loop in lr.find_loops(replay.steps):
            entry: dict[str, Any] = {
                "run": run.name,
                "successful": run.success,
                "steps": [loop.start, loop.end],
                "calls": loop.calls,
                "rules": loop.rules,
                "first": lr.describe(replay.steps[loop.start]),
                "signals": sorted({f"{s.label}@{s.step}" for s in replay.signals if loop.start <= s.step <= loop.end}),
                "governor_said": _squeeze(replay.outcomes[loop.start : loop.end + 1]),
            }
            for guard in GUARDS:
                stop = _ended(replay, guard, loop.start)
                if stop is None:
                    entry[guard] = {"status": "not stopped"}
                elif stop.step < loop.start:
                    entry[guard] = {"status": "stopped before", "step": stop.step, "detector": stop.detector}
                elif stop.step > loop.end:
                    entry[guard] = {"status": "stopped after", "step": stop.step, "detector": stop.detector}
                else:
                    entry[guard] = {
                        "status": "stopped",
                        "step": stop.step,
                        "detector": stop.detector,
                        "wasted": stop.step - loop.start + 1,
                    }
            loops.append(entry)
    return {
        "stops": stops,
        "loops": loops,
        "flagged_runs": {k: dict(sorted(v.items())) for k, v in flagged.items()},
        "signal_subjects_successful": {k: dict(v.most_common(10)) for k, v in sorted(subjects.items())},
    }


# -- 3: spliced patterns ---------------------------------------------------------------------


def spliced(runs: list[lr.Run], settings: Settings) -> dict[str, Any]:
    healthy = [run for run in runs if run.success]
    out: dict[str, Any] = {}
    for pattern in (*lr.PATTERNS, *lr.EXTRA_PATTERNS):
        per_guard: dict[str, dict[str, Any]] = {
            g: {"stopped": 0, "false": 0, "late": 0, "missed": 0, "wasted": [], "detectors": Counter()} for g in GUARDS
        }
        misses: list[dict[str, Any]] = []
        total = 0
        for run in healthy:
            for position in range(settings.positions):
                rng = random.Random(f"{settings.seed}:{pattern}:{run.name}:{position}")
                cut = lr.splice(run, pattern, rng)
                replay = settings.replay(cut.turns, run)
                total += 1
                end = cut.start + cut.length
                for guard in GUARDS:
                    stop, tally = _stop(replay, guard), per_guard[guard]
                    if stop is None:
                        tally["missed"] += 1
                    elif stop.step < cut.start:
                        tally["false"] += 1
                    elif stop.step >= end:
                        tally["late"] += 1
                    else:
                        tally["stopped"] += 1
                        tally["wasted"].append(stop.step - cut.start + 1)
                        tally["detectors"][stop.detector] += 1
                    if guard == "governor" and (stop is None or not cut.start <= stop.step < end):
                        inside = [s for s in replay.signals if cut.start <= s.step < end]
                        misses.append(
                            {
                                "run": run.name,
                                "splice_at": cut.start,
                                "result": "missed"
                                if stop is None
                                else ("false stop before the splice" if stop.step < cut.start else "stopped after it"),
                                "stop": None if stop is None else {"step": stop.step, "detector": stop.detector},
                                "governor_said": _tally(replay.outcomes[cut.start : end]),
                                "governor_sequence": _squeeze(replay.outcomes[cut.start : end]),
                                "signals": [f"{s.label}@+{s.step - cut.start}" for s in inside],
                                "unit": list(dict.fromkeys(lr.describe(st) for st in replay.steps[cut.start : end]))[
                                    :3
                                ],
                            }
                        )
        result: dict[str, Any] = {"help": lr.PATTERN_HELP[pattern], "extra": pattern in lr.EXTRA_PATTERNS, "n": total}
        for guard, tally in per_guard.items():
            wasted = tally.pop("wasted")
            result[guard] = {
                **tally,
                "detectors": dict(tally["detectors"]),
                "stopped_share": tally["stopped"] / total if total else None,
                # among the splices whose run was not already stopped before the splice point
                "stopped_share_clean": tally["stopped"] / (total - tally["false"]) if total > tally["false"] else None,
                "median_wasted": _median(wasted),
                "max_wasted": max(wasted) if wasted else None,
            }
        result["governor_misses"] = misses
        out[pattern] = result
    return out


# -- 4: cost per call --------------------------------------------------------------------------


def timing(runs: list[lr.Run], settings: Settings) -> dict[str, Any]:
    gov, fuse = lr.time_calls(runs, seed=settings.seed, raise_failures=settings.raise_failures)
    out: dict[str, Any] = {"calls": len(gov)}
    for name, values in (("governor", gov), ("fuse", fuse)):
        out[name] = {
            "median_us": _median(values),
            "p90_us": _quantile(values, 0.9),
            "mean_us": statistics.fmean(values),
        }
    return out


# -- per source at a glance ----------------------------------------------------------------------


def summary(corpora: dict[str, Any]) -> dict[str, Any]:
    """Per source and guard: false stops on successful runs; loops found in unsuccessful
    runs (the real ones) and in successful runs (often a healthy re-check), and how many of
    each the guard stopped inside the loop, with the calls spent up to the stop."""
    out: dict[str, Any] = {}
    for name, corpus in corpora.items():
        rec = corpus["recorded"]
        row: dict[str, Any] = {"runs": corpus["runs"], "successful": corpus["successful"]}
        for guard in GUARDS:
            false = [s for s in rec["stops"] if s["guard"] == guard and s["successful"]]
            entry: dict[str, Any] = {
                "false_stops": len(false),
                "false_detectors": dict(Counter(s["detector"] for s in false)),
            }
            for label, ok in (("loops_failed_runs", False), ("loops_successful_runs", True)):
                loops = [lp for lp in rec["loops"] if lp["successful"] is ok]
                stopped = [lp[guard] for lp in loops if lp[guard]["status"] == "stopped"]
                entry[label] = {
                    "found": len(loops),
                    "stopped": len(stopped),
                    "loop_calls": sum(lp["calls"] for lp in loops),
                    "median_spent": _median([float(v["wasted"]) for v in stopped]),
                }
            row[guard] = entry
        out[name] = row
    return out


# -- generated suites: healthy patterns and real loops -------------------------------------------


def _ran(outcome: str | None) -> bool:
    """Did the governor let the call reach the tool? (A call it answered from memory is
    ``refused ...``; one it never got to, because the run had ended, has no outcome.)"""
    return outcome is not None and "refused" not in outcome


def suites(settings: Settings, cases: list[gen.Case] | None = None) -> dict[str, Any]:
    """Replay ``loop_patterns``' healthy and loop cases (``settings.suite_cases`` of each
    pattern, or ``cases``), every turn also a model call (so a guard sees which calls share
    a turn), with the per-tool policies the case declares.

    Healthy: a guard's stop is a false stop; ``blocked_retries`` counts the calls that must
    run (``Case.must_run``) which the governor answered without running the tool. Loops: a
    stop inside the loop is a catch (calls spent counted from the loop's first call), one
    before it a false stop."""
    out: dict[str, Any] = {"healthy": {}, "loop": {}, "dropped_policy_fields": []}
    dropped: set[str] = set()
    if cases is None:
        n, seed = settings.suite_cases, settings.seed
        cases = gen.healthy_cases(n, seed) + gen.loop_cases(n, seed)
    for case in cases:
        tools, missing = lr.tool_policies(case.policies)
        dropped.update(missing)
        replay = lr.replay(
            case.run.turns,
            case.run.kind,
            task_id=case.run.name,
            seed=settings.seed,
            model_calls=True,
            run_on=True,
            raise_failures=settings.raise_failures,
            config=lg.GovernorConfig(tools=tools),
        )
        res = out[case.suite].setdefault(
            case.pattern,
            {"help": gen.HELP.get(case.pattern, ""), "n": 0, "policies": case.policies}
            | {g: {"false": 0, "caught": 0, "missed": 0, "spent": [], "detectors": Counter()} for g in GUARDS}
            | {"blocked_retries": 0, "false_stops": [], "misses": []},
        )
        res["n"] += 1
        if case.suite == "healthy":
            blocked = [i for i in case.must_run if not _ran(replay.outcomes[i] if i < len(replay.outcomes) else None)]
            res["blocked_retries"] += len(blocked)
        for guard in GUARDS:
            stop, tally = _stop(replay, guard), res[guard]
            if case.suite == "healthy":
                if stop is None:
                    continue
                tally["false"] += 1
                tally["detectors"][stop.detector] += 1
            elif stop is None:
                tally["missed"] += 1
                continue
            elif stop.step < case.loop_start:
                tally["false"] += 1
                tally["detectors"][f"before:{stop.detector}"] += 1
            else:
                tally["caught"] += 1
                tally["spent"].append(stop.step - case.loop_start + 1)
                tally["detectors"][stop.detector] += 1
            if stop is not None and (case.suite == "healthy" or stop.step < case.loop_start):
                res["false_stops"].append(
                    {
                        "case": case.run.name,
                        "guard": guard,
                        "step": stop.step,
                        "detector": stop.detector,
                        "message": stop.message[:300],
                        "context": _context(replay, stop.step),
                    }
                )
        if case.suite == "loop" and (replay.governor is None or replay.governor.step < case.loop_start):
            res["misses"].append(
                {
                    "case": case.run.name,
                    "governor_said": _squeeze(replay.outcomes[case.loop_start :]),
                    "signals": [f"{s.label}@+{s.step - case.loop_start}" for s in replay.signals],
                }
            )
    for suite in ("healthy", "loop"):
        for res in out[suite].values():
            for guard in GUARDS:
                tally = res[guard]
                spent = tally.pop("spent")
                tally["detectors"] = dict(tally["detectors"])
                tally["median_spent"] = _median([float(v) for v in spent])
                tally["max_spent"] = max(spent) if spent else None
    out["dropped_policy_fields"] = sorted(dropped)
    return out


# -- the whole report ---------------------------------------------------------------------------


def evaluate(paths: list[Path], settings: Settings | None = None) -> dict[str, Any]:
    """The report: every corpus (one per source: a folder of sub-folders, such as tau2's one
    folder per model, gives one per sub-folder), then the generated suites."""
    settings = settings or Settings()
    corpora: dict[str, Any] = {}
    for path in paths:
        loaded = lr.load_runs(path)
        sources = sorted({run.corpus for run in loaded}) or [path.name]
        for name in sources:
            runs = [run for run in loaded if run.corpus == name]
            corpora[name] = {
                "path": str(path),
                "runs": len(runs),
                "successful": sum(run.success for run in runs),
                "tool_calls": sum(len(run.steps) for run in runs),
                "model_calls": sum(len(run.turns) for run in runs),
                "recorded": recorded(runs, settings),
                "spliced": spliced(runs, settings),
                "timing": timing(runs, settings),
            }
    return {
        "settings": asdict(settings),
        "versions": {
            "loop-governor": importlib.metadata.version("loop-governor"),
            "trajectory-fuse": importlib.metadata.version("trajectory-fuse"),
        },
        "governor_config": lg.GovernorConfig().model_dump(mode="json"),
        "corpora": corpora,
        "summary": summary(corpora),
        "suites": suites(settings) if settings.suite_cases else None,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _detectors(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "-"


def render(report: dict[str, Any], console: Console) -> None:
    console.print(
        f"loop-governor {report['versions']['loop-governor']} vs trajectory-fuse "
        f"{report['versions']['trajectory-fuse']} (default configurations); {report['settings']}"
    )
    for name, corpus in report["corpora"].items():
        rec = corpus["recorded"]
        console.rule(
            f"{name}: {corpus['runs']} runs ({corpus['successful']} successful), {corpus['tool_calls']} tool calls"
        )
        summary = Table(box=box.SIMPLE_HEAD, title="recorded runs, per guard")
        for col in (
            "",
            "stops on successful runs (goal 0)",
            "stops on unsuccessful runs",
            "loops found and stopped in them",
        ):
            summary.add_column(col)
        loops = rec["loops"]
        for guard in GUARDS:
            good = Counter(s["detector"] for s in rec["stops"] if s["guard"] == guard and s["successful"])
            bad = Counter(s["detector"] for s in rec["stops"] if s["guard"] == guard and not s["successful"])
            stopped = [lp[guard] for lp in loops if lp[guard]["status"] == "stopped"]
            wasted = _median([float(s["wasted"]) for s in stopped])
            summary.add_row(
                GUARD_NAMES[guard],
                f"{sum(good.values())} ({_detectors(dict(good))})",
                f"{sum(bad.values())} ({_detectors(dict(bad))})",
                f"{len(stopped)} of {len(loops)}; median wasted {_num(wasted, '{:.0f}')} "
                f"({_detectors(dict(Counter(s['detector'] for s in stopped)))})",
            )
        console.print(summary)
        flags = rec["flagged_runs"]
        console.print(
            "governor signals (runs with at least one): successful: "
            f"{_detectors(flags['successful'])}; unsuccessful: {_detectors(flags['unsuccessful'])}"
        )
        for label, subjects in rec["signal_subjects_successful"].items():
            top = "; ".join(f"{n} x {subject[:90]}" for subject, n in list(subjects.items())[:4])
            console.print(f"  {label} on successful runs, by subject (runs): {top}")
        false = [s for s in rec["stops"] if s["successful"]]
        if false:
            console.print("\nstops on successful runs:")
        causes = Counter(
            f"{GUARD_NAMES[s['guard']]} {s['detector']}"
            + (f"/{s['subject']}" if s["subject"] else "")
            + f" (refused call recorded {'ok' if s['recorded'] == 'ok' else 'failing'})"
            for s in false
        )
        for cause, n in causes.most_common():
            console.print(f"  {n:>3} x {cause}")
        for s in false:
            about = f", about: {s['subject']}" if s["subject"] else ""
            console.print(
                f"- {GUARD_NAMES[s['guard']]} [{s['detector']}{about}] {s['run']}: step {s['step']} of "
                f"{s['of_steps']} (recorded outcome of that call: {s['recorded']})"
            )
            for line in s["context"]:
                console.print(f"    {line}")
        if loops:
            shown = sorted(loops, key=lambda lp: (lp["successful"], -lp["calls"]))[:LOOP_ROWS]
            title = "loops in the recorded runs (R1 repeat, R2 cycle, R3 failing)"
            if len(shown) < len(loops):
                title += f"; the {len(shown)} longest of {len(loops)}, failed runs first (all in --json)"
            table = Table(box=box.SIMPLE_HEAD, title=title)
            for col in ("run", "ok?", "steps", "rules", "first call", "loop-governor", "trajectory-fuse"):
                table.add_column(col, overflow="fold")
            for lp in shown:
                cells = []
                for guard in GUARDS:
                    v = lp[guard]
                    cells.append(
                        v["status"]
                        + (f" [{v['detector']}] @{v['step']}" if "detector" in v else "")
                        + (f", {v['wasted']} calls" if "wasted" in v else "")
                    )
                table.add_row(
                    lp["run"],
                    "yes" if lp["successful"] else "no",
                    f"{lp['steps'][0]}-{lp['steps'][1]} ({lp['calls']})",
                    ",".join(lp["rules"]),
                    lp["first"][:70],
                    *cells,
                )
            console.print(table)
        spl = corpus["spliced"]
        table = Table(
            box=box.SIMPLE_HEAD, title="spliced patterns (stopped inside / median wasted / false stops before)"
        )
        table.add_column("pattern")
        table.add_column("n")
        for guard in GUARDS:
            table.add_column(f"{GUARD_NAMES[guard]} stopped")
            table.add_column("of clean")
            table.add_column("wasted")
            table.add_column("false")
            table.add_column("detectors")
        for pattern, res in spl.items():
            cells = []
            for guard in GUARDS:
                g = res[guard]
                cells += [
                    f"{_pct(g['stopped_share'])} ({g['stopped']})",
                    _pct(g["stopped_share_clean"]),
                    _num(g["median_wasted"], "{:.0f}"),
                    str(g["false"]),
                    _detectors(g["detectors"]),
                ]
            table.add_row(pattern + (" *" if res["extra"] else ""), str(res["n"]), *cells)
        console.print(table)
        console.print(
            "* extra patterns, not among the issue's five. 'of clean': the share stopped among the splices "
            "whose run was not already (falsely) stopped before the splice point"
        )
        for pattern, res in spl.items():
            misses = res["governor_misses"]
            if not misses:
                continue
            reasons = Counter(f"{m['result']}: {m['governor_said']}" for m in misses)
            console.print(f"\ngovernor misses, {pattern} ({len(misses)} of {res['n']}):")
            for reason, n in reasons.most_common(6):
                console.print(f"    {n:>3} x {reason}")
        t = corpus["timing"]
        console.print(
            f"\nus per call over {t['calls']} recorded calls: loop-governor median {_num(t['governor']['median_us'])} "
            f"(p90 {_num(t['governor']['p90_us'])}), trajectory-fuse median {_num(t['fuse']['median_us'])} "
            f"(p90 {_num(t['fuse']['p90_us'])})",
            highlight=False,
        )


def render_summary(report: dict[str, Any], console: Console) -> None:
    table = Table(
        box=box.SIMPLE_HEAD,
        title="per source: false stops on successful runs (goal 0), then loops found and stopped "
        "(in failed runs: goal all) with the median calls spent up to the stop",
    )
    table.add_column("source")
    table.add_column("runs (ok)")
    for guard in GUARDS:
        table.add_column(f"{GUARD_NAMES[guard]} false stops")
        table.add_column("loops in failed runs")
        table.add_column("in ok runs")
    for name, row in report["summary"].items():
        cells = []
        for guard in GUARDS:
            g = row[guard]
            a, b = g["loops_failed_runs"], g["loops_successful_runs"]
            cells += [
                f"{g['false_stops']} ({_detectors(g['false_detectors'])})",
                f"{a['stopped']}/{a['found']}, spent {_num(a['median_spent'], '{:.0f}')}",
                f"{b['stopped']}/{b['found']}",
            ]
        table.add_row(name, f"{row['runs']} ({row['successful']})", *cells)
    console.print(table)


def render_suites(report: dict[str, Any], console: Console) -> None:
    res = report.get("suites")
    if not res:
        return
    n = report["settings"]["suite_cases"]
    console.rule(f"generated suites ({n} cases per pattern, seed {report['settings']['seed']})")
    if res["dropped_policy_fields"]:
        console.print(
            "policy fields this loop-governor does not know (replayed without them): "
            + ", ".join(res["dropped_policy_fields"])
        )
    healthy = Table(box=box.SIMPLE_HEAD, title="healthy patterns: false stops (goal 0)")
    healthy.add_column("pattern")
    healthy.add_column("n")
    healthy.add_column("loop-governor stops")
    healthy.add_column("calls that must run but did not: answered from memory or after a stop (goal 0)")
    healthy.add_column("trajectory-fuse stops")
    for pattern, r in res["healthy"].items():
        healthy.add_row(
            pattern,
            str(r["n"]),
            f"{r['governor']['false']} ({_detectors(r['governor']['detectors'])})",
            str(r["blocked_retries"]),
            f"{r['fuse']['false']} ({_detectors(r['fuse']['detectors'])})",
        )
    console.print(healthy)
    loops = Table(box=box.SIMPLE_HEAD, title="real loops: false stops before the loop, then catches (goal all)")
    loops.add_column("pattern")
    loops.add_column("n")
    for guard in GUARDS:
        loops.add_column(f"{GUARD_NAMES[guard]} false")
        loops.add_column("caught")
        loops.add_column("calls spent (median/max)")
        loops.add_column("detectors")
    for pattern, r in res["loop"].items():
        cells = []
        for guard in GUARDS:
            g = r[guard]
            cells += [
                str(g["false"]),
                f"{g['caught']}/{r['n']}",
                f"{_num(g['median_spent'], '{:.0f}')}/{_num(g['max_spent'], '{:.0f}')}",
                _detectors(g["detectors"]),
            ]
        loops.add_row(pattern, str(r["n"]), *cells)
    console.print(loops)
    for suite in ("healthy", "loop"):
        for pattern, r in res[suite].items():
            stops = r["false_stops"]
            if stops:
                console.print(f"\nfalse stops, {suite} {pattern} ({len(stops)}; first {min(len(stops), 2)} shown):")
            for s in stops[:2]:
                console.print(f"- {GUARD_NAMES[s['guard']]} [{s['detector']}] {s['case']}: step {s['step']}")
                for line in s["context"]:
                    console.print(f"    {line}")
            if r["misses"]:
                reasons = Counter(m["governor_said"] for m in r["misses"])
                console.print(f"\ngovernor misses, {pattern} ({len(r['misses'])} of {r['n']}):")
                for reason, k in reasons.most_common(3):
                    console.print(f"    {k:>3} x {reason}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="corpus folders (or files) of recorded runs; a folder of folders "
        "(tau2: one per model) is reported per sub-folder",
    )
    parser.add_argument("--seed", type=int, default=0, help="splice positions and pattern contents")
    parser.add_argument("--json", type=Path, default=None, help="write the full report here")
    parser.add_argument("--positions", type=int, default=2, help="splice positions per run and pattern")
    parser.add_argument(
        "--model-calls", action="store_true", help="also run each model call through g.call_model (a stub)"
    )
    parser.add_argument(
        "--no-raise", action="store_true", help="recorded failures are returned as results instead of raised"
    )
    parser.add_argument(
        "--suite-cases", type=int, default=20, help="cases per generated pattern (benchmarks/loop_patterns.py); 0: none"
    )
    parser.add_argument(
        "--read-only",
        default="",
        help="comma-separated tools of the recorded runs to declare ToolPolicy(read_only=True) "
        "(what a user would declare: lookups, think, calculate); default: none, every tool may change state",
    )
    args = parser.parse_args(argv)
    read_only = tuple(t for t in args.read_only.split(",") if t)
    settings = Settings(args.seed, args.positions, args.model_calls, not args.no_raise, args.suite_cases, read_only)
    report = evaluate(args.paths, settings)
    console = Console(width=200, highlight=False, markup=False)
    render(report, console)
    if report["summary"]:
        console.rule("summary")
        render_summary(report, console)
    render_suites(report, console)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
