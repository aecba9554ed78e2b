"""Bytes in, bytes out: the one encoding every checkpoint store shares.

Each store keeps three things per task: the write counter (``version``), the JSON body
and a CRC-32 over both. The checksum is what tells a torn or bit-rotted record from a
valid one, so corruption is detected and reported instead of being half-loaded. CRC-32
rather than SHA-256: it guards against accidents, not adversaries (whoever can write
the store can also write a matching hash), and it costs a third of SHA-256 on a large
checkpoint, which is saved after every tool call.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from pydantic import ValidationError

from loop_governor.checkpoint.errors import CheckpointSchemaError
from loop_governor.checkpoint.model import SCHEMA_VERSION, Serializer, TaskCheckpoint


class CorruptData(Exception):
    """Internal: the stored bytes are not a valid checkpoint (the store adds quarantine)."""


def checksum(version: int, body: bytes) -> str:
    """CRC-32 (8 hex digits) over the version and the body: neither changes undetected."""
    crc = zlib.crc32(body, zlib.crc32(str(version).encode() + b"\n"))
    return f"{crc:08x}"


def encode(cp: TaskCheckpoint, version: int, now: float, serializer: Serializer | None) -> tuple[bytes, str]:
    """The body bytes and checksum for ``cp`` stored as ``version`` at time ``now``."""
    body = cp.encode_body(now, serializer)
    return body, checksum(version, body)


def decode(task_id: str, version: int, digest: str, body: bytes) -> TaskCheckpoint:
    """Verify and parse a stored record; raises :class:`CorruptData` or a schema error."""
    if checksum(version, body) != digest:
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
