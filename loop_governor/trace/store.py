"""The embedded trace: a JSONL event file plus a content-addressed message store beside it.

Layout for ``trace.jsonl``::

    trace.jsonl             one JSON record per line; line 1 is a header naming the store
    trace.snapshots.jsonl   {"hash": ..., "message": {...}} — each distinct message once

A model-call record carries ``message_hashes`` instead of the messages, so a 50-turn run
stores its growing conversation once instead of 50 times, and :func:`rebuild_prompt` gives
back the exact (redacted) prompt of any turn. Snapshot lines are flushed before the record
that references them, so a reader never meets a dangling hash. Both files are append-only
and re-opening an existing trace continues it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

TRACE_FORMAT = "loop-governor-trace"
TRACE_VERSION = 1


def snapshot_path_for(path: str | Path) -> Path:
    """Where the snapshot store of trace ``path`` lives (``x.jsonl`` -> ``x.snapshots.jsonl``)."""
    p = Path(path)
    if p.suffix == ".jsonl":
        return p.with_suffix(".snapshots.jsonl")
    return p.with_name(p.name + ".snapshots.jsonl")


class JsonlWriter:
    """Appends records and snapshots. Not thread-safe: the Lens's writer thread owns it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.snapshot_path = snapshot_path_for(self.path)
        self._trace: IO[str] | None = None
        self._snapshots: IO[str] | None = None
        self._stored: set[str] = set()

    def _open(self) -> tuple[IO[str], IO[str]]:
        if self._trace is not None and self._snapshots is not None:
            return self._trace, self._snapshots
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.snapshot_path.exists():
            # Continuing a trace: keep the store content-addressed across sessions.
            self._stored.update(h for h, _ in _read_snapshots(self.snapshot_path))
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
            if digest in self._stored:
                continue
            out.write(json.dumps({"hash": digest, "message": message}, ensure_ascii=False) + "\n")
            self._stored.add(digest)
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
    fh = open(path, "a", encoding="utf-8")
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


def _read_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_no, value)``; a line that is not JSON yields ``(line_no, None)``.

    The last line of a trace written by a killed process may be cut short; readers skip it
    and count it rather than refuse the whole trace.
    """
    with open(path, encoding="utf-8") as fh:
        for no, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield no, json.loads(line)
            except json.JSONDecodeError:
                yield no, None


def _read_snapshots(path: Path) -> Iterator[tuple[str, Any]]:
    for _, value in _read_lines(path):
        if isinstance(value, dict) and isinstance(value.get("hash"), str) and "message" in value:
            yield value["hash"], value.get("message")


@dataclass
class Trace:
    """A loaded trace: its events in order and the message store."""

    path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[str, Any] = field(default_factory=dict)
    header: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0

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
    """Read a JSONL trace and its snapshot store (named by the header, else the default)."""
    p = Path(path)
    trace = Trace(path=p)
    for _, value in _read_lines(p):
        if not isinstance(value, dict):
            trace.skipped_lines += 1
        elif value.get("event") == "trace_header":
            trace.header = value
        else:
            trace.events.append(value)
    name = trace.header.get("snapshots")
    store = p.with_name(name) if isinstance(name, str) and "/" not in name else snapshot_path_for(p)
    if store.exists():
        trace.snapshots = dict(_read_snapshots(store))
    return trace


def rebuild_prompt(trace: Trace, event: dict[str, Any]) -> list[Any]:
    """The messages the model saw at ``event`` (a model-call record), in order, redacted."""
    hashes = event.get("message_hashes")
    if not isinstance(hashes, list):
        raise ValueError(f"event {event.get('event')!r} #{event.get('seq')} records no message hashes")
    missing = [h for h in hashes if h not in trace.snapshots]
    if missing:
        raise KeyError(f"{len(missing)} message(s) missing from the snapshot store, first {missing[0]}")
    return [trace.snapshots[h] for h in hashes]
