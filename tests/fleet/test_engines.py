"""The engines a fleet grows into, started by the fixtures on 127.0.0.1: a 3-master Redis
Cluster and a primary + replica + Sentinel (each on Redis and on Valkey), and the
configuration mistakes that must fail at start instead of running every process alone."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

import loop_governor as lg
from loop_governor.state.breaker import BreakerPolicy, BreakerState
from loop_governor.stores import StoreConfigError, store_from_url
from loop_governor.stores.redis import RedisStore

pytestmark = pytest.mark.redis

TRIP = """
import sys
from loop_governor.state.breaker import BreakerPolicy
from loop_governor.stores import store_from_url
store = store_from_url(sys.argv[1])
for _ in range(3):
    store.breaker_record("shared_api", False, False, 0.0, BreakerPolicy(3, 60))
assert not store.degraded, "fell back"
"""


def _namespaced(url: str) -> str:
    return f"{url}?namespace=lg-eng-{uuid.uuid4().hex[:10]}"


def _trip_in_another_process(url: str) -> None:
    out = subprocess.run([sys.executable, "-c", TRIP, url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


def _model_calls(gov: lg.Governor, n: int) -> list[str]:
    def reply(i: int) -> str:
        return f"answer {i}"

    with gov.task(f"task-{uuid.uuid4().hex[:6]}"):
        return [gov.call_model("openai:gpt-test", functools.partial(reply, i), estimated_tokens=50) for i in range(n)]


def _check_fleet_engine(url: str) -> None:
    """The three things a fleet needs from its engine, through the public config."""
    url = _namespaced(url)
    models = {"openai:gpt-test": lg.ModelPolicy(rpm=6000, tpm=600_000)}
    gov = lg.Governor(lg.GovernorConfig(store_url=url, models=models))
    store: Any = gov.rt.store
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    # rpm + tpm: both buckets in one script call (one hash tag), no CROSSSLOT
    assert _model_calls(gov, 5) == [f"answer {i}" for i in range(5)]
    # a tool on a task: budget, known-bad and signatures under one task tag
    with gov.task("t-1"):
        assert gov.call("lookup", lambda: "found") == "found"
        with pytest.raises(lg.PermanentError):
            gov.call("lookup", lambda: (_ for _ in ()).throw(ValueError("bad argument")))
    # a breaker tripped by another process is open here
    _trip_in_another_process(url)
    with pytest.raises(lg.CircuitOpenError):
        gov.call("shared_api", lambda: "ran")
    assert store.breaker_get("shared_api").state is BreakerState.OPEN
    assert [b.tool for b in store.breaker_list()] == ["shared_api"]
    assert not store.degraded and store.fallbacks == 0
    assert not [e for e in events if e["event"].startswith("store_")]
    store.close()


# -- Redis Cluster -----------------------------------------------------------------------


def test_cluster_shares_breakers_buckets_and_tasks(redis_cluster: Any) -> None:
    _check_fleet_engine(redis_cluster.url)


def test_cluster_keys_of_one_script_share_a_slot(redis_cluster: Any) -> None:
    from redis.cluster import key_slot

    store = RedisStore(redis_cluster.url, namespace="lg-slots")
    for task in ("t", "", "a{b}c", "}{"):
        assert len({key_slot(store._tkey(task, k).encode()) for k in ("budget", "bad", "sig")}) == 1
    for model in ("openai:gpt-4o", "https://x/{v1}", ""):
        keys = store._rkeys([(model, 1.0, 1.0, 1.0), (f"{model}:tokens", 1.0, 1.0, 1.0)])
        assert len({key_slot(k.encode()) for k in keys}) == 1
        assert store._rkeys([(f"{model}:tokens", 1.0, 1.0, 1.0)]) == keys[1:]  # same key taken alone
    store.close()


def test_cluster_outage_falls_back_and_merges_without_pipelined_scripts(redis_cluster: Any) -> None:
    """A store whose cluster went away keeps working locally and merges on return (the
    merge used EVALSHA in a cluster pipeline, which redis-py refuses)."""
    url = _namespaced(redis_cluster.url)
    mono = [0.0]
    store = RedisStore(url, monotonic=lambda: mono[0], server_time=False)
    events: list[dict[str, Any]] = []
    store.on_event = events.append
    real = store._redis
    store._fail("test", ConnectionError("cut"))  # as an outage would, without killing the shared cluster
    for _ in range(3):
        store.breaker_record("down_api", False, False, 5.0, BreakerPolicy(3, 60))
    store.known_bad_put("task", "call", "{}")
    assert store.signature_hit("task", "sig") == 1
    mono[0] = 10.0
    assert store._redis is real and store.breaker_get("down_api").state is BreakerState.OPEN
    assert [e["event"] for e in events] == ["store_fallback", "store_recovered"]
    assert events[1]["merged"] == {"breakers": 1, "budgets": 0, "known_bad": 1, "signatures": 1}
    peer = RedisStore(url)
    assert peer.known_bad_get("task", "call") == "{}" and peer.signature_hit("task", "sig") == 2
    peer.close()
    store.close()


def test_a_cluster_node_behind_a_plain_url_is_a_configuration_error(redis_cluster: Any) -> None:
    node = redis_cluster.nodes[0]
    with pytest.raises(StoreConfigError, match=r"Redis Cluster node.*MOVED.*redis\+cluster://"):
        store_from_url(node.url)
    with pytest.raises(StoreConfigError, match="store_url"):
        lg.Governor(lg.GovernorConfig(store_url=node.url))


# -- Sentinel ----------------------------------------------------------------------------


def test_sentinel_shares_breakers_buckets_and_tasks(redis_sentinel: Any) -> None:
    _check_fleet_engine(redis_sentinel.url)


def test_sentinel_failover_keeps_calls_governed_and_reconverges(redis_sentinel: Any) -> None:
    """SIGKILL the primary mid-run: no call raises anything but a governed error, the store
    follows Sentinel to the promoted replica at its first reconnect after the promotion,
    and a restarted old primary (a master again, empty, until Sentinel demotes it) is
    never written to.

    Every step waits on a condition with a bounded deadline, never on a fixed sleep or a
    wall-clock figure (a loaded machine stretches those): the store runs on a clock of the
    test's own (``monotonic``), frozen while Sentinel fails over, so its one reconnect is
    made once the new primary is known, and it must succeed. Socket timeouts are generous
    for the same reason: a starved CPU must not look like an outage."""
    setup = redis_sentinel
    ns = f"lg-fo-{uuid.uuid4().hex[:8]}"
    setup.wait_replica_known()
    mono = [0.0]
    reconnect_max = 4.0
    store = RedisStore(
        f"{setup.url}?namespace={ns}",
        monotonic=lambda: mono[0],
        socket_timeout=2.0,
        connect_timeout=2.0,
        reconnect_max_s=reconnect_max,
    )
    models = {"openai:gpt-test": lg.ModelPolicy(rpm=600_000)}
    gov = lg.Governor(lg.GovernorConfig(retry_max_attempts=1, models=models), store=store)
    events: list[dict[str, Any]] = []
    gov.subscribe(lambda e: events.append(e) if e["event"].startswith("store_") else None)
    unexpected: list[str] = []
    calls = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                with gov.task(f"task-{calls[0]}"):
                    gov.call("api", lambda: "ok")
                    gov.call_model("openai:gpt-test", lambda: "hi", estimated_tokens=10)
                calls[0] += 1
            except lg.AgentToolError:
                pass
            except BaseException as exc:  # the property under test: nothing else escapes
                unexpected.append(f"{type(exc).__name__}: {exc}")
            stop.wait(0.002)  # pacing, not a wait: the loop keeps calling throughout

    def seen(kind: str) -> list[dict[str, Any]]:
        return [e for e in list(events) if e["event"] == kind]

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        wait_calls = calls[0] + 20
        _wait(lambda: calls[0] >= wait_calls, "calls through the primary", 60)
        assert not store.degraded
        old_port = setup.primary.port
        setup.primary.kill()
        _wait(lambda: store.degraded, "the store to notice the outage and go local", 60)
        # the old primary comes back (a master again, empty, until Sentinel demotes it) while
        # Sentinel fails over: the store must not pick it
        _wait(lambda: setup.master_port() == setup.replica.port, "Sentinel to name the replica", 60)
        setup.primary.start()
        old = setup.primary.client()
        _wait(lambda: setup.failover_done(setup.replica.port), "Sentinel to finish the failover", 60)
        assert seen("store_recovered") == []  # the store's clock stood still: no reconnect yet
        mono[0] += reconnect_max  # the store's next reconnect is due (backoff is capped at this)
        _wait(lambda: seen("store_recovered"), "the store's reconnect to the promoted replica", 60)
        before = calls[0]
        _wait(lambda: calls[0] >= before + 50, "calls through the new primary", 60)
        # Not demoted yet (a master before and after the look) while Sentinel names the
        # promoted replica: it must hold nothing of ours. (Once demoted it copies the new
        # primary's data; on a loaded machine Sentinel may even fail back over to it.)
        named_before = setup.master_port()
        role_before, ours, role_after = (
            old.execute_command("ROLE")[0],
            old.keys(f"{ns}:*"),
            old.execute_command("ROLE")[0],
        )
        named_after = setup.master_port()
        if role_before == role_after == "master" and named_before == named_after == setup.replica.port:
            assert ours == []
    finally:
        stop.set()
        worker.join(30)
    assert unexpected == []
    assert [e["event"] for e in events][:2] == ["store_fallback", "store_recovered"]
    assert seen("store_recovered")[0]["attempts"] == 1  # the first reconnect after the promotion
    assert not store.degraded
    named = setup.primary if setup.master_port() == old_port else setup.replica
    assert named.client().keys(f"{ns}:rate:*")  # the model's shared buckets live on the named primary
    store.close()


def test_a_plain_url_primary_that_came_back_empty_is_not_written_to(redis_sentinel: Any) -> None:
    """A store on a plain URL to the primary: after a failover its old primary restarts
    empty, a master again until Sentinel demotes it. The store does not reconnect to it
    (new process, its replicas gone), stays local, and says so (store_misconfigured)."""
    setup = redis_sentinel
    setup.wait_replica_known()
    # the store learns at start that the primary has replicas: wait until the primary lists
    # its replica (under load it connects a moment after Sentinel knows it)
    _wait(lambda: len(setup.primary.client().execute_command("ROLE")[2]) > 0, "the primary to list its replica", 20)
    mono = [0.0]
    ns = f"lg-stale-{uuid.uuid4().hex[:8]}"
    store = RedisStore(setup.primary.url, namespace=ns, monotonic=lambda: mono[0])
    events: list[dict[str, Any]] = []
    store.on_event = events.append
    assert store.budget_take("t", 5) and not store.degraded
    setup.primary.kill()
    assert store.budget_take("t", 5) and store.degraded  # an outage: local state
    _wait(lambda: setup.master_port() == setup.replica.port, "Sentinel to promote the replica", 20)
    setup.primary.start()
    old = setup.primary.client()
    assert old.execute_command("ROLE")[0] == "master"
    mono[0] += 100.0  # a reconnect is due
    assert store.budget_take("t", 5)
    assert store.degraded and old.keys(f"{ns}:*") == []
    assert [e["event"] for e in events] == ["store_fallback", "store_misconfigured"]
    assert "came back empty" in events[1]["error"]
    store.close()


def _wait(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_replica_or_a_sentinel_behind_a_plain_url_is_a_configuration_error(redis_sentinel: Any) -> None:
    with pytest.raises(StoreConfigError, match=r"read-only replica \(writes answer READONLY\)"):
        RedisStore(redis_sentinel.replica.url)
    with pytest.raises(StoreConfigError, match=r"is a Sentinel.*redis\+sentinel://"):
        RedisStore(f"redis://127.0.0.1:{redis_sentinel.sentinel.port}/0")
    store = RedisStore(redis_sentinel.primary.url)  # the primary itself is fine (and warned about)
    assert not store.degraded
    store.close()


# -- start-up mistakes on one server ---------------------------------------------------------


def test_refused_credentials_are_a_configuration_error(redis_with_password: Any) -> None:
    port = redis_with_password.port
    with pytest.raises(StoreConfigError, match="refused the credentials") as info:
        RedisStore(f"redis://:wrong-pw@127.0.0.1:{port}/0")
    assert "wrong-pw" not in str(info.value)
    with pytest.raises(StoreConfigError, match="refused the credentials"):
        RedisStore(f"redis://127.0.0.1:{port}/0")  # NOAUTH
    store = RedisStore(f"redis://:s3cret-pw@127.0.0.1:{port}/0")
    assert not store.degraded
    store.close()


def test_a_client_that_does_not_decode_is_refused(redis_server: Any) -> None:
    import redis

    with pytest.raises(StoreConfigError, match="decode_responses=True"):
        RedisStore(redis_server.url, client=redis.Redis.from_url(redis_server.url))
    store = RedisStore(redis_server.url, client=redis.Redis.from_url(redis_server.url, decode_responses=True))
    assert not store.degraded
    store.close()


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/svc/x",
        "redis+cluster://127.0.0.1",
        "redis+cluster://127.0.0.1:7000,127.0.0.1:notaport",
        "redis+cluster://127.0.0.1:7000/3",
    ],
)
def test_malformed_engine_urls_fail_in_the_config(url: str) -> None:
    with pytest.raises(ValueError, match="store_url"):
        lg.GovernorConfig(store_url=url)


def test_engine_urls_pass_the_config() -> None:
    for url in ("redis+cluster://a:7000,b:7001", "redis+sentinel://a:26379,b:26380/svc/2", "rediss+cluster://a:1"):
        assert lg.GovernorConfig(store_url=url).store_url == url
