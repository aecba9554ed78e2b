"""Fleet state in Redis: many agent processes share breakers, budgets and rate limits.

Every state change is one Lua script, so a transition is atomic across the fleet:
exactly one caller moves an open breaker to half-open and gets the probe. The scripts
mirror [`loop_governor.state.breaker`][loop_governor.state.breaker] line by line (a differential test runs both
on random operation sequences); the pure Python functions remain the specification.

Hot path: a closed breaker is admitted in one round trip (one HMGET), and the clock is
read only when the breaker is not closed (then the admit script decides). A success
is recorded in one more round trip (it resets failures other calls completed while it
ran: "consecutive" is counted in completion order). A rate-limited call takes from all
its buckets (requests, tokens) in one script call.

Time: shared breakers and buckets run on the server's clock (``redis.call('TIME')``
inside the scripts), so a fleet whose hosts' clocks disagree, or a host whose wall clock
steps back, shares one timeline; a timestamp found in the future (a failover to a server
whose clock lags) is moved to the present, never waited out. ``server_time=False`` uses
the ``now`` the governor passes (virtual time in tests).

Engines: one server (``redis://``), a Redis Cluster (``redis+cluster://``: every script's
keys share a hash tag -- a task's keys one tag, a model's request and token buckets one
tag -- so no command crosses slots) or a Sentinel-managed primary (``redis+sentinel://``:
``master_for`` follows a failover and never writes to a primary Sentinel has replaced).
Valkey speaks the same protocol and runs the same scripts.

A server that cannot share state is a configuration error at construction
([`StoreConfigError`][loop_governor.stores.base.StoreConfigError]): a cluster node behind a plain
URL (``MOVED``), a read-only replica (``READONLY``), a Sentinel port, refused
credentials. A server that is merely down is not: the store starts on local state.

Redis unreachable (or misbehaving) during a run: the store never raises into the agent.
It switches to an in-process [`MemoryStore`][loop_governor.stores.memory.MemoryStore], reports ``store_fallback``
through ``on_event`` and the log, retries the connection with capped exponential backoff
(inline, at most once per backoff interval, with short socket timeouts), and on success
merges what happened meanwhile (opened breakers, budget spent, known-bad calls, error
signatures) back into Redis and reports ``store_recovered``. A server found unfit when
reconnecting (a replica, or a plain-URL primary that came back empty after its
replicas took over) is not written to: the store stays local and reports
``store_misconfigured``.

Keys live under ``<namespace>:`` and every write refreshes a TTL, so a fleet that goes
away leaves nothing behind for longer than ``ttl_s``.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import random as _random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisClusterException
    from redis.retry import Retry
    from redis.sentinel import Sentinel
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the redis store needs redis-py: pip install 'loop-governor[redis]'") from exc

from loop_governor.redaction import mask_url as _mask_url
from loop_governor.redaction import redact, refuse_ambiguous_password
from loop_governor.state.breaker import (
    ADMIT,
    ADMIT_DIRTY,
    Admission,
    BreakerPolicy,
    BreakerRecord,
    BreakerState,
    Transition,
    force,
)
from loop_governor.state.bucket import Bucket
from loop_governor.stores.base import BreakerStatus, Clock, StoreConfigError
from loop_governor.stores.memory import MemoryStore
from loop_governor.stores.redis_url import RedisTarget, parse_redis_url

__all__ = ["RedisStore"]

log = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], None]
_T = TypeVar("_T")


# What a failed command can raise: redis-py's errors, socket errors, and the cluster
# client's own exceptions (RedisClusterException is not a RedisError).
_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError, RedisClusterException)


class _Retry(enum.Enum):
    RETRY = "retry"


_STATES = {s.value: s for s in BreakerState}

# --- Lua ------------------------------------------------------------------------------
# Numbers cross the Lua boundary as strings: Redis truncates Lua numbers to integers in
# replies, and "%.17g" round-trips a double exactly, so Lua compares the same doubles
# Python would.

# Time: ARGV "now" is the governor's clock, or '' for the server's (TIME). Scripts that
# read TIME replicate by effects (the only mode since Redis 7; asked for explicitly where
# an older server needs it).
_LUA_HELPERS = """
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(x) return string.format('%.17g', x) end
local function clock(arg)
  if arg == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) + tonumber(t[2]) / 1000000
  end
  return tonumber(arg)
end
local function load(key)
  local h = redis.call('HMGET', key, 's', 'f', 'o', 'p')
  return (h[1] or 'closed'), (tonumber(h[2]) or 0), (tonumber(h[3]) or 0), (tonumber(h[4]) or 0)
end
local function put(key, s, f, o, p, ttl)
  redis.call('HSET', key, 's', s, 'f', f, 'o', fmt(o), 'p', fmt(p))
  redis.call('PEXPIRE', key, ttl)
end
"""

# breaker.admit() for a breaker that was not closed when read. ARGV: now, cooldown_s, ttl_ms.
# Replies: {'closed', failures} | {'probe', from_state} | {'deny', state, failures, retry_in}
# A stamp in the future (the clock stepped back) moves to now: never a negative elapsed time.
_ADMIT_LUA = (
    _LUA_HELPERS
    + """
local s, f, o, p = load(KEYS[1])
if s == 'closed' then return {'closed', tostring(f)} end
local now, cooldown, ttl = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if s == 'open' then
  if now < o then
    o = now
    put(KEYS[1], s, f, o, p, ttl)
  end
  local ready_at = o + cooldown
  if now >= ready_at then
    put(KEYS[1], 'half_open', f, o, now, ttl)
    return {'probe', 'open'}
  end
  return {'deny', s, tostring(f), fmt(ready_at - now)}
end
if now < p then
  p = now
  put(KEYS[1], s, f, o, p, ttl)
end
local stale_at = p + cooldown
if now >= stale_at then
  put(KEYS[1], s, f, o, now, ttl)
  return {'probe', ''}
end
return {'deny', s, tostring(f), fmt(stale_at - now)}
"""
)

# breaker.record(). ARGV: ok (1/0), probe (1/0), now, failure_threshold, ttl_ms, backdate_s.
# Reply: {} or {from_state, to_state}. A success on a healthy breaker writes nothing.
_RECORD_LUA = (
    _LUA_HELPERS
    + """
local s, f, o, p = load(KEYS[1])
local ok, probe = ARGV[1] == '1', ARGV[2] == '1'
if ok then
  if s == 'closed' then
    if f ~= 0 then put(KEYS[1], 'closed', 0, 0, 0, tonumber(ARGV[5])) end
    return {}
  end
  if s == 'half_open' and probe then
    put(KEYS[1], 'closed', 0, 0, 0, tonumber(ARGV[5]))
    return {'half_open', 'closed'}
  end
  return {}
end
local now, threshold, ttl = clock(ARGV[3]) - tonumber(ARGV[6]), tonumber(ARGV[4]), tonumber(ARGV[5])
f = f + 1
if s == 'half_open' then
  if probe then
    put(KEYS[1], 'open', f, now, 0, ttl)
    return {'half_open', 'open'}
  end
  put(KEYS[1], s, f, o, p, ttl)
  return {}
end
if s == 'open' then
  put(KEYS[1], s, f, o, p, ttl)
  return {}
end
if f >= threshold then
  put(KEYS[1], 'open', f, now, 0, ttl)
  return {'closed', 'open'}
end
put(KEYS[1], s, f, o, p, ttl)
return {}
"""
)

# breaker.force(). ARGV: state, now, ttl_ms.
_FORCE_LUA = (
    _LUA_HELPERS
    + """
local s = ARGV[1]
if s == 'closed' then
  put(KEYS[1], 'closed', 0, 0, 0, tonumber(ARGV[3]))
else
  put(KEYS[1], s, 0, clock(ARGV[2]), 0, tonumber(ARGV[3]))
end
return 1
"""
)

# Reconvergence after an outage: a breaker that tripped locally is written to Redis
# unless Redis already holds a non-closed one (the fleet's view wins). ARGV: s, f, o, p, ttl_ms.
_MERGE_BREAKER_LUA = (
    _LUA_HELPERS
    + """
local s = load(KEYS[1])
if s ~= 'closed' then return 0 end
put(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
return 1
"""
)

# MemoryStore.budget_take(). ARGV: limit, ttl_ms. Reply 1 (taken) or 0 (spent).
_BUDGET_LUA = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# One hash field set (mode 'set') or incremented (mode 'incr'), and the key's TTL refreshed,
# in one step. ARGV: mode, field, value, ttl_ms. Reply: the field's new value.
_HASH_LUA = """
local v
if ARGV[1] == 'incr' then
  v = redis.call('HINCRBY', KEYS[1], ARGV[2], ARGV[3])
else
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  v = 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return v
"""

# Token buckets, all or nothing (loop_governor.state.bucket.take_all): every bucket is
# refilled; if each holds its cost (capped at its burst) all are debited their whole cost
# (a bucket may go into debt), else none is and the longest wait is returned. A clock
# that steps back neither refills nor freezes the bucket (its stamp moves to now). A key
# lives at least twice its refill time.
# KEYS: buckets (one hash tag). ARGV: now ('' = server time), then per bucket: rate_per_s,
# burst, cost, ttl_ms. Reply: seconds to wait ('0' = admitted).
_RATE_LUA = """
if redis.replicate_commands then redis.replicate_commands() end
local now = tonumber(ARGV[1])
if ARGV[1] == '' then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) + tonumber(tm[2]) / 1000000
end
local tokens, stamps, wait = {}, {}, 0
for i, key in ipairs(KEYS) do
  local rate, burst, cost = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i])
  local h = redis.call('HMGET', key, 't', 'ts')
  local t, ts = tonumber(h[1]), tonumber(h[2])
  if t == nil or ts == nil then t, ts = burst, now end
  if now > ts then
    t = math.min(burst, t + (now - ts) * rate)
  end
  ts = now
  local need = math.min(cost, burst)
  if need - t > 1e-9 * need then wait = math.max(wait, (need - t) / rate) end
  tokens[i], stamps[i] = t, ts
end
for i, key in ipairs(KEYS) do
  local t = tokens[i]
  if wait == 0 then t = t - tonumber(ARGV[4 * i]) end
  redis.call('HSET', key, 't', string.format('%.17g', t), 'ts', string.format('%.17g', stamps[i]))
  -- a debt left by an earlier, larger request outlives this request's own TTL: the key
  -- must not expire (a full bucket) before the bucket has refilled
  local refill = 2000 * (tonumber(ARGV[4 * i - 1]) - t) / tonumber(ARGV[4 * i - 2])
  redis.call('PEXPIRE', key, string.format('%.0f', math.max(tonumber(ARGV[4 * i + 1]), math.ceil(refill))))
end
return string.format('%.17g', wait)
"""


def _num(x: float) -> str:
    """A float as text Lua's tonumber reads back to the same double."""
    return repr(float(x))


def _split_options(url: str) -> tuple[str, dict[str, str]]:
    """Take this store's own options (``?namespace=..&ttl_s=..``) out of a Redis URL, so
    ``GovernorConfig(store_url=...)`` can set them and redis-py never sees them."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _URL_OPTIONS}
    rest = [(k, v) for k, v in query if k not in _URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(rest))), ours


_URL_OPTIONS = ("namespace", "ttl_s")


_TOKENS = ":tokens"


def _tag(name: str) -> str:
    """``name`` as a hash tag: itself, or a digest when it is empty or holds a brace (a tag
    ends at the first ``}``, and an empty one hashes the whole key)."""
    if name and "{" not in name and "}" not in name:
        return name
    return "h" + hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


def _config_problem(exc: BaseException) -> str | None:
    """Why a server that answered cannot be used (a configuration error, not an outage)."""
    if isinstance(exc, RedisClusterException):
        text = str(exc)
        if "Cluster mode is not enabled" in text:
            return "not a Redis Cluster node (cluster mode is disabled): use redis://host:port/db"
        cause = exc.__cause__
        if cause is not None and _config_problem(cause) is not None:
            return _config_problem(cause)
        return None
    if isinstance(exc, (redis.AuthenticationError, redis.exceptions.AuthorizationError)):
        return f"the server refused the credentials ({type(exc).__name__})"
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return "the user lacks a permission the store needs (NOPERM): allow EVAL/EVALSHA, HMGET, INFO and ROLE"
    if isinstance(exc, redis.ReadOnlyError):
        return "the server is a read-only replica (READONLY): point store_url at the primary or use redis+sentinel://"
    if isinstance(exc, redis.exceptions.MovedError):
        return "a Redis Cluster node (MOVED): use redis+cluster://host:port[,host:port...]"
    if isinstance(exc, redis.ResponseError) and not isinstance(exc, redis.exceptions.ClusterDownError):
        return f"the server refused the store's commands: {redact(str(exc))[:200]}"
    return None


class _FailoverAwareSentinel(Sentinel):
    """redis-py's Sentinel, naming a primary only when ``SENTINEL MASTERS`` (what redis-py
    reads) and ``SENTINEL GET-MASTER-ADDR-BY-NAME`` agree.

    Why by hand: during a failover an old primary that restarts (empty, a master again)
    answers pings, so ``SENTINEL MASTERS`` shows it healthy until the switch completes,
    while ``GET-MASTER-ADDR-BY-NAME`` already names the promoted replica. redis-py would
    connect to the stale primary and the fleet's writes would land there (measured: a
    rate bucket written to it in 3 of 4 runs). A disagreement is a failover in progress:
    no primary yet (``MasterNotFoundError``, a ConnectionError: the store stays local and
    asks again)."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        address = super().discover_master(service_name)  # type: ignore[no-untyped-call]
        for sentinel in self.sentinels:
            try:
                named = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", service_name)  # type: ignore[no-untyped-call]
            except (redis.ConnectionError, redis.TimeoutError):
                continue
            if not named:
                continue
            host, port = (x.decode() if isinstance(x, bytes) else str(x) for x in named[:2])
            if (host, int(port)) != (str(address[0]), int(address[1])):
                raise redis.sentinel.MasterNotFoundError(
                    f"failover of {service_name!r} in progress: "
                    f"Sentinel names {host}:{port}, not {address[0]}:{address[1]}"
                )
            break
        return str(address[0]), int(address[1])


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class _Outage:
    """What happened locally while Redis was away, kept as deltas to merge back."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.tools: set[str] = set()
        self.budget_taken: dict[str, int] = {}
        self.known_bad: dict[str, dict[str, str]] = {}
        self.signatures: dict[str, dict[str, int]] = {}
        self.ended: set[str] = set()
        self.attempts = 0

    def empty(self) -> bool:
        return not (self.tools or self.budget_taken or self.known_bad or self.signatures or self.ended)

    def absorb(self, later: _Outage) -> None:
        """Add the deltas of ``later`` (recorded after ours) to ours."""
        self.tools |= later.tools
        for task_id in later.ended:  # the task ended after our deltas: they are moot
            self.budget_taken.pop(task_id, None)
            self.known_bad.pop(task_id, None)
            self.signatures.pop(task_id, None)
        self.ended |= later.ended
        for task_id, n in later.budget_taken.items():
            self.budget_taken[task_id] = self.budget_taken.get(task_id, 0) + n
        for task_id, calls in later.known_bad.items():
            self.known_bad.setdefault(task_id, {}).update(calls)
        for task_id, counts in later.signatures.items():
            mine = self.signatures.setdefault(task_id, {})
            for sig, n in counts.items():
                mine[sig] = mine.get(sig, 0) + n
        self.attempts = max(self.attempts, later.attempts)


# Recovery merges the outage's deltas in rounds while other threads keep working locally;
# if they still add deltas after this many rounds, the last round holds them off (one
# round trip) so recovery always completes.
_MERGE_ROUNDS = 8


class RedisStore:
    """The [`Store`][loop_governor.stores.base.Store] protocol on Redis, for a fleet of processes.

    ``url``: ``redis://[user:pass@]host:port/db``, ``rediss://...``, ``unix:///path``,
    ``redis+cluster://[user:pass@]host:port[,host:port...]`` (a Redis Cluster: redis-py's
    ``RedisCluster`` with the same timeouts and no client retries) or
    ``redis+sentinel://[user:pass@]host:port[,host:port...]/service_name[/db]`` (the primary
    Sentinel names: ``Sentinel(...).master_for(service_name)``, following failovers);
    ``?namespace=NS&ttl_s=S`` in the URL set the two options below (arguments win).
    ``namespace`` prefixes every key (default ``loop-governor``; one per fleet/environment).
    ``ttl_s``: idle lifetime (default one day) of every key (refreshed on each write; a breaker key also
    lives at least two cooldowns). Socket timeouts are short on purpose: a slow Redis
    must degrade to local state, not stall the agent.
    ``reconnect_base_s`` / ``reconnect_max_s``: the reconnect backoff while degraded (0.5 s
    doubling to 4 s, jittered): a fleet is back on shared state within about 4 s of the
    server's return or a failover's promotion, for one connect attempt per process per
    interval meanwhile.
    ``on_event``: called with ``{"event": "store_fallback" | "store_recovered" |
    "store_misconfigured", ...}`` (events from before it is set are delivered when it is).
    ``client``: a redis-py client you built yourself (TLS options, a credential provider,
    your own pool), used instead of one from ``url`` (which then only names it in events).
    It must be created with ``decode_responses=True`` and should have short timeouts and
    no retries of its own (``retry=Retry(NoBackoff(), 0)``), or an outage stalls every
    call for the retries; ``redis.Redis``, ``redis.cluster.RedisCluster`` and
    ``Sentinel(...).master_for(service, decode_responses=True)`` all work.
    ``server_time``: run shared breakers and buckets on the server's clock (default);
    False uses the ``now`` the governor passes (virtual time in tests).

    Raises [`StoreConfigError`][loop_governor.stores.base.StoreConfigError] (a ``ValueError``) at construction when the
    server answers but cannot share state (see the module docstring); a server that does not
    answer is an outage: the store starts on local state and reconnects.
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        namespace: str | None = None,
        ttl_s: float | None = None,
        socket_timeout: float = 0.25,
        connect_timeout: float = 0.25,
        reconnect_base_s: float = 0.5,
        reconnect_max_s: float = 4.0,
        monotonic: Callable[[], float] = time.monotonic,
        random: Callable[[], float] | None = None,
        on_event: EventCallback | None = None,
        client: Any = None,
        server_time: bool = True,
    ) -> None:
        refuse_ambiguous_password(url)
        url, options = _split_options(url)
        namespace = namespace or options.get("namespace") or "loop-governor"
        ttl_s = float(ttl_s if ttl_s is not None else options.get("ttl_s", 86_400.0))
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.url = url
        self.safe_url = _mask_url(url)
        self.namespace = namespace
        self.ttl_s = ttl_s
        self._on_event: EventCallback | None = on_event
        self._pending_events: list[dict[str, Any]] = []
        self._prefix = f"{namespace}:"
        self._ttl_ms = math.ceil(self.ttl_s * 1000)
        self._server_time = server_time
        self._timeouts = (socket_timeout, connect_timeout)
        self._target = parse_redis_url(url, self.safe_url) if client is None else RedisTarget("client", url)
        self._fallback = MemoryStore()
        self._monotonic = monotonic
        self._random = random or _random.Random().random
        self._reconnect_base = reconnect_base_s
        self._reconnect_max = reconnect_max_s
        self._delay = reconnect_base_s
        self._next_try = 0.0
        self._outage: _Outage | None = None
        # _state_lock: one thread at a time changes the outage state (fall back, reconnect).
        # _local_lock (held briefly): a degraded-mode operation updates the fallback and the
        # outage deltas atomically with respect to the recovery's swaps, so nothing written
        # locally can miss the merge. Recovery holds it across a network call only in its
        # last round, when other threads kept adding deltas for _MERGE_ROUNDS - 1 rounds.
        self._state_lock = threading.Lock()
        self._local_lock = threading.Lock()
        self.fallbacks = 0  # how many times this store fell back (for tests and reports)
        self._misconfigured = ""  # the last reason a reconnect was refused (reported once)
        # What the start saw of a plain-URL primary: a primary that had replicas and comes
        # back as another process (new run_id) with none is a restarted, emptied one whose
        # replica may have been promoted: it is not written to (module docstring).
        self._run_id: str | None = None
        self._had_replicas = False
        self._redis: Any = None
        if client is not None:
            encoder = client.get_encoder()
            if not getattr(encoder, "decode_responses", False):
                raise StoreConfigError(
                    "client= must decode responses: create it with decode_responses=True "
                    "(e.g. Sentinel(...).master_for(name, decode_responses=True))"
                )
            self._bind(client)
        self._start()

    # -- connection ----------------------------------------------------------------------

    def _make_client(self) -> Any:
        """A redis-py client for the URL: short timeouts, no client-side retries (a failed
        command falls back at once instead of multiplying the timeout; redis-py retries 3
        times by default), ``decode_responses=True``."""
        t = self._target
        socket_timeout, connect_timeout = self._timeouts
        common: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "decode_responses": True,
        }
        if t.kind == "single":
            return redis.Redis.from_url(t.url, retry=Retry(NoBackoff(), 0), **common)
        options: dict[str, Any] = {k: v for k, v in (("username", t.username), ("password", t.password)) if v}
        options.update(common)
        if t.kind == "cluster":
            nodes = [ClusterNode(host, port) for host, port in t.nodes]  # type: ignore[no-untyped-call]
            if t.ssl:
                options["ssl"] = True
            return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **options)
        sentinel: Any = _FailoverAwareSentinel(  # type: ignore[no-untyped-call]
            list(t.nodes),
            sentinel_kwargs={"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout},
        )
        if t.ssl:
            from redis.sentinel import SentinelManagedSSLConnection

            options["connection_class"] = SentinelManagedSSLConnection
        return sentinel.master_for(t.service, db=t.db, retry=Retry(NoBackoff(), 0), **options)

    def _bind(self, client: Any) -> None:
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self._admit = client.register_script(_ADMIT_LUA)
        self._record = client.register_script(_RECORD_LUA)
        self._force = client.register_script(_FORCE_LUA)
        self._merge_breaker = client.register_script(_MERGE_BREAKER_LUA)
        self._budget = client.register_script(_BUDGET_LUA)
        self._hash = client.register_script(_HASH_LUA)
        self._rate = client.register_script(_RATE_LUA)

    def _start(self) -> None:
        """Connect and inspect the server: unfit is a [`StoreConfigError`][loop_governor.stores.base.StoreConfigError],
        unreachable an outage from the start (local state, reconnect later)."""
        try:
            if self._redis is None:
                self._bind(self._make_client())
            self._inspect(starting=True)
        except StoreConfigError:
            self.close()
            raise
        except _ERRORS as exc:
            problem = _config_problem(exc)
            if problem is not None:
                self.close()
                raise StoreConfigError(f"store_url {self.safe_url}: {problem}") from None
            self._fail("connect", exc)

    def _inspect(self, *, starting: bool) -> None:
        """Is this a server whose state the fleet shares? Raises
        [`StoreConfigError`][loop_governor.stores.base.StoreConfigError] if not (a cluster node behind a plain URL, a
        replica, a Sentinel, a primary that came back empty after a failover). A cluster client checked its nodes
        connecting."""
        if self._cluster:
            self._redis.ping()
            return
        try:
            info = self._redis.info("server")
        except redis.ResponseError:  # INFO renamed or refused (managed services): nothing to inspect
            self._redis.ping()
            return
        mode = str(info.get("redis_mode") or info.get("server_mode") or "standalone")
        if mode == "sentinel":
            raise StoreConfigError(
                f"store_url {self.safe_url} is a Sentinel, not a Redis server: "
                "use redis+sentinel://host:port[,host:port...]/service_name"
            )
        if mode == "cluster":
            raise StoreConfigError(
                f"store_url {self.safe_url} is a Redis Cluster node: keys on other nodes answer MOVED; "
                "use redis+cluster://host:port[,host:port...]"
            )
        role = self._redis.execute_command("ROLE")
        if role and str(role[0]) in ("slave", "replica"):
            raise StoreConfigError(
                f"store_url {self.safe_url} is a read-only replica (writes answer READONLY): point it at the "
                "primary, or use redis+sentinel://host:port/service_name to follow the primary"
            )
        replicas = len(role[2]) if role and str(role[0]) == "master" and len(role) > 2 else 0
        run_id = info.get("run_id")
        run_id = None if run_id is None else str(run_id)
        if (
            not starting
            and self._target.kind == "single"
            and self._had_replicas
            and replicas == 0
            and run_id != self._run_id
        ):
            raise StoreConfigError(
                f"store_url {self.safe_url}: the primary came back empty, without its replicas, as a new "
                "process; one of them may have been promoted, so it is not written to as the primary "
                "(use redis+sentinel:// to follow failovers)"
            )
        if starting and replicas and self._target.kind == "single":
            log.warning(
                "loop-governor: store_url %s is a primary with replicas; a plain URL does not follow a "
                "failover: use redis+sentinel://",
                self.safe_url,
            )
        self._run_id, self._had_replicas = run_id, replicas > 0

    # -- keys ----------------------------------------------------------------------------
    # Redis Cluster hashes only the part of a key between the first '{' and the next '}':
    # every script and multi-key command below touches keys with one such tag.

    def _bkey(self, tool: str) -> str:
        return f"{self._prefix}breaker:{tool}"  # one key per script: no tag needed

    def _tkey(self, task_id: str, kind: str) -> str:
        tag = _tag(task_id)
        return (
            f"{self._prefix}task:{{{tag}}}:{kind}"
            if tag == task_id
            else f"{self._prefix}task:{{{tag}}}{task_id}:{kind}"
        )

    def _rkeys(self, buckets: Sequence[Bucket]) -> list[str]:
        """The buckets' keys, all tagged with the first bucket's base key (a model's
        ``key`` and ``key:tokens`` are always taken together or alone, so a bucket's key
        does not depend on its companions)."""
        first = buckets[0][0]
        base = first[: -len(_TOKENS)] if first.endswith(_TOKENS) else first
        tag = _tag(base)
        return [f"{self._prefix}rate:{{{tag}}}:{b[0]}" for b in buckets]

    def _rkey(self, key: str) -> str:
        """One bucket's key, as it is when taken alone."""
        return self._rkeys([(key, 1.0, 1.0, 1.0)])[0]

    def _now(self, now: float) -> str:
        return "" if self._server_time else _num(now)

    @staticmethod
    def _bucket_ttl_ms(rate_per_s: float, burst: float, cost: float = 0.0) -> int:
        # A bucket idle for (burst + debt)/rate seconds is full, the same as no key at all;
        # a debt (a cost above the burst) must not expire before it is paid.
        return max(60_000, math.ceil(2000 * (burst + cost) / rate_per_s))

    def _breaker_ttl_ms(self, policy: BreakerPolicy) -> int:
        return max(self._ttl_ms, math.ceil(policy.cooldown_s * 2000) + 60_000)

    # -- health --------------------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        """True while operations run on local state because Redis is unreachable."""
        return self._outage is not None

    def ping(self) -> bool:
        """One PING, for tools (the CLI) that must not silently use local state."""
        if self._redis is None:
            return False
        try:
            return bool(self._redis.ping())
        except _ERRORS:
            return False

    @property
    def on_event(self) -> EventCallback | None:
        return self._on_event

    @on_event.setter
    def on_event(self, callback: EventCallback | None) -> None:
        """Set the subscriber. Events from before it was set (a server down at start) reach
        it with the first operation after: the governor sets it in its constructor, before
        its own subscribers (trace, tests) are there."""
        self._on_event = callback

    def _flush_pending(self) -> None:
        pending, self._pending_events = self._pending_events, []
        for event in pending:
            self._emit(event)

    def _emit(self, event: dict[str, Any]) -> None:
        cb = self._on_event
        if cb is None:
            self._pending_events = [*self._pending_events[-15:], event]
            return
        try:
            cb(event)
        except Exception:  # a broken subscriber must not break the agent either
            log.exception("loop-governor: store event callback failed")

    def _fail(self, op: str, exc: BaseException) -> None:
        """Redis failed during ``op``: switch to local state (once per outage)."""
        with self._state_lock:
            if self._outage is not None:
                return
            now = self._monotonic()
            with self._local_lock:
                self._outage = _Outage(now)
            self._delay = self._reconnect_base
            self._next_try = now + self._delay
            self.fallbacks += 1
        error = redact(f"{type(exc).__name__}: {exc}")
        log.warning("loop-governor: redis store unreachable (%s); using local state", error)
        self._emit(
            {
                "event": "store_fallback",
                "store": "redis",
                "url": self.safe_url,
                "op": op,
                "error": error,
                "retry_in_s": self._delay,
            }
        )

    def _available(self) -> bool:
        """Use Redis for this operation? While degraded, try to reconnect when due."""
        if self._pending_events and self._on_event is not None:
            self._flush_pending()
        if self._outage is None:
            return True
        if self._monotonic() < self._next_try or not self._state_lock.acquire(blocking=False):
            return False
        try:
            if self._outage is None:  # another thread recovered meanwhile
                return True
            outcome = self._recover()
        finally:
            self._state_lock.release()
        if outcome is None:
            return False
        down_s, attempts, merged = outcome
        log.warning("loop-governor: redis store reachable again after %.1fs; state merged", down_s)
        self._emit(
            {
                "event": "store_recovered",
                "store": "redis",
                "url": self.safe_url,
                "down_s": down_s,
                "attempts": attempts,
                "merged": merged,
            }
        )
        return True

    def _recover(self) -> tuple[float, int, dict[str, int]] | None:
        """Reconnect and merge the outage back (caller holds ``_state_lock``).

        Other threads keep working locally meanwhile: each round swaps in a fresh outage
        record (under ``_local_lock``) and merges the previous one, until a swap finds no
        new deltas; only then does the store leave local state, in the same locked step.
        The last round merges under the lock, so recovery ends even under a steady stream
        of local writes. Returns ``(down_s, attempts, merged)``, or None if Redis failed.
        """
        with self._local_lock:
            outage = self._outage
            assert outage is not None
            outage.attempts += 1
            started, attempts = outage.started, outage.attempts
        merged = {"breakers": 0, "budgets": 0, "known_bad": 0, "signatures": 0}

        def count(counts: dict[str, int]) -> None:
            for k, n in counts.items():
                merged[k] += n

        try:
            if self._redis is None:  # a cluster that was down at start: connect now
                self._bind(self._make_client())
            try:
                self._inspect(starting=False)
            except StoreConfigError as exc:
                self._refuse(str(exc))
                raise redis.ConnectionError("server unfit for the fleet's state") from None
            self._misconfigured = ""
            for round_ in range(1, _MERGE_ROUNDS + 1):
                with self._local_lock:
                    pending = self._outage
                    assert pending is not None
                    if round_ == _MERGE_ROUNDS and not pending.empty():
                        count(self._merge(pending))  # if this fails, the deltas stay where they are
                    if round_ == _MERGE_ROUNDS or pending.empty():
                        self._outage = None
                        self._fallback = MemoryStore()
                        return self._monotonic() - started, attempts, merged
                    fresh = _Outage(started)
                    fresh.attempts = attempts
                    self._outage = fresh
                try:
                    count(self._merge(pending))
                except BaseException:
                    with self._local_lock:  # not merged: keep its deltas (and the newer ones)
                        pending.absorb(fresh)  # (only this thread replaces self._outage now)
                        self._outage = pending
                    raise
        except _ERRORS:
            self._delay = min(self._reconnect_max, self._delay * 2)
            # Jitter so a fleet doesn't reconnect in lock-step.
            self._next_try = self._monotonic() + self._delay * (0.5 + 0.5 * self._random())
            return None
        raise AssertionError("unreachable: the last merge round always returns")

    def _refuse(self, reason: str) -> None:
        """A reconnect found a server the fleet's state must not go to: stay local, say so
        (once per distinct reason)."""
        if reason == self._misconfigured:
            return
        self._misconfigured = reason
        log.error("loop-governor: redis store not reconnected: %s", reason)
        self._emit({"event": "store_misconfigured", "store": "redis", "url": self.safe_url, "error": reason})

    def _merge(self, outage: _Outage) -> dict[str, int]:
        """Push the outage's local deltas to Redis: the breaker merges one script call each
        (a cluster refuses EVALSHA in a pipeline), the rest one pipeline of single-key
        commands (a cluster pipeline sends each to its node)."""
        fb = self._fallback
        tools = 0
        for tool in sorted(outage.tools):
            rec = fb.breaker_get(tool)
            if rec.state is BreakerState.CLOSED:
                continue  # local successes must not erase the fleet's failures
            tools += 1
            ttl = max(self._ttl_ms, 3_600_000)
            args = [rec.state.value, rec.failures, _num(rec.opened_at), _num(rec.probe_at), ttl]
            self._merge_breaker(keys=[self._bkey(tool)], args=args)
        pipe = self._redis.pipeline(transaction=False)
        for task_id in sorted(outage.ended):
            for kind in ("budget", "bad", "sig"):
                pipe.delete(self._tkey(task_id, kind))
        for task_id, n in outage.budget_taken.items():
            key = self._tkey(task_id, "budget")
            pipe.incrby(key, n)
            pipe.pexpire(key, self._ttl_ms)
        for task_id, calls in outage.known_bad.items():
            key = self._tkey(task_id, "bad")
            for call, info in calls.items():
                pipe.hsetnx(key, call, info)
            pipe.pexpire(key, self._ttl_ms)
        for task_id, counts in outage.signatures.items():
            key = self._tkey(task_id, "sig")
            for sig, n in counts.items():
                pipe.hincrby(key, sig, n)
            pipe.pexpire(key, self._ttl_ms)
        if len(pipe):
            pipe.execute()
        return {
            "breakers": tools,
            "budgets": len(outage.budget_taken),
            "known_bad": sum(len(c) for c in outage.known_bad.values()),
            "signatures": sum(len(c) for c in outage.signatures.values()),
        }

    def _local(self, op: Callable[[MemoryStore, _Outage], _T]) -> _T | _Retry:
        """Run ``op(fallback, outage)`` on local state, atomically with respect to the
        recovery's swaps; ``_Retry.RETRY`` when the store left local state meanwhile (then the
        operation must go to Redis, or a write would land in a discarded fallback)."""
        with self._local_lock:
            outage = self._outage
            if outage is None:
                return _Retry.RETRY
            return op(self._fallback, outage)

    # -- breakers ------------------------------------------------------------------------

    def breaker_admit(self, tool: str, clock: Clock, policy: BreakerPolicy) -> tuple[Admission, Transition | None]:
        while True:
            if self._available():
                key = self._bkey(tool)
                cooldown, ttl = _num(policy.cooldown_s), self._breaker_ttl_ms(policy)
                try:
                    # Closed (the success path) is a read: one plain HMGET, about a GET's cost.
                    # Otherwise the clock is read and the admit script decides atomically
                    # (it re-reads the state, which may have changed in between).
                    state, failures = self._redis.hmget(key, ["s", "f"])
                    if state is None or state == "closed":
                        return (ADMIT_DIRTY if failures not in (None, "0") else ADMIT), None
                    now = "" if self._server_time else _num(clock())
                    reply = self._admit(keys=[key], args=[now, cooldown, ttl])
                    return self._admission(reply)
                except _ERRORS as exc:
                    self._fail("breaker_admit", exc)

            def local(fb: MemoryStore, o: _Outage) -> tuple[Admission, Transition | None]:
                o.tools.add(tool)
                return fb.breaker_admit(tool, clock, policy)

            result = self._local(local)
            if result is not _Retry.RETRY:
                return result

    @staticmethod
    def _admission(reply: list[str]) -> tuple[Admission, Transition | None]:
        kind = reply[0]
        if kind == "closed":  # it closed between our two round trips
            return (ADMIT_DIRTY if reply[1] != "0" else ADMIT), None
        if kind == "probe":
            adm = Admission(True, probe=True, dirty=True, state=BreakerState.HALF_OPEN)
            transition = (BreakerState.OPEN, BreakerState.HALF_OPEN) if reply[1] == "open" else None
            return adm, transition
        if kind == "deny":
            adm = Admission(False, state=_STATES[reply[1]], retry_in=float(reply[3]), failures=int(reply[2]))
            return adm, None
        raise redis.ResponseError(f"unexpected admit reply {reply!r}")

    def breaker_record(
        self, tool: str, ok: bool, probe: bool, now: float, policy: BreakerPolicy, *, backdate_s: float = 0.0
    ) -> Transition | None:
        while True:
            if self._available():
                args = [
                    "1" if ok else "0",
                    "1" if probe else "0",
                    self._now(now),
                    policy.failure_threshold,
                    self._breaker_ttl_ms(policy),
                    _num(backdate_s),
                ]
                try:
                    reply = self._record(keys=[self._bkey(tool)], args=args)
                    return (_STATES[reply[0]], _STATES[reply[1]]) if reply else None
                except _ERRORS as exc:
                    self._fail("breaker_record", exc)

            def local(fb: MemoryStore, o: _Outage) -> Transition | None:
                o.tools.add(tool)
                return fb.breaker_record(tool, ok, probe, now, policy, backdate_s=backdate_s)

            result = self._local(local)
            if result is not _Retry.RETRY:
                return result

    def breaker_get(self, tool: str) -> BreakerRecord:
        while True:
            if self._available():
                try:
                    h = self._redis.hmget(self._bkey(tool), ["s", "f", "o", "p"])
                    return self._to_record(h)
                except _ERRORS as exc:
                    self._fail("breaker_get", exc)
            record = self._local(lambda fb, o: fb.breaker_get(tool))
            if record is not _Retry.RETRY:
                return record

    @staticmethod
    def _to_record(h: list[Any]) -> BreakerRecord:
        if h[0] is None:
            return BreakerRecord()
        return BreakerRecord(_STATES[str(h[0])], int(h[1] or 0), float(h[2] or 0), float(h[3] or 0))

    def breaker_list(self) -> list[BreakerStatus]:
        while True:
            if self._available():
                try:
                    prefix = self._bkey("")
                    keys = sorted(self._redis.scan_iter(match=_glob_escape(prefix) + "*", count=500))
                    pipe = self._redis.pipeline(transaction=False)
                    for key in keys:
                        pipe.hmget(key, ["s", "f", "o", "p"])
                    out = []
                    for key, h in zip(keys, pipe.execute(), strict=True):
                        if h[0] is None:
                            continue  # expired between SCAN and HMGET
                        rec = self._to_record(h)
                        out.append(BreakerStatus(key[len(prefix) :], rec.state, rec.failures, rec.opened_at))
                    return out
                except _ERRORS as exc:
                    self._fail("breaker_list", exc)
            listing = self._local(lambda fb, o: fb.breaker_list())
            if listing is not _Retry.RETRY:
                return listing

    def breaker_force(self, tool: str, state: BreakerState | str, now: float) -> None:
        rec = force(state, now)
        while True:
            if self._available():
                try:
                    args = [rec.state.value, self._now(now), max(self._ttl_ms, 3_600_000)]
                    self._force(keys=[self._bkey(tool)], args=args)
                    return
                except _ERRORS as exc:
                    self._fail("breaker_force", exc)

            def local(fb: MemoryStore, o: _Outage) -> None:
                o.tools.add(tool)
                fb.breaker_force(tool, state, now)

            if self._local(local) is not _Retry.RETRY:
                return

    # -- per-task state ------------------------------------------------------------------

    def budget_take(self, task_id: str, limit: int) -> bool:
        while True:
            if self._available():
                try:
                    return bool(self._budget(keys=[self._tkey(task_id, "budget")], args=[limit, self._ttl_ms]))
                except _ERRORS as exc:
                    self._fail("budget_take", exc)

            def local(fb: MemoryStore, o: _Outage) -> bool:
                taken = fb.budget_take(task_id, limit)
                if taken:
                    o.budget_taken[task_id] = o.budget_taken.get(task_id, 0) + 1
                return taken

            result = self._local(local)
            if result is not _Retry.RETRY:
                return result

    def budget_used(self, task_id: str) -> int:
        while True:
            if self._available():
                try:
                    return int(self._redis.get(self._tkey(task_id, "budget")) or 0)
                except _ERRORS as exc:
                    self._fail("budget_used", exc)
            used = self._local(lambda fb, o: fb.budget_used(task_id))
            if used is not _Retry.RETRY:
                return used

    def known_bad_get(self, task_id: str, key: str) -> str | None:
        while True:
            if self._available():
                try:
                    value = self._redis.hget(self._tkey(task_id, "bad"), key)
                    return None if value is None else str(value)
                except _ERRORS as exc:
                    self._fail("known_bad_get", exc)
            found = self._local(lambda fb, o: fb.known_bad_get(task_id, key))
            if found is not _Retry.RETRY:
                return found

    def known_bad_put(self, task_id: str, key: str, info_json: str) -> None:
        while True:
            if self._available():
                try:
                    self._hash(keys=[self._tkey(task_id, "bad")], args=["set", key, info_json, self._ttl_ms])
                    return
                except _ERRORS as exc:
                    self._fail("known_bad_put", exc)

            def local(fb: MemoryStore, o: _Outage) -> None:
                o.known_bad.setdefault(task_id, {})[key] = info_json
                fb.known_bad_put(task_id, key, info_json)

            if self._local(local) is not _Retry.RETRY:
                return

    def known_bad_count(self, task_id: str) -> int:
        while True:
            if self._available():
                try:
                    return int(self._redis.hlen(self._tkey(task_id, "bad")))
                except _ERRORS as exc:
                    self._fail("known_bad_count", exc)
            count = self._local(lambda fb, o: fb.known_bad_count(task_id))
            if count is not _Retry.RETRY:
                return count

    def signature_hit(self, task_id: str, signature: str) -> int:
        while True:
            if self._available():
                try:
                    args = ["incr", signature, 1, self._ttl_ms]
                    return int(self._hash(keys=[self._tkey(task_id, "sig")], args=args))
                except _ERRORS as exc:
                    self._fail("signature_hit", exc)

            def local(fb: MemoryStore, o: _Outage) -> int:
                counts = o.signatures.setdefault(task_id, {})
                counts[signature] = counts.get(signature, 0) + 1
                return fb.signature_hit(task_id, signature)

            result = self._local(local)
            if result is not _Retry.RETRY:
                return result

    def end_task(self, task_id: str) -> None:
        while True:
            if self._available():
                try:
                    self._redis.delete(*(self._tkey(task_id, k) for k in ("budget", "bad", "sig")))
                    return
                except _ERRORS as exc:
                    self._fail("end_task", exc)

            def local(fb: MemoryStore, o: _Outage) -> None:
                o.ended.add(task_id)
                o.budget_taken.pop(task_id, None)
                o.known_bad.pop(task_id, None)
                o.signatures.pop(task_id, None)
                fb.end_task(task_id)

            if self._local(local) is not _Retry.RETRY:
                return

    # -- rate limits (per tool, fleet-wide) ----------------------------------------------

    def rate_acquire(self, tool: str, rate_per_s: float, burst: float, now: float) -> float:
        """Take one token from ``tool``'s shared bucket: 0.0 if admitted, else seconds to wait."""
        return self.rate_acquire_all([(tool, rate_per_s, burst, 1.0)], now)

    def rate_acquire_all(self, buckets: Sequence[Bucket], now: float) -> float:
        """Take each bucket's cost, all or nothing, fleet-wide: 0.0 if admitted, else the
        seconds to wait (nothing was taken; wait, then ask again). While Redis is away each
        process limits itself to the full rates on its own."""
        for _, rate_per_s, burst, _ in buckets:
            if rate_per_s <= 0 or burst < 1:
                raise ValueError("rate_per_s must be > 0 and burst >= 1")
        if not buckets:
            return 0.0
        while True:
            if self._available():
                args: list[str | int] = [self._now(now)]
                for _, rate_per_s, burst, cost in buckets:
                    args += [_num(rate_per_s), _num(burst), _num(cost), self._bucket_ttl_ms(rate_per_s, burst, cost)]
                try:
                    reply = self._rate(keys=self._rkeys(buckets), args=args)
                    return float(reply)
                except _ERRORS as exc:
                    self._fail("rate_acquire", exc)
            wait = self._local(lambda fb, o: fb.rate_acquire_all(buckets, now))
            if wait is not _Retry.RETRY:
                return wait

    def close(self) -> None:
        if self._redis is None:
            return
        try:
            self._redis.close()
        except _ERRORS:
            pass
