"""State backends behind one protocol: memory (default), sqlite (embedded), redis (fleet)."""

from __future__ import annotations

from urllib.parse import urlparse

from loop_governor.stores.base import BreakerStatus, Store
from loop_governor.stores.memory import MemoryStore
from loop_governor.stores.sqlite import SQLiteStore

__all__ = ["BreakerStatus", "MemoryStore", "SQLiteStore", "Store", "store_from_url"]


def store_from_url(url: str) -> Store:
    """``memory://``, ``sqlite:///path/to/state.db`` or ``redis://host:port/db``."""
    scheme = urlparse(url).scheme.lower()
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        # SQLAlchemy's convention: sqlite:///relative.db, sqlite:////absolute/path.db
        path = url[len("sqlite:///") :] if url.lower().startswith("sqlite:///") else ""
        if not path:
            raise ValueError(f"sqlite store URL needs a path: {url!r} (e.g. sqlite:///state.db)")
        return SQLiteStore(path)
    if scheme in ("redis", "rediss", "unix"):
        from loop_governor.stores.redis import RedisStore  # optional dependency: redis-py

        return RedisStore(url)
    raise ValueError(f"unknown store URL {url!r}: use memory://, sqlite:///path or redis://host:port/db")
