"""The Redis store's connections: which client a URL gets, and which answers mean the
server cannot hold the fleet's state (a configuration error, not an outage)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from loop_governor.redaction import redact
from loop_governor.stores.redis_url import RedisTarget

# What a failed command can raise: redis-py's errors, socket errors, and the cluster
# client's own exceptions (RedisClusterException is not a RedisError).
ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError, RedisClusterException)

URL_OPTIONS = ("namespace", "ttl_s")


def split_options(url: str) -> tuple[str, dict[str, str]]:
    """Take the store's own options (``?namespace=..&ttl_s=..``) out of a Redis URL, so
    ``GovernorConfig(store_url=...)`` can set them and redis-py never sees them."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in URL_OPTIONS}
    rest = [(k, v) for k, v in query if k not in URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(rest))), ours


def config_problem(exc: BaseException) -> str | None:
    """Why a server that answered cannot be used (a configuration error, not an outage)."""
    if isinstance(exc, RedisClusterException):
        text = str(exc)
        if "Cluster mode is not enabled" in text:
            return "not a Redis Cluster node (cluster mode is disabled): use redis://host:port/db"
        cause = exc.__cause__
        if cause is not None and config_problem(cause) is not None:
            return config_problem(cause)
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


class FailoverAwareSentinel(Sentinel):
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


def make_client(target: RedisTarget, socket_timeout: float, connect_timeout: float) -> Any:
    """A redis-py client for the URL: short timeouts, no client-side retries (a failed
    command falls back at once instead of multiplying the timeout; redis-py retries 3
    times by default), ``decode_responses=True``."""
    t = target
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
    sentinel: Any = FailoverAwareSentinel(  # type: ignore[no-untyped-call]
        list(t.nodes),
        sentinel_kwargs={"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout},
    )
    if t.ssl:
        from redis.sentinel import SentinelManagedSSLConnection

        options["connection_class"] = SentinelManagedSSLConnection
    return sentinel.master_for(t.service, db=t.db, retry=Retry(NoBackoff(), 0), **options)


# Replies that do not fail the deferred command for good: the command is sent again
# through the client, which loads the script (NOSCRIPT) or follows the slot (cluster).
_RESEND: tuple[type[BaseException], ...] = (
    redis.exceptions.NoScriptError,
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
)


class _Lease:
    """A held connection goes back to its pool (disconnected: its replies are unread) if
    its thread ends holding it: a thread's local state is dropped when the thread ends."""

    __slots__ = ("conn", "pool")

    def __init__(self, conn: Any, pool: Any) -> None:
        self.conn, self.pool = conn, pool

    def __del__(self) -> None:
        if self.conn is not None:
            self.conn.disconnect()
            self.pool.release(self.conn)


class _Held(threading.local):
    """One thread's connection with replies still unread, and how to resend each."""

    conn: Any = None
    pool: Any = None
    lease: _Lease | None = None
    epoch = 0
    pid = 0  # the process that took the connection: a fork's child must not read its replies
    since = 0.0  # monotonic time the first unread reply was sent

    def __init__(self) -> None:
        self.pending: list[Callable[[], object]] = []

    def take(self) -> tuple[Any, Any, list[Callable[[], object]]]:
        """Stop holding the connection (the caller reads its replies or drops it)."""
        conn, pool, pending, lease = self.conn, self.pool, self.pending, self.lease
        if lease is not None:
            lease.conn = None
        self.conn, self.pool, self.pending, self.lease = None, None, [], None
        return conn, pool, pending


class DeferredReplies:
    """Commands whose reply can wait: sent now, their reply read with the next request's.

    What it is for: a governed call's success must reach the server when it completes (a
    failure another process records after it must not be reset by it: consecutive failures
    count in completion order), but its reply carries nothing the caller needs (a success
    outside a probe never changes the breaker's state). So the success is written to the
    socket at once and the thread moves on; the next admission sends its read on the same
    connection and reads both replies: one round trip per governed call, and the server
    applies every success in the order the calls completed.

    Why by hand: redis-py's ``Pipeline`` sends its commands when it executes, all at once;
    nothing in redis-py writes a command now and reads its reply later. This uses only the
    pool's ``get_connection``/``release`` and the connection's ``send_command``/``read_response``.

    Each thread holds at most one connection with unread replies, taken from the pool of
    the key's server (a cluster node's own pool), and gives it back when its replies are
    read. Any failure disconnects it (its reply stream is out of step) and the replies are
    dropped: the store falls back, and a success recorded on the fresh local state an
    outage starts with changes nothing. ``forget()`` (the store fell back) drops every
    thread's held connection at its next use, whatever was sent before the outage.
    """

    _LIMIT = 64  # unread replies per thread at most (successes recorded without admissions)

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._held = _Held()
        self._epoch = 0
        self._monotonic = monotonic  # the store's: how long a connection has been held

    def forget(self) -> None:
        self._epoch += 1

    @property
    def holding(self) -> bool:
        return self._held.conn is not None

    def send(self, pool: Any, resend: Callable[[], object], *command: Any) -> None:
        """Write ``command`` now; read its reply later (``resend()`` runs it again through
        the client if that reply is NOSCRIPT or MOVED/ASK)."""
        if isinstance(pool, redis.BlockingConnectionPool):
            # a bounded pool sized to the threads: a connection held until the thread's next
            # call could starve another thread, so the reply is read now (two round trips)
            self._now(pool, resend, command)
            return
        held = self._held
        self._settle()
        if held.conn is not None and (held.pool is not pool or len(held.pending) >= self._LIMIT):
            self.drain()
        conn = held.conn
        if conn is None:
            conn = pool.get_connection()
            held.conn, held.pool, held.epoch, held.lease = conn, pool, self._epoch, _Lease(conn, pool)
            held.pid, held.since = os.getpid(), self._monotonic()
        try:
            # no health-check PING (a client's health_check_interval) while replies are unread:
            # its read would take one of them
            conn.send_command(*command, check_health=not held.pending)
        except BaseException:
            self._drop()
            raise
        held.pending.append(resend)

    def request(self, pool: Any, *command: Any) -> Any:
        """Send ``command`` and return its reply, reading every unread reply before it on
        the same connection: one round trip for all of them."""
        held = self._held
        self._settle()
        if held.conn is not None and held.pool is not pool:
            self.drain()
        if held.conn is None:
            conn = pool.get_connection()
            try:
                conn.send_command(*command)
                return conn.read_response()
            except BaseException:
                conn.disconnect()
                raise
            finally:
                pool.release(conn)
        resends = self._read_pending(command)
        reply = resends.pop()
        for resend in resends:
            resend()
        return reply

    def drain(self) -> None:
        """Read the unread replies (before any other command: read-your-writes)."""
        self._settle()
        if self._held.conn is not None:
            for resend in self._read_pending(None):
                resend()

    _IDLE_S = 0.5  # a connection held longer is read out and given back before its next use

    def _settle(self) -> None:
        """Before a held connection is used again: in a forked child, forget it without
        touching the socket (the parent owns its replies); after an idle spell, read its
        replies (long arrived: no wait) and give it back, so the pool's own checks (a
        socket the server closed for idling, a health check) apply to the next command."""
        held = self._held
        if held.conn is None:
            return
        if held.pid != os.getpid():
            held.take()  # the parent's: neither read, disconnected nor released here
            return
        if self._monotonic() - held.since > self._IDLE_S:
            for resend in self._read_pending(None):
                resend()

    def _now(self, pool: Any, resend: Callable[[], object], command: tuple[Any, ...]) -> None:
        """Send ``command`` and read its reply at once (resending it if it asks for that)."""
        self.drain()
        try:
            self.request(pool, *command)
        except _RESEND:
            resend()

    def _read_pending(self, command: tuple[Any, ...] | None) -> list[Any]:
        """Send ``command`` (if any), read the pending replies and then its own; give the
        connection back. Returns the resends due, then ``command``'s reply (if sent)."""
        held = self._held
        conn, pool, pending = held.take()
        if held.epoch != self._epoch:  # sent before an outage: the connection is suspect
            conn.disconnect()
            pool.release(conn)
            if command is None:
                return []
            return [self.request(pool, *command)]
        out: list[Any] = []
        failure: BaseException | None = None
        own: BaseException | None = None
        try:
            if command is not None:
                conn.send_command(*command, check_health=not pending)
            for resend in pending:
                try:
                    conn.read_response()
                except _RESEND:
                    out.append(resend)
                except redis.ResponseError as exc:  # an error reply: read on, then raise it
                    failure = failure or exc
            if command is not None:
                try:
                    out.append(conn.read_response())
                except _RESEND as exc:  # the caller resends its own; the pending ones are ours
                    own = exc
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if own is not None:
            for resend in out:
                resend()
            raise own
        if failure is not None:
            raise failure
        return out

    def _drop(self) -> None:
        conn, pool, _ = self._held.take()
        if conn is not None:
            conn.disconnect()
            pool.release(conn)
