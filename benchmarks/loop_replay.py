"""Replay recorded agent runs through the governor and through trajectory-fuse, step by step.

The machinery behind ``benchmarks/loop_guard_calibration.py`` (kept apart so a test can run
it on a small generated trajectory without the corpus): load runs, say which recorded tool
results were failures, replay every recorded tool call through ``Governor.call`` inside one
task per run and feed the same call to a trajectory-fuse ``AgentFuse`` in the same loop,
splice loop patterns into healthy runs, and find the loops a run already contains with a
simple definition of our own (independent of both guards).

Replay is open-loop: the recorded run goes on whatever the governor answered (a refusal, a
warning in the result), because the model that would have read the answer is not here. A
stop is therefore measured at the first call a guard refuses to let through, and the steps
after it are what the stop would have saved.

What counts as a failure (the replayed tool *raises*, so the governor's failure path --
classification, known-bad memory, the repeated-error guard, escalation -- runs as it would
for a real tool):

* mini-swe-agent runs (``{"exit_status", "messages"}``): the bash tool's output carries
  ``<returncode>N</returncode>``; a non-zero N raises :class:`CommandFailed`, an
  ``<exception>`` result (the harness's own 60 s timeout) raises :class:`CommandTimedOut`
  (a ``TimeoutError``). The message is the recorded output, exactly what the model read.
* tau-bench runs (``[{task_id, reward, traj}]``): tau-bench's tools raise and its
  environment returns ``"Error: <message>"``; such a result raises :class:`ToolError` with
  the message after ``"Error: "``.
* tau2-bench runs (``{"source", "model", "outcome", "messages", "meta"}``, one file per
  run, one folder per model): the same rule -- a tool result starting with ``"Error"``
  raises :class:`ToolError` (tau2 marks exactly these results ``"error": true``); the run
  is successful when ``outcome`` is ``"success"`` (reward 1.0).
* generated runs (``benchmarks/loop_patterns.py``): kind ``"tau"``, the same rule; a run
  may declare per-tool policies (``Run.policies``), passed to ``GovernorConfig(tools=...)``.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import loop_governor as lg
from loop_governor.bench.clock import VirtualClock  # virtual time: sleep() advances it

# -- runs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One tool call as recorded (or spliced): what was asked and what came back."""

    tool: str
    args: Any  # the decoded JSON arguments (a dict), or the raw string when not JSON
    result: str  # the result text the model read
    failure: str | None = None  # None: success; "error" / "timeout": the replayed tool raises
    origin: str = "run"  # "run", or the spliced pattern's name
    # generated runs only: a wait tool's seconds (virtual time passes), and an outage: the
    # tool raises "HTTP 503" until this many seconds after the replay's start
    wait_s: float = 0.0
    down_until: float | None = None


@dataclass(slots=True)
class Run:
    """A recorded run: one entry of ``turns`` per assistant message (one model call), each
    the tool calls that message asked for (often none, sometimes several)."""

    corpus: str
    name: str
    kind: str  # "swe" (mini-swe-agent) or "tau" (tau-bench)
    success: bool
    turns: list[list[Step]]
    outcome: str = ""  # exit_status / reward, as recorded
    # per-tool ToolPolicy fields this run's agent declares (generated suites): tool -> fields
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def steps(self) -> list[Step]:
        return [step for turn in self.turns for step in turn]


_RETURNCODE = re.compile(r"<returncode>(-?\d+)</returncode>")


def swe_failure(text: str) -> str | None:
    """mini-swe-agent output: a non-zero ``<returncode>`` fails; ``<exception>`` timed out."""
    if text.lstrip().startswith("<exception>"):
        return "timeout" if "timed out" in text else "error"
    match = _RETURNCODE.search(text)
    return "error" if match is not None and int(match.group(1)) != 0 else None


def tau_failure(text: str) -> str | None:
    """tau-bench: the environment turns a tool's exception into ``"Error: ..."``."""
    return "error" if text.startswith("Error") else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content)


def _decode(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments if arguments is not None else {}
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def turns_of(messages: Sequence[dict[str, Any]], failure_of: Callable[[str], str | None]) -> list[list[Step]]:
    """OpenAI-format messages -> one list of steps per assistant message."""
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages if m.get("role") == "tool"}
    turns: list[list[Step]] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        steps = []
        for call in message.get("tool_calls") or []:
            result = results.get(call.get("id"))
            if result is None:
                continue  # asked for, never answered (the run ended there)
            fn = call.get("function") or {}
            steps.append(Step(fn.get("name", "?"), _decode(fn.get("arguments")), result, failure_of(result)))
        turns.append(steps)
    return turns


def load_runs(path: Path, corpus: str | None = None) -> list[Run]:
    """Every run under ``path`` (a directory of ``*.json.gz`` or one file), in name order.

    A run in a sub-folder belongs to the corpus ``<path name>/<sub-folder>`` (tau2: one
    folder per model), so a report can speak per source."""
    files = sorted(path.rglob("*.json.gz")) if path.is_dir() else [path]
    corpus = corpus or path.name.removesuffix(".json.gz")
    runs: list[Run] = []
    for file in files:
        with gzip.open(file, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
        folder = file.parent.relative_to(path).as_posix() if path.is_dir() else "."
        source = corpus if folder == "." else f"{corpus}/{folder}"
        if isinstance(data, dict) and "messages" in data and "outcome" in data:  # tau2-bench
            turns = turns_of(data["messages"], tau_failure)
            meta = data.get("meta") or {}
            name = str(meta.get("run_id") or file.name.removesuffix(".json.gz"))
            outcome = f"{data['outcome']}, reward {meta.get('reward')}, {meta.get('termination_reason')}"
            runs.append(Run(source, name, "tau", data["outcome"] == "success", turns, outcome))
        elif isinstance(data, dict) and "messages" in data:  # mini-swe-agent
            status = str(data.get("exit_status"))
            turns = turns_of(data["messages"], swe_failure)
            runs.append(Run(source, file.name, "swe", status == "Submitted", turns, status))
        elif isinstance(data, list):  # tau-bench results: one entry per run
            for index, entry in enumerate(data):
                name = f"{file.name}#{index} (task {entry.get('task_id')}, trial {entry.get('trial')})"
                reward = entry.get("reward")
                turns = turns_of(entry.get("traj") or [], tau_failure)
                runs.append(Run(source, name, "tau", reward == 1.0, turns, f"reward {reward}"))
        else:
            raise ValueError(f"{file}: neither a mini-swe-agent run, a tau2-bench run nor a tau-bench result list")
    return runs


# -- the replayed tools ------------------------------------------------------------------


class ReplayedToolError(Exception):
    """A recorded failure, raised the way a tool wrapper raises it."""


class CommandFailed(ReplayedToolError):
    """A bash command exited non-zero (the message is the output the model read)."""


class CommandTimedOut(ReplayedToolError, TimeoutError):
    """The harness killed a bash command after its timeout."""


class ToolError(ReplayedToolError):
    """A tau-bench tool raised (its environment showed ``"Error: <message>"``)."""


_TIMED_OUT = re.compile(r"timed out after (\d+(?:\.\d+)?) seconds")


def tool_fn(
    step: Step,
    kind: str,
    *,
    raise_failures: bool = True,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> Callable[[Any], str]:
    """The function ``g.call`` runs for ``step``: returns the recorded result, or raises
    when it was a failure (unless ``raise_failures`` is off: then failures are results too).
    A timed-out command takes its timeout again on every attempt (``sleep``: virtual time);
    a generated wait lets its seconds pass; a generated outage raises until it is over."""
    if step.down_until is not None and clock is not None:
        up_at, result = START + step.down_until, step.result

        def flaky(_args: Any) -> str:
            if clock() < up_at:
                raise ToolError("HTTP 503: service unavailable")
            return result

        return flaky
    if step.wait_s and sleep is not None:
        waited, seconds = step.result, step.wait_s

        def wait(_args: Any) -> str:
            sleep(seconds)
            return waited

        return wait
    if step.failure is None or not raise_failures:
        result = step.result

        def ok(_args: Any) -> str:
            return result

        return ok
    wait = 0.0
    if kind == "tau":
        exc_type: type[Exception] = ToolError
        message = step.result.removeprefix("Error: ")
    else:
        exc_type = CommandTimedOut if step.failure == "timeout" else CommandFailed
        message = step.result
        if step.failure == "timeout" and sleep is not None:
            match = _TIMED_OUT.search(step.result)
            wait = float(match.group(1)) if match else 60.0

    def fail(_args: Any) -> str:
        if wait and sleep is not None:
            sleep(wait)
        raise exc_type(message)

    return fail


# -- one replay --------------------------------------------------------------------------

STEP_SECONDS = 5.0  # virtual time between tool calls (breaker cool-downs, retry pauses)
START = 1_000_000.0  # where a replay's virtual clock starts


# Events every call produces; everything else the governor emits is a signal (a warning
# or a stop) and is recorded with the step it came from.
ROUTINE_EVENTS = frozenset(
    {
        "tool_call",
        "model_call",
        "task_start",
        "task_end",
        "retry",
        "usage_estimated",
        "unpriced_model",
        "checkpoint_skipped",
    }
)
# The fields of a signal worth keeping (what it was about), when present.
SIGNAL_FIELDS = ("signature", "subject", "count", "period", "code", "remaining", "state")


@dataclass(slots=True)
class Stop:
    step: int  # index of the tool call (0-based, in the replayed sequence) that was refused
    detector: str  # governor: ``info.code``; trajectory-fuse: the detection kind
    message: str = ""


@dataclass(slots=True)
class Signal:
    step: int
    event: str
    tool: str | None
    action: str | None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.event}:{self.action}" if self.action else self.event


@dataclass(slots=True)
class Replay:
    """What both guards did with one replayed sequence of steps."""

    steps: list[Step]
    model_calls: int
    governor: Stop | None = None
    fuse: Stop | None = None
    # the governor's tool withdrawals (the ladder's step before a stop: the model is no
    # longer offered the tool, so a live loop of it ends there)
    withdrawals: list[Stop] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)  # governor warnings / stops (events)
    outcomes: list[str] = field(default_factory=list)  # per step: what the governor answered


def _fuse_types() -> tuple[Any, Any, Any, Any]:
    from trajectory_fuse import AgentFuse, DeadlockDetected, FuseConfig
    from trajectory_fuse.types import Action

    return AgentFuse, DeadlockDetected, FuseConfig, Action


def tool_policies(policies: dict[str, dict[str, Any]]) -> tuple[dict[str, lg.ToolPolicy], list[str]]:
    """``ToolPolicy`` objects for ``policies`` (tool -> fields), and the fields this version
    of loop-governor does not know (dropped, so the harness runs on older code too: a run
    declaring ``poll=True`` then replays with the defaults and the report says so)."""
    known = set(lg.ToolPolicy.model_fields)
    built: dict[str, lg.ToolPolicy] = {}
    dropped: list[str] = []
    for tool, fields in policies.items():
        dropped += [f"{tool}.{name}" for name in fields if name not in known]
        built[tool] = lg.ToolPolicy(**{name: value for name, value in fields.items() if name in known})
    return built, dropped


def new_governor(clock: VirtualClock, seed: int, config: lg.GovernorConfig | None = None) -> lg.Governor:
    """A governor with the default configuration (or ``config``), on virtual time (one per
    run: runs were separate agents, so breakers and known-bad memory must not leak between
    them)."""
    return lg.Governor(
        config or lg.GovernorConfig(),
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=random.Random(seed).random,
    )


def replay(
    turns: Sequence[Sequence[Step]],
    kind: str,
    *,
    task_id: str = "replay",
    seed: int = 0,
    model_calls: bool = False,
    fuse: bool = True,
    run_on: bool = False,
    raise_failures: bool = True,
    config: lg.GovernorConfig | None = None,
) -> Replay:
    """Replay ``turns`` through ``g.call`` in one task, and through trajectory-fuse.

    With ``model_calls``, every turn is also one ``g.call_model`` of a stub (iteration
    budgets see the model calls). The replay ends once both guards have stopped, unless
    ``run_on`` (then every step is replayed, e.g. to see what the governor said later).
    ``outcomes[i]`` is what ``g.call`` answered for step ``i``: ``ok``, or the error's class
    (and code), prefixed ``refused`` when the governor answered without calling the tool.
    ``config`` replaces ``GovernorConfig()`` (per-tool policies of a generated run).
    """
    clock = VirtualClock(START)
    gov = new_governor(clock, seed, config)
    AgentFuse, DeadlockDetected, FuseConfig, Action = _fuse_types()
    guard = AgentFuse(FuseConfig()) if fuse else None
    steps = [step for turn in turns for step in turn]
    out = Replay(steps, len(turns))
    index = 0

    def on_event(event: dict[str, Any]) -> None:
        name = str(event.get("event"))
        if name not in ROUTINE_EVENTS:
            action = event.get("action")
            fields = {k: event[k] for k in SIGNAL_FIELDS if isinstance(event.get(k), (str, int, float))}
            out.signals.append(Signal(index, name, event.get("tool"), None if action is None else str(action), fields))
            if name == "tool_withdrawn":
                out.withdrawals.append(Stop(index, f"withdrawn:{event.get('code')}", str(event.get("reason") or "")))

    gov.subscribe(on_event)
    with gov.task(task_id):
        for turn_index, turn in enumerate(turns):
            if model_calls and out.governor is None:
                clock.sleep(1.0)
                try:
                    gov.call_model("replay:model", _model_stub, turn_index, estimated_tokens=0)
                except lg.FatalError as stop:
                    out.governor = Stop(index, stop.info.code or type(stop).__name__, stop.info.message)
            for step in turn:
                clock.sleep(STEP_SECONDS)
                if out.governor is None:
                    fn, ran = tool_fn(step, kind, raise_failures=raise_failures, sleep=clock.sleep, clock=clock), []

                    def counted(args: Any, fn: Callable[[Any], str] = fn, ran: list[int] = ran) -> str:
                        ran.append(1)
                        return fn(args)

                    try:
                        gov.call(step.tool, counted, step.args)
                        out.outcomes.append("ok")
                    except lg.FatalError as stop:
                        out.governor = Stop(index, stop.info.code or type(stop).__name__, stop.info.message)
                        out.outcomes.append(f"STOP {out.governor.detector}" + ("" if ran else " (refused)"))
                    except lg.AgentToolError as exc:  # the model reads it; the recorded run goes on
                        code = f" ({exc.info.code})" if exc.info.code else ""
                        out.outcomes.append(("" if ran else "refused ") + type(exc).__name__ + code)
                if guard is not None and out.fuse is None:
                    action = Action(tool=step.tool, args=step.args, result=step.result, success=step.failure is None)
                    try:
                        guard.observe(action)
                    except DeadlockDetected as stop:
                        out.fuse = Stop(index, stop.kind.value, str(stop))
                index += 1
            if not run_on and out.governor is not None and (guard is None or out.fuse is not None):
                break
    return out


def _model_stub(turn: int) -> dict[str, Any]:
    return {"content": f"turn {turn}"}


def time_calls(runs: Sequence[Run], *, seed: int = 0, raise_failures: bool = True) -> tuple[list[float], list[float]]:
    """Microseconds per call, for every step of ``runs``: ``g.call`` inside a task (nobody
    listening to events, as in production without a tracer) and trajectory-fuse's
    ``observe`` (with its ``Action``). Same steps, same process, interleaved.

    As in production, one governor serves every run, each in its own task (an hour of
    virtual time apart, so no breaker carries over), and each run gets its own
    ``AgentFuse``; a guard that stops goes on in a fresh task (fuse), so both time the same
    calls."""
    clock = VirtualClock(START)
    gov = new_governor(clock, seed)
    AgentFuse, DeadlockDetected, FuseConfig, Action = _fuse_types()
    gov_us: list[float] = []
    fuse_us: list[float] = []
    perf = time.perf_counter_ns
    for number, run in enumerate(runs):
        clock.sleep(3600.0)
        guard = AgentFuse(FuseConfig())
        scope = gov.task(f"timing-{number}")
        scope.__enter__()
        try:
            for step in run.steps:
                clock.sleep(STEP_SECONDS)
                fn = tool_fn(step, run.kind, raise_failures=raise_failures, sleep=clock.sleep, clock=clock)
                tool, args = step.tool, step.args
                stopped = False
                start = perf()
                try:
                    gov.call(tool, fn, args)
                except lg.FatalError:
                    stopped = True
                except lg.AgentToolError:
                    pass
                gov_us.append((perf() - start) / 1000)
                if stopped:
                    scope.__exit__(None, None, None)
                    scope = gov.task(f"timing-{number}-{len(gov_us)}")
                    scope.__enter__()
                start = perf()
                try:
                    guard.observe(Action(tool=tool, args=args, result=step.result, success=step.failure is None))
                except DeadlockDetected:
                    guard = AgentFuse(FuseConfig())
                fuse_us.append((perf() - start) / 1000)
        finally:
            scope.__exit__(None, None, None)
    return gov_us, fuse_us


# -- spliced loop patterns ---------------------------------------------------------------

PATTERNS = (
    "failure_x10",
    "ab_x10",
    "abc_x10",
    "critic_x10",
    "page_walk_x10",
    "think_failure_x10",
    "critic_revised_x10",
)
EXTRA_PATTERNS = ("near_failure_x10", "edit_check_x10")
PATTERN_HELP = {
    "failure_x10": "the identical call raising the identical failure 10 times",
    "ab_x10": "two recorded calls of the run (unchanged results) alternating, A-B x10",
    "abc_x10": "three recorded calls of the run (unchanged results) cycling, A-B-C x10",
    "critic_x10": "a critic judging a new draft 10 times; its verdict differs only in a score and a timestamp",
    "page_walk_x10": "a page/offset argument walking on, the result the same empty one, 10 calls",
    "think_failure_x10": "the identical failing call alternated with a varied think / note / new search, x10",
    "critic_revised_x10": "a critic judging a revised draft 10 times; its verdict moves only in a score or a time",
    "near_failure_x10": "extra: a failing call whose argument and error differ in one number, 10 times",
    "edit_check_x10": "extra: revise, then re-run the same check whose failure differs only in a duration, x10",
}


def _swe_out(body: str, returncode: int = 0) -> str:
    return f"<returncode>{returncode}</returncode>\n<output>\n{body}</output>"


def _distinct_successes(steps: Iterable[Step]) -> list[Step]:
    seen: set[tuple[str, str]] = set()
    out = []
    for step in steps:
        key = (step.tool, json.dumps(step.args, sort_keys=True, default=str))
        if step.failure is None and key not in seen:
            seen.add(key)
            out.append(step)
    return out


def _fallback(kind: str, i: int) -> Step:
    """A plausible successful call when the run has too few distinct ones of its own."""
    if kind == "swe":
        path = ("src/pkg/core.py", "src/pkg/utils.py", "tests/test_core.py")[i % 3]
        return Step(
            "bash", {"command": f"grep -n 'def ' {path} | head -5"}, _swe_out(f"12:def load(x):\n40:def dump{i}(y):\n")
        )
    rid = ("ZFA04Y", "8JX2WO", "4WQ150")[i % 3]
    body = json.dumps({"reservation_id": rid, "user_id": "mia_li_3668", "origin": "JFK", "destination": "SEA"})
    return Step("get_reservation_details", {"reservation_id": rid}, body)


def _cycle(width: int) -> Callable[[str, Sequence[Step], random.Random], list[Step]]:
    def make(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
        pool = _distinct_successes(run_steps)
        if len(pool) >= width:
            picked = rng.sample(pool, width)
        else:
            picked = pool + [_fallback(kind, i) for i in range(width - len(pool))]
        return [Step(s.tool, s.args, s.result) for _ in range(10) for s in picked]

    return make


_PAID = {"reservation_id": "ZFA04Y", "payment_id": "gift_card_7815826"}


def _failure(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    if kind == "swe":
        name = rng.choice(("reproduce_issue.py", "test_fix.py", "check.py"))
        out = (
            f'Traceback (most recent call last):\n  File "/testbed/{name}", line {rng.randint(2, 30)}, in <module>\n'
            "    from pkg.core import Loader\nImportError: cannot import name 'Loader' from 'pkg.core'\n"
        )
        return [Step("bash", {"command": f"cd /testbed && python {name}"}, _swe_out(out, 1), "error")] * 10
    total, paid = rng.randint(150, 900), rng.randint(10, 60)
    text = f"Error: payment amount does not add up, total price is {total}, but paid {paid}"
    return [Step("update_reservation_flights", {**_PAID, "amount": paid}, text, "error")] * 10


def _near_failure(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    total, paid = rng.randint(150, 900), rng.randint(10, 60)
    steps = []
    for i in range(1, 11):
        if kind == "swe":
            out = f'Traceback (most recent call last):\n  File "/testbed/reproduce_issue.py", line {20 + i}\n'
            out += f"KeyError: 'case_{i}'\n"
            command = f"cd /testbed && python reproduce_issue.py --case {i}"
            steps.append(Step("bash", {"command": command}, _swe_out(out, 1), "error"))
        else:
            text = f"Error: payment amount does not add up, total price is {total}, but paid {paid + i}"
            steps.append(Step("update_reservation_flights", {**_PAID, "amount": paid + i}, text, "error"))
    return steps


def _critic(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    topic = rng.choice(("the nested case", "the empty input", "the timezone"))
    minute, second = rng.randint(0, 50), rng.randint(0, 29)
    steps = []
    for i in range(1, 11):
        stamp = f"12:{minute:02d}:{second + 3 * i:02d}"
        verdict = f"score {rng.randint(4, 8)}/10 at {stamp} - revise: {topic} is still not handled"
        # the same draft sent back every round (a new draft would be a new question: progress)
        if kind == "swe":
            steps.append(Step("bash", {"command": "python review.py drafts/final.md"}, _swe_out(verdict + "\n")))
        else:
            draft = f"Draft: offer the passenger a refund, handle {topic}"
            steps.append(Step("critic", {"draft": draft}, verdict))
    return steps


def _think_failure(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    """The identical failing call, with a varied call of another tool between each try."""
    if kind == "swe":
        out = "Traceback (most recent call last):\nFileNotFoundError: [Errno 2] No such file: 'docs/refunds-2019.md'\n"
        failing = Step("bash", {"command": "cat docs/refunds-2019.md"}, _swe_out(out, 1), "error")
    else:
        failing = Step(
            "fetch_doc", {"name": "refunds-2019.pdf"}, "Error: HTTP 404: no document named refunds-2019.pdf", "error"
        )
    steps = []
    for i in range(10):
        steps.append(failing)
        kind_of = rng.choice(("think", "note", "search"))
        if kind == "swe":
            between = Step(
                "bash",
                {"command": f"echo 'attempt {i}: {rng.choice(('retry', 'check', 'again'))}'"},
                _swe_out(f"attempt {i}\n"),
            )
        elif kind_of == "think":
            between = Step(
                "think", {"thought": f"The document may exist under another id ({i}); let me try again."}, ""
            )
        elif kind_of == "note":
            between = Step("log_note", {"note": f"fetch attempt {i} failed, retrying"}, f"note {i} saved")
        else:
            topic = rng.choice(("refund window", "refund policy 2019", "returns", "refund exceptions"))
            between = Step("search_kb", {"query": f"{topic} {i}"}, f"{rng.randint(1, 9)} results for {topic} {i}")
        steps.append(between)
    return steps


def _critic_revised(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    """A critic sent a new draft each round; its verdict moves only in a score or a timestamp."""
    topic = rng.choice(("the nested case", "the empty input", "the timezone"))
    moving = rng.choice(("score", "time"))
    steps = []
    for i in range(10):
        if moving == "score":
            verdict = f"Score {rng.randint(4, 7)}/10. Not good enough: {topic} is still not handled. Revise."
        else:
            verdict = f"[reviewed 2024-05-1{i % 10}T12:{rng.randint(0, 59):02d}:00Z] Not good enough: {topic}. Revise."
        # (a coding agent's reviewer is a tool of its own, handed the draft: the same call)
        steps.append(
            Step("critic", {"draft": f"Draft v{i}: offer the passenger a refund ({rng.randint(1, 999)})"}, verdict)
        )
    return steps


def _page_walk(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    if kind == "swe":  # a coding agent pages through a file with sed, past its end
        path, first = rng.choice(("src/pkg/core.py", "src/pkg/io.py")), rng.choice((400, 600, 1000))
        lines = [(first + 50 * i, first + 50 * i + 49) for i in range(10)]
        return [Step("bash", {"command": f"sed -n '{a},{b}p' {path}"}, _swe_out("")) for a, b in lines]
    user = rng.choice(("mia_li_3668", "omar_davis_3817", "sofia_kim_7287"))
    return [Step("list_reservations", {"user_id": user, "page": i, "limit": 10}, "[]") for i in range(2, 12)]


def _edit_check(kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    steps = []
    for i in range(1, 11):
        if kind == "swe":
            edit = f"sed -i 's/return value/return value or {i}/' src/pkg/core.py"
            steps.append(Step("bash", {"command": edit}, _swe_out("")))
            out = "F.....\nFAILED tests/test_core.py::test_nested - AssertionError\n"
            out += f"1 failed, 5 passed in 0.{rng.randint(10, 99)}s\n"
            steps.append(Step("bash", {"command": "python -m pytest tests/test_core.py -q"}, _swe_out(out, 1), "error"))
        else:
            steps.append(Step("think", {"thought": f"Let me rework the offer, attempt {i}."}, ""))
            verdict = f"score {rng.randint(4, 8)}/10 at 12:0{i // 6}:{10 * (i % 6):02d} - revise: the refund is missing"
            steps.append(Step("critic", {"draft": f"Offer v{i}: rebook on HAT{rng.randint(100, 300)}"}, verdict))
    return steps


_MAKERS: dict[str, Callable[[str, Sequence[Step], random.Random], list[Step]]] = {
    "failure_x10": _failure,
    "ab_x10": _cycle(2),
    "abc_x10": _cycle(3),
    "critic_x10": _critic,
    "page_walk_x10": _page_walk,
    "think_failure_x10": _think_failure,
    "critic_revised_x10": _critic_revised,
    "near_failure_x10": _near_failure,
    "edit_check_x10": _edit_check,
}


def pattern_steps(pattern: str, kind: str, run_steps: Sequence[Step], rng: random.Random) -> list[Step]:
    """The spliced steps of ``pattern`` in a run of ``kind`` (``run_steps`` lends the A-B(-C)
    patterns their calls), drawn with ``rng``; each step's ``origin`` is the pattern."""
    maker = _MAKERS.get(pattern)
    if maker is None:
        raise ValueError(f"unknown pattern {pattern!r}")
    return [
        Step(s.tool, s.args, s.result, s.failure, pattern, s.wait_s, s.down_until) for s in maker(kind, run_steps, rng)
    ]


@dataclass(slots=True)
class Splice:
    turns: list[list[Step]]
    start: int  # index of the first spliced step in the replayed sequence
    length: int  # number of spliced steps


def splice(run: Run, pattern: str, rng: random.Random) -> Splice:
    """``run`` with ``pattern`` inserted before a random turn (each spliced call its own turn)."""
    at = rng.randint(0, len(run.turns))
    inserted = pattern_steps(pattern, run.kind, run.steps, rng)
    start = sum(len(turn) for turn in run.turns[:at])
    turns = [*run.turns[:at], *([step] for step in inserted), *run.turns[at:]]
    return Splice(turns, start, len(inserted))


# -- loops the recorded runs contain (our own, simple definition) ---------------------

LOOP_WINDOW = 8  # R1: the same call with the same result 3 times within this many calls
FAIL_WINDOW = 6  # R3: the same tool failing the same way (digits aside) 3 times within this many calls
_DIGITS = re.compile(r"\d+")


@dataclass(slots=True)
class Loop:
    start: int
    end: int  # inclusive
    rules: list[str]

    @property
    def calls(self) -> int:
        return self.end - self.start + 1


def _key(step: Step) -> tuple[str, str, str]:
    return step.tool, json.dumps(step.args, sort_keys=True, default=str), step.result


def find_loops(steps: Sequence[Step]) -> list[Loop]:
    """Candidate loops, by three simple rules (independent of either guard's logic):

    * R1 ``repeat``: the same (tool, arguments, result) 3 times within ``LOOP_WINDOW`` calls;
    * R2 ``cycle``: a block of 2-4 calls, not all the same, immediately repeated with
      identical (tool, arguments, result) -- A-B-A-B, A-B-C-A-B-C, ...;
    * R3 ``failing``: the same tool failing 3 times within ``FAIL_WINDOW`` calls with the
      same error once digits are blanked (arguments may differ).

    Overlapping or adjacent hits merge into one loop with the step range they cover.
    """
    keys = [_key(step) for step in steps]
    hits: list[tuple[int, int, str]] = []
    positions: dict[tuple[str, str, str], list[int]] = {}
    for i, key in enumerate(keys):
        positions.setdefault(key, []).append(i)
    for pos in positions.values():
        for j in range(len(pos) - 2):
            if pos[j + 2] - pos[j] < LOOP_WINDOW:
                hits.append((pos[j], pos[j + 2], "repeat"))
    for period in (2, 3, 4):
        for i in range(len(keys) - 2 * period + 1):
            block = keys[i : i + period]
            if len(set(block)) > 1 and block == keys[i + period : i + 2 * period]:
                hits.append((i, i + 2 * period - 1, f"cycle{period}"))
    failures: dict[tuple[str, str], list[int]] = {}
    for i, step in enumerate(steps):
        if step.failure is not None:
            failures.setdefault((step.tool, _DIGITS.sub("#", step.result)), []).append(i)
    for pos in failures.values():
        for j in range(len(pos) - 2):
            if pos[j + 2] - pos[j] < FAIL_WINDOW:
                hits.append((pos[j], pos[j + 2], "failing"))
    loops: list[Loop] = []
    for start, end, rule in sorted(hits):
        if loops and start <= loops[-1].end + 1:
            last = loops[-1]
            last.end = max(last.end, end)
            if rule not in last.rules:
                last.rules.append(rule)
        else:
            loops.append(Loop(start, end, [rule]))
    return loops


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(step: Step, width: int = 70) -> str:
    """One line for a report: tool, arguments and result, each cut to ``width``."""
    args = step.args
    if isinstance(args, dict) and set(args) == {"command"}:
        args = args["command"]  # bash: the command is the argument
    text = args if isinstance(args, str) else json.dumps(args, sort_keys=True)
    flag = f" [{step.failure}]" if step.failure else ""
    return f"{step.tool}({_cut(text, width)}) -> {_cut(step.result, width)}{flag}"
