"""Checkpoints in Redis, for a fleet of agent processes that may resume each other's tasks.

Each task is one hash ``<prefix><task_id>`` with fields ``version``, ``checksum`` and
``body``. The version check and the write run in one Lua script, which Redis executes
atomically, so two writers can never both pass the check. Durability is the server's
(AOF/RDB settings): a checkpoint survives the agent process, and survives a Redis
restart only if the server persists.

redis-py is an optional dependency (the ``[redis]`` extra); it is imported when a store
is created, so ``loop_governor.checkpoint`` imports without it.
"""

from __future__ import annotations

import builtins
import hashlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loop_governor.checkpoint.base import check_task_id
from loop_governor.checkpoint.codec import CorruptData, decode, encode
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint

if TYPE_CHECKING:
    import redis

DEFAULT_PREFIX = "loop-governor:checkpoint:"
DEFAULT_QUARANTINE_PREFIX = "loop-governor:checkpoint-quarantine:"

# KEYS[1] = checkpoint hash; ARGV = expected version, checksum, body.
# Returns {1, new_version} on success, {0, stored_version} on a conflict,
# {-1, 0} if the stored version field is not a number (corrupt: refuse to overwrite).
_SAVE_LUA = """
local raw = redis.call('HGET', KEYS[1], 'version')
local stored = 0
if raw then
  stored = tonumber(raw)
  if not stored then return {-1, 0} end
end
if stored ~= tonumber(ARGV[1]) then return {0, stored} end
redis.call('HSET', KEYS[1], 'version', stored + 1, 'checksum', ARGV[2], 'body', ARGV[3])
return {1, stored + 1}
"""

_FORCE_ATTEMPTS = 50


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisCheckpointStore:
    """Checkpoints as Redis hashes; the two-writer rule is enforced by a Lua script."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client: redis.Redis | None = None,
        prefix: str = DEFAULT_PREFIX,
        quarantine_prefix: str = DEFAULT_QUARANTINE_PREFIX,
        serializer: Serializer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if quarantine_prefix.startswith(prefix):
            raise ValueError("quarantine_prefix must not start with prefix (list() would report quarantined keys)")
        if client is None:
            import redis as redis_module

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
        self._clock = clock
        self._save_script = client.register_script(_SAVE_LUA)

    def __repr__(self) -> str:
        return f"RedisCheckpointStore({self.url!r})"

    def key_for(self, task_id: str) -> str:
        return self.prefix + check_task_id(task_id)

    # -- public API ------------------------------------------------------------------------

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        key = self.key_for(cp.task_id)
        now = self._clock()
        serializer = cp.serializer or self.serializer
        expected = cp.version
        attempts = _FORCE_ATTEMPTS if force else 1
        if force:  # overwrite whatever is there: expect the current version, retry on races
            expected = self._stored_version(key)
        for _ in range(attempts):
            body, digest = encode(cp, expected + 1, now, serializer)
            outcome = self._save_script(keys=[key], args=[expected, digest, body])
            status, value = int(outcome[0]), int(outcome[1])
            if status == 1:
                cp.version = value
                cp.updated_at = now
                return value
            if status == -1:
                if force:
                    self.client.hdel(key, "version")
                    expected = 0
                    continue
                raise self._corrupted(cp.task_id, key, self._fields(key), "version field is not a number")
            if not force:
                raise CheckpointConflictError(cp.task_id, cp.version, value)
            expected = value
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
            except (ValueError, UnicodeDecodeError):
                raise CorruptData("version or checksum field is malformed") from None
            return decode(task_id, version, digest, body)
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

    def _fields(self, key: str) -> dict[bytes, bytes]:
        raw: Any = self.client.hgetall(key)
        return {bytes(k): bytes(v) for k, v in raw.items()}

    def _stored_version(self, key: str) -> int:
        raw: Any = self.client.hget(key, "version")
        try:
            return 0 if raw is None else int(raw)
        except ValueError:
            return 0

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
