"""Agent Lens: what the model saw at each decision, as a JSONL trace, OTel spans and a report.

``install(governor, path)`` subscribes a [`Lens`][loop_governor.trace.lens.Lens] to the governor's event bus. Model
calls are stored with the hashes of the messages the model saw (each distinct message
once, in a snapshot store beside the trace), so [`rebuild_prompt`][loop_governor.trace.store.rebuild_prompt] gives back
any turn's exact prompt; detectors flag cache misses, repeated errors, context growth and low
context health as ``"anomaly"`` events; ``loop-governor report`` renders one HTML page.
"""

from __future__ import annotations

from loop_governor.trace.budget import TraceBudget
from loop_governor.trace.detectors import DetectorConfig, context_health
from loop_governor.trace.lens import Lens, install
from loop_governor.trace.report import render_report, write_report
from loop_governor.trace.store import Trace, load_trace, rebuild_prompt, snapshot_path_for

__all__ = [
    "DetectorConfig",
    "Lens",
    "Trace",
    "TraceBudget",
    "context_health",
    "install",
    "load_trace",
    "rebuild_prompt",
    "render_report",
    "snapshot_path_for",
    "write_report",
]
