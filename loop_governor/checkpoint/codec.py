"""Bytes in, bytes out: the one encoding every checkpoint store shares.

Each store keeps three things per task: the write counter (``version``), the JSON body
and a checksum over both. The checksum is what tells a torn or bit-rotted record from a
valid one, so corruption is detected and reported instead of being half-loaded. XXH3
(64-bit) rather than SHA-256 or CRC-32: it guards against accidents, not adversaries
(whoever can write the store can also write a matching hash), and a checkpoint is saved
after every tool call: on a 0.5 MB checkpoint XXH3 takes ~9 us where zlib's CRC-32 takes
~130 us and SHA-256 ~300 us (``benchmarks/checkpoint_save.py`` measures the whole save).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import xxhash
from pydantic import ValidationError

from loop_governor.checkpoint.errors import CheckpointSchemaError
from loop_governor.checkpoint.model import SCHEMA_VERSION, Serializer, TaskCheckpoint


class CorruptData(Exception):
    """Internal: the stored bytes are not a valid checkpoint (the store adds quarantine)."""


def checksum(version: int, body: bytes) -> str:
    """XXH3-64 (16 hex digits) of the body, seeded with the version: neither changes undetected."""
    # The modulo keeps a damaged (negative or huge) stored version a checksum mismatch
    # instead of an OverflowError.
    return xxhash.xxh3_64_hexdigest(body, seed=version % 2**64)


def encode(cp: TaskCheckpoint, version: int, now: float, serializer: Serializer | None) -> tuple[bytes, str]:
    """The body bytes and checksum for ``cp`` stored as ``version`` at time ``now``."""
    body = cp.encode_body(now, serializer)
    return body, checksum(version, body)


def encode_parts(
    cp: TaskCheckpoint, version: int, now: float, serializer: Serializer | None
) -> tuple[list[bytes], str]:
    """:func:`encode` as a few byte strings, for a store that writes them without joining.

    The checksum is the same as over the joined body (XXH3 streams).
    """
    parts = cp.encode_parts(now, serializer)
    digest = xxhash.xxh3_64(seed=version % 2**64)
    for part in parts:
        digest.update(part)
    return parts, digest.hexdigest()


def legacy_checksum(version: int, body: bytes) -> str:
    """The CRC-32 (8 hex digits) that loop-governor wrote before XXH3; still verified on load."""
    crc = zlib.crc32(body, zlib.crc32(str(version).encode() + b"\n"))
    return f"{crc:08x}"


def decode(task_id: str, version: int, digest: str, body: bytes) -> TaskCheckpoint:
    """Verify and parse a stored record; raises :class:`CorruptData` or a schema error."""
    expected = legacy_checksum(version, body) if len(digest) == 8 else checksum(version, body)
    if expected != digest:
        raise CorruptData("checksum mismatch (torn or modified data)")
    try:
        doc: Any = json.loads(body)
    except ValueError as exc:
        raise CorruptData(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CorruptData("body is not a JSON object")
    schema = doc.get("schema_version")
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        raise CheckpointSchemaError(
            f"checkpoint for task {task_id!r} has schema version {schema}; "
            f"this loop-governor reads up to {SCHEMA_VERSION}: upgrade loop-governor"
        )
    try:
        cp = TaskCheckpoint.model_validate(doc)
    except ValidationError as exc:
        raise CorruptData(f"body does not match the checkpoint schema: {exc.error_count()} error(s)") from None
    if cp.task_id != task_id:
        raise CorruptData(f"body belongs to task {cp.task_id!r}")
    cp.version = version
    return cp
