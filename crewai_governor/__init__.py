"""CrewAI adapter for loop-governor: governed tools, LLM/tool hooks, an event listener.

Swap a crew's tools for governed ones and, optionally, install the hooks for one run:

    import loop_governor as lg
    from crewai_governor import govern_tools, install

    g = lg.Governor(lg.GovernorConfig())
    agent = Agent(role=..., goal=..., backstory=..., tools=govern_tools([search, fetch], g))
    with install(g, pruner_factory=ContextPruner):
        crew.kickoff()

Long-term memory: ``Memory(storage=GovernedStorage(backend))``, or ``install(g, memory=True)``
for every ``Memory`` built while installed (failures, secrets and repeats kept out).

The adapter holds no governance logic: retries, breakers, budgets and classification
live in [`loop_governor`][loop_governor]; this package only maps them onto crewAI's plug points.
"""

from typing import Any

import loop_governor as lg
from crewai_governor.failures import GovernedToolError, GovernedToolFailure, stop_error
from crewai_governor.hooks import GovernorHooks, Installation
from crewai_governor.hooks import install as _install_hooks
from crewai_governor.listener import GovernorEventListener
from crewai_governor.memory import GovernedStorage, MemoryFactory, MemoryInstallation
from crewai_governor.resume import CrewResumeError, rebind_llm, restore_task_outputs, resume_crew
from crewai_governor.tools import GovernedTool, govern_tool, govern_tools
from loop_governor.adapter import resolve_governor

__all__ = [
    "CrewResumeError",
    "GovernedStorage",
    "GovernedTool",
    "GovernedToolError",
    "GovernedToolFailure",
    "GovernorEventListener",
    "GovernorHooks",
    "Installation",
    "MemoryFactory",
    "MemoryInstallation",
    "govern_tool",
    "govern_tools",
    "install",
    "rebind_llm",
    "resolve_governor",
    "restore_task_outputs",
    "resume_crew",
    "stop_error",
]


def install(governor: lg.Governor | None = None, *, memory: bool = False, **options: Any) -> Installation:
    """`crewai_governor.hooks.install` (same ``options``); ``memory=True`` also wraps
    the storage of every crewAI ``Memory`` built while the installation is active in a
    `GovernedStorage` (crewAI's ``set_memory_storage_factory``)."""
    installation = _install_hooks(governor, **options)
    if not memory:
        return installation
    return MemoryInstallation.adopt(installation, resolve_governor(governor))
