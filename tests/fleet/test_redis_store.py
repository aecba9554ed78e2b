"""RedisStore against a real redis-server: the same observable behaviour as MemoryStore,
plus what only a shared store has (atomic Lua transitions, TTLs, namespaces, fallback)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loop_governor as lg
from loop_governor.state.breaker import ADMIT, BreakerPolicy, BreakerRecord, BreakerState
from loop_governor.stores import MemoryStore, store_from_url
from loop_governor.stores.redis import RedisStore

pytestmark = pytest.mark.redis

POLICY = BreakerPolicy(failure_threshold=3, cooldown_s=10.0)


def _virtual(*args: Any, **kwargs: Any) -> RedisStore:
    """A RedisStore on the governor's (virtual) clock instead of the server's, so these tests
    drive cooldowns and refills with FakeClock."""
    return RedisStore(*args, server_time=False, **kwargs)


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, redis_server: Any, namespace: str) -> Iterator[Any]:
    """The same assertions run on the reference store and on Redis."""
    st_: Any = MemoryStore() if request.param == "memory" else _virtual(redis_server.url, namespace=namespace)
    events: list[dict[str, Any]] = []
    st_.on_event = events.append
    yield st_
    assert events == [], "the store fell back to local state during a test with a healthy server"
    st_.close()


# -- behaviour shared with MemoryStore ----------------------------------------------------


def test_breaker_opens_after_threshold_and_lets_one_probe_through(store: Any) -> None:
    clock = FakeClock(100.0)
    adm, tr = store.breaker_admit("api", clock, POLICY)
    assert adm.allowed and not adm.dirty and tr is None
    assert store.breaker_record("api", False, False, 100.0, POLICY) is None
    assert store.breaker_admit("api", clock, POLICY)[0].dirty  # a success now must reset the count
    assert store.breaker_record("api", False, False, 101.0, POLICY) is None
    assert store.breaker_record("api", False, False, 102.0, POLICY) == (BreakerState.CLOSED, BreakerState.OPEN)

    clock.now = 105.0
    adm, tr = store.breaker_admit("api", clock, POLICY)
    assert (adm.allowed, adm.state, adm.retry_in, adm.failures, tr) == (False, BreakerState.OPEN, 7.0, 3, None)

    clock.now = 112.0
    adm, tr = store.breaker_admit("api", clock, POLICY)
    assert adm.allowed and adm.probe and tr == (BreakerState.OPEN, BreakerState.HALF_OPEN)
    second, tr2 = store.breaker_admit("api", clock, POLICY)
    assert not second.allowed and second.state is BreakerState.HALF_OPEN and tr2 is None

    assert store.breaker_record("api", True, True, 112.5, POLICY) == (BreakerState.HALF_OPEN, BreakerState.CLOSED)
    assert store.breaker_get("api") == BreakerRecord()
    assert store.breaker_admit("api", clock, POLICY) == (ADMIT, None)


def test_failed_probe_reopens_and_stale_probe_is_replaced(store: Any) -> None:
    clock = FakeClock(0.0)
    store.breaker_force("api", "open", 0.0)
    clock.now = 10.0
    assert store.breaker_admit("api", clock, POLICY)[0].probe
    assert store.breaker_record("api", False, True, 10.5, POLICY) == (BreakerState.HALF_OPEN, BreakerState.OPEN)
    assert store.breaker_get("api").opened_at == 10.5
    clock.now = 20.5
    assert store.breaker_admit("api", clock, POLICY)[0].probe
    # The probe's process dies: after one more cooldown someone else may probe.
    clock.now = 30.4
    assert not store.breaker_admit("api", clock, POLICY)[0].allowed
    clock.now = 30.5
    adm, tr = store.breaker_admit("api", clock, POLICY)
    assert adm.probe and tr is None


def test_closed_breaker_never_reads_the_clock(store: Any) -> None:
    def clock() -> float:
        raise AssertionError("clock read on the closed fast path")

    assert store.breaker_admit("other", clock, POLICY) == (ADMIT, None)
    store.breaker_force("other", "closed", 1.0)
    assert store.breaker_admit("other", clock, POLICY) == (ADMIT, None)
    if isinstance(store, RedisStore):  # (MemoryStore takes its lock and reads it here)
        store.breaker_record("api", False, False, 1.0, POLICY)
        assert store.breaker_admit("api", clock, POLICY)[0].dirty


def test_breaker_list_and_force(store: Any) -> None:
    store.breaker_force("b-tool", BreakerState.OPEN, 50.0)
    store.breaker_force("a-tool", "half_open", 60.0)
    store.breaker_record("c-tool", False, False, 1.0, POLICY)
    listed = [(s.tool, s.state, s.failures, s.opened_at) for s in store.breaker_list()]
    assert listed == [
        ("a-tool", BreakerState.HALF_OPEN, 0, 60.0),
        ("b-tool", BreakerState.OPEN, 0, 50.0),
        ("c-tool", BreakerState.CLOSED, 1, 0.0),
    ]
    store.breaker_force("b-tool", "closed", 70.0)
    assert store.breaker_get("b-tool") == BreakerRecord()


def test_task_budget_known_bad_and_signatures(store: Any) -> None:
    assert [store.budget_take("t1", 2) for _ in range(3)] == [True, True, False]
    assert store.budget_used("t1") == 2 and store.budget_used("t2") == 0
    assert store.known_bad_get("t1", "k") is None
    store.known_bad_put("t1", "k", '{"error":{"type":"permanent"}}')
    store.known_bad_put("t1", "k2", "{}")
    assert store.known_bad_get("t1", "k") == '{"error":{"type":"permanent"}}'
    assert store.known_bad_count("t1") == 2 and store.known_bad_count("t2") == 0
    assert [store.signature_hit("t1", "sig") for _ in range(3)] == [1, 2, 3]
    assert store.signature_hit("t2", "sig") == 1
    store.end_task("t1")
    assert store.budget_used("t1") == 0 and store.known_bad_count("t1") == 0
    assert store.signature_hit("t1", "sig") == 1
    assert store.signature_hit("t2", "sig") == 2


def test_tool_and_task_names_with_separators_and_glob_characters(store: Any) -> None:
    tool = "ns:tool*[x]?\\"
    store.breaker_force(tool, "open", 1.0)
    assert [s.tool for s in store.breaker_list()] == [tool]
    assert store.budget_take("task:with:colons", 1)
    assert store.budget_used("task:with") == 0


# -- the Lua scripts are the pure transition functions -----------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "rate", "record_ok", "record_fail", "force"]),
        st.floats(min_value=-7.0, max_value=7.0, allow_nan=False),  # time step (a clock may step back)
        st.booleans(),  # probe flag for record
        st.sampled_from(["closed", "open", "half_open"]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=ops, threshold=st.integers(1, 4), cooldown=st.sampled_from([0.5, 3.0, 4.7, 10.0]))
def test_lua_transitions_match_the_python_reference(
    redis_server: Any, namespace: str, seq: list[tuple[str, float, bool, str]], threshold: int, cooldown: float
) -> None:
    policy = BreakerPolicy(threshold, cooldown)
    ref, red = MemoryStore(), _virtual(redis_server.url, namespace=namespace)
    tool = uuid.uuid4().hex
    now = 1_700_000_000.123  # epoch-sized floats must survive the trip through Lua exactly
    try:
        for op, step, probe, state in seq:
            now += step
            clock = FakeClock(now)
            if op == "admit":
                assert red.breaker_admit(tool, clock, policy) == ref.breaker_admit(tool, clock, policy)
            elif op == "rate":  # two buckets, all or nothing: the same waits as the Python reference
                buckets = [(tool, 1.0 + threshold, 2.0, 1.0), (f"{tool}:tokens", 50.0, 100.0, 10.0 * threshold)]
                assert red.rate_acquire_all(buckets, now) == pytest.approx(ref.rate_acquire_all(buckets, now))
            elif op == "force":
                red.breaker_force(tool, state, now)
                ref.breaker_force(tool, state, now)
            else:
                ok = op == "record_ok"
                expected = ref.breaker_record(tool, ok, probe, now, policy)
                assert red.breaker_record(tool, ok, probe, now, policy) == expected
            assert red.breaker_get(tool) == ref.breaker_get(tool)
        assert red.fallbacks == 0
    finally:
        red.close()


# -- only a shared store -----------------------------------------------------------------


def test_two_stores_share_state_and_namespaces_isolate(redis_server: Any, namespace: str) -> None:
    a = _virtual(redis_server.url, namespace=namespace)
    b = _virtual(f"{redis_server.url}?namespace={namespace}")
    other = _virtual(redis_server.url, namespace=namespace + "-other")
    a.breaker_force("api", "open", 10.0)
    assert b.namespace == namespace
    assert b.breaker_get("api").state is BreakerState.OPEN
    assert other.breaker_get("api").state is BreakerState.CLOSED
    assert a.budget_take("t", 1) and not b.budget_take("t", 1)
    assert other.budget_take("t", 1)


def test_every_key_expires(redis_server: Any, namespace: str) -> None:
    store = _virtual(redis_server.url, namespace=namespace, ttl_s=120)
    store.breaker_record("api", False, False, 1.0, POLICY)
    store.budget_take("t", 5)
    store.known_bad_put("t", "k", "{}")
    store.signature_hit("t", "s")
    assert store.rate_acquire("api", 5.0, 2.0, 1.0) == 0.0
    r = redis_server.client()
    keys = list(r.scan_iter(match=f"{namespace}:*"))
    assert len(keys) == 5
    for key in keys:
        assert 0 < r.pttl(key) <= 120_000 + 60_000, key


def test_url_options_reach_the_store_not_redis(redis_server: Any, namespace: str) -> None:
    store = store_from_url(f"{redis_server.url}?namespace={namespace}&ttl_s=30")
    assert isinstance(store, RedisStore)
    assert (store.namespace, store.ttl_s) == (namespace, 30.0)
    store.budget_take("t", 1)
    assert 0 < redis_server.client().pttl(f"{namespace}:task:{{t}}:budget") <= 30_000


def test_rate_bucket_refills_at_the_rate_and_caps_at_burst(redis_server: Any, namespace: str) -> None:
    store = _virtual(redis_server.url, namespace=namespace)
    t = 1000.0
    assert [store.rate_acquire("api", 2.0, 3.0, t) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert store.rate_acquire("api", 2.0, 3.0, t) == pytest.approx(0.5)
    assert store.rate_acquire("api", 2.0, 3.0, t + 0.25) == pytest.approx(0.25)  # refused callers take nothing
    assert store.rate_acquire("api", 2.0, 3.0, t + 0.5) == 0.0
    # A long idle period refills to the burst, not beyond.
    assert [store.rate_acquire("api", 2.0, 3.0, t + 100) for _ in range(4)][-1] == pytest.approx(0.5)
    # A clock that steps back neither refills nor breaks the bucket.
    assert store.rate_acquire("api", 2.0, 3.0, t + 50) > 0
    assert store.rate_acquire("other", 2.0, 3.0, t) == 0.0
    with pytest.raises(ValueError):
        store.rate_acquire("api", 0.0, 3.0, t)


def test_several_buckets_are_taken_all_or_nothing(redis_server: Any, namespace: str) -> None:
    """A provider's request and token limits: a call held back by one spends nothing of the other."""
    store = _virtual(redis_server.url, namespace=namespace)
    t = 1000.0
    requests, tokens = ("key", 10.0, 10.0, 1.0), ("key:tokens", 100.0, 1000.0, 600.0)
    assert store.rate_acquire_all([requests, tokens], t) == 0.0
    # 400 tokens left: the next 600-token call waits (600 - 400) / 100 = 2 s, and takes no request token
    assert store.rate_acquire_all([requests, tokens], t) == pytest.approx(2.0)
    assert [store.rate_acquire("key", 10.0, 10.0, t) for _ in range(9)] == [0.0] * 9
    assert store.rate_acquire("key", 10.0, 10.0, t) == pytest.approx(0.1)
    # a cost above the burst waits for a full bucket (not forever), then takes all of it:
    # the next caller waits out the debt, (500 + 4500) / 100 = 50 s, and no key expiry forgives it
    big = ("big", 100.0, 500.0, 5000.0)
    assert store.rate_acquire_all([big], t) == 0.0
    assert store.rate_acquire_all([big], t) == pytest.approx(50.0)
    assert store._redis.pttl(store._rkeys([big])[0]) >= 100_000
    assert store.rate_acquire_all([big], t + 50.0) == 0.0


@pytest.mark.parametrize("in_task", [True, False], ids=["in a task", "outside a task"])
def test_a_governed_success_costs_one_round_trip(redis_server: Any, namespace: str, in_task: bool) -> None:
    """A governed call on a closed breaker is one round trip to Redis (counted on the
    socket): the success is written when the call completes (consecutive failures count in
    completion order: it resets a failure another call completed while it ran) and its
    reply is read with the next call's admission, a plain read on the same connection."""
    from contextlib import nullcontext

    from fleet.socket_count import counting

    store = _virtual(redis_server.url, namespace=namespace, monotonic=lambda: 5.0)  # never idle
    gov = lg.Governor(lg.GovernorConfig(), store=store, clock=FakeClock(5.0))
    with gov.task("task-1") if in_task else nullcontext():
        gov.call("warmup", lambda: None)  # first use of a connection: handshake + script load
        gov.call("search", lambda x: x, -1)
        buckets = [("provider", 100.0, 1000.0, 1.0), ("provider:tokens", 1e4, 1e5, 800.0)]
        assert store.rate_acquire_all(buckets, 5.0) == 0.0  # (the script loaded)
        monitor = redis_server.client()
        stats = monitor.info("commandstats")
        reads, scripts = stats["cmdstat_hmget"]["calls"], stats["cmdstat_evalsha"]["calls"]
        with counting() as sent:
            for i in range(20):
                assert gov.call("search", lambda x: x * 2, i) == i * 2
        # 20 admissions and 20 successes sent; the last success's reply comes with the next request's
        assert (sent.round_trips, sent.sends, sent.replies) == (20, 40, 39)
        # the server ran each call's admission (a plain read) and its success (one script,
        # whose HMGET counts too), in the order the calls completed
        stats = monitor.info("commandstats")
        assert (stats["cmdstat_hmget"]["calls"] - reads, stats["cmdstat_evalsha"]["calls"] - scripts) == (40, 20)
        with counting() as sent:
            assert store.rate_acquire_all(buckets, 5.0) == 0.0
        assert (sent.round_trips, sent.replies) == (1, 2)  # a request and a token limit, and the last success


def test_a_held_connection_the_server_closed_while_idle_is_no_outage(own_redis_server: Any, namespace: str) -> None:
    """A success's reply is read with the next call's; if the agent thought for a while and
    the server closed the idle connection meanwhile (its ``timeout``), the next call still
    reaches Redis: the held connection is read out and given back, and the pool reconnects."""
    mono = FakeClock(0.0)
    store = RedisStore(own_redis_server.url, namespace=namespace, monotonic=mono)
    policy = BreakerPolicy(3, 60)
    store.breaker_admit("search", mono, policy)
    store.breaker_record("search", True, False, 0.0, policy)
    assert store._deferred.holding
    own_redis_server.client().client_kill_filter(_type="normal", skipme=True)  # as `timeout` does
    mono.now += 30.0  # the model's turn
    admission, _ = store.breaker_admit("search", mono, policy)
    assert admission.allowed and store.fallbacks == 0 and not store.degraded


def test_a_success_whose_reply_asks_for_a_resend_is_resent_with_the_next_calls(
    redis_server: Any, namespace: str
) -> None:
    """Scripts flushed while a tool runs (a restart behind a proxy, a failover): the
    success's NOSCRIPT reply is read with the next rate-limit request, itself NOSCRIPT; the
    success is still applied, so the breaker's consecutive failures start over."""
    store = _virtual(redis_server.url, namespace=namespace, monotonic=lambda: 1.0)
    policy = BreakerPolicy(3, 60)
    for _ in range(2):
        store.breaker_admit("t", FakeClock(1.0), policy)
        store.breaker_record("t", False, False, 1.0, policy)
    store.rate_acquire("t", 100.0, 10.0, 1.0)
    store.breaker_admit("t", FakeClock(1.0), policy)
    redis_server.client().script_flush()
    store.breaker_record("t", True, False, 1.0, policy)  # sent; its reply (NOSCRIPT) unread
    store.rate_acquire("t", 100.0, 10.0, 1.0)  # reads it, and is NOSCRIPT itself
    assert store.breaker_get("t").failures == 0
    store.breaker_admit("t", FakeClock(1.0), policy)
    store.breaker_record("t", False, False, 1.0, policy)
    assert store.breaker_get("t").state is BreakerState.CLOSED


def test_a_bounded_pool_of_the_users_is_never_pinned_by_idle_threads(redis_server: Any, namespace: str) -> None:
    """``client=`` with a BlockingConnectionPool sized to the workers: a success's reply is
    read at once there, so a worker idle after its call holds no connection another needs."""
    from concurrent.futures import ThreadPoolExecutor

    import redis

    host, port = redis_server.url.removeprefix("redis://").split("/")[0].split(":")
    pool = redis.BlockingConnectionPool(
        host=host, port=int(port), max_connections=2, timeout=5.0, decode_responses=True
    )
    store = _virtual(redis_server.url, namespace=namespace, client=redis.Redis(connection_pool=pool))
    policy = BreakerPolicy(3, 60)
    workers = threading.Barrier(2)

    def work(_: int) -> None:
        workers.wait()
        store.breaker_admit("t", FakeClock(1.0), policy)
        store.breaker_record("t", True, False, 1.0, policy)

    with ThreadPoolExecutor(2) as pool_of_workers:
        list(pool_of_workers.map(work, range(2)))
        idle = list(pool.pool.queue)
        assert sum(c is not None for c in pool._connections) == sum(c is not None for c in idle)  # none held
        store.breaker_admit("t", FakeClock(1.0), policy)  # a third caller
    assert store.fallbacks == 0


def test_a_forked_child_never_reads_its_parents_unread_replies(redis_server: Any, namespace: str) -> None:
    """gunicorn --preload, multiprocessing's fork: a process forked while its thread holds
    a connection with an unread reply; the child uses a connection of its own."""
    import os

    store = _virtual(redis_server.url, namespace=namespace, monotonic=lambda: 1.0)
    policy = BreakerPolicy(1, 3600)
    store.breaker_admit("down", FakeClock(1.0), policy)
    store.breaker_record("down", False, False, 1.0, policy)  # open in Redis
    store.breaker_admit("up", FakeClock(1.0), policy)
    store.breaker_record("up", True, False, 1.0, policy)  # held, its reply unread
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            admission, _ = store.breaker_admit("down", FakeClock(1.0), policy)
            os.write(write, f"{admission.allowed} {store.fallbacks}".encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    admission, _ = store.breaker_admit("up", FakeClock(1.0), policy)
    assert child == "False 0"  # the child saw the open breaker, through Redis
    assert admission.allowed and store.fallbacks == 0  # the parent's stream stayed in step


def test_a_success_another_call_completed_before_a_failure_does_not_reset_it(redis_server: Any, namespace: str) -> None:
    """Completion order across stores: A's success is on the server before B's failure
    (its reply not read yet), so it resets only what came before it; B's failures count on."""
    a = _virtual(redis_server.url, namespace=namespace)
    b = _virtual(redis_server.url, namespace=namespace)
    clock = FakeClock(0.0)
    assert b.breaker_record("api", False, False, 0.0, POLICY) is None
    assert a.breaker_admit("api", clock, POLICY)[0].dirty
    assert a.breaker_record("api", True, False, 1.0, POLICY) is None  # sent; reply unread
    assert b.breaker_record("api", False, False, 2.0, POLICY) is None
    assert b.breaker_record("api", False, False, 3.0, POLICY) is None
    assert a.breaker_get("api").failures == 2  # A reads its own write, then B's two failures
    assert b.breaker_record("api", False, False, 4.0, POLICY) == (BreakerState.CLOSED, BreakerState.OPEN)
    a.close()
    b.close()


# -- Redis unreachable --------------------------------------------------------------------


def test_unreachable_at_start_never_raises(namespace: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    events: list[dict[str, Any]] = []
    store = _virtual(f"redis://127.0.0.1:{port}/0", namespace=namespace, on_event=events.append)
    clock = FakeClock(0.0)
    assert store.breaker_admit("api", clock, POLICY)[0].allowed
    assert store.breaker_record("api", False, False, 0.0, POLICY) is None
    assert store.budget_take("t", 1) and not store.budget_take("t", 1)
    assert store.rate_acquire("api", 1.0, 1.0, 0.0) == 0.0 and store.rate_acquire("api", 1.0, 1.0, 0.0) == 1.0
    assert store.rate_acquire_all([("other", 1.0, 1.0, 1.0)], 0.0) == 0.0
    assert store.rate_acquire_all([("other", 1.0, 1.0, 1.0), ("x", 1.0, 1.0, 1.0)], 0.0) == 1.0
    assert store.signature_hit("t", "s") == 1
    store.known_bad_put("t", "k", "{}")
    assert store.known_bad_get("t", "k") == "{}" and store.known_bad_count("t") == 1
    assert store.breaker_list()[0].failures == 1
    store.end_task("t")
    assert not store.ping() and store.degraded
    assert [e["event"] for e in events] == ["store_fallback"]
    assert events[0]["op"] == "connect" and "ConnectionError" in events[0]["error"]


def test_outage_falls_back_backs_off_and_merges_on_recovery(own_redis_server: Any, namespace: str) -> None:
    mono = FakeClock(0.0)
    events: list[dict[str, Any]] = []
    store = _virtual(
        own_redis_server.url,
        namespace=namespace,
        monotonic=mono,
        random=lambda: 1.0,
        reconnect_base_s=0.5,
        reconnect_max_s=4.0,
    )
    config = lg.GovernorConfig(retry_max_attempts=1, breaker_failure_threshold=2, breaker_cooldown_s=60)
    now = FakeClock(1000.0)
    gov = lg.Governor(config, store=store, clock=now)
    gov.subscribe(events.append)
    store.on_event = lambda e: gov.emit(e.pop("event"), **e)
    peer = _virtual(own_redis_server.url, namespace=namespace)  # another process of the fleet

    def down() -> None:
        raise ConnectionError("refused")

    assert gov.call("api", lambda: "ok") == "ok"
    own_redis_server.kill()

    # Calls keep completing; failures are still governed (locally).
    assert gov.call("api", lambda: "ok") == "ok"
    assert store.degraded
    with gov.task("t1"):
        for _ in range(2):
            with pytest.raises(lg.TransientError):
                gov.call("down_api", down)
        with pytest.raises(lg.CircuitOpenError):
            gov.call("down_api", lambda: "never runs")
        store.budget_take("t1", 10)
    fallback = [e for e in events if e["event"] == "store_fallback"]
    assert len(fallback) == 1 and fallback[0]["store"] == "redis" and fallback[0]["retry_in_s"] == 0.5

    # Backoff: no reconnect attempt before it's due; a failed attempt doubles the delay.
    mono.now = 0.6
    assert gov.call("api", lambda: "ok") == "ok"  # attempt 1 fails, next try at 0.6 + 1.0
    mono.now = 1.5
    assert gov.call("api", lambda: "ok") == "ok"  # not due: no attempt

    own_redis_server.start()  # same port, empty (no persistence)
    assert peer.breaker_get("down_api").state is BreakerState.CLOSED
    assert gov.call("api", lambda: "ok") == "ok" and store.degraded  # still not due
    mono.now = 1.7
    assert gov.call("api", lambda: "ok") == "ok"
    assert not store.degraded
    recovered = [e for e in events if e["event"] == "store_recovered"]
    assert len(recovered) == 1
    assert recovered[0]["attempts"] == 2 and recovered[0]["down_s"] == pytest.approx(1.7)
    assert recovered[0]["merged"]["breakers"] == 1

    # Reconverged: the breaker this process tripped alone is now the fleet's.
    assert peer.breaker_get("down_api").state is BreakerState.OPEN
    assert not peer.breaker_admit("down_api", now, config.policy_for("down_api").breaker)[0].allowed
    # Work done during the outage is not lost: task t1 ended, so its keys are gone.
    assert peer.budget_used("t1") == 0
    assert store.fallbacks == 1


def test_outage_merge_keeps_live_task_state(own_redis_server: Any, namespace: str) -> None:
    mono = FakeClock(0.0)
    store = _virtual(own_redis_server.url, namespace=namespace, monotonic=mono, reconnect_base_s=1.0)
    peer = _virtual(own_redis_server.url, namespace=namespace)
    assert store.budget_take("live", 5)
    own_redis_server.kill()
    assert store.budget_take("live", 5)  # local
    store.known_bad_put("live", "k", '{"x":1}')
    assert store.signature_hit("live", "sig") == 1
    own_redis_server.start()
    peer.signature_hit("live", "sig")  # the fleet kept working on Redis meanwhile
    mono.now = 2.0
    assert store.budget_used("live") == 1  # the reconnect merged the outage's deltas first
    assert peer.known_bad_get("live", "k") == '{"x":1}'
    assert peer.signature_hit("live", "sig") == 3


class _MergeHookStore(RedisStore):
    """A RedisStore whose outage merge runs scripted steps: ``hooks[i]`` runs right after
    the i-th merge pipeline was sent (``"fail"``: that round then fails like a dropped
    connection). Steps run on another thread and are joined: deterministic, no sleeps."""

    def __init__(self, *args: Any, hooks: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hooks = hooks
        self.merges = 0

    def _merge(self, outage: Any) -> dict[str, int]:
        self.merges += 1
        step = self.hooks.pop(0) if self.hooks else None
        fail = step == "fail"
        if fail:
            step = self.hooks.pop(0) if self.hooks else None
        else:
            result = super()._merge(outage)
        if step is not None:
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    step()
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            worker = threading.Thread(target=run)
            worker.start()
            worker.join(30)
            assert not worker.is_alive() and not errors, errors
        if fail:
            import redis

            raise redis.ConnectionError("connection dropped during the merge")
        return result


def _outage_store(server: Any, namespace: str, mono: FakeClock, hooks: list[Any]) -> _MergeHookStore:
    hooked = _MergeHookStore(server.url, namespace=namespace, monotonic=mono, reconnect_base_s=1.0, hooks=hooks)
    server.kill()
    assert hooked.budget_take("t", 100)  # local: the outage starts
    hooked.known_bad_put("t", "call-A", '{"a":1}')
    assert hooked.degraded
    server.start()
    mono.now = 5.0  # the reconnect is due
    return hooked


def test_writes_made_while_the_outage_is_being_merged_reach_redis(own_redis_server: Any, namespace: str) -> None:
    mono = FakeClock(0.0)
    peer = _virtual(own_redis_server.url, namespace=namespace)

    def meanwhile() -> None:  # another agent thread, while the merge is in flight
        hooked.known_bad_put("t", "call-B", '{"b":1}')
        assert hooked.budget_take("t", 100)
        assert hooked.signature_hit("t", "sig") == 1
        for i in range(POLICY.failure_threshold):
            hooked.breaker_record("api", False, False, 100.0 + i, POLICY)

    events: list[dict[str, Any]] = []
    hooked = _outage_store(own_redis_server, namespace, mono, [meanwhile])
    hooked.on_event = events.append
    assert hooked.known_bad_get("t", "call-A") == '{"a":1}'  # this call reconnects and merges
    assert not hooked.degraded

    assert peer.known_bad_get("t", "call-A") == '{"a":1}'
    assert peer.known_bad_get("t", "call-B") == '{"b":1}'
    assert peer.budget_used("t") == 2
    assert peer.signature_hit("t", "sig") == 2
    assert peer.breaker_get("api").state is BreakerState.OPEN
    assert hooked.merges == 2  # the writes made meanwhile were merged in a second round
    recovered = [e for e in events if e["event"] == "store_recovered"]
    assert len(recovered) == 1
    assert recovered[0]["merged"] == {"breakers": 1, "budgets": 2, "known_bad": 2, "signatures": 1}


def test_a_failed_merge_round_keeps_its_deltas_and_later_ones(own_redis_server: Any, namespace: str) -> None:
    mono = FakeClock(0.0)
    peer = _virtual(own_redis_server.url, namespace=namespace)

    def round1() -> None:
        assert hooked.budget_take("t", 100)
        hooked.known_bad_put("t", "call-B", '{"b":1}')

    def round2() -> None:  # written while round 2 is in flight, and round 2 fails
        assert hooked.budget_take("t", 100)
        hooked.known_bad_put("t", "call-C", '{"c":1}')

    hooked = _outage_store(own_redis_server, namespace, mono, [round1, "fail", round2])
    assert hooked.budget_used("t") == 3  # reconnect: round 1 merged, round 2 failed -> local
    assert hooked.degraded and hooked.merges == 2
    assert peer.budget_used("t") == 1 and peer.known_bad_get("t", "call-B") is None

    mono.now = 100.0  # next reconnect: what round 2 held, and what came meanwhile, once each
    assert hooked.budget_used("t") == 3
    assert not hooked.degraded
    assert peer.budget_used("t") == 3
    assert [peer.known_bad_get("t", c) for c in ("call-A", "call-B", "call-C")] == ['{"a":1}', '{"b":1}', '{"c":1}']


def test_recovery_completes_while_other_threads_keep_writing(own_redis_server: Any, namespace: str) -> None:
    import loop_governor.stores.redis as redis_store

    rounds = getattr(redis_store, "_MERGE_ROUNDS", 8)
    mono = FakeClock(0.0)
    peer = _virtual(own_redis_server.url, namespace=namespace)
    writes = [0]

    def meanwhile() -> None:  # new deltas during every round the lock is not held
        writes[0] += 1
        assert hooked.budget_take("t", 100)
        hooked.known_bad_put("t", f"call-{writes[0]}", "{}")

    hooked = _outage_store(own_redis_server, namespace, mono, [meanwhile] * (rounds - 1))
    assert hooked.budget_used("t") == 1 + writes[0]  # one reconnect attempt, and it completes
    assert not hooked.degraded and hooked.merges == rounds and writes[0] == rounds - 1
    assert peer.budget_used("t") == 1 + writes[0]
    assert peer.known_bad_count("t") == 1 + writes[0]


def test_a_bucket_debt_outlives_the_ttl_a_later_request_sets(redis_server: Any, namespace: str) -> None:
    """A 100k-token prompt on a 6k TPM key (rate 100/s, burst 1000) leaves a 990 s debt
    with a TTL to match; the next (small, refused) request reset the TTL to 60 s when
    each request set its own cost's TTL, so an idle minute forgave the debt that memory and
    SQLite keep."""
    store = _virtual(redis_server.url, namespace=namespace)
    memory = MemoryStore()
    for s in (store, memory):
        assert s.rate_acquire_all([("k", 100.0, 1000.0, 100_000.0)], 0.0) == 0.0
        assert s.rate_acquire_all([("k", 100.0, 1000.0, 10.0)], 1.0) == pytest.approx(989.1)
    assert store._redis.pttl(store._rkey("k")) >= 989_000


def test_a_cancelled_probe_is_handed_back_fleet_wide(store: Any) -> None:
    """On Redis too: a probe cancelled in flight lets the next caller (any process) probe
    at once, through the stores' own atomic record (no cooldown left to wait out)."""
    clock = FakeClock(1000.0)
    gov = lg.Governor(lg.GovernorConfig(breaker_failure_threshold=3), store=store, clock=clock)
    policy = gov.rt.policy("tool", "svc").breaker
    for _ in range(3):
        store.breaker_record("svc", False, False, clock(), policy)
    clock.now += policy.cooldown_s + 1

    def cancelled() -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gov.call("svc", cancelled)
    admission = store.breaker_admit("svc", clock, policy)[0]
    assert admission.allowed and admission.probe  # another caller, at the same instant
