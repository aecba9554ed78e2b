"""Docstrings are Markdown in Google style, as mkdocstrings renders them.

mkdocstrings reads no reST: a ``:class:`X``` role shows up raw on the site, and a ``*``
outside a code span (``random()*jitter``, ``*args``) is taken for emphasis and vanishes.
Every docstring of the three packages is checked here, rendered on the site or not (the
API reference grows); the site build itself is checked in ``test_docs_site.py``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("loop_governor", "langchain_governor", "crewai_governor", "pydantic_ai_governor")

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj|ref|const|term|doc):`")
_REST = re.compile(
    r"^\s*(?:\.\. [a-z-]+::|:param\b|:type\b|:returns?:|:rtype:|:raises?\b)|^\s*::\s*$|\w::\s*$", re.MULTILINE
)
_CODE = re.compile(r"``.+?``|`[^`\n]+`", re.DOTALL)
_FENCED = re.compile(r"^\s*```.*?^\s*```", re.DOTALL | re.MULTILINE)
# a star the docstring meant: escaped, a bullet, or emphasis around words (*one*, **two**)
_MEANT = re.compile(r"\\\*|^\s*\* |\*\*\w[^*\n]*?\w\*\*|\*\*\w\*\*|(?<![\w*])\*\w[^*\n]*?\w\*(?![\w*])|\*\w\*", re.M)


def _docstrings() -> Iterator[tuple[str, int, str]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    doc = ast.get_docstring(node, clean=True)
                    if doc:
                        line = node.body[0].lineno if node.body else 1
                        yield f"{path.relative_to(ROOT)}:{line}", line, doc


DOCSTRINGS = list(_docstrings())


def _without_indented_code(doc: str) -> str:
    """The docstring less its indented code blocks (4 spaces in, after a blank line)."""
    out, in_code, blank = [], False, True
    for line in doc.splitlines():
        in_code = bool(line.strip()) and line.startswith("    ") and (in_code or blank)
        blank = not line.strip()
        out.append("" if in_code else line)
    return "\n".join(out)


def _stray_stars(doc: str) -> list[str]:
    text = _CODE.sub("", _FENCED.sub("", _without_indented_code(doc)))
    text = _MEANT.sub("", text)
    return [text[max(0, m.start() - 30) : m.end() + 30] for m in re.finditer(r"\*", text)]


def test_there_are_docstrings_to_check() -> None:
    assert len(DOCSTRINGS) > 500


@pytest.mark.parametrize("check", ["rest", "stars"])
def test_every_docstring_is_markdown(check: str) -> None:
    bad = []
    for where, _, doc in DOCSTRINGS:
        if check == "rest":
            found = [m.group(0) for m in _ROLE.finditer(doc)] + [m.group(0).strip() for m in _REST.finditer(doc)]
        else:
            found = _stray_stars(doc)
        bad.extend(f"{where}: {item!r}" for item in found)
    assert not bad, f"{len(bad)} reST construct(s) or stray '*' in docstrings:\n" + "\n".join(bad[:60])


def test_the_checks_catch_what_they_are_for() -> None:
    assert _ROLE.search("See :class:`~loop_governor.errors.FatalError`.")
    assert _ROLE.search(":meth:`Governor.task`") and not _ROLE.search("[`Governor.task`][loop_governor.Governor.task]")
    assert _stray_stars("delay = 0.5 + random()*jitter")
    assert _stray_stars("takes *args and **kwargs")
    assert not _stray_stars("the model *withdraws* it; **never** twice; `a*b`; ``*args``; \\* literal\n* a bullet")
    assert not _stray_stars("A diagram:\n\n    policies .after_attempt_*  (breaker)\n")
    assert _REST.search("The chain::\n\n    a -> b") and _REST.search("::\n\n    a")
