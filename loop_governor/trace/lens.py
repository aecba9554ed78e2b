"""Agent Lens: the governor subscriber that records what the model saw and what the tools did.

Split in two halves because the governed call is a hot path (target: tracing adds at most
~10 us to it) while redaction, JSON encoding, file I/O and span export cost far more:

* on the caller's thread: enqueue the event as is (a plain tool call costs a sequence
  number, a clock read and a deque append); only model calls, failed tool calls and task
  ends are copied and judged under a lock — the prompt's messages are hashed now because
  the framework may mutate that list right after the call — and run the detectors;
* on one writer thread, woken every ``flush_interval_s`` (or when a batch piles up) rather
  than per event — a per-event wake-up costs a thread switch, more than the work itself:
  redact, serialize, append to the JSONL trace and snapshot store, build the spans.

A failing sink never breaks the agent: every sink call is guarded, failures are counted
in [`Lens.failures`][loop_governor.trace.lens.Lens.failures] and logged once per sink.

Memory stays bounded over any number of tasks: every long-lived cache has a byte budget
([`TraceBudget`][loop_governor.trace.budget.TraceBudget]) and per-task state (detectors, open
spans) is dropped at ``task_end``; [`Lens.memory`][loop_governor.trace.lens.Lens.memory] reports what each cache holds.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace

from loop_governor.trace.budget import TraceBudget
from loop_governor.trace.detectors import DetectorConfig, Detectors
from loop_governor.trace.otel import SpanBridge
from loop_governor.trace.records import MessageHasher, Redactor
from loop_governor.trace.store import JsonlWriter

log = logging.getLogger(__name__)

# Records serialized with one reusable encoder (building one per dumps call costs ~1 us).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)

_Item = tuple[Mapping[str, Any], int, "list[tuple[str, Any]] | None", int, "otel_context.Context | None"]

# Events the detectors look at (plus failed tool calls): the rest skip the lock.
_JUDGED = frozenset({"model_call", "task_end", "anomaly"})


class _Governor(Protocol):
    def subscribe(self, fn: Callable[[dict[str, Any]], None], *, raw: bool = ...) -> Any: ...

    def emit(self, event: str, **fields: Any) -> Any: ...


class Lens:
    """Subscriber turning governor events into a JSONL trace, OTel spans and anomalies.

    ``emit`` is how anomalies are published (normally ``governor.emit``, so every
    subscriber sees them); without it they are fed straight back into this Lens.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        emit: Callable[..., Any] | None = None,
        detectors: DetectorConfig | None = None,
        spans: bool = True,
        max_pending: int = 100_000,
        flush_interval_s: float = 0.05,
        wake_batch: int = 2048,
        budget: TraceBudget | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        # Every record this Lens writes carries it: runs appended to one trace file stay
        # apart in the report (turns numbered per run, not 1,2,3,1,2 across runs).
        self.run_id = uuid.uuid4().hex[:12]
        self.budget = budget = budget or TraceBudget()
        self._writer = JsonlWriter(self.path, budget) if self.path is not None else None
        self._bridge = SpanBridge(tracer_provider) if spans else None
        self._detectors = Detectors(detectors)
        # Messages are long and redacted once each (the hasher's memo is the cache); only
        # the record redactor memoizes strings.
        self._hasher = MessageHasher(Redactor(budget=0), budget.snapshot_memo)
        self._record_redactor = Redactor(budget.record_memo)
        self._emit = emit
        self._max_pending = max_pending
        self._interval = flush_interval_s
        self._wake_batch = wake_batch
        self._lock = threading.Lock()
        self._fail_lock = threading.Lock()
        # deque append/popleft are atomic: the caller and the writer need no shared lock.
        self._pending: deque[Any] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopping = False
        self._seq = itertools.count()
        self._failures: dict[str, int] = {}
        self._last_errors: dict[str, str] = {}
        self._anomalies: deque[tuple[dict[str, Any], int]] = deque()
        self._anomaly_bytes = 0
        self.anomalies_dropped = 0
        """Anomalies no longer in :attr:`anomalies` (the oldest, beyond ``budget.anomalies``)."""
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- reporting -----------------------------------------------------------------
    @property
    def snapshot_path(self) -> Path | None:
        return self._writer.snapshot_path if self._writer is not None else None

    @property
    def failures(self) -> dict[str, int]:
        """Failure counts per sink ("jsonl", "otel", "detectors", "emit", "dropped", "lens")."""
        return dict(self._failures)

    @property
    def last_errors(self) -> dict[str, str]:
        """The most recent exception text per failing sink."""
        return dict(self._last_errors)

    @property
    def anomalies(self) -> list[dict[str, Any]]:
        """Anomaly events seen so far (from the detectors or any other emitter), oldest
        first; the most recent ``budget.anomalies`` bytes of them (the trace has them all)."""
        with self._lock:
            return [a for a, _ in self._anomalies]

    def memory(self) -> dict[str, tuple[int, int]]:
        """Estimated bytes each long-lived cache holds, with its budget: ``{name: (held, budget)}``."""
        b = self.budget
        with self._lock:
            out = {
                "snapshot_memo": (self._hasher.memo.bytes, b.snapshot_memo),
                "record_memo": (self._record_redactor.bytes, b.record_memo),
                "anomalies": (self._anomaly_bytes, b.anomalies),
            }
        if self._writer is not None:
            out["stored_hashes"] = (self._writer.stored_bytes, b.stored_hashes)
        return out

    def _keep_anomaly(self, event: Mapping[str, Any]) -> None:
        """Remember an anomaly for [`anomalies`][loop_governor.trace.lens.Lens.anomalies] within the byte budget (under
        the lock)."""
        anomaly = dict(event)
        size = len(_ENCODER.encode(anomaly)) + 200  # the dict and its values, roughly
        self._anomalies.append((anomaly, size))
        self._anomaly_bytes += size
        while self._anomaly_bytes > self.budget.anomalies and self._anomalies:
            _, dropped = self._anomalies.popleft()
            self._anomaly_bytes -= dropped
            self.anomalies_dropped += 1

    def _fail(self, sink: str, exc: BaseException) -> None:
        with self._fail_lock:  # called from the caller threads and the writer thread
            first = sink not in self._failures
            self._failures[sink] = self._failures.get(sink, 0) + 1
            self._last_errors[sink] = f"{type(exc).__name__}: {exc}"
        if first:
            log.warning(
                "loop-governor trace sink %r failed (%s); the agent continues, "
                "further failures are counted in Lens.failures",
                sink,
                self._last_errors[sink],
            )

    # -- caller side ---------------------------------------------------------------
    def __call__(self, event: Mapping[str, Any]) -> None:
        """Subscriber entry point. Never raises."""
        try:
            anomalies = self._ingest(event)
        except Exception as exc:
            self._fail("lens", exc)
            return
        for fields in anomalies:
            self._publish(fields, event.get("task_id"))

    def _ingest(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        now = time.time_ns()
        kind = event.get("event")
        seq = next(self._seq)  # atomic under the GIL: unique, in order per thread
        # The caller's OTel context parents the task span (and spans outside any task);
        # inside a task the task span is the parent, so skip the lookup on the hot path.
        ambient = None
        if self._bridge is not None and (kind == "task_start" or event.get("task_id") is None):
            ambient = otel_context.get_current()
        # The governor hands every subscriber the same dict: never mutate it. A plain tool
        # call is queued as is (the writer makes the redacted copy); only events carrying
        # messages, or judged by the detectors, are copied and handled under the lock.
        record: Mapping[str, Any] = event
        snapshots: list[tuple[str, Any]] | None = None
        found: list[dict[str, Any]] = []
        if kind in _JUDGED or "messages" in event or (kind == "tool_call" and event.get("status") == "error"):
            with self._lock:
                record, snapshots, found = self._judge(kind, event)
        if self._closed or (self._writer is None and self._bridge is None):
            return found
        pending = len(self._pending)
        if pending >= self._max_pending:
            self._fail("dropped", RuntimeError("trace writer queue full; event dropped"))
            return found
        if self._thread is None:
            self._start_writer()
        self._pending.append((record, seq, snapshots, now, ambient))
        if pending >= self._wake_batch or snapshots is not None:
            self._wake.set()  # a big batch, or a model call: write it now
        return found

    def _judge(
        self, kind: Any, event: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[str, Any]] | None, list[dict[str, Any]]]:
        """Hash the prompt and run the detectors (caller's thread, under the lock)."""
        record = dict(event)
        snapshots: list[tuple[str, Any]] | None = None
        messages = record.pop("messages", None)
        if isinstance(messages, list):
            snapshots = [self._hasher.digest(m) for m in messages]
            record["message_hashes"] = [h for h, _ in snapshots]
        found: list[dict[str, Any]] = []
        try:
            if kind == "tool_call":
                found = self._detectors.on_tool_call(record)
            elif kind == "model_call":
                hashes = record.get("message_hashes") or []
                seen = [m for _, m in snapshots] if snapshots else []
                turn, health, prefix, found = self._detectors.on_model_call(record, hashes, seen)
                record["turn"] = turn
                record["prefix_kept"] = prefix
                if health is not None:
                    record["context_health"] = health
            elif kind == "task_end":
                self._detectors.end_task(record.get("task_id"))
            elif kind == "anomaly":
                self._keep_anomaly(event)
        except Exception as exc:
            self._fail("detectors", exc)
        return record, snapshots, found

    def _start_writer(self) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="loop-governor-lens", daemon=True)
                thread.start()
                self._thread = thread

    def _publish(self, fields: dict[str, Any], task_id: Any) -> None:
        if self._emit is not None:
            try:
                # task_id explicitly: the triggering event may come from a thread (CrewAI's
                # event bus) where the governor's task contextvar is not set.
                self._emit("anomaly", task_id=task_id, **fields)
                return
            except Exception as exc:
                self._fail("emit", exc)
        self({"event": "anomaly", "ts": time.time(), "task_id": task_id, **fields})

    # -- writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        pending = self._pending
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            wrote = False
            while pending:
                item = pending.popleft()
                if isinstance(item, threading.Event):  # a flush() marker
                    self._flush_writer()
                    item.set()
                    continue
                try:
                    self._process(item)
                    wrote = True
                except Exception as exc:  # never let the writer thread die
                    self._fail("lens", exc)
            if wrote:
                self._flush_writer()
            if self._stopping and not pending:
                return

    def _process(self, item: _Item) -> None:
        record, seq, snapshots, now, ambient = item
        clean = self._record_redactor.record(record)
        clean["seq"] = seq
        clean["run_id"] = self.run_id
        if self._writer is not None:
            try:
                if snapshots:
                    self._writer.store(snapshots)
                self._writer.write(_ENCODER.encode(clean))
            except Exception as exc:
                self._fail("jsonl", exc)
        if self._bridge is not None:
            try:
                self._bridge.handle(clean, now, ambient)
            except Exception as exc:
                self._fail("otel", exc)

    def _flush_writer(self) -> None:
        if self._writer is not None:
            try:
                self._writer.flush()
            except Exception as exc:
                self._fail("jsonl", exc)

    # -- lifecycle -------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything received so far is written and handed to the span processor."""
        if self._thread is None or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Flush, stop the writer thread, end spans of unfinished tasks, close the files."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._stopping = True
            self._wake.set()
            thread.join(timeout)
        if self._bridge is not None:
            try:
                self._bridge.close(time.time_ns())
            except Exception as exc:
                self._fail("otel", exc)
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception as exc:
                self._fail("jsonl", exc)

    def __enter__(self) -> Lens:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_at_exit(ref: weakref.ref[Lens]) -> None:
    lens = ref()
    if lens is not None:
        lens.close(timeout=2.0)


def install(
    governor: _Governor,
    path: str | Path | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    *,
    detectors: DetectorConfig | None = None,
    spans: bool = True,
    budget: TraceBudget | None = None,
) -> Lens:
    """Attach a [`Lens`][loop_governor.trace.lens.Lens] to ``governor``: JSONL trace at ``path`` (if given), OTel spans
    through ``tracer_provider`` (default: the global one), anomalies emitted on the governor;
    ``budget`` bounds its caches in bytes."""
    lens = Lens(path, tracer_provider, emit=governor.emit, detectors=detectors, spans=spans, budget=budget)
    # raw: the Lens redacts in its writer thread (records.Redactor), off the agent's path
    governor.subscribe(lens, raw=True)
    return lens
