"""Fleet state in Redis: many agent processes share breakers, budgets and rate limits.

Every state change is one Lua script (`redis_scripts.py`), so a
transition is atomic across the fleet: exactly one caller moves an open breaker to
half-open and gets the probe. The scripts mirror
[`loop_governor.state.breaker`][loop_governor.state.breaker] line by line (a differential test runs both
on random operation sequences); the pure Python functions remain the specification. Which
client a URL gets, and which answers are configuration errors, is `redis_connection.py`.

Hot path: a governed success is one round trip. A closed breaker is admitted by one
HMGET, and the clock is read only when the breaker is not closed (then the admit script
decides). The success is recorded by a script written to the socket when the call
completes (it resets failures other calls completed while it ran: "consecutive" is
counted in completion order), and its reply, always empty, is read with the next
admission's on the same connection (`DeferredReplies` in `redis_connection.py`). A
rate-limited call takes from all its buckets (requests, tokens) in one script call.

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

import hashlib
import logging
import math
import random as _random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

try:
    import redis
    from redis.cluster import RedisCluster
    from redis.exceptions import AskError, MovedError, NoScriptError
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
from loop_governor.stores.redis_connection import (
    ERRORS,
    DeferredReplies,
    config_problem,
    make_client,
    split_options,
)
from loop_governor.stores.redis_scripts import num, register
from loop_governor.stores.redis_url import RedisTarget, parse_redis_url

__all__ = ["RedisStore"]

log = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], None]
_T = TypeVar("_T")


_STATES = {s.value: s for s in BreakerState}

_TOKENS = ":tokens"


def _tag(name: str) -> str:
    """``name`` as a hash tag: itself, or a digest when it is empty or holds a brace (a tag
    ends at the first ``}``, and an empty one hashes the whole key)."""
    if name and "{" not in name and "}" not in name:
        return name
    return "h" + hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


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
        url, options = split_options(url)
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
        self._deferred = DeferredReplies(monotonic)  # the successes' replies, read with the next admission
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

    def _bind(self, client: Any) -> None:
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self._scripts = register(client)
        # Where a key's commands go when sent by hand (DeferredReplies): the client's pool, a
        # cluster node's own pool, or none for a single-connection client (then every
        # command goes through the client, and a success costs its own round trip).
        self._one_pool = None if self._cluster or getattr(client, "connection", None) else client.connection_pool

    def _pool(self, key: str) -> Any:
        if self._cluster:
            return self._redis.get_redis_connection(self._redis.get_node_from_key(key)).connection_pool
        return self._one_pool

    def _start(self) -> None:
        """Connect and inspect the server: unfit is a [`StoreConfigError`][loop_governor.stores.base.StoreConfigError],
        unreachable an outage from the start (local state, reconnect later)."""
        try:
            if self._redis is None:
                self._bind(make_client(self._target, *self._timeouts))
            self._inspect(starting=True)
        except StoreConfigError:
            self.close()
            raise
        except ERRORS as exc:
            problem = config_problem(exc)
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
        return "" if self._server_time else num(now)

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
        except ERRORS:
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
            self._deferred.forget()
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
                self._bind(make_client(self._target, *self._timeouts))
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
        except ERRORS:
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
            args = [rec.state.value, rec.failures, num(rec.opened_at), num(rec.probe_at), ttl]
            self._scripts.merge_breaker(keys=[self._bkey(tool)], args=args)
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

    def _run(
        self,
        op: str,
        remote: Callable[[], _T],
        local: Callable[[MemoryStore, _Outage], _T],
        *,
        drain: bool = True,
    ) -> _T:
        """The fallback pattern, once: ``remote()`` on Redis; if Redis fails, fall back and
        run ``local(fallback, outage)`` on local state (which records the outage's deltas),
        atomically with respect to the recovery's swaps. If the store left local state
        meanwhile, the operation goes to Redis again (a write must never land in a
        discarded fallback). ``drain``: read this thread's unread success replies first
        (every operation but the two that pipeline them), so it reads its own writes."""
        while True:
            if self._available():
                try:
                    if drain and self._deferred.holding:
                        self._deferred.drain()
                    return remote()
                except ERRORS as exc:
                    self._fail(op, exc)
            with self._local_lock:
                outage = self._outage
                if outage is not None:
                    return local(self._fallback, outage)

    # -- breakers ------------------------------------------------------------------------

    def breaker_admit(self, tool: str, clock: Clock, policy: BreakerPolicy) -> tuple[Admission, Transition | None]:
        def remote() -> tuple[Admission, Transition | None]:
            # Closed (the success path) is a read: one plain HMGET, about a GET's cost.
            # Otherwise the clock is read and the admit script decides atomically
            # (it re-reads the state, which may have changed in between).
            key = self._bkey(tool)
            pool = self._pool(key)
            if pool is None:
                state, failures = self._redis.hmget(key, ["s", "f"])
            else:
                try:  # on the connection holding this thread's unread success replies, if any
                    state, failures = self._deferred.request(pool, "HMGET", key, "s", "f")
                except (MovedError, AskError):  # a cluster slot moved: the client follows it
                    state, failures = self._redis.hmget(key, ["s", "f"])
            if state is None or state == "closed":
                return (ADMIT_DIRTY if failures not in (None, "0") else ADMIT), None
            now = "" if self._server_time else num(clock())
            args = [now, num(policy.cooldown_s), self._breaker_ttl_ms(policy)]
            return self._admission(self._scripts.admit(keys=[key], args=args))

        def local(fb: MemoryStore, o: _Outage) -> tuple[Admission, Transition | None]:
            o.tools.add(tool)
            return fb.breaker_admit(tool, clock, policy)

        return self._run("breaker_admit", remote, local, drain=False)

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
        def remote() -> Transition | None:
            args = [
                "1" if ok else "0",
                "1" if probe else "0",
                self._now(now),
                policy.failure_threshold,
                self._breaker_ttl_ms(policy),
                num(backdate_s),
            ]
            key = self._bkey(tool)
            if ok and not probe and (pool := self._pool(key)) is not None:
                # A success outside a probe never changes the state (its reply is always
                # empty): written now, in completion order, and its reply read with the next
                # admission's (DeferredReplies): one round trip per governed call.
                def resend() -> None:
                    self._scripts.record(keys=[key], args=args)

                self._deferred.send(pool, resend, "EVALSHA", self._scripts.record.sha, 1, key, *args)
                return None
            reply = self._scripts.record(keys=[key], args=args)
            return (_STATES[reply[0]], _STATES[reply[1]]) if reply else None

        def local(fb: MemoryStore, o: _Outage) -> Transition | None:
            o.tools.add(tool)
            return fb.breaker_record(tool, ok, probe, now, policy, backdate_s=backdate_s)

        return self._run("breaker_record", remote, local, drain=not ok or probe)

    def breaker_get(self, tool: str) -> BreakerRecord:
        return self._run(
            "breaker_get",
            lambda: self._to_record(self._redis.hmget(self._bkey(tool), ["s", "f", "o", "p"])),
            lambda fb, o: fb.breaker_get(tool),
        )

    @staticmethod
    def _to_record(h: list[Any]) -> BreakerRecord:
        if h[0] is None:
            return BreakerRecord()
        return BreakerRecord(_STATES[str(h[0])], int(h[1] or 0), float(h[2] or 0), float(h[3] or 0))

    def breaker_list(self) -> list[BreakerStatus]:
        def remote() -> list[BreakerStatus]:
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

        return self._run("breaker_list", remote, lambda fb, o: fb.breaker_list())

    def breaker_force(self, tool: str, state: BreakerState | str, now: float) -> None:
        rec = force(state, now)

        def remote() -> None:
            args = [rec.state.value, self._now(now), max(self._ttl_ms, 3_600_000)]
            self._scripts.force(keys=[self._bkey(tool)], args=args)

        def local(fb: MemoryStore, o: _Outage) -> None:
            o.tools.add(tool)
            fb.breaker_force(tool, state, now)

        self._run("breaker_force", remote, local)

    # -- per-task state ------------------------------------------------------------------

    def budget_take(self, task_id: str, limit: int) -> bool:
        def local(fb: MemoryStore, o: _Outage) -> bool:
            taken = fb.budget_take(task_id, limit)
            if taken:
                o.budget_taken[task_id] = o.budget_taken.get(task_id, 0) + 1
            return taken

        return self._run(
            "budget_take",
            lambda: bool(self._scripts.budget(keys=[self._tkey(task_id, "budget")], args=[limit, self._ttl_ms])),
            local,
        )

    def budget_used(self, task_id: str) -> int:
        return self._run(
            "budget_used",
            lambda: int(self._redis.get(self._tkey(task_id, "budget")) or 0),
            lambda fb, o: fb.budget_used(task_id),
        )

    def known_bad_get(self, task_id: str, key: str) -> str | None:
        def remote() -> str | None:
            value = self._redis.hget(self._tkey(task_id, "bad"), key)
            return None if value is None else str(value)

        return self._run("known_bad_get", remote, lambda fb, o: fb.known_bad_get(task_id, key))

    def known_bad_put(self, task_id: str, key: str, info_json: str) -> None:
        def remote() -> None:
            self._scripts.hash(keys=[self._tkey(task_id, "bad")], args=["set", key, info_json, self._ttl_ms])

        def local(fb: MemoryStore, o: _Outage) -> None:
            o.known_bad.setdefault(task_id, {})[key] = info_json
            fb.known_bad_put(task_id, key, info_json)

        self._run("known_bad_put", remote, local)

    def known_bad_count(self, task_id: str) -> int:
        return self._run(
            "known_bad_count",
            lambda: int(self._redis.hlen(self._tkey(task_id, "bad"))),
            lambda fb, o: fb.known_bad_count(task_id),
        )

    def signature_hit(self, task_id: str, signature: str) -> int:
        def local(fb: MemoryStore, o: _Outage) -> int:
            counts = o.signatures.setdefault(task_id, {})
            counts[signature] = counts.get(signature, 0) + 1
            return fb.signature_hit(task_id, signature)

        args = ["incr", signature, 1, self._ttl_ms]
        return self._run(
            "signature_hit", lambda: int(self._scripts.hash(keys=[self._tkey(task_id, "sig")], args=args)), local
        )

    def end_task(self, task_id: str) -> None:
        def remote() -> None:
            self._redis.delete(*(self._tkey(task_id, k) for k in ("budget", "bad", "sig")))

        def local(fb: MemoryStore, o: _Outage) -> None:
            o.ended.add(task_id)
            o.budget_taken.pop(task_id, None)
            o.known_bad.pop(task_id, None)
            o.signatures.pop(task_id, None)
            fb.end_task(task_id)

        self._run("end_task", remote, local)

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

        def remote() -> float:
            args: list[str | int] = [self._now(now)]
            for _, rate_per_s, burst, cost in buckets:
                args += [num(rate_per_s), num(burst), num(cost), self._bucket_ttl_ms(rate_per_s, burst, cost)]
            keys = self._rkeys(buckets)
            if self._deferred.holding and (pool := self._pool(keys[0])) is not None:
                # a rate-limited call's success is still unread: read it with this request's reply
                try:
                    return float(
                        self._deferred.request(pool, "EVALSHA", self._scripts.rate.sha, len(keys), *keys, *args)
                    )
                except (NoScriptError, MovedError, AskError):
                    pass  # the client loads the script, or follows the slot
            return float(self._scripts.rate(keys=keys, args=args))

        return self._run("rate_acquire", remote, lambda fb, o: fb.rate_acquire_all(buckets, now), drain=False)

    def close(self) -> None:
        if self._redis is None:
            return
        try:
            self._deferred.drain()  # this thread's last successes' replies
        except ERRORS:
            pass
        try:
            self._redis.close()
        except ERRORS:
            pass
