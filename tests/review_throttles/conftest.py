"""Fixtures for the review of 48cf096 (throttles and overloads waited out)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lg_testing import VirtualClock

import loop_governor as lg


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def gov(clock: VirtualClock) -> lg.Governor:
    return lg.Governor(clock=clock, sleep=clock.sleep, asleep=clock.asleep, random=lambda: 0.5)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A private redis-server on a free local port (skips where the binary is absent)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server binary not found on PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*args, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)
