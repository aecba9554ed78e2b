"""The Redis store's connections: which client a URL gets, and which answers mean the
server cannot hold the fleet's state (a configuration error, not an outage)."""

from __future__ import annotations

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
