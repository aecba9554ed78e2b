"""Fixtures shared across test areas.

``redis_server``: a real redis-server on a free 127.0.0.1 port for the whole session
(no persistence, its own temp directory), yielding its URL. Tests share it and isolate
themselves by key prefix. Skips with a reason when the binary is not installed.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server binary not found on PATH (apt-get install redis-server)")
    workdir = tmp_path_factory.mktemp("redis-server")
    for _ in range(3):  # the free port can be taken between probing and binding: retry
        port = _free_port()
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(
            [binary, *args, "--dir", str(workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline and not _answers_ping(port):
            time.sleep(0.02)
        if proc.poll() is None and _answers_ping(port):
            break
        proc.kill()
        proc.wait()
    else:
        pytest.fail("could not start redis-server on a free port (3 attempts)")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
