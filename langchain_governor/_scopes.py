"""Task scopes that span a whole LangGraph run -- and end however the run ends.

A governor task (budgets, known-bad calls, the repeated-error guard, ``max_steps``) must
cover every model and tool call of one agent run. LangGraph runs each node in its own
copy of the context, so a ``with governor.task(...)`` opened inside one node is gone in
the next, and leaving it ends the task (the store forgets the task's state). So the
adapter keeps one live [`loop_governor.TaskScope`][loop_governor.task.TaskScope] per task id, entered once in a
context of its own, attaches it to each node while that node runs, and ends it when the
run ends:

* normally, in the agent's ``after_agent`` node;
* by an exception, a ``CancelledError`` or a ``KeyboardInterrupt`` raised inside one of
  the governor's nodes (the middleware's ``_scope``), with that outcome;
* without a word to the governor -- LangGraph's ``GraphRecursionError`` (raised between
  steps), a stream its consumer stopped reading, a cancellation between two nodes, an
  exception in another middleware's node. LangGraph gives a run no end hook a
  middleware can use, but every node of one run shares the run's ``stream_writer``
  (one function object per ``stream``/``invoke`` call, and freed with it): a weak
  reference to it tells when the run is gone. A run without a checkpointer cannot
  resume, so its task ends then. A checkpointed run may only be paused at an interrupt
  (which may happen in another middleware's node): its checkpointer says so (an
  ``__interrupt__`` write pending on the thread's latest checkpoint), and then the task
  waits for the resume; otherwise it ends, with the error the checkpoint recorded if
  there is one. Where the checkpointer cannot be asked from there (an async-only saver
  called from its event loop), the thread's next run ends it
  ([`LiveTasks.begin`][langchain_governor._scopes.LiveTasks.begin]).

A run paused by an interrupt inside the governor's nodes keeps its task: resuming the
thread continues with the same known-bad memory and budgets.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import gc
import queue
import re
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any

from langgraph.errors import GraphRecursionError

import loop_governor as lg
from loop_governor.adapter import RunAbandoned

__all__ = ["LiveTasks", "RunAbandoned", "RunInfo"]




class RunInfo:
    """What a node knows of the run it belongs to: a handle on the run (its
    ``stream_writer``), the LangGraph step it runs at, the run's recursion limit, and
    where the run's checkpoints are (checkpointer and config, for a run with a thread)."""

    __slots__ = ("checkpoint", "handle", "limit", "step")

    def __init__(
        self, handle: Any, step: int | None, limit: int | None, checkpoint: tuple[Any, dict[str, Any]] | None
    ) -> None:
        self.handle = handle
        self.step = step
        self.limit = limit
        self.checkpoint = checkpoint


class RunFailed(Exception):
    """How a task ends whose run failed in a node the governor does not run (the error
    its checkpoint recorded): never raised, only reported."""


_PAUSED = "paused"


# Set while the cyclic garbage collector runs on this thread. A run freed by a collection
# (its frames in a cycle, as an exception's traceback often makes them) is not ended there:
# ending a task takes locks the code the collection interrupted may hold. It is handed to
# one sweeper thread instead, through a SimpleQueue (whose put is safe in a weakref
# callback); a run freed by its last reference going away is ended at once.
_collecting = threading.local()


def _gc_phase(phase: str, _info: dict[str, Any]) -> None:
    _collecting.on = phase == "start"


gc.callbacks.append(_gc_phase)

_to_sweep: queue.SimpleQueue[weakref.ref[LiveTasks]] = queue.SimpleQueue()
_sweeper_lock = threading.Lock()
_sweeper: threading.Thread | None = None


def _sweep_forever() -> None:
    while True:
        live = _to_sweep.get()()
        if live is not None:
            try:
                live._sweep()
            except Exception:  # a task's end failing must not stop the others'
                continue


def _start_sweeper() -> None:
    global _sweeper
    with _sweeper_lock:
        if _sweeper is None:
            _sweeper = threading.Thread(target=_sweep_forever, name="loop-governor-run-sweeper", daemon=True)
            _sweeper.start()


class _Live:
    """One live task: its scope, the private context it was entered in, and its run."""

    __slots__ = ("checkpoint", "first_step", "home", "last_step", "limit", "paused", "run", "scope")

    def __init__(self, scope: lg.TaskScope, home: contextvars.Context) -> None:
        self.scope = scope
        self.home = home
        self.run: weakref.ref[Any] | None = None  # the run's stream_writer, while it lives
        self.paused = False  # an interrupt inside the governor's nodes paused the run
        self.checkpoint: tuple[Any, dict[str, Any]] | None = None  # (checkpointer, thread config)
        self.first_step: int | None = None  # the step of the run's before_agent
        self.limit: int | None = None  # the run's recursion_limit
        self.last_step: int | None = None  # the latest step a governor node ran at

    def hit_recursion_limit(self) -> bool:
        """Whether the run's last node ran at the last step its recursion limit allows
        (measured on LangGraph 1.2: the before_agent step - 1 + recursion_limit)."""
        if self.first_step is None or self.limit is None or self.last_step is None:
            return False
        return self.last_step >= self.first_step - 1 + self.limit


class LiveTasks:
    """Live task scopes by id for one governor (thread-safe).

    ``on_end(task_id)`` runs after each task ends (the middleware drops its pruner).
    How the latest tasks ended is kept (bounded) for the answers to tool calls a run
    left pending (`ended_how`)."""

    def __init__(
        self, governor: lg.Governor, resume: bool | None = None, on_end: Callable[[str], None] | None = None
    ) -> None:
        self.governor = governor
        self.resume = resume
        self._on_end = on_end
        self._lock = threading.RLock()
        self._live: dict[str, _Live] = {}
        self._gone: deque[tuple[str, weakref.ref[Any]]] = deque()  # runs freed meanwhile
        self._ended: OrderedDict[str, str] = OrderedDict()  # task id -> how it ended, latest last
        self._me = weakref.ref(self)
        _start_sweeper()

    def __len__(self) -> int:
        """How many tasks are live (a run's task is live from its first node to its end)."""
        self._sweep()
        return len(self._live)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._live

    def scope(self, task_id: str, name: Callable[[], str | None] | None = None) -> lg.TaskScope:
        """The live scope for ``task_id``, opened (task_start) on first use, named by
        ``name()`` then (asked only then: what a person reads for the task)."""
        return self._entry(task_id, name).scope

    def _entry(self, task_id: str, name: Callable[[], str | None] | None = None) -> _Live:
        with self._lock:
            entry = self._live.get(task_id)
            if entry is None:
                # Entered in a private, empty context: its token stays valid there, so the
                # scope can be exited later from whichever node ends the run (a copy of
                # the node's context would hold the run's config, so the run, alive).
                home = contextvars.Context()
                scope = self.governor.task(task_id, name=name() if name else None, resume=self.resume)
                home.run(scope.__enter__)
                entry = _Live(scope, home)
                self._live[task_id] = entry
            return entry

    # -- a run's nodes ---------------------------------------------------------------------

    def begin(self, task_id: str, run: RunInfo, name: Callable[[], str | None] | None = None) -> None:
        """A new run of ``task_id`` starts (its ``before_agent``): a task an earlier run
        left live (that run ended without a word) ends first, then this run's opens."""
        self._sweep()
        with self._lock:
            stale = self._live.get(task_id)
        if stale is not None and (stale.run is None or stale.run() is not run.handle):
            self.end(task_id, self._abandoned(stale))
        entry = self._entry(task_id, name)
        with self._lock:
            self._bind(task_id, entry, run)
            entry.first_step, entry.limit = run.step, run.limit

    @contextlib.contextmanager
    def attached(
        self, task_id: str, run: RunInfo | None = None, name: Callable[[], str | None] | None = None
    ) -> Iterator[lg.TaskScope]:
        """Make the task current for the duration of one node (or one handler call)."""
        self._sweep()
        entry = self._entry(task_id, name)
        if run is not None:
            with self._lock:
                self._bind(task_id, entry, run)
                if run.step is not None and (entry.last_step is None or run.step > entry.last_step):
                    entry.last_step = run.step
        with self.governor.attach(entry.scope) as scope:
            yield scope

    def pause(self, task_id: str) -> None:
        """An interrupt paused the run: its task waits for the resume."""
        with self._lock:
            entry = self._live.get(task_id)
            if entry is not None:
                entry.paused = True

    def _bind(self, task_id: str, entry: _Live, run: RunInfo) -> None:
        """Follow ``run`` (held by the lock): the task ends when it is gone (module doc)."""
        if run.handle is None or (entry.run is not None and entry.run() is run.handle):
            return
        try:
            entry.run = weakref.ref(run.handle, functools.partial(self._run_gone, task_id))
        except TypeError:  # not weakly referenceable: the next run of the thread ends the task
            entry.run = None
        entry.paused = False  # a resumed run
        entry.checkpoint = run.checkpoint

    def _run_gone(self, task_id: str, ref: weakref.ref[Any]) -> None:
        self._gone.append((task_id, ref))
        if getattr(_collecting, "on", False):
            _to_sweep.put(self._me)
        else:
            self._sweep()

    def _sweep(self) -> None:
        """End the tasks of runs that are gone (see the module doc for which)."""
        while self._gone:
            try:
                task_id, ref = self._gone.popleft()
            except IndexError:
                return
            with self._lock:
                entry = self._live.get(task_id)
                if entry is None or entry.run is not ref or entry.paused:
                    continue
            how = self._abandoned(entry) if entry.checkpoint is None else _checkpointed_end(entry)
            if isinstance(how, BaseException):  # (None: cannot tell; "paused": keep it)
                self.end(task_id, how)

    @staticmethod
    def _abandoned(entry: _Live) -> BaseException:
        if entry.hit_recursion_limit():
            return GraphRecursionError(f"Recursion limit of {entry.limit} reached without hitting a stop condition.")
        return RunAbandoned("the run ended before the agent finished (a stream closed early, a cancellation)")

    # -- the end -----------------------------------------------------------------------------

    def end(self, task_id: str, exc: BaseException | None = None) -> None:
        """End the task (task_end, whose ``outcome`` says how: ``exc`` is what ended the
        run, if anything; the store drops its per-task state)."""
        with self._lock:
            entry = self._live.pop(task_id, None)
        if entry is None:
            return
        scope = entry.scope
        how = scope.outcome(exc)
        try:
            entry.home.run(scope.__exit__, type(exc) if exc is not None else None, exc, None)
        finally:
            with self._lock:
                self._ended[task_id] = str(how.get("reason") or how["outcome"])
                self._ended.move_to_end(task_id)
                while len(self._ended) > 1024:
                    self._ended.popitem(last=False)
            if self._on_end is not None:
                self._on_end(task_id)

    def ended_how(self, task_id: str) -> str | None:
        """How the latest task of this id ended (a stop's reason, "cancelled", ...), if
        this object ended it."""
        with self._lock:
            return self._ended.get(task_id)


def _checkpointed_end(entry: _Live) -> BaseException | str | None:
    """How a checkpointed run that the governor did not see end ended, from its latest
    checkpoint: paused at an interrupt (``"paused"``), failed in a node (the error it
    recorded), else as `LiveTasks._abandoned` says; None when the checkpointer
    cannot be asked here."""
    assert entry.checkpoint is not None
    saver, config = entry.checkpoint
    if entry.hit_recursion_limit():
        return LiveTasks._abandoned(entry)
    try:
        latest = saver.get_tuple(config)
    except Exception:  # e.g. an async saver refusing a sync call from its own event loop
        return None
    writes = list(getattr(latest, "pending_writes", None) or ())
    if any(w[1] == _INTERRUPT for w in writes):
        return _PAUSED
    for _, channel, value in writes:
        if channel == _ERROR:
            return _failed(str(value))
    return LiveTasks._abandoned(entry)


_failed_classes: dict[str, type[RunFailed]] = {}


def _failed(text: str) -> RunFailed:
    """The recorded error (its ``repr``, e.g. ``ToolCallLimitExceededError('...')``) as a
    `RunFailed` named like it, so ``task_end`` names the class that ended the run."""
    match = re.match(r"([A-Za-z_]\w*)\((.*)\)$", text.strip(), re.S)
    name, message = (match.group(1), match.group(2).strip("'\"")) if match else ("RunFailed", text)
    cls = _failed_classes.get(name)
    if cls is None:
        cls = _failed_classes.setdefault(name, type(name, (RunFailed,), {"__module__": __name__}))
    return cls(message[:500])


# LangGraph's channel names for a node's error and an interrupt in a checkpoint's pending
# writes (langgraph._internal._constants: internal, hence the literals).
_ERROR = "__error__"
_INTERRUPT = "__interrupt__"
