"""Fixtures shared across test areas.

``redis_server``: a real redis-server on a free 127.0.0.1 port for the whole session
(no persistence, its own temp directory), yielding its URL. Tests share it and isolate
themselves by key prefix. Skips with a reason when the binary is not installed.

``openai_server``: an OpenAI-compatible chat-completions server on 127.0.0.1 for real SDK
clients (``lg_openai_server``); ``no_network``: fails a test that tries to leave loopback;
``crewai_retry_waits``: crewAI's own LLM retry without its sleeps, recording the waits.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lg_openai_server import OpenAIServer, deny_remote_connections


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


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A started OpenAI-compatible server on 127.0.0.1 (tests/lg_openai_server.py); its
    ``url`` is the ``base_url`` for clients. Script it with ``set_script``/``fail_*``."""
    with OpenAIServer() as server:
        yield server


@pytest.fixture
def no_network() -> Iterator[list[str]]:
    """Refuse connections and name lookups beyond loopback; fail the test if any was tried
    (clients retry connection errors, so a refused attempt alone could go unnoticed)."""
    with deny_remote_connections() as attempts:
        yield attempts
    assert not attempts, f"the test tried to reach the network: {attempts}"


@pytest.fixture
def crewai_retry_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """crewAI 1.15 wraps every ``BaseLLM.call`` in its own rate-limit retry (3 attempts, waits
    of ~1 s and ~2 s it cannot shorten from Retry-After): record the waits it asks for and sleep
    none. The calling conftest must have switched crewAI offline before this imports it."""
    import lg_crewai_env

    lg_crewai_env.require_offline_crewai()
    import crewai.llms.retry as crewai_retry

    waits: list[float] = []
    real = crewai_retry.get_retry_delay_seconds

    def record(*args: Any, **kwargs: Any) -> float:
        waits.append(real(*args, **kwargs))
        return 0.0

    monkeypatch.setattr(crewai_retry, "get_retry_delay_seconds", record)
    return waits
