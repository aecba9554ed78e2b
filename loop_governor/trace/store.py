"""The embedded trace: a JSONL event file plus a content-addressed message store beside it.

Layout for ``trace.jsonl``:

    trace.jsonl             one JSON record per line; line 1 is a header naming the store
    trace.snapshots.jsonl   {"hash": ..., "message": {...}} — each distinct message once

A model-call record carries ``message_hashes`` instead of the messages, so a 50-turn run
stores its growing conversation once instead of 50 times, and
[`rebuild_prompt`][loop_governor.trace.store.rebuild_prompt] gives back the exact (redacted) prompt of any turn.
Snapshot lines are flushed before the record that references them, so a reader never meets a dangling hash. Both files
are append-only and re-opening an existing trace continues it.

A trace is read back after crashes and from other tools' hands, so the reader trusts no
line: a line cut short by a killed writer (half a UTF-8 sequence included), random bytes,
nesting too deep to walk, or a record whose fields have the wrong types (a list as task
id, ``message_hashes: [[1]]``, an integer too large for a chart) is skipped and counted,
never raised.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from loop_governor.trace.budget import BoundedMemo, TraceBudget

TRACE_FORMAT = "loop-governor-trace"
TRACE_VERSION = 1

# What one remembered hash costs in JsonlWriter's dedup memo: a 32-char str (~81 bytes) and
# its OrderedDict node and tuple (~100 bytes).
_HASH_ENTRY_BYTES = 184


def snapshot_path_for(path: str | Path) -> Path:
    """Where the snapshot store of trace ``path`` lives (``x.jsonl`` -> ``x.snapshots.jsonl``)."""
    p = Path(path)
    if p.suffix == ".jsonl":
        return p.with_suffix(".snapshots.jsonl")
    return p.with_name(p.name + ".snapshots.jsonl")


class JsonlWriter:
    """Appends records and snapshots. Not thread-safe: the Lens's writer thread owns it."""

    def __init__(self, path: str | Path, budget: TraceBudget | None = None) -> None:
        self.path = Path(path)
        self.snapshot_path = snapshot_path_for(self.path)
        self._trace: IO[str] | None = None
        self._snapshots: IO[str] | None = None
        # The hashes the store holds, bounded: a hash evicted and met again is written again
        # (readers keep one copy), never the other way round — a false "stored" would leave
        # a prompt that cannot be rebuilt.
        self._stored: BoundedMemo[str, None] = BoundedMemo((budget or TraceBudget()).stored_hashes)

    @property
    def stored_bytes(self) -> int:
        """Estimated bytes of the dedup memo (<= ``TraceBudget.stored_hashes``)."""
        return self._stored.bytes

    def _open(self) -> tuple[IO[str], IO[str]]:
        if self._trace is not None and self._snapshots is not None:
            return self._trace, self._snapshots
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.snapshot_path.is_file():
            # Continuing a trace: keep the store content-addressed across sessions.
            for digest, _ in _read_snapshots(self.snapshot_path):
                self._stored.put(digest, None, _HASH_ENTRY_BYTES)
        self._snapshots = _open_for_append(self.snapshot_path)  # kept open: appended to per record
        self._trace = _open_for_append(self.path)  # kept open: appended to per record
        if self._trace.tell() == 0:
            header = {
                "event": "trace_header",
                "format": TRACE_FORMAT,
                "version": TRACE_VERSION,
                "snapshots": self.snapshot_path.name,
            }
            self._trace.write(json.dumps(header, separators=(",", ":")) + "\n")
        return self._trace, self._snapshots

    def store(self, snapshots: list[tuple[str, Any]]) -> None:
        """Write the messages whose hash the store does not hold yet, then flush them."""
        _, out = self._open()
        wrote = False
        for digest, message in snapshots:
            if self._stored.touch(digest):
                continue
            out.write(json.dumps({"hash": digest, "message": message}, ensure_ascii=False) + "\n")
            self._stored.put(digest, None, _HASH_ENTRY_BYTES)
            wrote = True
        if wrote:
            out.flush()

    def write(self, line: str) -> None:
        trace, _ = self._open()
        trace.write(line)
        trace.write("\n")

    def flush(self) -> None:
        for fh in (self._snapshots, self._trace):
            if fh is not None:
                fh.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            for fh in (self._snapshots, self._trace):
                if fh is not None:
                    fh.close()
            self._trace = self._snapshots = None


def _open_for_append(path: Path) -> IO[str]:
    """Open ``path`` to append lines, first ending a last line a killed writer cut short.

    Appending straight after a partial line would glue the next record onto it, and the
    reader would skip both (for the snapshot store: a message whose hash the writer
    believes stored, so every prompt using it could never be rebuilt).
    """
    # backslashreplace: a lone surrogate (a filename decoded with surrogateescape) inside
    # a JSON string becomes its \\udcXX escape, which reads back as the same string.
    fh = open(path, "a", encoding="utf-8", errors="backslashreplace")
    try:
        if fh.tell() > 0:
            with open(path, "rb") as raw:
                raw.seek(-1, os.SEEK_END)
                cut = raw.read(1) != b"\n"
            if cut:
                fh.write("\n")
    except BaseException:
        fh.close()
        raise
    return fh


_MAX_DEPTH = 100  # chat messages nest ~10 deep; deeper is damage (and would exhaust the stack)
_MAX_INT = 1 << 63  # beyond this no counter or timestamp is real, and floats overflow on it


def _depth_ok(value: Any) -> bool:
    """Whether ``value`` nests at most ``_MAX_DEPTH`` containers deep (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > _MAX_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _read_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_no, value)``; a damaged line yields ``(line_no, None)``.

    Damaged: not UTF-8 (a writer killed mid-character), not JSON (cut short, random bytes),
    an integer JSON refuses (over 4300 digits), or nested deeper than ``_MAX_DEPTH``.
    Lines are decoded one by one, so one bad byte costs one line, not the trace.
    """
    with open(path, "rb") as fh:
        for no, raw in enumerate(fh, 1):
            raw = raw.strip()
            if not raw:
                continue
            try:
                value = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                yield no, None
                continue
            yield no, value if _depth_ok(value) else None


def _read_snapshots(path: Path, damaged: list[int] | None = None) -> Iterator[tuple[str, Any]]:
    for no, value in _read_lines(path):
        if isinstance(value, dict) and isinstance(value.get("hash"), str) and "message" in value:
            yield value["hash"], value.get("message")
        elif damaged is not None:
            damaged.append(no)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_MAX_INT <= value <= _MAX_INT


def _is_real(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_int(value)


# Record fields the readers (report, rebuild_prompt, detectors) compute with, and the types
# they must have when present; other fields are only ever shown as text.
_INT_FIELDS = (
    "seq",
    "turn",
    "attempts",
    "attempt",
    "steps",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "prefix_kept",
    "tokens_before",
    "tokens_after",
    "messages_before",
    "messages_after",
)
_REAL_FIELDS = ("ts", "latency_s", "duration_s", "delay_s", "context_health")
_ID_TYPES = (str, int, float, bool)


def _valid_record(value: Any) -> bool:
    """Whether a parsed trace line is a record the readers can use as it is."""
    if not isinstance(value, dict) or not isinstance(value.get("event"), str):
        return False
    for name in ("task_id", "turn"):
        item = value.get(name)
        if item is not None and not isinstance(item, _ID_TYPES):
            return False  # used as dict keys: must be hashable scalars
    for name in _INT_FIELDS:
        item = value.get(name)
        if item is not None and not _is_int(item):
            return False
    for name in _REAL_FIELDS:
        item = value.get(name)
        if item is not None and not _is_real(item):
            return False
    hashes = value.get("message_hashes")
    return hashes is None or (isinstance(hashes, list) and all(isinstance(h, str) for h in hashes))


@dataclass
class Trace:
    """A loaded trace: its events in order and the message store."""

    path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[str, Any] = field(default_factory=dict)
    header: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0
    """Trace lines skipped: damaged (cut short, not UTF-8, not JSON) or type-confused."""
    skipped_snapshot_lines: int = 0
    """Snapshot-store lines skipped for the same reasons (their messages show as missing)."""

    def of(self, kind: str) -> list[dict[str, Any]]:
        """Events whose ``event`` field is ``kind`` (e.g. ``"model_call"``)."""
        return [e for e in self.events if e.get("event") == kind]

    @property
    def model_calls(self) -> list[dict[str, Any]]:
        return self.of("model_call")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.of("tool_call")

    @property
    def anomalies(self) -> list[dict[str, Any]]:
        return self.of("anomaly")


def load_trace(path: str | Path) -> Trace:
    """Read a JSONL trace and its snapshot store (named by the header, else the default).

    Never fails on content: damaged and type-confused lines are skipped and counted in
    [`Trace.skipped_lines`][loop_governor.trace.store.Trace.skipped_lines] /
    [`Trace.skipped_snapshot_lines`][loop_governor.trace.store.Trace.skipped_snapshot_lines]. (A ``path`` that cannot be
    opened at all still raises ``OSError``.)
    """
    p = Path(path)
    trace = Trace(path=p)
    for _, value in _read_lines(p):
        if isinstance(value, dict) and value.get("event") == "trace_header":
            trace.header = value
        elif _valid_record(value):
            trace.events.append(value)
        else:
            trace.skipped_lines += 1
    store = snapshot_path_for(p)
    name = trace.header.get("snapshots")
    if isinstance(name, str) and "/" not in name and "\\" not in name:
        try:
            named = p.with_name(name)
        except ValueError:  # "", ".", ".." name no file
            named = store
        if _is_file(named):
            store = named
    if _is_file(store):
        damaged: list[int] = []
        try:
            trace.snapshots = dict(_read_snapshots(store, damaged))
        except OSError:
            damaged.append(0)  # unreadable as a whole: the prompts show their messages as missing
        trace.skipped_snapshot_lines = len(damaged)
    return trace


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def rebuild_prompt(trace: Trace, event: dict[str, Any]) -> list[Any]:
    """The messages the model saw at ``event`` (a model-call record), in order, redacted."""
    hashes = event.get("message_hashes")
    if not isinstance(hashes, list):
        raise ValueError(f"event {event.get('event')!r} #{event.get('seq')} records no message hashes")
    missing = [h for h in hashes if h not in trace.snapshots]
    if missing:
        raise KeyError(f"{len(missing)} message(s) missing from the snapshot store, first {missing[0]}")
    return [trace.snapshots[h] for h in hashes]
