"""The package builds and installs like any other, and the README's quickstart runs from the wheel.

``python -m build`` makes a wheel and an sdist with no warning, ``twine check`` passes, and the
wheel installed into a fresh virtual environment runs the README's LangChain quickstart against
the local OpenAI-compatible test server (a real ``ChatOpenAI`` over real HTTP on 127.0.0.1).

Kept fast and offline: the build runs without isolation (the dev extra pins setuptools >= 77,
what the SPDX license needs), on a copy of the sources so the checkout gets no build
artefacts; the fresh venv reaches the *dependencies* through a ``.pth`` file naming the dev
environment's site-packages (a directory added that way has its own ``.pth`` files ignored,
so the dev environment's editable install of loop_governor stays invisible), while
loop_governor itself must import from the installed wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from lg_openai_server import OpenAIServer, tool_reply

import loop_governor

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "loop_governor",
    "langchain_governor",
    "crewai_governor",
    "pydantic_ai_governor",
)
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env or _clean_env(), capture_output=True, text=True, timeout=240
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel-build")
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, src / name)
    output = _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", work / "dist", src, cwd=work)
    # setuptools' deprecations (a license table, a license classifier) print as WARNING lines
    warnings = [line for line in output.splitlines() if re.search(r"warning", line, re.IGNORECASE)]
    assert not warnings, "\n".join(warnings)
    return work / "dist"


def test_the_build_gives_a_wheel_and_an_sdist_that_twine_accepts(dist: Path) -> None:
    version = loop_governor.__version__
    wheel = dist / f"loop_governor-{version}-py3-none-any.whl"
    sdist = dist / f"loop_governor-{version}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())
    output = _run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=dist)
    assert output.count("PASSED") == 2, output
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"loop_governor-{version}.dist-info/METADATA").decode()
    assert {
        "loop_governor/py.typed",
        "loop_governor/bench/calibration.json",
        "langchain_governor/py.typed",
        "crewai_governor/py.typed",
        "pydantic_ai_governor/py.typed",
        "pydantic_ai_governor/capability.py",
    } <= names
    assert f"loop_governor-{version}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata  # the SPDX string, PEP 639
    assert f"Version: {version}" in metadata  # the one version, read from loop_governor.__version__
    assert "Provides-Extra: langchain" in metadata and "Provides-Extra: docs" in metadata
    assert "Provides-Extra: pydantic-ai" in metadata and "pydantic-ai-slim" in metadata
    assert "# loop-governor" in metadata  # the README is the package's long description


def test_the_installed_wheel_runs_the_readmes_langchain_quickstart(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    wheel = next(dist.glob("*.whl"))
    _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp_path
    )
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip()
    dev_paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "_dev_dependencies.pth").write_text("\n".join(dev_paths) + "\n", encoding="utf-8")

    quickstart = next(
        code for code in _PYTHON_BLOCK.findall((ROOT / "README.md").read_text()) if "create_agent" in code
    )
    script = tmp_path / "quickstart.py"
    script.write_text(
        f"""
import json, sys
import loop_governor, langchain_governor
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

model = ChatOpenAI(model="gpt-4o-mini", base_url=sys.argv[1], api_key="sk-test-wheel-0000")

@tool
def search(query: str) -> str:
    \"\"\"Search the docs.\"\"\"
    return "Keys are rotated yearly."

@tool
def fetch_page(url: str) -> str:
    \"\"\"Fetch a page.\"\"\"
    return "page " + url

exec(compile({quickstart!r}, "README.md LangChain quickstart", "exec"))
print(json.dumps({{"loop_governor": loop_governor.__file__, "langchain_governor": langchain_governor.__file__,
                  "version": loop_governor.__version__, "answer": result["messages"][-1].content}}))
""",
        encoding="utf-8",
    )
    with OpenAIServer([tool_reply("search", {"query": "docs"}), "The docs say: rotate keys yearly."]) as server:
        output = _run(python, script, server.url, cwd=tmp_path)
        requests = server.count()
    seen = json.loads(output.strip().splitlines()[-1])
    assert seen["loop_governor"].startswith(site), seen  # the wheel's package, not the checkout's
    assert seen["langchain_governor"].startswith(site), seen
    assert seen["version"] == loop_governor.__version__
    assert seen["answer"] == "The docs say: rotate keys yearly."
    assert requests == 2  # the tool call, then the answer

    # the console script is installed too
    assert "bench" in _run(venv / "bin" / "loop-governor", "--help", cwd=tmp_path)
