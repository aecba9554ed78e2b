"""Task scope: the per-task state a governed call reads from a contextvar.

Budgets, known-bad calls, loop guards and checkpoints are per task; the scope travels in
a contextvar (``with governor.task("id"):``), so adapters never thread it through
framework code, and it follows asyncio tasks.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any

from loop_governor.errors import FatalError
from loop_governor.keys import call_key
from loop_governor.policies.fixes import MOVERS_KEPT
from loop_governor.policies.progress import ProgressGuard
from loop_governor.redaction import redact, redact_value
from loop_governor.scope_vars import _SCOPE

if TYPE_CHECKING:
    from loop_governor.checkpoint import TaskCheckpoint
    from loop_governor.governor import Governor

__all__ = ["PARTIAL_RESULTS_MAX", "PARTIAL_RESULT_CHARS", "RunAbandoned", "TaskScope", "call_key"]

PARTIAL_RESULTS_MAX = 20  # the latest successful tool results a stop hands back
PARTIAL_RESULT_CHARS = 2000  # each cut to this many characters (redacted)


def _result_text(value: Any) -> str:
    """A tool result as the text ``partial_results`` holds: a message's content, else
    the string (or repr) of the value; redacted and cut."""
    content = getattr(value, "content", None)
    if isinstance(content, str):
        value = content
    text = value if isinstance(value, str) else repr(value)
    text = text[: PARTIAL_RESULT_CHARS * 2]  # redaction works on a bounded text
    text = redact(text)
    return text if len(text) <= PARTIAL_RESULT_CHARS else text[: PARTIAL_RESULT_CHARS - 3] + "..."


NAME_CHARS = 80  # a task's readable name is cut to this many characters


def readable_name(text: str, limit: int = NAME_CHARS) -> str:
    """``text`` as a task's name on one line: whitespace runs collapsed, redacted, cut to
    ``limit`` characters (a crew task's description can be a page long)."""
    one_line = redact(" ".join(str(text).split()))
    return one_line if len(one_line) <= limit else one_line[: limit - 1].rstrip() + "…"


FINISHED_KEY = "finished_at"  # checkpoint metadata: when the task completed


class RunAbandoned(BaseException):
    """How an adapter ends a task whose run ended without telling it how (LangGraph's
    stream left unread, a crewAI kickoff cancelled between its hooks): ``task_end`` says
    ``abandoned``, with this text as the reason. A BaseException, as a cancellation; never
    raised, only handed to `TaskScope.__exit__`."""


class TaskScope:
    """Per-task counters; the durable per-task state (budget, known-bad) is in the store.

    With a checkpoint store, entering the scope resumes the task's checkpoint (completed
    calls return their stored result, known-bad calls their stored error) only if that
    task did not finish. A task that completes keeps its checkpoint, marked finished
    (``metadata["finished_at"]``), until the same task id runs again: that run starts
    over and replaces it (``resume=True`` resumes it anyway, ``resume=False`` never
    resumes). ``loop-governor checkpoints rm`` deletes one."""

    __slots__ = (
        "_token",
        "bad_calls",
        "calls_by_tool",
        "checkpoint",
        "checkpoint_lock",
        "cost",
        "cycles",
        "episodes",
        "error_turns",
        "failed_tools",
        "first_call_at",
        "governor",
        "known_bad",
        "last_invocation",
        "listed",
        "model_calls",
        "movers",
        "name",
        "polls",
        "progress",
        "results",
        "results_saved",
        "resumable",
        "resume",
        "started_at",
        "steps",
        "stop",
        "streaks",
        "task_id",
        "tokens",
        "told",
        "told_calls",
        "tool_calls",
        "tool_results",
        "unavailable",
        "withdrawn",
        "world",
    )

    def __init__(self, governor: Governor, task_id: str, resume: bool | None = None, name: str | None = None) -> None:
        self.governor = governor
        self.task_id = task_id
        # what a person reads for this task (log lines, the report): the name given, else the id
        self.name = readable_name(name) if name is not None else task_id
        # None: resume a checkpoint only if its task did not finish; True: resume it even
        # if it did; False: start over (the old checkpoint is replaced)
        self.resume = resume
        self.stop: FatalError | None = None  # the stop that ended the task (set by stop_run)
        # the latest successful tool results, (tool, value): redacted and cut only when a
        # stop hands them back, so a success costs an append
        self.tool_results: deque[tuple[str, Any]] = deque(maxlen=PARTIAL_RESULTS_MAX)
        self.steps = 0
        self.tool_calls = 0
        self.model_calls = 0
        self.calls_by_tool: dict[str, int] = {}  # only tools with their own max_calls
        self.first_call_at: dict[str, float] = {}  # only tools with their own max_wall_s
        self.polls: dict[str, list[Any]] = {}  # a declared poll's job -> [polls, first poll's time, warned]
        # failure key (repeats.failure_key) -> (the tool call it last came back at, its model decision)
        self.error_turns: dict[str, tuple[int, int | None]] = {}
        # repeats.failure_key's episodes: a tool (its outages) or a tool and entity (a question)
        # -> how many of its failure episodes a success ended; the tools that ever failed
        self.episodes: dict[str, int] = {}
        self.failed_tools: set[str] = set()
        # the latest state-changing successes, (tool call number, call): what may have fixed a
        # repeat is asked of them only when a repeat comes (loop_governor.policies.fixes)
        self.movers: deque[tuple[int, Any]] = deque(maxlen=MOVERS_KEPT)
        # How many times a tool that may change state succeeded in this task: a failure, a
        # warning or a count recorded in an earlier world describes the world as it was
        # (the agent may have fixed the cause: pressed the brake, logged in, edited a file).
        self.world = 0
        # tools withdrawn from the model for the rest of the task -> why (the step of the
        # escalation ladder before the stop: the next call of one ends the run)
        # tool -> (stop code, decision, until: the clock time an outage's withdrawal ends, or None)
        # (ladder.Withdrawal: code, decision, until, whether another tool's state change lifts it)
        self.withdrawn: dict[str, tuple[str, int | None, float | None, bool]] = {}
        # tool -> the world its failures since its last success began in (ladder)
        self.streaks: dict[str, int] = {}
        # withdrawn tools an adapter could not take out of the model's prompt (a text
        # prompt it could not edit): a call of one is refused, never a stop (ladder)
        self.listed: set[str] = set()
        self.known_bad = 0
        self.results: list[Any] = []
        self.results_saved = 0  # how many of ``results`` the checkpoint store already has
        # the calls a resume may answer from the checkpoint: those completed before this run
        # (not a call this run made: a poll, or a re-check after a fix, runs again)
        self.resumable: set[str] = set()
        self.started_at = 0.0
        self.checkpoint: TaskCheckpoint | None = None
        # Held while the checkpoint is recorded into and saved (Governor.update_checkpoint).
        self.checkpoint_lock = threading.RLock()
        self.tokens = 0
        self.cost = 0.0
        config = governor.config
        self.progress = ProgressGuard(
            config.no_progress_threshold, config.trivial_result_chars, config.escalation_repeats
        )
        self.cycles: Any = None  # cycles.CycleTracker, made on first use
        # escalation: what the model was told not to repeat -> (repeats since, the last
        # tool call id counted, the model decision it was told or last counted in, the
        # failure's error for an identical call, the tool call it last came at)
        self.told: dict[tuple[str, str], tuple[int, Any, int | None, str | None, int]] = {}
        # tool -> its entries of ``told`` about its availability (outage, breaker, rate
        # limit), which its next success ends: found without a scan of ``told``
        self.unavailable: dict[str, set[tuple[str, str]]] = {}
        # tool -> call key -> its entry of ``told`` about that identical call failing: the
        # call's own success ends it (found without a scan of ``told``)
        self.told_calls: dict[str, dict[str, tuple[str, str]]] = {}
        self.last_invocation: Any = None  # the tool call id of the task's last governed tool call
        self.bad_calls: Any = None  # known_bad.BadCalls, made at the task's first permanent failure
        self._token: Token[TaskScope | None] | None = None

    # Both context-manager protocols: ``with g.task(...)`` and ``async with g.task(...)``.
    def __enter__(self) -> TaskScope:
        if self._token is not None:
            raise RuntimeError(f"task scope {self.task_id!r} is already entered")
        self.started_at = self.governor.clock()
        self.known_bad = self.governor.store.known_bad_count(self.task_id)
        checkpoints = self.governor.checkpoints
        if checkpoints is not None:
            # Resume: completed calls, known-bad calls and sub-results come back.
            from loop_governor.checkpoint import TaskCheckpoint  # optional feature, loaded on demand

            loaded = checkpoints.load(self.task_id)
            if loaded is not None and not self._resumes(loaded):
                # A finished task's checkpoint does not answer a new run: start over.
                checkpoints.delete(self.task_id)
                loaded = None
            if loaded is not None:
                loaded.metadata.pop(FINISHED_KEY, None)  # running again: unfinished until it completes
            self.checkpoint = loaded or TaskCheckpoint(task_id=self.task_id)
            self.resumable = set(self.checkpoint.completed)
            self.results = self.checkpoint.results
            self.results_saved = len(self.results)
            self.steps = self.checkpoint.step
        self._token = _SCOPE.set(self)
        self.governor.emit("task_start", name=self.name)
        return self

    def _resumes(self, loaded: TaskCheckpoint) -> bool:
        """Whether a stored checkpoint answers this run: only if its task did not finish,
        unless ``resume`` says otherwise."""
        if self.resume is not None:
            return self.resume
        return loaded.metadata.get(FINISHED_KEY) is None

    def outcome(self, exc: BaseException | None = None) -> dict[str, Any]:
        """How the task ended, for ``task_end``: ``outcome`` is ``completed``, ``stopped``
        (a [`FatalError`][loop_governor.errors.FatalError]: the governor or a fatal failure ended it), ``failed``
        (another exception left the task), ``cancelled`` (a ``CancelledError``, a
        ``KeyboardInterrupt``, a closed generator: the run was ended from outside) or
        ``abandoned`` (an adapter saw the run end without learning how:
        `RunAbandoned`), with the error's class, code and
        redacted reason."""
        from loop_governor.policies.checkpointing import stop_fields

        stop: BaseException | None = self.stop
        if stop is None and isinstance(exc, FatalError):
            stop = exc
        if stop is not None:
            return {"outcome": "stopped", **stop_fields(stop)}
        if exc is not None and isinstance(exc, Exception):
            return {"outcome": "failed", **stop_fields(exc)}
        if exc is not None:  # cancelled, interrupted; or, from an adapter, a run that ended unseen
            reason = redact(str(exc))[:500] or "cancelled"
            outcome = "abandoned" if isinstance(exc, RunAbandoned) else "cancelled"
            return {"outcome": outcome, "error_class": type(exc).__name__, "code": None, "reason": reason}
        return {"outcome": "completed"}

    def partial_results(self) -> list[Any]:
        """What the task got done: the ``add_result`` values (redacted), then the latest
        successful tool results as ``{"tool": name, "result": text}`` (bounded, redacted); see
        [`FatalError`][loop_governor.errors.FatalError]."""
        # redacted here whatever the store: a checkpoint store keeps them redacted JSON,
        # without one they are the values as given (an object: its redacted JSON form)
        out = [redact_value(value, objects=True) for value in self.results]
        out.extend({"tool": tool, "result": _result_text(value)} for tool, value in list(self.tool_results))
        return out

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        gov = self.governor
        outcome = self.outcome(exc)
        if outcome["outcome"] == "completed" and self.checkpoint is not None:
            # kept, marked finished: a new run of the same task id starts over
            finished_at = gov.clock()
            gov.update_checkpoint(self, lambda cp: cp.metadata.__setitem__(FINISHED_KEY, finished_at))
        gov.emit("task_end", steps=self.steps, tool_calls=self.tool_calls, model_calls=self.model_calls, **outcome)
        if self._token is not None:
            try:
                _SCOPE.reset(self._token)
            except ValueError:
                # ended from another context than it was entered in (an adapter ending
                # the task of a run it saw end elsewhere): that context is done with it
                pass
            self._token = None
        gov.store.end_task(self.task_id)

    async def __aenter__(self) -> TaskScope:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    @contextlib.contextmanager
    def attached(self) -> Iterator[TaskScope]:
        """This (already open) scope as the current one for the block, without starting or
        ending it (see ``Governor.attach``)."""
        token = _SCOPE.set(self)
        try:
            yield self
        finally:
            _SCOPE.reset(token)

    @property
    def decision(self) -> int | None:
        """The model decision the current tool call carries out: the tool calls one model
        turn asked for (parallel calls) share it, and together they are one decision, never
        "N repeats". None when the task's model calls are not governed: then every tool call
        is a decision of its own."""
        return self.model_calls or None

    def calls_of(self, tool: str) -> int:
        return self.calls_by_tool.get(tool, 0)

    def count_call(self, tool: str) -> None:
        self.calls_by_tool[tool] = self.calls_by_tool.get(tool, 0) + 1

    def add_result(self, value: Any) -> None:
        """Keep a sub-task result: a stop (any [`FatalError`][loop_governor.errors.FatalError])
        hands it back first in ``partial_results``, and with a checkpoint store it is
        saved (JSON-checked, redacted) so a resume has it."""
        if self.checkpoint is None:
            self.results.append(value)
            return
        # JSON-checked, redacted; then saved so a resume has it
        self.governor.update_checkpoint(self, lambda cp: cp.add_result(value))
