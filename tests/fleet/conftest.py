"""Fleet tests run against a real redis-server this suite starts on a free local port.

``redis_server`` (session) is shared; every test isolates itself with its own key
namespace. ``own_redis_server`` is a private server for tests that kill and restart it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REDIS_BIN = shutil.which("redis-server")
WORKER = Path(__file__).with_name("fleet_worker.py")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throw-away redis-server: no persistence, its own port and directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_BIN is not None
        self.proc = subprocess.Popen(
            [
                REDIS_BIN,
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
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}") from None
                time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING within 20s")

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
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if REDIS_BIN is None:
        pytest.skip("redis-server binary not found on PATH (apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS_BIN is None:
        pytest.skip("redis-server binary not found on PATH (apt-get install redis-server)")
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
