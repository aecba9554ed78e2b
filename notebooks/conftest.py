"""pytest rules for the notebooks, which run through nbmake (``pytest --nbmake notebooks``).

Each quickstart needs an agent framework (or matplotlib). On an install without it, e.g.
Python 3.10 where the ``langchain`` extra installs nothing because langchain-core needs
3.11, the notebook is reported as skipped with the reason instead of failing on its first
import. With ``.[all,dev]`` installed nothing is skipped.
"""

from __future__ import annotations

import importlib.util

import pytest

NEEDS = {
    "01_langchain_quickstart.ipynb": ("langchain",),
    "02_crewai_quickstart.ipynb": ("crewai",),
    "03_context_and_cost.ipynb": ("matplotlib",),
    "04_tracing.ipynb": ("langchain",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        missing = [m for m in NEEDS.get(item.path.name, ()) if importlib.util.find_spec(m) is None]
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"{item.path.name} needs {', '.join(missing)}"))
