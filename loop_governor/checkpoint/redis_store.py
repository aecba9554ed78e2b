"""Checkpoints in Redis, for a fleet of agent processes that may resume each other's tasks.

Each task is one hash ``<prefix><task_id>``: the snapshot in fields ``version``,
``checksum`` and ``body`` (the layout earlier releases wrote), and one field
``j:<version>`` per save since (that save's changes, see
[`loop_governor.checkpoint.journal`][loop_governor.checkpoint.journal]), with ``jhead``/``jtail`` naming the last one.
A save is one script call that checks the stored version and adds one field, so it
costs the same at call 5000 as at call 5; once the journal outgrows the snapshot, a
save replaces the snapshot and drops the journal fields in the same script. Redis runs
each script atomically, so two writers can never both pass the check. Durability is the
server's (AOF/RDB settings): a checkpoint survives the agent process, and survives a
Redis restart only if the server persists.

redis-py is an optional dependency (the ``[redis]`` extra); it is imported when a store
is created, so ``loop_governor.checkpoint`` imports without it.
"""

from __future__ import annotations

import builtins
import hashlib
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loop_governor.checkpoint.base import check_task_id
from loop_governor.checkpoint.codec import CorruptData, checksum
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.journal import PendingSave, compaction, replay
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint
from loop_governor.redaction import refuse_ambiguous_password

if TYPE_CHECKING:
    import redis

DEFAULT_PREFIX = "loop-governor:checkpoint:"
DEFAULT_QUARANTINE_PREFIX = "loop-governor:checkpoint-quarantine:"

# The stored version is jhead when there are journal records, else the snapshot's version.
_STORED = """
local f = redis.call('HMGET', KEYS[1], 'version', 'checksum', 'jhead', 'jtail')
local stored, tail, snap = 0, false, 0
if f[1] then
  snap = tonumber(f[1])
  if not snap then return nil end
  stored, tail = snap, f[2]
end
if f[3] then
  local head = tonumber(f[3])
  if not head then return nil end
  if head > stored then stored, tail = head, f[4] end
end
"""

# KEYS[1] = checkpoint hash; ARGV = expected version, expected tail checksum, checksum, record.
# {1, new} appended; {0, stored} conflict; {2, stored} the store is not at the tail the
# record continues from (the caller saves a snapshot); {-1, 0} a version field is not a
# number (corrupt: refuse to write).
_APPEND_LUA = (
    "local function stored_of()\n"
    + _STORED
    + """
return {stored, tail}
end
local s = stored_of()
if not s then return {-1, 0} end
local stored, tail = s[1], s[2]
if stored ~= tonumber(ARGV[1]) then return {0, stored} end
if stored == 0 or tail ~= ARGV[2] then return {2, stored} end
local new = stored + 1
redis.call('HSET', KEYS[1], 'j:' .. new, ARGV[3] .. ARGV[4], 'jhead', new, 'jtail', ARGV[3])
return {1, new}
"""
)

# KEYS[1]; ARGV = expected version, new version, checksum, body. Replaces the snapshot
# and drops every journal field (all folded into the new snapshot, or overwritten).
_SNAPSHOT_LUA = (
    "local function stored_of()\n"
    + _STORED
    + """
return {stored}
end
local s = stored_of()
if not s then return {-1, 0} end
local stored = s[1]
if stored ~= tonumber(ARGV[1]) then return {0, stored} end
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(name, 1, 2) == 'j:' then redis.call('HDEL', KEYS[1], name) end
end
redis.call('HDEL', KEYS[1], 'jhead', 'jtail')
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'checksum', ARGV[3], 'body', ARGV[4])
return {1, tonumber(ARGV[2])}
"""
)

_FORCE_ATTEMPTS = 50
_DIGEST = re.compile(rb"[0-9a-f]{16}")


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisCheckpointStore:
    """Checkpoints as Redis hashes (snapshot + journal fields), written by Lua scripts."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client: redis.Redis | None = None,
        prefix: str = DEFAULT_PREFIX,
        quarantine_prefix: str = DEFAULT_QUARANTINE_PREFIX,
        serializer: Serializer | None = None,
        clock: Callable[[], float] = time.time,
        compact_min_bytes: int | None = None,
        compact_ratio: float | None = None,
    ) -> None:
        if quarantine_prefix.startswith(prefix):
            raise ValueError("quarantine_prefix must not start with prefix (list() would report quarantined keys)")
        if client is None:
            import redis as redis_module

            refuse_ambiguous_password(url)  # else redis-py echoes part of the password as a host name
            # Bounded waits: a stalled Redis must not hang the agent (the governor reports
            # a failed save as an event and goes on).
            client = redis_module.Redis.from_url(
                url, decode_responses=False, socket_timeout=5.0, socket_connect_timeout=2.0
            )
        self.url = url
        self.client = client
        self.prefix = prefix
        self.quarantine_prefix = quarantine_prefix
        self.serializer = serializer
        self.compaction = compaction(compact_min_bytes, compact_ratio)
        self._clock = clock
        self._append_script = client.register_script(_APPEND_LUA)
        self._snapshot_script = client.register_script(_SNAPSHOT_LUA)

    def __repr__(self) -> str:
        return f"RedisCheckpointStore({self.url!r})"

    def key_for(self, task_id: str) -> str:
        return self.prefix + check_task_id(task_id)

    # -- public API ------------------------------------------------------------------------

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        key = self.key_for(cp.task_id)
        with PendingSave(cp, self.serializer, self._clock()) as pending:
            sync = cp.sync_state()
            tail = sync.tail
            if (
                not force
                and tail is not None
                and pending.appendable(cp.version, tail)
                and not pending.compaction_due(self.compaction, sync.journal_bytes, sync.snapshot_bytes)
            ):
                record = pending.record
                assert record is not None
                digest = checksum(cp.version + 1, record)
                outcome = self._append_script(keys=[key], args=[cp.version, tail, digest, record])
                status, value = int(outcome[0]), int(outcome[1])
                if status == 1:
                    pending.appended(value, digest)
                    return value
                self._refuse(cp, key, status, value)  # 2: not in sync, a snapshot follows
            expected = self._stored_version(key) if force else cp.version
            for _ in range(_FORCE_ATTEMPTS if force else 1):
                new = max(expected, cp.version) + 1 if force else expected + 1
                body = b"".join(pending.snapshot_parts())
                digest = checksum(new, body)
                outcome = self._snapshot_script(keys=[key], args=[expected, new, digest, body])
                status, value = int(outcome[0]), int(outcome[1])
                if status == 1:
                    pending.snapshotted(value, digest, len(body))
                    return value
                if not force:
                    self._refuse(cp, key, status, value)
                if status == -1:  # overwrite a damaged counter
                    self.client.hdel(key, "version", "jhead", "jtail")
                    expected = 0
                else:
                    expected = value  # another writer raced us: expect what it wrote
            raise CheckpointConflictError(cp.task_id, expected, self._stored_version(key))

    def load(self, task_id: str) -> TaskCheckpoint | None:
        key = self.key_for(task_id)
        fields = self._fields(key)
        if not fields:
            return None
        try:
            raw_version = fields.get(b"version")
            raw_digest = fields.get(b"checksum")
            body = fields.get(b"body")
            if raw_version is None or raw_digest is None or body is None:
                raise CorruptData("hash lacks version, checksum or body")
            try:
                version = int(raw_version)
                digest = raw_digest.decode("ascii")
                head = int(fields[b"jhead"]) if b"jhead" in fields else version
            except (ValueError, UnicodeDecodeError):
                raise CorruptData("version, jhead or checksum field is malformed") from None
            if head - version > len(fields):
                raise CorruptData(f"jhead {head} is beyond the journal fields", part="journal")
            records = []
            for index, number in enumerate(range(version + 1, head + 1)):
                value = fields.get(b"j:%d" % number)
                if value is None or not _DIGEST.fullmatch(value, 0, 16):
                    raise CorruptData(f"journal record {number} is missing or unframed", part="journal", index=index)
                records.append((number, value[:16].decode(), value[16:]))
            return replay(task_id, (version, digest, body), records)
        except CorruptData as exc:
            raise self._corrupted(task_id, key, fields, str(exc)) from None

    def delete(self, task_id: str) -> bool:
        return bool(self.client.delete(self.key_for(task_id)))

    def list(self) -> builtins.list[str]:
        prefix = self.prefix.encode("utf-8")
        ids: builtins.list[str] = []
        for raw in self.client.scan_iter(match=_glob_escape(self.prefix) + "*", count=500):
            key = raw if isinstance(raw, bytes) else str(raw).encode("utf-8")
            if key.startswith(prefix):
                ids.append(key[len(prefix) :].decode("utf-8", "replace"))
        return sorted(ids)

    def close(self) -> None:
        self.client.close()

    # -- internals -------------------------------------------------------------------------

    def _refuse(self, cp: TaskCheckpoint, key: str, status: int, value: int) -> None:
        """Raise for a script's refusal (conflict, corrupt counter); return for "not in sync"."""
        if status == 0:
            raise CheckpointConflictError(cp.task_id, cp.version, value)
        if status == -1:
            raise self._corrupted(cp.task_id, key, self._fields(key), "version field is not a number")

    def _fields(self, key: str) -> dict[bytes, bytes]:
        raw: Any = self.client.hgetall(key)
        return {bytes(k): bytes(v) for k, v in raw.items()}

    def _stored_version(self, key: str) -> int:
        raw: Any = self.client.hmget(key, ["version", "jhead"])
        best = 0
        for value in raw:
            try:
                best = max(best, 0 if value is None else int(value))
            except ValueError:
                continue
        return best

    def _corrupted(self, task_id: str, key: str, fields: dict[bytes, bytes], reason: str) -> CheckpointCorruptedError:
        """Copy the hash to a quarantine key (named by content, so written once)."""
        digest = hashlib.sha256()
        for name in sorted(fields):
            digest.update(name + b"\0" + fields[name] + b"\0")
        qkey = f"{self.quarantine_prefix}{task_id}:{digest.hexdigest()[:16]}"
        try:
            mapping: dict[str | bytes, bytes | str | float] = dict(fields.items())
            mapping["reason"] = reason
            mapping["quarantined_at"] = self._clock()
            mapping["original_key"] = key
            self.client.hset(qkey, mapping=mapping)  # type: ignore[arg-type]
            quarantine: str | None = f"redis key {qkey!r}"
        except Exception:  # the copy is best effort; the corruption error is raised regardless
            quarantine = None
        return CheckpointCorruptedError(task_id, f"redis key {key!r}", reason, quarantine)
