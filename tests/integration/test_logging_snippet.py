"""The README's logging snippet, as written, in a crew and in a ``create_agent`` agent.

Each run happens in a fresh interpreter (``logging_child.py``), so what is on stderr is what a
user sees in a terminal: one stream of ``loop_governor`` lines, each once, in the order things
happened, each naming the task and quoting the tool's own message -- with nothing else
configured, and with a root logger configured the way an application or a framework does
(without ``propagate = False`` in the snippet, every line would then print twice).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("logging_child.py")
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
# the snippet's format: "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) loop_governor: (.*)$")


def readme_logging_snippet() -> str:
    """The README's logging snippet, byte for byte."""
    blocks = [code for code in _BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8")) if "logging" in code]
    (snippet,) = [code for code in blocks if 'getLogger("loop_governor")' in code]
    return snippet


def _run(tmp_path: Path, framework: str, root: str) -> tuple[list[tuple[str, str]], str, str]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(readme_logging_snippet(), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(CHILD), str(snippet), framework, root, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [(m[1], m[2]) for m in map(_LINE.match, done.stderr.splitlines()) if m]
    return lines, done.stdout, done.stderr


@pytest.mark.parametrize("root", ["plain", "root"])
@pytest.mark.parametrize(
    ("framework", "task"), [("crew", "What is our refund policy?"), ("agent", "Summarise the docs")]
)
def test_the_readme_snippet_gives_one_clean_stream(tmp_path: Path, framework: str, task: str, root: str) -> None:
    lines, out, err = _run(tmp_path, framework, root)
    assert "stopped: repeated_failure" in out  # the run really went to the stop
    # nothing of ours reached the root logger's handler: each line once, in the snippet's format
    assert "loop_governor" not in "\n".join(line for line in err.splitlines() if line.startswith("ROOT"))
    texts = [text for _, text in lines]
    assert len(texts) == len(set(texts)), "\n".join(texts)
    # every line names the task (a crew's task description, a run's first user message)
    assert texts and all(text.startswith(f'task "{task}": ') for text in texts), "\n".join(texts)
    story = [(level, text.removeprefix(f'task "{task}": ')) for level, text in lines]

    def index(level: str, start: str) -> int:
        found = [i for i, (lv, text) in enumerate(story) if lv == level and text.startswith(start)]
        assert found, f"no {level} line starting {start!r} in:\n" + "\n".join(texts)
        return found[0]

    # the story in the order it happened, each line with the tool's own words
    retry = index("INFO", "search failed (transient, HTTP 503): HTTPError: search backend unavailable; retrying in ")
    told = index("INFO", "fetch_page failed (permanent, HTTP 404): HTTPError: no document at refunds-2019.pdf")
    memory = index("WARNING", "answered a call to fetch_page from memory without making it")
    withdrawn = index("WARNING", "withdrew fetch_page from the model for the rest of the task")
    stop = index("WARNING", "loop-governor stopped the run: fetch_page (repeated_failure)")
    assert retry < told < memory < withdrawn < stop
    assert "no document at refunds-2019.pdf" in story[memory][1] and "no document at" in story[withdrawn][1]
    assert "the model was told: " in story[told][1]
    assert not any("<n>" in text or "<q>" in text or "<url>" in text for text in texts)  # no signatures
