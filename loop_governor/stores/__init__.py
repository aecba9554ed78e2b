"""State backends behind one protocol: memory (default), sqlite (embedded), redis (fleet)."""

from __future__ import annotations

from urllib.parse import urlparse

from loop_governor.stores.base import BreakerStatus, Store, StoreConfigError
from loop_governor.stores.memory import MemoryStore
from loop_governor.stores.sqlite import SQLiteStore

#: URL schemes the Redis store takes (redis-py's own, plus a cluster and a Sentinel form).
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")

__all__ = ["BreakerStatus", "MemoryStore", "SQLiteStore", "Store", "StoreConfigError", "store_from_url"]


def store_from_url(url: str) -> Store:
    """``memory://``, ``sqlite:///path/to/state.db``, ``redis://host:port/db``,
    ``redis+cluster://host:port[,host:port...]`` or
    ``redis+sentinel://host:port[,host:port...]/service_name[/db]``."""
    scheme = urlparse(url).scheme.lower()
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        # SQLAlchemy's convention: sqlite:///relative.db, sqlite:////absolute/path.db
        path = url[len("sqlite:///") :] if url.lower().startswith("sqlite:///") else ""
        if not path:
            raise ValueError(f"sqlite store URL needs a path: {url!r} (e.g. sqlite:///state.db)")
        return SQLiteStore(path)
    if scheme in REDIS_SCHEMES:
        from loop_governor.stores.redis import RedisStore  # optional dependency: redis-py

        return RedisStore(url)
    raise ValueError(
        f"unknown store URL {url!r}: use memory://, sqlite:///path, redis://host:port/db, "
        "redis+cluster://host:port,... or redis+sentinel://host:port,.../service_name"
    )
