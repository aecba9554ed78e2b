"""Pick a checkpoint store from a URL (config files and the CLI speak URLs)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from loop_governor.checkpoint.base import CheckpointStore


def checkpoint_store_from_url(url: str, **options: Any) -> CheckpointStore:
    """The store named by ``url``; ``options`` go to the store's constructor.

    * ``memory://`` -- in-process (lost on exit)
    * ``file:///abs/dir`` or ``file:rel/dir`` -- one JSON file per task
    * ``sqlite:///rel/path.db`` or ``sqlite:////abs/path.db`` -- SQLAlchemy's convention:
      the path is what follows the third slash
    * ``redis://host:port/db``, ``rediss://...``, ``unix:///path/redis.sock`` -- Redis
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "memory":
        from loop_governor.checkpoint.memory_store import MemoryCheckpointStore

        return MemoryCheckpointStore(**options)
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URL {url!r} names host {parts.netloc!r}; use file:///absolute/dir")
        if not parts.path:
            raise ValueError(f"file URL {url!r} names no directory")
        from loop_governor.checkpoint.file_store import FileCheckpointStore

        return FileCheckpointStore(unquote(parts.path), **options)
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise ValueError(f"SQLite URL {url!r} must look like sqlite:///relative.db or sqlite:////abs.db")
        from loop_governor.checkpoint.sqlite_store import SQLiteCheckpointStore

        return SQLiteCheckpointStore(unquote(url[len("sqlite:///") :].split("?", 1)[0]), **options)
    if scheme in ("redis", "rediss", "unix"):
        from loop_governor.checkpoint.redis_store import RedisCheckpointStore

        return RedisCheckpointStore(url, **options)
    raise ValueError(f"unknown checkpoint store URL {url!r}: use memory://, file://, sqlite:/// or redis://")
