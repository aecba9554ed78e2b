"""The fleet store's URL forms, parsed without importing redis-py (the config validates
``store_url`` with this, so a typo fails at construction, not at the first call).

- ``redis://[user:pass@]host:port/db``, ``rediss://...``, ``unix:///path``: one server
  (redis-py's own ``from_url``);
- ``redis+cluster://[user:pass@]host:port[,host:port...]``: a Redis Cluster, the nodes
  being startup nodes (any reachable one is enough to discover the others);
- ``redis+sentinel://[user:pass@]host:port[,host:port...]/service_name[/db]``: the
  primary Sentinel currently names for ``service_name`` (the credentials are the
  primary's; the Sentinels themselves are reached without).

redis-py has no URL form for either (``Redis.from_url`` takes one host), hence this parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["RedisTarget", "parse_redis_url"]

_PLAIN = ("redis", "rediss", "unix")


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What a ``store_url`` points at. ``kind``: ``single``, ``cluster`` or ``sentinel``."""

    kind: str
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def _nodes(netloc: str, url_for_errors: str) -> tuple[tuple[str, int], ...]:
    hosts = netloc.rpartition("@")[2]
    out = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            # the text is not echoed: a password holding '/' or '@' lands here, cut up
            raise ValueError(f"store_url {url_for_errors}: every node must be host:port, comma-separated")
        out.append((host.strip("[]"), int(port)))
    return tuple(out)


def parse_redis_url(url: str, safe_url: str | None = None) -> RedisTarget:
    """Parse a Redis store URL; ``ValueError`` (naming ``store_url``) if it is malformed.
    ``safe_url`` (the URL with its password masked) is what error messages show."""
    shown = safe_url if safe_url is not None else "(redis URL)"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in _PLAIN:
        return RedisTarget("single", url)
    base, _, kind = scheme.partition("+")
    if base not in ("redis", "rediss") or kind not in ("cluster", "sentinel"):
        raise ValueError(f"store_url {shown}: unknown scheme {scheme!r}")
    userinfo = parts.netloc.rpartition("@")[0]
    user, has_pw, pw = userinfo.partition(":")
    username = unquote(user) or None
    password = unquote(pw) if has_pw else None
    nodes = _nodes(parts.netloc, shown)
    ssl = base == "rediss"
    path = [p for p in parts.path.split("/") if p]
    if kind == "cluster":
        if path and path != ["0"]:
            raise ValueError(f"store_url {shown}: a Redis Cluster has only database 0 (no /db in the URL)")
        return RedisTarget("cluster", url, nodes, username=username, password=password, ssl=ssl)
    if not path or len(path) > 2:
        raise ValueError(
            f"store_url {shown}: a Sentinel URL names the service: redis+sentinel://host:port/service_name[/db]"
        )
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"store_url {shown}: the database after the service name must be a number")
        db = int(path[1])
    return RedisTarget("sentinel", url, nodes, unquote(path[0]), db, username, password, ssl)
