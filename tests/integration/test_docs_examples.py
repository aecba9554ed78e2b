"""Every JSON example of the README and the docs site, and every example of what the model
reads, is produced here by the code it shows, byte for byte.

A page that says "the same failure gives the same bytes" must show those bytes: each fenced
``json`` block, and each ``text`` block that is a governed failure (it starts with ``Error:``),
has to be one of the outputs below. A new example needs a producer here; a change of the
text the model reads fails this test until the pages show the new text (the failure prints it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

import loop_governor as lg

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(json|text)[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def _first_404(error_format: str) -> str:
    """What the model reads for the pages' example: fetch_doc's first 404 in a task."""

    def fetch_doc(name: str) -> str:
        raise FileNotFoundError(f"HTTP 404: no document named {name}")

    governor = lg.Governor(lg.GovernorConfig(error_format=error_format))  # type: ignore[arg-type]
    with governor.task("docs-example"), pytest.raises(lg.PermanentError) as failed:
        governor.call("fetch_doc", fetch_doc, "refunds-2019.pdf")
    return failed.value.info.to_model_text()


PRODUCERS: dict[str, Callable[[], str]] = {
    "fetch_doc's first 404, as text (the default)": lambda: _first_404("text"),
    "fetch_doc's first 404, as JSON": lambda: _first_404("json"),
}


def _examples() -> list[tuple[str, int, str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            kind, body = match.group(1), match.group(2).rstrip("\n")
            if kind == "json" or body.startswith("Error: "):
                line = text.count("\n", 0, match.start()) + 1
                found.append((page.name, line, kind, body))
    return found


def test_the_pages_show_what_the_model_reads() -> None:
    examples = _examples()
    assert {name for name, *_ in examples} >= {"README.md", "concepts.md"}
    assert {kind for _, _, kind, _ in examples} == {"json", "text"}


@pytest.mark.parametrize(("page", "line", "kind", "body"), _examples(), ids=lambda v: str(v)[:40])
def test_every_example_is_produced_by_the_code(page: str, line: int, kind: str, body: str) -> None:
    produced = {name: make() for name, make in PRODUCERS.items()}
    assert body in produced.values(), (
        f"{page}:{line}: this {kind} example is not what the code produces; the outputs are:\n"
        + "\n".join(f"{name}:\n{out}" for name, out in produced.items())
    )
