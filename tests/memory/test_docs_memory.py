"""docs/memory.md runs as written: its python blocks, in order, in one namespace (as a reader
pastes them into one session), offline, and they show what the page says they show."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "memory.md"
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def test_every_python_block_of_the_memory_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the page writes LanceDB folders under ./
    text = PAGE.read_text(encoding="utf-8")
    blocks = _BLOCK.findall(text)
    assert len(blocks) == text.count("```python") >= 8
    namespace: dict[str, Any] = {"__name__": "docs_memory"}
    for number, code in enumerate(blocks, 1):
        exec(compile(code, f"memory.md python block {number}", "exec"), namespace)

    # crewAI, before and after: the failure was remembered, then kept out
    assert any("Permanent failure: " in r for r in namespace["remembered"])
    assert namespace["after"].count() == 0 and namespace["storage"].stats["dropped"] == 1
    assert type(namespace["memory"]._storage).__name__ == "GovernedStorage"
    assert namespace["memory"].list_records() == []
    # LangGraph, before and after
    assert any("Permanent failure: " in f for f in namespace["facts"])
    assert namespace["inner_store"].search(("memories", "user-1")) == []
    # redaction and repeats (each under its own key), backend failures
    items = {item.key: item.value for item in namespace["notes"].search(("ops",))}
    assert items == {
        "deploy-1": {"note": "deploy 1041 passed", "api_key": "[REDACTED]"},
        "deploy-2": {"note": "deploy 1042 passed", "api_key": "[REDACTED]"},
        "deploy-3": {"note": "deploy  1042 passed", "api_key": "[REDACTED]"},
    }
    assert [(e["key"], e["same_as"]) for e in namespace["events"] if e["event"] == "memory_repeat"] == [
        ("deploy-3", "deploy-2")
    ]
    assert namespace["down"].stats["lost"] == namespace["down"].stats["save_failures"] == 1


def test_the_figures_on_the_memory_page_are_the_benchmarks() -> None:
    """The cost table names the benchmark that measures it and the cases it prints."""
    text = PAGE.read_text(encoding="utf-8")
    assert "python benchmarks/memory_overhead.py --lance-calls 10" in text
    for case in ("dict save", "LanceDB save", "InMemoryStore put"):
        assert f"| {case} |" in text
