"""What every store (memory, SQLite, Redis, Valkey) must do the same way: consecutive
failures counted in completion order, clocks that step back, bounded local state."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import loop_governor as lg
from loop_governor.state.breaker import BreakerPolicy, BreakerState
from loop_governor.stores import MemoryStore, SQLiteStore
from loop_governor.stores.memory import MAX_ENTRIES

POLICY = BreakerPolicy(failure_threshold=3, cooldown_s=10.0)


@pytest.fixture(params=["memory", "sqlite", "redis", "valkey"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path, servers: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "sqlite":
        store = SQLiteStore(tmp_path / "state.db")
        yield store
        store.close()
    else:
        from loop_governor.stores.redis import RedisStore

        server = servers(request.param)
        store = RedisStore(server.url, namespace=f"lg-sem-{uuid.uuid4().hex[:10]}", server_time=False)
        yield store
        assert store.fallbacks == 0
        store.close()


def _overlapping(gov: lg.Governor, outcomes: list[bool], in_task: bool) -> None:
    """Start one governed call per outcome, all admitted at once, and let them complete in
    list order (True = success, False = a transient failure)."""
    started = threading.Barrier(len(outcomes) + 1)
    release = [threading.Event() for _ in outcomes]
    done = [threading.Event() for _ in outcomes]

    def make(i: int) -> Callable[[], str]:
        def fn() -> str:
            release[i].wait(10)
            if not outcomes[i]:
                raise ConnectionError("upstream reset the connection")
            return "ok"

        return fn

    def run(i: int) -> None:
        started.wait(10)
        try:
            if in_task:
                with gov.task(f"t{i}"):
                    gov.call("api", make(i))
            else:
                gov.call("api", make(i))
        except lg.AgentToolError:
            pass
        finally:
            done[i].set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(outcomes))]
    for t in threads:
        t.start()
    started.wait(10)
    time.sleep(0.05)  # every call is admitted (closed, no failures yet) before any completes
    for i in range(len(outcomes)):
        release[i].set()
        assert done[i].wait(10)
    for t in threads:
        t.join(10)


@pytest.mark.parametrize("in_task", [False, True], ids=["hot-path", "in-task"])
def test_a_success_completing_after_a_failure_resets_the_count(any_store: Any, in_task: bool) -> None:
    """Completions fail, ok, fail, ok, fail are never three consecutive failures, however the
    calls overlapped: the breaker (threshold 3) stays closed. Run one after another they
    leave it closed too; before the fix a success admitted while the count was zero
    reset nothing and the overlapping run opened it."""
    config = lg.GovernorConfig(retry_max_attempts=1, breaker_failure_threshold=3, breaker_cooldown_s=60)
    gov = lg.Governor(config, store=any_store)
    _overlapping(gov, [False, True, False, True, False], in_task)
    rec = any_store.breaker_get("api")
    assert (rec.state, rec.failures) == (BreakerState.CLOSED, 1)
    # ... and three failures in completion order do open it
    _overlapping(gov, [False, False], in_task)
    assert any_store.breaker_get("api").state is BreakerState.OPEN


def test_a_clock_stepping_back_neither_freezes_a_bucket_nor_a_breaker(any_store: Any) -> None:
    """After a 600 s step back a bucket waits its refill time, not 600 s more, and an open
    breaker at most one cooldown."""
    t = 10_000.0
    assert any_store.rate_acquire("api", 1.0, 1.0, t) == 0.0
    assert any_store.rate_acquire("api", 1.0, 1.0, t - 600) == pytest.approx(1.0)
    assert any_store.rate_acquire("api", 1.0, 1.0, t - 599) == 0.0  # refilled from the step, not frozen

    for _ in range(3):
        any_store.breaker_record("svc", False, False, t, POLICY)
    adm = any_store.breaker_admit("svc", lambda: t - 600, POLICY)[0]
    assert not adm.allowed and adm.retry_in <= POLICY.cooldown_s
    assert any_store.breaker_admit("svc", lambda: t - 600 + POLICY.cooldown_s, POLICY)[0].probe


def test_the_memory_store_is_bounded_like_an_lru() -> None:
    """Distinct endpoints and tasks without end: the memory store keeps the most recent."""
    assert MAX_ENTRIES <= 100_000
    store = MemoryStore(max_entries=50)
    for i in range(2_000):
        key = f"https://tenant-{i}.example/v1"
        store.breaker_record(key, False, False, 1.0, POLICY)
        store.rate_acquire_all([(key, 1.0, 5.0, 1.0), (f"{key}:tokens", 100.0, 1000.0, 10.0)], 1.0)
        store.budget_take(f"task-{i}", 5)
        store.known_bad_put(f"task-{i}", "call", "{}")
        store.signature_hit(f"task-{i}", "sig")
    assert len(store.breaker_list()) == 50
    assert max(len(store._buckets), len(store._budgets), len(store._known_bad), len(store._signatures)) <= 50
    last = "https://tenant-1999.example/v1"
    assert store.breaker_get(last).failures == 1 and store.known_bad_count("task-1999") == 1
    assert store.breaker_get("https://tenant-0.example/v1").failures == 0  # evicted: forgotten
    with pytest.raises(ValueError, match="max_entries"):
        MemoryStore(max_entries=0)


def test_redis_shares_breakers_and_buckets_on_the_server_clock(redis_server: Any) -> None:
    """A process whose wall clock is 600 s behind (or ahead) sees the same cooldowns and
    refills as the rest of the fleet: the scripts read the server's TIME."""
    from loop_governor.stores.redis import RedisStore

    store = RedisStore(redis_server.url, namespace=f"lg-time-{uuid.uuid4().hex[:10]}")
    policy = BreakerPolicy(failure_threshold=1, cooldown_s=0.3)
    skewed = time.time() - 600
    assert store.breaker_record("svc", False, False, skewed, policy) == (BreakerState.CLOSED, BreakerState.OPEN)
    opened = store.breaker_get("svc").opened_at
    assert abs(opened - time.time()) < 5  # stamped with the server's time, not the skewed clock
    adm = store.breaker_admit("svc", lambda: skewed, policy)[0]
    assert not adm.allowed and 0 < adm.retry_in <= 0.3
    time.sleep(0.35)
    assert store.breaker_admit("svc", lambda: skewed - 600, policy)[0].probe
    assert store.rate_acquire("api", 10.0, 1.0, skewed) == 0.0
    wait = store.rate_acquire("api", 10.0, 1.0, skewed + 3600)  # an hour ahead refills nothing
    assert 0 < wait <= 0.1
    store.close()
