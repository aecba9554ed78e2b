"""The core's import layers hold (pyproject.toml's [tool.importlinter] contracts, drawn in
docs/architecture.md): no module imports one from a layer above it, no package has an
import cycle, the core imports no adapter, the adapters import only `loop_governor` and
`loop_governor.adapter`, and every module of the core has its layer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_adapters_contract_forbids_every_core_module_but_the_adapter_interface() -> None:
    """A new top-level module of the core is forbidden to the adapters until it is listed."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (adapters,) = [c for c in contracts if c["id"] == "adapters-one-interface"]
    core = ROOT / "loop_governor"
    modules = {p.stem for p in core.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in core.glob("*/__init__.py")}
    assert set(adapters["forbidden_modules"]) == {f"loop_governor.{m}" for m in modules - {"adapter"}}
    assert set(adapters["source_modules"]) == {"langchain_governor", "crewai_governor", "pydantic_ai_governor"}
