"""Pages checked as a reader sees them: a screenshot in headless Chromium, its colours
counted; and the rule that every table of a page the CLI writes explains its columns."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image


def screenshot(page: Path, workdir: Path, size: tuple[int, int]) -> Callable[[str], int]:
    """Render ``page`` in headless Chromium at ``size`` (skips the test without Chromium);
    returns ``near(hex)``: how many pixels of the screenshot are about that colour."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("chromium not found on PATH (apt-get install chromium); the page is not rendered")
    shot = workdir / f"{page.stem}.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={workdir / 'chromium-profile'}",
            f"--screenshot={shot}",
            f"--window-size={size[0]},{size[1]}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with Image.open(shot) as img:
        rgb = img.convert("RGB")
        assert rgb.size == size
        colors = rgb.getcolors(maxcolors=1 << 22)
    assert colors is not None
    by_color = {c: n for n, c in colors}
    assert len(by_color) > 50  # text, charts and cards, not a blank or single-colour page
    white = by_color.get((255, 255, 255), 0) + by_color.get((246, 247, 249), 0)
    assert white < 0.9 * size[0] * size[1]

    def near(rgb_hex: str) -> int:
        r, g, b = (int(rgb_hex[i : i + 2], 16) for i in (1, 3, 5))
        return sum(n for (cr, cg, cb), n in by_color.items() if abs(cr - r) + abs(cg - g) + abs(cb - b) < 12)

    return near


def assert_columns_explained(page: str, at_least: int) -> None:
    """Every ``<th>`` of every table of ``page`` is explained in the "Columns — " line under it."""
    tables = re.findall(r"<table>(.*?)</table>(<p class=\"cols\">Columns — .*?</p>)?", page, re.S)
    assert len(tables) >= at_least
    for table, note in tables:
        headers = re.findall(r"<th>(.*?)</th>", table)
        assert note, f"no explanation under the table of {headers}"
        for header in headers:
            assert f"<b>{header}</b>: " in note, header
