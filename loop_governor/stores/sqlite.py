"""Embedded, durable state in one SQLite file: survives restarts, shared by the processes
of one host. Each operation is one ``BEGIN IMMEDIATE`` transaction, which serializes
writers across processes, so breaker transitions stay atomic without a server.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from loop_governor.state.breaker import (
    Admission,
    BreakerPolicy,
    BreakerRecord,
    BreakerState,
    Transition,
    admit,
    force,
    record,
)
from loop_governor.state.bucket import Bucket, State, take_all
from loop_governor.stores.base import BreakerStatus, Clock, rebase

_SCHEMA = """
CREATE TABLE IF NOT EXISTS breakers (
    tool TEXT PRIMARY KEY, state TEXT NOT NULL, failures INTEGER NOT NULL,
    opened_at REAL NOT NULL, probe_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rate_buckets (tool TEXT PRIMARY KEY, tokens REAL NOT NULL, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS budgets (task_id TEXT PRIMARY KEY, used INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS known_bad (
    task_id TEXT NOT NULL, call_key TEXT NOT NULL, info TEXT NOT NULL,
    PRIMARY KEY (task_id, call_key));
CREATE TABLE IF NOT EXISTS signatures (
    task_id TEXT NOT NULL, signature TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (task_id, signature));
"""


def _row_to_record(row: tuple[str, int, float, float] | None) -> BreakerRecord:
    if row is None:
        return BreakerRecord()
    return BreakerRecord(BreakerState(row[0]), int(row[1]), float(row[2]), float(row[3]))


class SQLiteStore:
    """SQLite-backed store (WAL mode, one connection per thread)."""

    name = "sqlite"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._conn  # noqa: B018 - create the schema now, so a bad path fails at construction

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.executescript(_SCHEMA)
        with self._all_lock:
            self._all.append(conn)
        return conn

    @property
    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _get(self, conn: sqlite3.Connection, tool: str) -> BreakerRecord:
        row = conn.execute(
            "SELECT state, failures, opened_at, probe_at FROM breakers WHERE tool = ?", (tool,)
        ).fetchone()
        return _row_to_record(row)

    def _put(self, conn: sqlite3.Connection, tool: str, rec: BreakerRecord) -> None:
        conn.execute(
            "INSERT INTO breakers (tool, state, failures, opened_at, probe_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(tool) DO UPDATE SET state = excluded.state, failures = excluded.failures, "
            "opened_at = excluded.opened_at, probe_at = excluded.probe_at",
            (tool, rec.state.value, rec.failures, rec.opened_at, rec.probe_at),
        )

    def breaker_admit(self, tool: str, clock: Clock, policy: BreakerPolicy) -> tuple[Admission, Transition | None]:
        rec = self._get(self._conn, tool)
        if rec.state is BreakerState.CLOSED:
            # Closed needs no transition: a plain read, no write transaction.
            return admit(rec, 0.0, policy)[0], None
        with self._tx() as conn:
            rec = self._get(conn, tool)
            adm, new, transition = admit(rec, clock(), policy)
            if new is not rec:
                self._put(conn, tool, new)
            return adm, transition

    def breaker_record(
        self, tool: str, ok: bool, probe: bool, now: float, policy: BreakerPolicy, *, backdate_s: float = 0.0
    ) -> Transition | None:
        if ok and not probe:
            rec = self._get(self._conn, tool)
            if rec.state is BreakerState.CLOSED and not rec.failures:
                return None  # nothing to reset: a plain read, no write transaction
        with self._tx() as conn:
            rec = self._get(conn, tool)
            new, transition = record(rec, ok, probe, now - backdate_s, policy)
            if new is not rec:
                self._put(conn, tool, new)
            return transition

    def breaker_get(self, tool: str) -> BreakerRecord:
        return self._get(self._conn, tool)

    def breaker_list(self) -> list[BreakerStatus]:
        rows = self._conn.execute("SELECT tool, state, failures, opened_at FROM breakers ORDER BY tool").fetchall()
        return [BreakerStatus(r[0], BreakerState(r[1]), int(r[2]), float(r[3])) for r in rows]

    def breaker_force(self, tool: str, state: BreakerState | str, now: float) -> None:
        with self._tx() as conn:
            self._put(conn, tool, force(state, now))

    def rate_acquire(self, tool: str, rate_per_s: float, burst: float, now: float) -> float:
        return self.rate_acquire_all([(tool, rate_per_s, burst, 1.0)], now)

    def rate_acquire_all(self, buckets: Sequence[Bucket], now: float) -> float:
        with self._tx() as conn:
            before: list[State | None] = []
            for bucket in buckets:
                row = conn.execute("SELECT tokens, ts FROM rate_buckets WHERE tool = ?", (bucket[0],)).fetchone()
                before.append(rebase((float(row[0]), float(row[1])), now) if row else None)
            states, wait = take_all(before, buckets, now)
            conn.executemany(
                "INSERT INTO rate_buckets (tool, tokens, ts) VALUES (?, ?, ?) "
                "ON CONFLICT(tool) DO UPDATE SET tokens = excluded.tokens, ts = excluded.ts",
                [(b[0], st[0], st[1]) for b, st in zip(buckets, states, strict=True)],
            )
            return wait

    def budget_take(self, task_id: str, limit: int) -> bool:
        with self._tx() as conn:
            row = conn.execute("SELECT used FROM budgets WHERE task_id = ?", (task_id,)).fetchone()
            used = int(row[0]) if row else 0
            if used >= limit:
                return False
            conn.execute(
                "INSERT INTO budgets (task_id, used) VALUES (?, 1) ON CONFLICT(task_id) DO UPDATE SET used = used + 1",
                (task_id,),
            )
            return True

    def budget_used(self, task_id: str) -> int:
        row = self._conn.execute("SELECT used FROM budgets WHERE task_id = ?", (task_id,)).fetchone()
        return int(row[0]) if row else 0

    def known_bad_get(self, task_id: str, key: str) -> str | None:
        row = self._conn.execute(
            "SELECT info FROM known_bad WHERE task_id = ? AND call_key = ?", (task_id, key)
        ).fetchone()
        return None if row is None else str(row[0])

    def known_bad_put(self, task_id: str, key: str, info_json: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO known_bad (task_id, call_key, info) VALUES (?, ?, ?)",
                (task_id, key, info_json),
            )

    def known_bad_count(self, task_id: str) -> int:
        row = self._conn.execute("SELECT COUNT(*) FROM known_bad WHERE task_id = ?", (task_id,)).fetchone()
        return int(row[0])

    def signature_hit(self, task_id: str, signature: str) -> int:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO signatures (task_id, signature, count) VALUES (?, ?, 1) "
                "ON CONFLICT(task_id, signature) DO UPDATE SET count = count + 1",
                (task_id, signature),
            )
            row = conn.execute(
                "SELECT count FROM signatures WHERE task_id = ? AND signature = ?", (task_id, signature)
            ).fetchone()
            return int(row[0])

    def end_task(self, task_id: str) -> None:
        with self._tx() as conn:
            for table in ("budgets", "known_bad", "signatures"):
                conn.execute(f"DELETE FROM {table} WHERE task_id = ?", (task_id,))

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()
