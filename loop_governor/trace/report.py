"""One self-contained HTML page for a trace: charts, timeline, anomalies, every prompt.

Self-contained means no remote script, stylesheet or font: the page must open from a CI
artifact or an air-gapped laptop. The charts are inline SVG built here (a charting
library would mean shipping or linking its JavaScript; two small charts do not justify
it), hover text uses SVG ``<title>``, and prompts open with ``<details>``. The only
script is a few lines that open the prompt a chart bar links to.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from loop_governor.trace.reading import (
    FROM_CHECKPOINT,
    FROM_MEMORY,
    NOT_MADE,
    OUTCOMES,
    REFUSED_WITHDRAWN,
    call_outcome,
    model_read,
    task_names,
)
from loop_governor.trace.records import canonical_json
from loop_governor.trace.store import Trace, load_trace

_MAX_CONTENT_CHARS = 20_000
_CACHED, _UNCACHED, _OUTPUT = "#2e7d32", "#ef6c00", "#90a4ae"
_OK, _ERR, _RETRY, _PRUNE, _ANOMALY = "#43a047", "#e53935", "#fb8c00", "#1e88e5", "#c62828"
_BREAKER = {"open": "#e53935", "half_open": "#fb8c00", "closed": "#43a047"}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;
  background:#f6f7f9;color:#1d2330;font-size:14px}
header{background:#1d2330;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px} header .sub{color:#b8c0cc;font-size:12px;margin-top:4px}
main{padding:16px 24px;max-width:1400px}
section{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:12px 16px;margin:0 0 16px}
h2{font-size:16px;margin:0 0 8px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:0 0 16px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:8px 14px;min-width:110px}
.card .v{font-size:20px;font-weight:600} .card .k{font-size:12px;color:#5b6472}
.card.bad .v{color:#c62828}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eceff3;vertical-align:top}
th{background:#f0f2f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.kind{font-weight:600;color:#c62828}
details.call{border:1px solid #dde1e7;border-radius:6px;margin:6px 0;background:#fcfcfd}
details.call>summary{cursor:pointer;padding:6px 10px;font-variant-numeric:tabular-nums}
details.call[open]>summary{border-bottom:1px solid #dde1e7;background:#f0f4fa}
.badge{display:inline-block;background:#c62828;color:#fff;border-radius:9px;padding:0 7px;font-size:11px;
  margin-left:6px}
.badge.new{background:#1e88e5} .muted{color:#5b6472}
ol.prompt{margin:8px 0;padding-left:34px} ol.prompt li{margin:0 0 8px}
.role{font-weight:600;font-size:12px;text-transform:uppercase;color:#3949ab}
.role-tool .role{color:#6d4c41} .role-assistant .role{color:#2e7d32} .role-system .role{color:#6a1b9a}
.hash{font-family:ui-monospace,Menlo,Consolas,monospace;font-weight:400;color:#8a93a2;text-transform:none}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0 0;background:#f4f5f7;padding:6px 8px;
  border-radius:4px;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;max-height:420px;overflow:auto}
li.kept pre{background:#f4f5f7} li.fresh pre{background:#e8f1fd}
p.cols{font-size:12px;color:#5b6472;margin:6px 0 0} p.cols b{color:#1d2330;font-weight:600}
span.notmade{color:#6a1b9a;font-style:italic} span.made.failed{color:#c62828}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
"""

_NEW_BADGE = '<span class="badge new">new</span>'
_NO_CALLS = '<p class="muted">No model calls.</p>'

_JS = """
function openHash(){var id=decodeURIComponent(location.hash.slice(1));
 var d=id&&document.getElementById(id);
 if(d&&d.tagName==='DETAILS'){d.open=true;d.scrollIntoView({block:'start'});}}
window.addEventListener('hashchange',openHash);openHash();
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _fnum(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _short(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1000:
        return f"{n / 1000:.1f}k" if n < 10_000 else f"{n / 1000:.0f}k"
    return f"{n:.0f}"


def _axis(value: float) -> tuple[float, int]:
    """A round tick step and tick count covering ``value`` (about five ticks)."""
    if value <= 0:
        return 1.0, 1
    raw = value / 5
    exp = 10 ** math.floor(math.log10(raw))
    step = next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw)
    return step, max(1, math.ceil(value / step))


# -- charts ---------------------------------------------------------------------------
def _tokens_chart(calls: Sequence[dict[str, Any]], flagged: set[int], names: dict[Any, str]) -> str:
    """Stacked bars per model call: cached input, uncached input, output."""
    if not calls:
        return '<p class="muted">No model calls in this trace.</p>'
    width, height, left, right, top, bottom = 1100, 300, 56, 12, 24, 42
    plot_w, plot_h = width - left - right, height - top - bottom
    rows = []
    for call in calls:
        total_in = _num(call.get("input_tokens"))
        cached = min(_num(call.get("cache_read_tokens")), total_in) if total_in else _num(call.get("cache_read_tokens"))
        rows.append((cached, max(total_in - cached, 0), _num(call.get("output_tokens"))))
    step, ticks = _axis(max(sum(r) for r in rows))
    vmax = step * ticks
    slot = plot_w / len(rows)
    bar = max(min(slot * 0.72, 48), 1.5)
    out = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="tokens per turn">']
    for i in range(ticks + 1):
        v = step * i
        y = top + plot_h - plot_h * i / ticks
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6eb"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" fill="#5b6472">{_short(v)}</text>'
        )
    label_every = max(1, math.ceil(len(rows) / 25))
    prev_task: Any = object()
    for i, (call, (cached, uncached, output)) in enumerate(zip(calls, rows, strict=True)):
        x = left + slot * i + (slot - bar) / 2
        task = call.get("task_id")
        if task != prev_task and i > 0:
            sx = left + slot * i
            out.append(
                f'<line x1="{sx:.1f}" x2="{sx:.1f}" y1="{top - 14}" y2="{top + plot_h}" '
                'stroke="#9aa3b0" stroke-dasharray="3,3"/>'
            )
        if task != prev_task:
            label = str(names.get(task, task))
            label = label if len(label) <= 48 else label[:47] + "…"
            out.append(
                f'<text x="{left + slot * i + 3:.1f}" y="{top - 6}" font-size="11" fill="#5b6472">{_e(label)}</text>'
            )
        prev_task = task
        y = top + plot_h
        tip = (
            f"#{i + 1} {call.get('model') or ''} turn {call.get('turn', '?')}: input {cached + uncached} "
            f"(cached {cached}, uncached {uncached}), output {output}"
        )
        out.append(f'<a href="#call-{_e(call.get("seq"))}"><g><title>{_e(tip)}</title>')
        for value, color in ((cached, _CACHED), (uncached, _UNCACHED), (output, _OUTPUT)):
            if value <= 0:
                continue
            h = plot_h * value / vmax
            y -= h
            out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{color}"/>')
        out.append("</g></a>")
        if i in flagged:
            cx = x + bar / 2
            out.append(
                f'<path d="M{cx - 5:.1f},{y - 9:.1f} L{cx + 5:.1f},{y - 9:.1f} L{cx:.1f},{y - 2:.1f} Z" '
                f'fill="{_ANOMALY}"><title>anomaly flagged at this call</title></path>'
            )
        if i % label_every == 0:
            out.append(
                f'<text x="{x + bar / 2:.1f}" y="{top + plot_h + 15}" font-size="11" '
                f'text-anchor="middle" fill="#5b6472">{i + 1}</text>'
            )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" font-size="12" text-anchor="middle" '
        'fill="#5b6472">model call (click a bar for its prompt)</text>'
    )
    out.append("</svg>")
    legend = (
        f'<div class="legend"><span><i style="background:{_CACHED}"></i>cached input</span>'
        f'<span><i style="background:{_UNCACHED}"></i>uncached input</span>'
        f'<span><i style="background:{_OUTPUT}"></i>output</span>'
        f'<span><i style="background:{_ANOMALY}"></i>anomaly</span></div>'
    )
    return legend + "".join(out)


_MEMORY, _REFUSED, _STOP, _WITHDRAWN = "#8e24aa", "#d84315", "#b71c1c", "#b0bec5"
_TIMELINE_EVENTS = frozenset(
    {
        "tool_call",
        "model_call",
        "retry",
        "breaker",
        "pruning",
        "anomaly",
        "summary",
        "checkpoint",
        "loop_detected",
        "budget_exhausted",
        "tool_withdrawn",
        "tool_restored",
        "run_stopped",
    }
)


def _not_made_mark(outcome: str, x: float, y: float, tip: str) -> str:
    """A call the governor answered without making it: a hollow mark, never a bar."""
    cy = y + 12
    title = f"<title>{_e(tip)}</title>"
    if outcome in (FROM_MEMORY, FROM_CHECKPOINT):  # a hollow circle: the answer came from memory
        color = _MEMORY if outcome == FROM_MEMORY else _PRUNE
        return (
            f'<circle cx="{x:.1f}" cy="{cy:.1f}" r="6" fill="#fff" stroke="{color}" stroke-width="2.5">{title}</circle>'
        )
    if outcome == REFUSED_WITHDRAWN:  # an octagon: the call of a withdrawn tool stopped the run
        angles = [math.pi / 8 + i * math.pi / 4 for i in range(8)]
        pts = " ".join(f"{x + 8 * math.cos(a):.1f},{cy + 8 * math.sin(a):.1f}" for a in angles)
        return f'<polygon points="{pts}" fill="{_STOP}">{title}</polygon>'
    return (  # a crossed hollow square: refused (breaker open, rate limit)
        f'<g>{title}<rect x="{x - 6:.1f}" y="{cy - 6:.1f}" width="12" height="12" fill="#fff" '
        f'stroke="{_REFUSED}" stroke-width="2"/><path d="M{x - 4:.1f},{cy - 4:.1f} L{x + 4:.1f},{cy + 4:.1f} '
        f'M{x + 4:.1f},{cy - 4:.1f} L{x - 4:.1f},{cy + 4:.1f}" stroke="{_REFUSED}" stroke-width="2"/></g>'
    )


def _timeline(events: Sequence[dict[str, Any]], names: dict[Any, str]) -> str:
    """Rows per tool (plus model calls and governor events) on a shared time axis: calls
    made are bars, calls answered without being made are hollow marks, a withdrawal is a
    grey band on its tool's row until the tool is offered again, a stop a dark red line."""
    marks = [e for e in events if e.get("event") in _TIMELINE_EVENTS]
    if not marks:
        return '<p class="muted">No tool calls or governor events in this trace.</p>'

    def span_of(e: dict[str, Any]) -> tuple[float, float] | None:
        ts = _fnum(e.get("ts"))
        if ts is None:
            return None
        dur = _fnum(e.get("duration_s") if e.get("event") == "tool_call" else e.get("latency_s")) or 0.0
        return ts - max(dur, 0.0), ts

    spans = [span_of(e) for e in marks]
    use_time = all(s is not None for s in spans)
    if use_time:
        t0 = min(s[0] for s in spans if s is not None)
        t1 = max(s[1] for s in spans if s is not None)
        use_time = t1 > t0
    if not use_time:  # virtual or missing clock: lay events out in order instead
        spans = [(float(i), float(i) + 0.8) for i in range(len(marks))]
        t0, t1 = 0.0, float(len(marks))
    assert all(s is not None for s in spans)

    tools: list[str] = []
    for e in marks:
        name = str(e.get("tool"))
        if e.get("event") in {"tool_call", "retry", "tool_withdrawn"} and name not in tools:
            tools.append(name)
    rows = ["model", *tools, "governor"]
    width, left, right, top, row_h = 1100, 150, 16, 46, 26
    height = top + row_h * len(rows) + 30
    plot_w = width - left - right

    def px(t: float) -> float:
        return left + plot_w * (t - t0) / (t1 - t0)

    def row_y(name: str) -> float:
        return top + row_h * rows.index(name)

    out = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="tool-call timeline">']
    for name in rows:
        y = row_y(name)
        out.append(f'<rect x="{left}" y="{y:.1f}" width="{plot_w}" height="{row_h - 4}" fill="#f4f6f9"/>')
        out.append(
            f'<text x="{left - 8}" y="{y + 16:.1f}" font-size="12" text-anchor="end" fill="#1d2330">'
            f"{_e(name[:22])}</text>"
        )
    bottom = top + row_h * len(rows)
    # withdrawals first, under everything: from tool_withdrawn to tool_restored (or the end)
    open_since: dict[tuple[Any, str], tuple[float, dict[str, Any]]] = {}
    bands: list[tuple[str, float, float, dict[str, Any]]] = []
    for e, s in zip(marks, spans, strict=True):
        assert s is not None
        key = (e.get("task_id"), str(e.get("tool")))
        if e.get("event") == "tool_withdrawn":
            open_since.setdefault(key, (s[1], e))
        elif e.get("event") == "tool_restored" and key in open_since:
            start, what = open_since.pop(key)
            bands.append((key[1], start, s[1], what))
    # a withdrawal still open lasts until its task ends (or the trace does)
    ended = {e.get("task_id"): s[1] for e, s in zip(marks, spans, strict=True) if s is not None and e.get("task_id")}
    bands.extend((key[1], start, ended.get(key[0], t1), what) for key, (start, what) in open_since.items())
    for tool, start, stop, what in bands:
        y, x0 = row_y(tool), px(start)
        lasting = (
            "for the rest of the task" if what.get("for_s") is None else f"for {_fnum(what.get('for_s')) or 0:.0f}s"
        )
        tip = f"{tool} withdrawn from the model {lasting} ({what.get('code')}: {what.get('reason')})"
        out.append(
            f'<rect x="{x0:.1f}" y="{y + 2:.1f}" width="{max(px(stop) - x0, 4):.1f}" height="{row_h - 8}" '
            f'fill="{_WITHDRAWN}"><title>{_e(tip)}</title></rect>'
            f'<text x="{x0 + 4:.1f}" y="{y + 15:.1f}" font-size="10" fill="#424242">withdrawn</text>'
        )
    for i in range(6):
        t = t0 + (t1 - t0) * i / 5
        x = px(t)
        label = f"{t - t0:.2f}s" if use_time else f"#{int(t)}"
        anchor = "start" if i == 0 else "end" if i == 5 else "middle"
        out.append(
            f'<text x="{x:.1f}" y="{bottom + 14}" font-size="11" text-anchor="{anchor}" fill="#5b6472">{label}</text>'
        )
    stops = 0
    for e, s in zip(marks, spans, strict=True):
        assert s is not None
        kind = e.get("event")
        x0, x1 = px(s[0]), px(s[1])
        task = names.get(e.get("task_id"), e.get("task_id"))
        if kind == "tool_call" and call_outcome(e) in NOT_MADE:
            outcome = call_outcome(e)
            tip = f"{task}: {e.get('tool')} {OUTCOMES[outcome]}: {model_read(e)}"
            out.append(_not_made_mark(outcome, x1, row_y(str(e.get("tool"))), tip))
        elif kind in {"tool_call", "model_call"}:
            y = row_y("model" if kind == "model_call" else str(e.get("tool")))
            color = "#7986cb" if kind == "model_call" else (_ERR if e.get("status") == "error" else _OK)
            if kind == "model_call" and e.get("status") == "error":
                color = _ERR
            w = max(x1 - x0, 3.0)
            attempts = _num(e.get("attempts"))
            if kind == "tool_call":
                tip = (
                    f"{task}: {e.get('tool')}: {e.get('status')}"
                    + (f" ({e.get('error_type')}): {model_read(e)}" if e.get("status") == "error" else "")
                    + f", attempts {attempts or 1}, {_fnum(e.get('duration_s')) or 0:.3f}s"
                )
            elif e.get("status") == "error":
                tip = f"{task}: model call failed ({e.get('error_code') or e.get('error_type')}): {model_read(e)}"
            else:
                tip = (
                    f"{task}: model call turn {e.get('turn', '?')}: in {_num(e.get('input_tokens'))}, "
                    f"cached {_num(e.get('cache_read_tokens'))}"
                )
            body = (
                f'<rect x="{x0:.1f}" y="{y + 3:.1f}" width="{w:.1f}" height="{row_h - 10}" rx="2" '
                f'fill="{color}"><title>{_e(tip)}</title></rect>'
            )
            if kind == "model_call":
                body = f'<a href="#call-{_e(e.get("seq"))}">{body}</a>'
            out.append(body)
            if attempts > 1:
                out.append(
                    f'<text x="{x0 + w + 2:.1f}" y="{y + 15:.1f}" font-size="10" fill="{_RETRY}">×{attempts}</text>'
                )
        elif kind == "retry":
            y = row_y(str(e.get("tool")))
            tip = (
                f"retry {e.get('tool')} attempt {e.get('attempt')} after {e.get('delay_s')}s: "
                f"{e.get('message') or e.get('signature')}"
            )
            out.append(
                f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="{y + 1:.1f}" y2="{y + row_h - 5:.1f}" '
                f'stroke="{_RETRY}" stroke-width="2"><title>{_e(tip)}</title></line>'
            )
        elif kind == "run_stopped":
            tip = f"{task}: the run stopped: {e.get('reason')}"
            label_y = top - 8 - 12 * (stops % 2)  # two stops close together: labels one above the other
            stops += 1
            out.append(
                f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="{label_y + 4}" y2="{bottom:.1f}" stroke="{_STOP}" '
                f'stroke-width="3"><title>{_e(tip)}</title></line>'
                f'<text x="{x1 - 3:.1f}" y="{label_y}" font-size="11" text-anchor="end" fill="{_STOP}" '
                f'font-weight="600">stopped: {_e(e.get("code") or e.get("error_class"))}</text>'
            )
        elif kind == "breaker":
            color = _BREAKER.get(str(e.get("to_state")), "#757575")
            tip = f"breaker {e.get('tool')}: {e.get('from_state')} → {e.get('to_state')}"
            out.append(
                f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="{top - 4}" y2="{bottom:.1f}" stroke="{color}" '
                f'stroke-width="2" stroke-dasharray="5,3"><title>{_e(tip)}</title></line>'
            )
            out.append(
                f'<text x="{x1 + 3:.1f}" y="{top - 8}" font-size="10" fill="{color}">'
                f"{_e(e.get('tool'))} {_e(e.get('to_state'))}</text>"
            )
        elif kind == "pruning":
            y = row_y("governor")
            tip = (
                f"pruning: {e.get('tokens_before')} → {e.get('tokens_after')} tokens, "
                f"{e.get('messages_before')} → {e.get('messages_after')} messages"
            )
            out.append(
                f'<line x1="{x1:.1f}" x2="{x1:.1f}" y1="{top:.1f}" y2="{bottom:.1f}" stroke="{_PRUNE}" '
                f'stroke-width="1.5" opacity="0.6"><title>{_e(tip)}</title></line>'
            )
            out.append(
                f'<rect x="{x1 - 4:.1f}" y="{y + 6:.1f}" width="8" height="{row_h - 16}" '
                f'fill="{_PRUNE}"><title>{_e(tip)}</title></rect>'
            )
        elif kind in ("tool_withdrawn", "tool_restored"):
            continue  # drawn as the band above
        else:
            y = row_y("governor") + row_h / 2 - 2
            tip = f"{kind}: {e.get('kind', '')} {e.get('message', '')}"
            color = _ANOMALY if kind == "anomaly" else "#607d8b"
            out.append(
                f'<path d="M{x1:.1f},{y - 6:.1f} L{x1 + 6:.1f},{y:.1f} L{x1:.1f},{y + 6:.1f} '
                f'L{x1 - 6:.1f},{y:.1f} Z" fill="{color}"><title>{_e(tip)}</title></path>'
            )
    out.append("</svg>")
    hollow = "background:#fff;border:2px solid"
    legend = (
        f'<div class="legend"><span><i style="background:{_OK}"></i>tool called: ok</span>'
        f'<span><i style="background:{_ERR}"></i>tool called: failed</span>'
        f'<span><i style="background:{_RETRY}"></i>retry (×n = attempts)</span>'
        f'<span><i style="{hollow} {_MEMORY};border-radius:50%"></i>answered from memory, not called</span>'
        f'<span><i style="{hollow} {_REFUSED}"></i>refused, not called (breaker open, rate limit)</span>'
        f'<span><i style="background:{_WITHDRAWN}"></i>withdrawn from the model</span>'
        f'<span><i style="background:{_STOP}"></i>run stopped (a withdrawn tool called: octagon)</span>'
        f'<span><i style="background:#7986cb"></i>model call</span>'
        f'<span><i style="background:{_PRUNE}"></i>pruning</span>'
        f'<span><i style="background:{_BREAKER["open"]}"></i>breaker transition</span>'
        f'<span><i style="background:{_ANOMALY}"></i>anomaly</span>'
        '<span><i style="background:#607d8b"></i>other governor event (summary, checkpoint, ...)</span></div>'
    )
    return legend + "".join(out)


# -- prompts ----------------------------------------------------------------------------
def _content_text(message: Any) -> str:
    if not isinstance(message, dict):
        return canonical_json(message)
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
    elif content is not None:
        parts.append(canonical_json(content))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, dict):
            inner = call.get("function")
            fn: dict[str, Any] = inner if isinstance(inner, dict) else call
            args = fn.get("arguments", fn.get("args", ""))
            args_text = args if isinstance(args, str) else canonical_json(args)
            parts.append(f"→ {fn.get('name')}({args_text})  id={call.get('id')}")
    text = "\n".join(parts)
    if len(text) > _MAX_CONTENT_CHARS:
        text = text[:_MAX_CONTENT_CHARS] + f"\n… ({len(text) - _MAX_CONTENT_CHARS} more characters)"
    return text


def _prompt_html(trace: Trace, call: dict[str, Any], prev: list[str]) -> str:
    hashes = call.get("message_hashes")
    if not isinstance(hashes, list):
        return '<p class="muted">This model call recorded no messages.</p>'
    kept = _num(call.get("prefix_kept"))
    prev_set = set(prev)
    meta = (
        f'<p class="muted">{len(hashes)} messages; the first {kept} repeat the previous call of this task '
        f"unchanged (cacheable prefix)"
    )
    if prev and kept < len(prev):
        meta += f"; <b>message {kept + 1} of the previous prompt changed or was removed</b>"
    out = [meta + ".</p>", '<ol class="prompt">']
    for h in hashes:
        message = trace.snapshots.get(h)
        fresh = h not in prev_set
        if message is None:
            out.append(f'<li><span class="muted">message {_e(h)} missing from the snapshot store</span></li>')
            continue
        role = message.get("role", "?") if isinstance(message, dict) else "?"
        extra = ""
        if isinstance(message, dict):
            for key in ("name", "tool_call_id", "status"):
                if message.get(key):
                    extra += f" {key}={message.get(key)}"
        out.append(
            f'<li class="role-{_e(role)} {"fresh" if fresh else "kept"}"><div class="role">{_e(role)}'
            f'<span class="hash"> {_e(h[:10])}{_e(extra)}</span>'
            f"{_NEW_BADGE if fresh else ''}</div>"
            f"<pre>{_e(_content_text(message))}</pre></li>"
        )
    out.append("</ol>")
    return "".join(out)


# -- page -------------------------------------------------------------------------------
class _Html(str):
    """A table cell that is HTML already (escaped where it had to be)."""


Column = tuple[str, str]
"""A table column: its header and what it holds, explained on the page under the table."""


def _table(columns: Sequence[Column], rows: Iterable[Iterable[Any]], numeric: Collection[int] = ()) -> str:
    """A table, then a line explaining each of its columns: nothing on the page is a
    header the reader has to guess."""
    head = "".join(f"<th>{_e(name)}</th>" for name, _ in columns)
    body = []
    for row in rows:
        cells = "".join(
            ('<td class="num">' if i in numeric else "<td>") + f"{v if isinstance(v, _Html) else _e(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    explained = "; ".join(f"<b>{_e(name)}</b>: {_e(why)}" for name, why in columns)
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        f'<p class="cols">Columns — {explained}.</p>'
    )


def skipped_note(trace: Trace) -> str:
    """What the reader skipped: damaged or type-confused lines of the trace and of its store."""
    parts = []
    if trace.skipped_lines:
        parts.append(f"{trace.skipped_lines} unreadable trace line(s) skipped")
    if trace.skipped_snapshot_lines:
        parts.append(f"{trace.skipped_snapshot_lines} unreadable snapshot line(s) skipped")
    return ", ".join(parts)


def runs_apart(trace: Trace) -> Trace:
    """``trace`` with each run of a task under a task id of its own.

    Runs appended to one trace file (a script run twice, two processes) may reuse a task
    id; merged, their turns read 1,2,3,1,2. A run is a Lens's ``run_id`` (one per trace
    open) and, within it, one ``task_start`` to the next for the same task id (older
    traces without run ids split on ``task_start`` alone). A task id with one run is
    left as it is; otherwise each run reads ``"<task id> · run <n>"`` (and its name
    ``"<name> · run <n>"``)."""
    current: dict[tuple[Any, Any], int] = {}  # (run_id, task_id) -> its run number
    runs: dict[Any, int] = {}  # task_id -> how many runs it has
    numbered: list[int | None] = []
    for e in trace.events:
        task = e.get("task_id")
        if task is None:
            numbered.append(None)
            continue
        key = (e.get("run_id"), task)
        if key not in current or e.get("event") == "task_start":
            runs[task] = current[key] = runs.get(task, 0) + 1
        numbered.append(current[key])
    if all(n <= 1 for n in runs.values()):
        return trace
    events = []
    for e, n in zip(trace.events, numbered, strict=True):
        task = e.get("task_id")
        if n is None or runs[task] <= 1:
            events.append(e)
            continue
        apart = {**e, "task_id": f"{task} · run {n}"}
        if isinstance(e.get("name"), str) and e.get("event") == "task_start":
            apart["name"] = f"{e['name']} · run {n}"
        events.append(apart)
    return dataclasses.replace(trace, events=events)


_ENDED_COLUMNS: tuple[Column, ...] = (
    (
        "task",
        "the task's name: the name given to governor.task, the LangGraph thread id, the run's first "
        "request, or the crew's task description",
    ),
    (
        "outcome",
        "completed, stopped (the governor or a fatal failure ended it), failed (another exception "
        "left the task), or unfinished (the trace ends before the task did)",
    ),
    ("why", "for a task that did not complete: the error class, its code in brackets, and the reason"),
    ("steps", "the task's model decisions (steps) counted by the governor"),
    ("tool calls", "the tool calls counted against the task's budgets (a call answered from memory is not)"),
)


def _how_tasks_ended(events: Sequence[dict[str, Any]], tasks: Sequence[Any], names: dict[Any, str]) -> tuple[str, int]:
    """The first-screen table: how each task ended and why (``task_end``'s outcome, or
    ``run_stopped`` for a stop outside a task); and how many did not complete."""
    ends = {e.get("task_id"): e for e in events if e.get("event") == "task_end"}
    stops: dict[Any, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "run_stopped":
            stops.setdefault(e.get("task_id"), e)
    rows = []
    bad = 0
    for task in tasks:
        end = ends.get(task)
        stop = stops.get(task)
        if end is not None and end.get("outcome"):
            outcome = str(end.get("outcome"))
            why_from: dict[str, Any] | None = end if outcome != "completed" else None
        elif end is not None:
            outcome, why_from = ("stopped", stop) if stop is not None else ("ended", None)
        else:
            outcome, why_from = ("stopped" if stop is not None else "unfinished (no task_end)"), stop
        if outcome != "completed":
            bad += 1
        why = ""
        if why_from is not None:
            code = why_from.get("code")
            why = f"{why_from.get('error_class') or ''}{f' [{code}]' if code else ''}: {why_from.get('reason') or ''}"
        steps, calls = (end.get("steps", ""), end.get("tool_calls", "")) if end else ("", "")
        rows.append((names.get(task, task), outcome, why, steps, calls))
    outside = stops.get(None)
    if outside is not None:
        bad += 1
        rows.append(("(no task)", "stopped", f"{outside.get('error_class')}: {outside.get('reason')}", "", ""))
    if not rows:
        return '<p class="muted">No tasks.</p>', 0
    return _table(_ENDED_COLUMNS, rows, {3, 4}), bad


_FAILED_MODEL_COLUMNS: tuple[Column, ...] = (
    ("task", "the task's name"),
    ("model", "the model (or endpoint) that failed"),
    ("HTTP", "the HTTP status the provider answered, if any"),
    ("code", "the provider's error code (insufficient_quota, rate_limit_exceeded...), or the governor's"),
    ("type", "transient (retried), permanent or fatal (the run stops)"),
    ("ended by", "why the governor stopped retrying: attempts spent, a wait too long, the breaker, a budget"),
    ("attempts", "requests sent for this call"),
    ("the provider said", "the error message, redacted"),
)


def _failed_model_calls(calls: Sequence[dict[str, Any]], names: dict[Any, str]) -> str:
    failed = [c for c in calls if c.get("status") == "error"]
    if not failed:
        return '<p class="muted">No failed model calls.</p>'
    rows = [
        (
            names.get(c.get("task_id"), c.get("task_id")),
            c.get("model") or c.get("endpoint"),
            c.get("http_status") or "",
            c.get("error_code") or "",
            c.get("error_type") or "",
            c.get("stop_reason") or "",
            _num(c.get("attempts")),
            model_read(c),
        )
        for c in failed
    ]
    return _table(_FAILED_MODEL_COLUMNS, rows, {6})


_ANOMALY_COLUMNS: tuple[Column, ...] = (
    ("task", "the task's name"),
    ("turn", "the task's model call the anomaly was found at (1 = its first)"),
    ("kind", "the detector: cache_read_zero, repeated_error, context_growth, low_context_health..."),
    ("what", "what the detector saw"),
)

_TOOL_COLUMNS: tuple[Column, ...] = (
    ("task", "the task's name"),
    ("tool", "the tool the model asked for"),
    (
        "what happened",
        "whether the tool was called (ok or failed) or the governor answered without calling it: "
        "from memory, from the checkpoint, or refused",
    ),
    ("attempts", "times the tool was actually called for this request (retries included; 0: not called)"),
    ("duration s", "seconds from the request to its outcome, waits and retries included"),
    (
        "the model read",
        "for a failure: the tool's own message, then the governor's advice, as the model read them; for the "
        "call that stopped the run: why it stopped (hover for the error signature that groups failures alike)",
    ),
)


def _read(event: dict[str, Any]) -> str:
    """What the model read of a failed call; a stop's reason alone (no advice reaches a
    model whose run ended)."""
    if event.get("error_type") == "fatal" and event.get("message"):
        return str(event["message"])
    return model_read(event)


def _tool_calls(tools: Sequence[dict[str, Any]], names: dict[Any, str]) -> str:
    if not tools:
        return '<p class="muted">No tool calls.</p>'
    rows = []
    for t in tools:
        outcome = call_outcome(t)
        made = outcome not in NOT_MADE
        label = OUTCOMES[outcome]
        rows.append(
            (
                names.get(t.get("task_id"), t.get("task_id")),
                t.get("tool"),
                _Html(f'<span class="{"made" if made else "notmade"} {outcome}">{_e(label)}</span>'),
                _num(t.get("attempts")) if not made else (_num(t.get("attempts")) or 1),
                f"{_fnum(t.get('duration_s')) or 0:.3f}",
                _Html(f'<span title="signature: {_e(t.get("signature") or "")}">{_e(_read(t))}</span>')
                if t.get("status") == "error"
                else "",
            )
        )
    return _table(_TOOL_COLUMNS, rows, {3, 4})


def _call_summary(i: int, call: dict[str, Any], names: dict[Any, str], flags: str) -> str:
    """One model call's line above its prompt. A failed call says so: the context health
    of a prompt that got no answer is no figure of the call."""
    task = names.get(call.get("task_id"), call.get("task_id"))
    head = f"#{i + 1} · {_e(task)} · turn {_e(call.get('turn', '?'))} · {_e(call.get('model') or 'model')}"
    if call.get("status") == "error":
        code = call.get("error_code") or call.get("http_status") or call.get("error_type") or "error"
        return f'{head} · <span class="kind">failed ({_e(code)})</span>: {_e(model_read(call))}{flags}'
    health = _fnum(call.get("context_health"))
    return (
        f"{head} · in {_num(call.get('input_tokens')):,} (cached {_num(call.get('cache_read_tokens')):,}) · "
        f"out {_num(call.get('output_tokens')):,}"
        + (f" · {_e(call.get('finish_reason'))}" if call.get("finish_reason") else "")
        + (f" · context health {health:.0%}" if health is not None else "")
        + flags
    )


_CARDS_NOTE = (
    "tool calls made: requests that reached a tool; answered from memory: repeats of a failed call the governor "
    "answered without calling the tool; refused: calls not made (breaker open, rate limit, a withdrawn tool); "
    "withdrawals: times a tool was taken out of the model's tool list; cached share: input tokens read from the "
    "provider's prompt cache"
)


def render_report(trace: Trace, title: str | None = None) -> str:
    """The HTML text of the report for ``trace``: first how each task ended and why,
    and the failed model calls; then tokens, the timeline, anomalies and every prompt."""
    trace = runs_apart(trace)
    events = trace.events
    names = task_names(events)
    calls = trace.model_calls
    tools = trace.tool_calls
    anomalies = trace.anomalies
    retries = trace.of("retry")
    trips = [e for e in trace.of("breaker") if e.get("to_state") == "open"]
    prunes = trace.of("pruning")
    withdrawals = trace.of("tool_withdrawn")
    tasks = list(dict.fromkeys(e.get("task_id") for e in events if e.get("task_id") is not None))

    total_in = sum(_num(c.get("input_tokens")) for c in calls)
    total_cached = sum(_num(c.get("cache_read_tokens")) for c in calls)
    total_out = sum(_num(c.get("output_tokens")) for c in calls)
    outcomes = [call_outcome(t) for t in tools]
    made = sum(1 for o in outcomes if o not in NOT_MADE)
    errors = outcomes.count("failed")
    from_memory = sum(1 for o in outcomes if o in (FROM_MEMORY, FROM_CHECKPOINT))
    refused = sum(1 for o in outcomes if o in NOT_MADE) - from_memory

    # Which model calls (by index) carry an anomaly: match on task and turn.
    index = {(c.get("task_id"), c.get("turn")): i for i, c in enumerate(calls)}
    flagged = {
        index[(a.get("task_id"), a.get("turn"))] for a in anomalies if (a.get("task_id"), a.get("turn")) in index
    }
    badges: dict[int, list[str]] = {}
    for a in anomalies:
        key = (a.get("task_id"), a.get("turn"))
        if key in index:
            badges.setdefault(index[key], []).append(str(a.get("kind")))

    def card(label: str, value: Any, bad: bool = False) -> str:
        cls = "card bad" if bad else "card"
        return f'<div class="{cls}"><div class="v">{_e(value)}</div><div class="k">{_e(label)}</div></div>'

    cached_share = f"{total_cached / total_in:.0%}" if total_in else "–"
    ended_html, not_completed = _how_tasks_ended(events, tasks, names)
    failed_calls = sum(1 for c in calls if c.get("status") == "error")
    stopped = any(o == REFUSED_WITHDRAWN for o in outcomes)
    cards = "".join(
        [
            card("tasks", len(tasks)),
            card("not completed", not_completed, bad=not_completed > 0),
            card("failed model calls", failed_calls, bad=failed_calls > 0),
            card("model calls", len(calls)),
            card("input tokens", f"{total_in:,}"),
            card("cached share", cached_share, bad=bool(total_in) and total_cached == 0 and len(calls) > 1),
            card("output tokens", f"{total_out:,}"),
            card("tool calls made", made),
            card("tool errors", errors, bad=errors > 0),
            card("retries", len(retries)),
            card("answered from memory", from_memory),
            card("refused", refused, bad=stopped),
            card("withdrawals", len(withdrawals), bad=bool(withdrawals)),
            card("breaker trips", len(trips), bad=bool(trips)),
            card("prunings", len(prunes)),
            card("anomalies", len(anomalies), bad=bool(anomalies)),
        ]
    )

    anomaly_html = (
        _table(
            _ANOMALY_COLUMNS,
            [
                (names.get(a.get("task_id"), a.get("task_id")), a.get("turn", ""), a.get("kind"), a.get("message", ""))
                for a in anomalies
            ],
        )
        if anomalies
        else '<p class="muted">No anomalies flagged.</p>'
    )

    prompt_parts: list[str] = []
    prev_by_task: dict[Any, list[str]] = {}
    for i, call in enumerate(calls):
        task = call.get("task_id")
        prev = prev_by_task.get(task, [])
        hashes = call.get("message_hashes")
        prev_by_task[task] = hashes if isinstance(hashes, list) else []
        flags = "".join(f'<span class="badge">{_e(k)}</span>' for k in badges.get(i, []))
        prompt_parts.append(
            f'<details class="call" id="call-{_e(call.get("seq"))}"><summary>{_call_summary(i, call, names, flags)}'
            f"</summary>{_prompt_html(trace, call, prev)}</details>"
        )

    name = title or f"Agent Lens — {trace.path.name}"
    skipped = f" · {skipped_note(trace)}" if trace.skipped_lines or trace.skipped_snapshot_lines else ""
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(name)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{_CSS}</style></head><body>"
        f'<header><h1>{_e(name)}</h1><div class="sub">{len(events)} events · '
        f"{len(trace.snapshots)} distinct messages{_e(skipped)}</div></header><main>"
        f'<div class="cards">{cards}</div><p class="cols">{_e(_CARDS_NOTE)}.</p>'
        f"<section><h2>How each task ended</h2>{ended_html}</section>"
        f"<section><h2>Failed model calls</h2>{_failed_model_calls(calls, names)}</section>"
        f"<section><h2>Tokens per turn</h2>{_tokens_chart(calls, flagged, names)}</section>"
        f"<section><h2>Tool-call timeline</h2>{_timeline(events, names)}</section>"
        f"<section><h2>Anomalies</h2>{anomaly_html}</section>"
        f"<section><h2>Model calls and the prompt each one saw</h2>"
        f"{''.join(prompt_parts) or _NO_CALLS}</section>"
        f"<section><h2>Tool calls</h2>{_tool_calls(tools, names)}</section>"
        f"</main><script>{_JS}</script></body></html>\n"
    )


def write_report(trace_path: str | Path, out_path: str | Path) -> Path:
    """Load the trace at ``trace_path`` and write its report to ``out_path``."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(load_trace(trace_path)), encoding="utf-8")
    return out
