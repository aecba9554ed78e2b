"""crewAI offline switches, for every process that imports crewai (standard library only).

Importing crewai writes under ``~/.local/share/crewai`` and starts telemetry unless these
are set first, so call :func:`offline_crewai` before anything imports crewai: at the top
of a conftest, or of a child process script, ahead of its other imports. ``lg_crewai``
checks with :func:`require_offline_crewai` that this happened.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SWITCHES = {
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
}


def offline_crewai(home: str | Path | None = None, *, prefix: str = "lg-crewai-home-") -> str:
    """Set crewAI's offline switches and point HOME at ``home`` (default: a new temporary
    directory named ``prefix...``); returns the HOME used."""
    os.environ.update(SWITCHES)
    os.environ["HOME"] = str(home) if home is not None else tempfile.mkdtemp(prefix=prefix)
    return os.environ["HOME"]


def require_offline_crewai() -> None:
    """Raise unless :func:`offline_crewai` (or the same settings) came first."""
    unset = sorted(name for name, value in SWITCHES.items() if os.environ.get(name) != value)
    if unset:
        raise RuntimeError(f"call lg_crewai_env.offline_crewai() before importing crewai (unset: {', '.join(unset)})")
