"""Bytes in, bytes out: checksums and body parsing every checkpoint store shares.

Each store keeps, per task, a snapshot (write counter ``version``, JSON body, a checksum
over both) and journal records (the same three). The checksum is what tells a torn or
bit-rotted record from a valid one, so corruption is detected and reported instead of
being half-loaded. XXH3 (64-bit) rather than SHA-256 or CRC-32: it guards against
accidents, not adversaries (whoever can write the store can also write a matching hash),
and a checkpoint is saved after every tool call: on a 0.5 MB checkpoint XXH3 takes ~9 us
where zlib's CRC-32 takes ~130 us and SHA-256 ~300 us.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import xxhash

from loop_governor.checkpoint.errors import CheckpointSchemaError
from loop_governor.checkpoint.model import SCHEMA_VERSION


class CorruptData(Exception):
    """Internal: the stored bytes are not a valid checkpoint (the store adds quarantine).

    ``part`` says which stored piece is bad: ``"snapshot"`` or ``"journal"``.
    """

    def __init__(self, reason: str, *, part: str = "snapshot", index: int | None = None) -> None:
        super().__init__(reason)
        self.part = part
        self.index = index  # which journal record (0-based), when one is to blame


def checksum(version: int, body: bytes) -> str:
    """XXH3-64 (16 hex digits) of the body, seeded with the version: neither changes undetected."""
    # The modulo keeps a damaged (negative or huge) stored version a checksum mismatch
    # instead of an OverflowError.
    return xxhash.xxh3_64_hexdigest(body, seed=version % 2**64)


def checksum_parts(version: int, parts: list[bytes]) -> str:
    """[`checksum`][loop_governor.checkpoint.codec.checksum] of the concatenation of ``parts`` (XXH3 streams: no joined
    copy)."""
    digest = xxhash.xxh3_64(seed=version % 2**64)
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def legacy_checksum(version: int, body: bytes) -> str:
    """The CRC-32 (8 hex digits) that loop-governor wrote before XXH3; still verified on load."""
    crc = zlib.crc32(body, zlib.crc32(str(version).encode() + b"\n"))
    return f"{crc:08x}"


def parse_body(task_id: str, version: int, digest: str, body: bytes) -> dict[str, Any]:
    """Verify a stored snapshot body and parse it to a JSON object (not validated yet).

    Raises [`CorruptData`][loop_governor.checkpoint.codec.CorruptData], or ``CheckpointSchemaError`` for a newer schema.
    """
    expected = legacy_checksum(version, body) if len(digest) == 8 else checksum(version, body)
    if expected != digest:
        raise CorruptData("checksum mismatch (torn or modified data)")
    try:
        doc: Any = json.loads(body)
    except ValueError as exc:
        raise CorruptData(f"body is not JSON: {exc}") from None
    except RecursionError:
        # A body nested ~1000 deep (no writer of ours makes one) would otherwise escape
        # as an untyped RecursionError: no quarantine copy, and `checkpoints ls` dies.
        raise CorruptData("body is nested too deeply to be a checkpoint") from None
    if not isinstance(doc, dict):
        raise CorruptData("body is not a JSON object")
    schema = doc.get("schema_version")
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        raise CheckpointSchemaError(
            f"checkpoint for task {task_id!r} has schema version {schema}; "
            f"this loop-governor reads up to {SCHEMA_VERSION}: upgrade loop-governor"
        )
    return doc
