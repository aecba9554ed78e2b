"""SQLite and Redis specifics: WAL, corrupt rows/keys kept and quarantined, URLs."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from loop_governor.checkpoint import (
    CheckpointCorruptedError,
    FileCheckpointStore,
    MemoryCheckpointStore,
    RedisCheckpointStore,
    SQLiteCheckpointStore,
    TaskCheckpoint,
    checkpoint_store_from_url,
)
from loop_governor.checkpoint.codec import legacy_checksum


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    SQLiteCheckpointStore(tmp_path / "c.db").save(TaskCheckpoint(task_id="t"))
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sqlite_corrupt_row_raises_and_is_copied_to_quarantine(tmp_path: Path) -> None:
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    cp = TaskCheckpoint(task_id="victim")
    cp.add_result("important")
    store.save(cp)
    with sqlite3.connect(tmp_path / "c.db") as db:
        body = db.execute("SELECT body FROM lg_checkpoints").fetchone()[0]
        bad = body.replace(b"important", b"imp0rtant")
        db.execute("UPDATE lg_checkpoints SET body = ?", (bad,))
    with pytest.raises(CheckpointCorruptedError, match="checksum") as info:
        store.load("victim")
    assert info.value.quarantine is not None and "lg_checkpoint_quarantine" in info.value.quarantine
    with pytest.raises(CheckpointCorruptedError):
        store.load("victim")
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("SELECT body FROM lg_checkpoints").fetchone()[0] == bad
        rows = db.execute("SELECT task_id, body, reason FROM lg_checkpoint_quarantine").fetchall()
    assert len(rows) == 1 and rows[0][0] == "victim" and rows[0][1] == bad and "checksum" in rows[0][2]


def test_sqlite_unreadable_database_file_is_kept_and_copied(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    path.write_bytes(b"this is not an sqlite database, but it is someone's data" * 100)
    original = path.read_bytes()
    with pytest.raises(CheckpointCorruptedError) as info:
        SQLiteCheckpointStore(path, clock=lambda: 1234.0)
    assert path.read_bytes() == original
    assert info.value.quarantine is not None and Path(info.value.quarantine).read_bytes() == original


@pytest.mark.redis
def test_redis_corrupt_hash_raises_and_is_copied_to_quarantine(redis_server: str) -> None:
    import redis

    ns = uuid.uuid4().hex[:12]
    store = RedisCheckpointStore(redis_server, prefix=f"t-{ns}:ck:", quarantine_prefix=f"t-{ns}:q:")
    cp = TaskCheckpoint(task_id="victim")
    cp.add_result("important")
    store.save(cp)
    client = redis.Redis.from_url(redis_server)
    key = f"t-{ns}:ck:victim"
    bad = client.hget(key, "body").replace(b"important", b"imp0rtant")  # type: ignore[union-attr]
    client.hset(key, "body", bad)
    with pytest.raises(CheckpointCorruptedError, match="checksum") as info:
        store.load("victim")
    assert client.hget(key, "body") == bad
    qkeys = client.keys(f"t-{ns}:q:*")
    assert len(qkeys) == 1 and client.hget(qkeys[0], "body") == bad
    assert info.value.quarantine is not None and qkeys[0].decode() in info.value.quarantine
    assert store.list() == ["victim"]  # quarantine keys are not listed as tasks
    client.hset(key, "version", "not-a-number")
    with pytest.raises(CheckpointCorruptedError):
        store.save(TaskCheckpoint(task_id="victim"))
    assert client.hget(key, "body") == bad
    store.close()
    client.close()


@pytest.mark.redis
def test_redis_prefix_with_glob_characters_lists_only_its_own_keys(redis_server: str) -> None:
    ns = uuid.uuid4().hex[:12]
    mine = RedisCheckpointStore(redis_server, prefix=f"g-{ns}:[a]*:", quarantine_prefix=f"g-{ns}:q:")
    other = RedisCheckpointStore(redis_server, prefix=f"g-{ns}:a-other:", quarantine_prefix=f"g-{ns}:q2:")
    mine.save(TaskCheckpoint(task_id="one"))
    other.save(TaskCheckpoint(task_id="two"))
    assert mine.list() == ["one"]
    mine.close()
    other.close()


def test_store_urls(tmp_path: Path) -> None:
    assert isinstance(checkpoint_store_from_url("memory://"), MemoryCheckpointStore)
    file_store = checkpoint_store_from_url(f"file://{tmp_path}/files")
    assert isinstance(file_store, FileCheckpointStore) and file_store.directory == tmp_path / "files"
    sqlite_store = checkpoint_store_from_url(f"sqlite:///{tmp_path}/c.db")
    assert isinstance(sqlite_store, SQLiteCheckpointStore) and sqlite_store.path == tmp_path / "c.db"
    sqlite_store.close()
    redis_store = checkpoint_store_from_url("redis://127.0.0.1:1/3")  # connects lazily
    assert isinstance(redis_store, RedisCheckpointStore)
    assert redis_store.client.connection_pool.connection_kwargs["db"] == 3
    for bad in ("ftp://x", "file://otherhost/dir", "sqlite://", "nonsense"):
        with pytest.raises(ValueError):
            checkpoint_store_from_url(bad)


def test_sqlite_rows_with_the_earlier_crc32_checksum_still_load(tmp_path: Path) -> None:
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    cp = TaskCheckpoint(task_id="t")
    cp.add_result("kept")
    store.save(cp)
    with sqlite3.connect(tmp_path / "c.db") as db:  # as an earlier release stored it
        body = db.execute("SELECT body FROM lg_checkpoints").fetchone()[0]
        db.execute("UPDATE lg_checkpoints SET checksum = ?", (legacy_checksum(1, body),))
    loaded = store.load("t")
    assert loaded is not None and loaded.results == ["kept"]


@pytest.mark.redis
def test_redis_saves_add_one_journal_field_each_and_compaction_drops_them(redis_server: str) -> None:
    import redis

    ns = uuid.uuid4().hex[:12]
    store = RedisCheckpointStore(
        redis_server, prefix=f"j-{ns}:ck:", quarantine_prefix=f"j-{ns}:q:", compact_min_bytes=300, compact_ratio=0
    )
    client = redis.Redis.from_url(redis_server)
    key = f"j-{ns}:ck:t"
    cp = TaskCheckpoint(task_id="t")
    store.save(cp)
    body = client.hget(key, "body")
    for i in range(3):
        cp.add_result(f"result {i}")
        store.save(cp)
    assert client.hget(key, "body") == body  # the snapshot is untouched
    assert sorted(k for k in client.hkeys(key) if k.startswith(b"j:")) == [b"j:2", b"j:3", b"j:4"]
    assert client.hget(key, "jhead") == b"4"
    for i in range(3, 20):
        cp.add_result(f"result {i}")
        store.save(cp)
    fields = client.hkeys(key)
    assert len([k for k in fields if k.startswith(b"j:")]) < 10  # compacted into the snapshot
    loaded = store.load("t")
    assert loaded is not None and loaded.results == [f"result {i}" for i in range(20)] and loaded.version == 21
    store.close()
    store = RedisCheckpointStore(redis_server, prefix=f"j-{ns}:ck:", quarantine_prefix=f"j-{ns}:q:")
    loaded.add_result("one more")
    store.save(loaded)  # an append (the default compaction is far off)
    head = int(client.hget(key, "jhead") or 0)
    damaged = client.hget(key, f"j:{head}").replace(b"one more", b"one m0re")  # type: ignore[union-attr]
    client.hset(key, f"j:{head}", damaged)
    with pytest.raises(CheckpointCorruptedError, match="checksum") as info:
        store.load("t")
    qkeys = client.keys(f"j-{ns}:q:*")
    assert len(qkeys) == 1 and client.hget(qkeys[0], f"j:{head}") == damaged
    assert info.value.quarantine is not None
    store.close()
    client.close()


def test_sqlite_damaged_journal_row_is_quarantined_and_left_in_place(tmp_path: Path) -> None:
    store = SQLiteCheckpointStore(tmp_path / "c.db")
    cp = TaskCheckpoint(task_id="t")
    store.save(cp)
    cp.add_result("important")
    store.save(cp)
    with sqlite3.connect(tmp_path / "c.db") as db:
        body = db.execute("SELECT body FROM lg_checkpoint_journal").fetchone()[0]
        bad = body.replace(b"important", b"imp0rtant")
        db.execute("UPDATE lg_checkpoint_journal SET body = ?", (bad,))
    with pytest.raises(CheckpointCorruptedError, match="journal record") as info:
        store.load("t")
    assert info.value.quarantine is not None and "lg_checkpoint_journal" in info.value.location
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("SELECT body FROM lg_checkpoint_journal").fetchone()[0] == bad
        rows = db.execute("SELECT body, reason FROM lg_checkpoint_quarantine").fetchall()
    assert rows == [(bad, rows[0][1])] and "journal record" in rows[0][1]
    store.close()


@pytest.mark.parametrize("url", ["redis://:pa/ss@127.0.0.1:1/0", "redis://user:p?w#d@127.0.0.1:1/0"])
def test_a_redis_url_whose_password_would_become_a_host_name_is_refused(url: str) -> None:
    """redis-py would cut the host part at the '/' (or '?', '#') inside the password and
    print the rest of the password in every connection error; both stores refuse it."""
    from loop_governor.checkpoint import RedisCheckpointStore
    from loop_governor.stores.redis import RedisStore

    for store in (RedisCheckpointStore, RedisStore):
        with pytest.raises(ValueError, match="percent-encode") as refused:
            store(url)
        assert "pa/ss" not in str(refused.value) and "p?w#d" not in str(refused.value)
