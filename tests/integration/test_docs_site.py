"""The documentation site builds with ``mkdocs build --strict``, and says what the code says.

Strict mode turns every warning into a failure: a broken link or anchor between pages, a page
missing from the navigation's files, an mkdocstrings reference to an object that no longer
exists. The configuration reference is generated from the pydantic models at build time, so it
lists every field with its default.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import loop_governor as lg

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages() -> list[str]:
    # mkdocs.yml has no custom YAML tags, so the safe loader reads it
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages: list[str] = []
    for entry in config["nav"]:
        pages.extend(entry.values())
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,  # the changelog page includes CHANGELOG.md by a path relative to the root
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _text(site: Path, page: str) -> str:
    html = (site / page / "index.html").read_text(encoding="utf-8")
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_every_page_is_in_the_navigation_and_every_nav_entry_is_a_page() -> None:
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert set(_nav_pages()) == on_disk


def test_the_configuration_reference_lists_every_field_with_its_default(site: Path) -> None:
    text = _text(site, "configuration")
    for model in (lg.GovernorConfig, lg.ToolPolicy, lg.ModelPolicy, lg.ModelPrice):
        for name in model.model_fields:
            assert name in text, f"{model.__name__}.{name}"
    assert "LOOP_GOVERNOR_RETRY_MAX_ATTEMPTS" in text
    assert "int | None" in text and "\\|" not in text  # a type's pipe reads as one
    assert "attempts per call, first included" in text  # the field's own description
    assert re.search(r"retry_max_attempts .{0,120}\b3\b", text)  # and its default


def test_the_api_reference_and_the_changelog_are_rendered(site: Path) -> None:
    api = _text(site, "api")
    for name in ("Governor", "GovernorMiddleware", "FatalError", "classify", "install"):
        assert name in api
    assert "Unreleased" in _text(site, "changelog")  # CHANGELOG.md, included


def test_no_page_points_the_reader_at_the_projects_internals() -> None:
    for page in (ROOT / "docs").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        for word in ("../shared", "seed 004", "Agent Lens", "seeds'"):
            assert word not in text, f"{page.name}: {word}"


def test_plain_pytest_nbmake_collects_the_notebooks_without_the_dev_only_plugins() -> None:
    # an install with nbmake but without pytest-benchmark, pytest-timeout or pytest-asyncio
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbmake",
            "notebooks",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:timeout",
            "-p",
            "no:asyncio",
            "-p",
            "no:benchmark",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 tests collected" in done.stdout


def test_no_page_shows_a_raw_rest_role_or_loses_a_star(site: Path) -> None:
    """mkdocstrings renders Markdown, not reST: a role shows up raw on the page, a `*`
    read as emphasis vanishes (the configuration table read "0.5 + random()jitter")."""
    pages = sorted(p.parent.name for p in site.glob("*/index.html") if (ROOT / "docs" / f"{p.parent.name}.md").exists())
    assert "api" in pages and "configuration" in pages
    for page in pages:
        text = _text(site, page)
        found = re.findall(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj|ref):\s*\S{0,40}", text)
        assert not found, f"{page}: raw reST roles {found[:5]}"
    config = _text(site, "configuration")
    for model in (lg.GovernorConfig, lg.ToolPolicy, lg.ModelPolicy, lg.ModelPrice):
        for name, field in model.model_fields.items():
            if "*" in (field.description or ""):
                assert " ".join(field.description.split()) in config, f"{model.__name__}.{name}"
    assert "delay *= 0.5 + random()*jitter" in config
