"""The file store's journal: one framed record per line, appended and fsynced.

Layout of ``<stem>.ckpt.journal``, every line framed the same way:

    <payload> <version:16 hex> <xxh3:16 hex> <payload length:16 hex>\\n

The payload is compact ASCII JSON, which never holds a raw newline, so a line is exactly
one record and the fixed-size trailer can be read from the end of the file. The first
line is a header naming the snapshot the records extend
(``{"lg_journal":1,"snapshot":"<its checksum>"}``, framed with the snapshot's version);
a journal whose header names another snapshot is stale (left by a compaction killed
after it replaced the snapshot) and is ignored, which is what makes compaction safe
without any ordering between the two files beyond "snapshot durable first".

Damage is told from a torn write by position and shape: a writer killed mid-append
leaves a prefix of its line, i.e. bytes after the last newline. That tail was never
acknowledged (the save returns after the fsync of the whole line), so it is dropped, and
the next writer truncates it before appending. A complete line that does not verify is
corruption, wherever it is.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from loop_governor.checkpoint.codec import CorruptData, checksum

TRAILER_LEN = 52  # " " + 16 + " " + 16 + " " + 16 + "\n"
_TRAILER = re.compile(rb" ([0-9a-f]{16}) ([0-9a-f]{16}) ([0-9a-f]{16})\n")
_HEADER_PAYLOAD = re.compile(rb'\{"lg_journal":1,"snapshot":"([0-9a-f]{8}|[0-9a-f]{16})"\}')
HEADER_MAX = 256  # a header line is ~130 bytes

Record = tuple[int, str, bytes]  # version, checksum, payload


def frame(version: int, payload: bytes) -> tuple[bytes, str]:
    """The journal line for ``payload`` stored as ``version``, and its checksum."""
    digest = checksum(version, payload)
    return b"%s %016x %s %016x\n" % (payload, version, digest.encode(), len(payload)), digest


def header_line(snapshot_version: int, snapshot_digest: str) -> bytes:
    """The first line of a journal that extends this snapshot."""
    return frame(snapshot_version, b'{"lg_journal":1,"snapshot":"%s"}' % snapshot_digest.encode())[0]


def _line(data: bytes, start: int, end: int, what: str) -> Record:
    """Verify the complete line ``data[start:end]`` (newline included)."""
    match = _TRAILER.fullmatch(data, end - TRAILER_LEN, end) if end - start >= TRAILER_LEN else None
    if match is None:
        raise CorruptData(f"{what} at byte {start} has no valid frame", part="journal")
    version, digest, length = int(match.group(1), 16), match.group(2).decode(), int(match.group(3), 16)
    payload = data[start : end - TRAILER_LEN]
    if length != len(payload):
        raise CorruptData(f"{what} at byte {start}: length {len(payload)}, frame says {length}", part="journal")
    if checksum(version, payload) != digest:
        raise CorruptData(f"{what} at byte {start}: checksum mismatch (modified data)", part="journal")
    return version, digest, payload


def parse_header(data: bytes) -> tuple[tuple[int, str] | None, int]:
    """``((snapshot version, snapshot checksum), end of the header line)`` from the start
    of a journal; ``(None, 0)`` when the header line is torn (not even one full line).

    Raises [`CorruptData`][loop_governor.checkpoint.codec.CorruptData] for a complete first line that is not a valid
    header.
    """
    end = data.find(b"\n", 0, HEADER_MAX)
    if end < 0:
        if len(data) < HEADER_MAX:
            return None, 0  # torn while the journal was being started: nothing in it counts
        raise CorruptData("journal header line is too long", part="journal")
    version, _, payload = _line(data, 0, end + 1, "journal header")
    match = _HEADER_PAYLOAD.fullmatch(payload)
    if match is None:
        raise CorruptData("journal header does not name a snapshot", part="journal")
    return (version, match.group(1).decode()), end + 1


@dataclass
class Journal:
    """A parsed journal: its header, its complete records, and where valid data ends."""

    header: tuple[int, str] | None
    records: list[Record] = field(default_factory=list)
    end: int = 0  # offset after the last complete line (the next record goes here)
    torn: bool = False  # bytes after ``end``: a killed append, dropped


def parse(data: bytes, snapshot: tuple[int, str] | None) -> Journal:
    """Parse a whole journal; records are read only if it extends ``snapshot``.

    A stale journal (its header names another snapshot) comes back with no records and
    is never looked into further, so damage in a journal nobody needs is not reported.
    """
    header, start = parse_header(data)
    if header is None:
        return Journal(None, end=0, torn=bool(data))
    journal = Journal(header, end=start)
    if header != snapshot:
        return journal
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            break
        journal.records.append(_line(data, start, end + 1, f"journal record {len(journal.records) + 1}"))
        start = journal.end = end + 1
    journal.torn = journal.end < len(data)
    return journal


def tail(fd: int, size: int, header_end: int) -> tuple[int, str] | None:
    """``(version, checksum)`` of the last record, read from the end of the file.

    Two small reads instead of the whole journal: a save needs only the stored version
    and the checksum it continues from. ``None`` when the file does not end with one
    complete verified record (torn tail, damage): the caller parses the whole journal.
    """
    if size - header_end < TRAILER_LEN:
        return None
    match = _TRAILER.fullmatch(os.pread(fd, TRAILER_LEN, size - TRAILER_LEN))
    if match is None:
        return None
    length = int(match.group(3), 16)
    start = size - TRAILER_LEN - length
    if start < header_end:
        return None
    data = os.pread(fd, length + TRAILER_LEN + 1, start - 1)
    if data[:1] != b"\n":
        return None
    try:
        version, digest, _ = _line(data, 1, len(data), "journal record")
    except CorruptData:
        return None
    return version, digest


def max_version(data: bytes) -> int:
    """The highest version any complete, verified line claims (0 if none): what a
    forced save must stay ahead of when the journal is damaged."""
    best, start = 0, 0
    while (end := data.find(b"\n", start)) >= 0:
        try:
            best = max(best, _line(data, start, end + 1, "line")[0])
        except CorruptData:
            pass
        start = end + 1
    return best
