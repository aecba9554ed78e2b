"""Root conftest for crewAI's own tests as its sdist ships them (loop-governor's compat run).

crewAI's tests rely on a workspace-level conftest that the sdist does not contain. This
one (written for loop-governor, copied next to the sdist's ``tests/`` by
``compat/run.py``) gives them what they need to run offline and deterministically:

* telemetry, tracking and tracing off and HOME in a temporary directory, set before
  anything imports crewai (importing it writes under ~/.local/share and ~/.config);
* fake provider keys, so clients build without talking to anyone;
* the VCR cassettes replayed, never recorded (``record_mode="none"``: a request with no
  recorded answer fails the test instead of reaching the network), from crewAI's layout
  ``tests/cassettes/<test folder>/<test name>.yaml``, matched on method, scheme, host,
  port and path as crewAI records them;
* every socket but AF_UNIX refused (pytest-socket, switched on in ``pytest_configure``;
  asyncio's loop needs a unix socketpair);
* a fresh crewAI storage directory, event ids and an empty event bus per test;
* no pause between the openai client's retries. crewAI 1.15.30 asks OpenAI's
  input-token-count endpoint before each call, which the older cassettes never
  recorded: VCR refuses it, the client retries twice with backoff and crewAI falls back
  to its own estimate, as it would in crewAI's CI. The retries still happen; only the
  ~2 s of sleeping per model call goes (it made the suite ~7x slower).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HOME = tempfile.mkdtemp(prefix="crewai-compat-home-")
os.environ.update(
    {
        "HOME": _HOME,
        "OTEL_SDK_DISABLED": "true",
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_DISABLE_TRACKING": "true",
        "CREWAI_TRACING_ENABLED": "false",
        "CREWAI_TESTING": "true",
        "OPENAI_API_KEY": "fake-api-key",
        "ANTHROPIC_API_KEY": "fake-anthropic-key",
        "GEMINI_API_KEY": "fake-gemini-key",
        "AZURE_API_KEY": "fake-azure-key",
        "OPENAI_BASE_URL": "https://api.openai.com/v1",
        "OPENAI_API_BASE": "https://api.openai.com/v1",
    }
)

import pytest  # noqa: E402

_TESTS = Path(__file__).parent / "tests"


def _no_retry_pause() -> None:
    from openai._base_client import BaseClient

    BaseClient._calculate_retry_timeout = lambda self, *args, **kwargs: 0.0  # type: ignore[method-assign]


_no_retry_pause()


def pytest_configure(config: pytest.Config) -> None:
    # the same switches as pytest-socket's --disable-socket --allow-unix-socket
    config.option.disable_socket = True
    config.option.allow_unix_socket = True


@pytest.fixture(scope="module")
def vcr_cassette_dir(request: pytest.FixtureRequest) -> str:
    folder = Path(str(request.node.path)).parent
    relative = folder.relative_to(_TESTS)
    return str(_TESTS / "cassettes" / relative)


@pytest.fixture(scope="module")
def vcr_config(vcr_cassette_dir: str) -> dict[str, Any]:
    return {
        "cassette_library_dir": vcr_cassette_dir,
        "record_mode": "none",
        "match_on": ["method", "scheme", "host", "port", "path"],
        "filter_headers": ["authorization", "api-key", "x-api-key"],
    }


@pytest.fixture(autouse=True)
def _crewai_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREWAI_STORAGE_DIR", str(tmp_path / "crewai-storage"))


@pytest.fixture(autouse=True)
def _empty_event_bus() -> Iterator[None]:
    from crewai.events.base_events import reset_emission_counter
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.event_context import EventContextConfig, _event_context_config, _event_id_stack

    reset_emission_counter()
    _event_id_stack.set(())
    _event_context_config.set(EventContextConfig())
    yield
    with crewai_event_bus._rwlock.w_locked():
        crewai_event_bus._sync_handlers.clear()
        crewai_event_bus._async_handlers.clear()
