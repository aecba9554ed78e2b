"""Store protocol behaviour (memory and SQLite alike) and the breaker state machine."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.call import PassThrough
from loop_governor.state.breaker import BreakerPolicy, BreakerState
from loop_governor.stores import MemoryStore, SQLiteStore, Store, store_from_url

POLICY = BreakerPolicy(failure_threshold=3, cooldown_s=10.0)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "memory":
        return MemoryStore()
    return SQLiteStore(tmp_path / "state.db")


def test_store_urls(tmp_path: Path) -> None:
    assert isinstance(store_from_url("memory://"), MemoryStore)
    db = tmp_path / "sub" / "s.db"
    s = store_from_url(f"sqlite:///{db}")
    assert isinstance(s, SQLiteStore) and Path(s.path) == db and db.exists()
    with pytest.raises(ValueError, match="unknown store URL"):
        store_from_url("mongodb://x")


def test_breaker_cycle(store: Store) -> None:
    now = 100.0
    for _ in range(2):
        assert store.breaker_record("t", False, False, now, POLICY) is None
    assert store.breaker_record("t", False, False, now, POLICY) == (BreakerState.CLOSED, BreakerState.OPEN)
    adm, _ = store.breaker_admit("t", lambda: now + 5, POLICY)
    assert not adm.allowed and adm.retry_in == pytest.approx(5.0)
    adm, tr = store.breaker_admit("t", lambda: now + 10, POLICY)
    assert adm.allowed and adm.probe and tr == (BreakerState.OPEN, BreakerState.HALF_OPEN)
    second, _ = store.breaker_admit("t", lambda: now + 10, POLICY)
    assert not second.allowed  # one probe at a time
    assert store.breaker_record("t", True, True, now + 11, POLICY) == (BreakerState.HALF_OPEN, BreakerState.CLOSED)
    assert store.breaker_get("t").state is BreakerState.CLOSED
    assert [b.tool for b in store.breaker_list()] == ["t"]
    store.breaker_force("t", "open", now)
    assert store.breaker_get("t").state is BreakerState.OPEN


def test_stale_probe_is_replaced(store: Store) -> None:
    store.breaker_force("t", "open", 0.0)
    first, _ = store.breaker_admit("t", lambda: 10.0, POLICY)
    assert first.probe
    again, _ = store.breaker_admit("t", lambda: 15.0, POLICY)
    assert not again.allowed
    later, _ = store.breaker_admit("t", lambda: 20.0, POLICY)  # the first probe never reported
    assert later.allowed and later.probe


class Interrupted(BaseException):
    """Stands for a cancellation the governor must let through: it is never retried."""


def _open_then_cool(gov: lg.Governor, clock: VirtualClock, key: str, kind: str) -> None:
    policy = gov.rt.policy(kind, key.removeprefix("model:")).breaker
    for _ in range(policy.failure_threshold):
        gov.store.breaker_record(key, False, False, clock(), policy)
    clock.advance(policy.cooldown_s + 1)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, asyncio.CancelledError, Interrupted])
@pytest.mark.parametrize("kind", ["tool", "model"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_cancelled_probe_hands_the_probe_back(
    store: Store, interrupt: type[BaseException], kind: str, mode: str
) -> None:
    """The half-open probe is cancelled in flight (Ctrl-C, a task cancelled, a timeout):
    it gave no verdict. Held, it would keep every caller out for one more cooldown; the
    next caller probes at once instead, and the cancellation goes on as it came."""
    clock = VirtualClock()
    gov = lg.Governor(store=store, clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    seen: list[dict[str, object]] = []
    gov.subscribe(seen.append)
    name = "svc" if kind == "tool" else "openai:gpt-4o"
    key = name if kind == "tool" else f"model:{name}"
    _open_then_cool(gov, clock, key, kind)

    def cancelled(*_: object) -> str:
        raise interrupt

    def answers(*_: object) -> str:
        return "ok"

    call = gov.call if kind == "tool" else gov.call_model
    acall = gov.acall if kind == "tool" else gov.acall_model
    with pytest.raises(interrupt):
        if mode == "sync":
            call(name, cancelled, "x")
        else:
            asyncio.run(acall(name, cancelled, "x"))
    assert store.breaker_get(key).state is not BreakerState.HALF_OPEN
    assert [e["tool"] for e in seen if e["event"] == "breaker_probe_abandoned"] == [key]
    assert call(name, answers, "x") == "ok"  # at once: no cooldown to wait out
    assert store.breaker_get(key).state is BreakerState.CLOSED


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_probe_that_passes_a_foreign_exception_through_hands_the_probe_back(store: Store, mode: str) -> None:
    """A probe ended by ``PassThrough`` (the LangChain middleware's: an inner middleware
    or the structured-output parser raised, not the model) gave no verdict either: the
    breaker neither counts it nor stays half-open for a cooldown."""
    clock = VirtualClock()
    gov = lg.Governor(store=store, clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    key = "model:openai:gpt-4o"
    _open_then_cool(gov, clock, key, "model")

    def parser_failed(*_: object) -> str:
        raise PassThrough(ValueError("not the model's"))

    with pytest.raises(ValueError, match="not the model's"):
        if mode == "sync":
            gov.call_model("openai:gpt-4o", parser_failed, "x")
        else:
            asyncio.run(gov.acall_model("openai:gpt-4o", parser_failed, "x"))
    assert store.breaker_get(key).state is not BreakerState.HALF_OPEN
    assert gov.call_model("openai:gpt-4o", lambda *_: "ok", "x") == "ok"  # at once
    assert store.breaker_get(key).state is BreakerState.CLOSED


def test_task_state(store: Store) -> None:
    assert [store.budget_take("task", 2) for _ in range(3)] == [True, True, False]
    assert store.budget_used("task") == 2
    store.known_bad_put("task", "k", '{"x":1}')
    assert store.known_bad_get("task", "k") == '{"x":1}' and store.known_bad_count("task") == 1
    assert [store.signature_hit("task", "s") for _ in range(3)] == [1, 2, 3]
    store.end_task("task")
    assert store.budget_used("task") == 0 and store.known_bad_get("task", "k") is None
    assert store.signature_hit("task", "s") == 1


def test_rate_buckets_are_taken_all_or_nothing(store: Store) -> None:
    """A provider's request and token limits: a request held back by one takes nothing of the other."""
    requests, tokens = ("key", 10.0, 10.0, 1.0), ("key:tokens", 100.0, 1000.0, 600.0)
    assert store.rate_acquire_all([requests, tokens], 0.0) == 0.0
    assert store.rate_acquire_all([requests, tokens], 0.0) == pytest.approx(2.0)  # (600 - 400) / 100
    assert [store.rate_acquire("key", 10.0, 10.0, 0.0) for _ in range(9)] == [0.0] * 9  # none was spent
    # above the burst: waits for a full bucket (not forever), then takes its whole cost
    assert store.rate_acquire_all([("big", 100.0, 500.0, 5000.0)], 0.0) == 0.0
    assert store.rate_acquire_all([("big", 100.0, 500.0, 5000.0)], 0.0) == pytest.approx(50.0)  # the debt
    assert store.rate_acquire_all([tokens], 2.0) == 0.0  # refilled meanwhile


def test_governor_is_unchanged_on_sqlite(tmp_path: Path) -> None:
    clock = VirtualClock()
    gov = lg.Governor(lg.GovernorConfig(store_url=f"sqlite:///{tmp_path / 's.db'}"), clock=clock, sleep=clock.sleep)
    backend = Backend(forever=HTTPError(503))
    with gov.task("t"):
        for _ in range(3):
            with pytest.raises(lg.TransientError):
                gov.call("search", backend)
    assert backend.calls == 5
    # the breaker survives a restart: a new governor on the same file refuses the call
    gov2 = lg.Governor(lg.GovernorConfig(store_url=f"sqlite:///{tmp_path / 's.db'}"), clock=clock, sleep=clock.sleep)
    with pytest.raises(lg.CircuitOpenError):
        gov2.call("search", backend)
    assert backend.calls == 5


_PROBE_WORKER = """
import sys, time
from pathlib import Path
from loop_governor.state.breaker import BreakerPolicy
from loop_governor.stores import SQLiteStore
store = SQLiteStore(sys.argv[1])
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
adm, _ = store.breaker_admit("svc", lambda: 11.0, BreakerPolicy(3, 10.0))
print("probe" if adm.probe else ("refused" if not adm.allowed else "admitted"))
"""


def test_sqlite_processes_share_one_probe(tmp_path: Path) -> None:
    path = os.fspath(tmp_path / "s.db")
    SQLiteStore(path).breaker_force("svc", "open", 0.0)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", _PROBE_WORKER, path, os.fspath(go)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    time.sleep(0.5)  # let them reach the start line; correctness doesn't depend on it
    go.touch()
    results = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert results == ["probe", "refused", "refused", "refused"]


class StrictBreakerMachine(RuleBasedStateMachine):
    """Without time passing beyond a probe's lifetime, concurrent probes are impossible."""

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.store.breaker_force("t", "open", 0.0)
        self.now = 10.0  # cooldown elapsed
        self.probes = 0

    @rule()
    def admit(self) -> None:
        adm, _ = self.store.breaker_admit("t", lambda: self.now, POLICY)
        if adm.probe:
            self.probes += 1

    @rule(dt=st.floats(min_value=0, max_value=9.9))
    def tick(self, dt: float) -> None:
        self.now = min(self.now + dt, 19.9)

    @invariant()
    def one_probe(self) -> None:
        assert self.probes <= 1


TestStrictBreaker = StrictBreakerMachine.TestCase
TestStrictBreaker.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
