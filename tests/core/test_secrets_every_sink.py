"""Issue 17 must-show: every secret format planted in one run reaches no sink.

One governed run plants each format (the issue's new ones and the ones redacted before) as
tool arguments, tool results, exception messages, prompt messages and tool-call arguments
(JSON strings, and JSON inside JSON strings). Then every sink is read back as bytes: the
model text, the JSONL trace and its snapshot store, the OTel spans, the HTML report, the
file and SQLite checkpoints (through the public checkpoint API only), ``checkpoints show``
and the ``breakers`` CLI. Each secret is a random alphanumeric core, so finding it anywhere
means it leaked; a canary next to each secret proves the planted text did reach the sink.
"""

from __future__ import annotations

import json
import logging
import socket
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.testing import CliRunner

import loop_governor as lg
from loop_governor.checkpoint import SQLiteCheckpointStore, TaskCheckpoint
from loop_governor.cli import app
from loop_governor.trace import install, load_trace, render_report

runner = CliRunner()
CANARY = "canary-host.internal"

Planted = tuple[str, list[str]]  # (text carrying secrets, the secret cores in it)


def _formats(c: Callable[[int], str]) -> list[Planted]:
    """Each secret format, built around cores c(0), c(1)...; every text names the canary."""
    pw = f'{c(16)} {c(17)},{c(18)};{c(19)}"{c(20)}\\{c(21)}'
    return [
        # issue 17
        (f"dsn postgres://app:{c(0)}@{c(1)}/{c(2)}@{CANARY}:5432/app refused", [c(0), c(1), c(2)]),
        (
            f"GET https://{CANARY}/o?token={c(3)}&key={c(4)}&sig={c(5)}&X-Amz-Signature={c(6)}"
            f"&access_token={c(7)}&X-Goog-Signature={c(8)}&client_secret={c(9)} 403",
            [c(i) for i in range(3, 10)],
        ),
        (
            f"{CANARY} env: DB_PASSWORD={c(10)} PGPASSWORD={c(11)} OPENAI_API_KEY={c(12)} "
            f"MY_SECRET={c(13)} GITHUB_TOKEN={c(14)} STRIPE_API_KEY={c(15)}",
            [c(i) for i in range(10, 16)],
        ),
        (json.dumps({"host": CANARY, "password": pw}), [c(i) for i in range(16, 22)]),
        (json.dumps({"host": CANARY, "arguments": json.dumps({"password": pw})}), [c(i) for i in range(16, 22)]),
        (
            f"{CANARY} replied; Cookie: session={c(22)}; csrftoken={c(23)}\r\nSet-Cookie: sid={c(24)}; Path=/",
            [c(22), c(23), c(24)],
        ),
        (
            f"{CANARY} key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIE{c(25)}\n{c(26)}==\n-----END RSA PRIVATE KEY-----",
            [c(25), c(26)],
        ),
        # redacted before issue 17
        (
            f"{CANARY}: sk-proj-{c(27)} AKIA{c(28).upper()[:16]} ghp_{c(29)}{c(30)} api_key={c(31)} "
            f"Authorization: Bearer {c(32)} eyJ{c(33)}.eyJ{c(34)}.{c(35)} xoxb-{c(36)} hf_{c(37)}{c(37)} "
            f"AIza{c(38)}{c(38)}{c(38)} https://admin:{c(39)}@{CANARY}/db",
            [c(i) for i in range(27, 40)] + [c(28).upper()[:16]],
        ),
    ]


_CORES = st.lists(
    st.text(string.ascii_letters + string.digits, min_size=12, max_size=16).filter(
        lambda s: any(ch.isdigit() for ch in s) and any(ch.isalpha() for ch in s)
    ),
    min_size=40,
    max_size=40,
    unique_by=str.lower,
)


@pytest.fixture(autouse=True)
def _otel_sdk_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CrewAI tests set OTEL_SDK_DISABLED=true for the session; spans are a sink here."""
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)


class _Leak(Exception):
    """A tool failure whose message is the planted text (what HTTP clients do)."""


class _Events(logging.Handler):
    """The events a subscriber receives and the ``lg_event`` each log record carries."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append([record.getMessage(), getattr(record, "lg_event", None)])


def _run_governed(tmp: Path, planted: list[Planted], events: _Events) -> tuple[list[str], InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gov = lg.Governor(lg.GovernorConfig(checkpoint_url=f"file://{tmp / 'ck'}"), sleep=lambda s: None)
    lens = install(gov, tmp / "trace.jsonl", tracer_provider=provider)
    gov.subscribe(events.seen.append)  # a user's subscriber: a sink like the others
    model_texts: list[str] = []

    def fail(text: str, attempt: int) -> str:
        raise _Leak(text)

    with gov.task("t-secrets") as scope:
        for n, (text, _) in enumerate(planted):
            assert gov.call("echo", lambda text: text, text) == text
            try:
                gov.call("fetch", fail, text, attempt=n)
            except lg.AgentToolError as err:
                model_texts.append(err.info.to_model_text())
            scope.add_result({"summary": text, "password": text})
            args = json.dumps({"password": text, "note": text})
            gov.emit(
                "model_call",
                model="m",
                input_tokens=2000,
                messages=[
                    {"role": "user", "content": text},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {"id": f"c{n}", "type": "function", "function": {"name": "x", "arguments": args}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": f"c{n}", "content": text},
                ],
            )
    lens.close()
    provider.shutdown()
    return model_texts, exporter


def _partial_results(planted: list[Planted]) -> list[Any]:
    """What a stop hands back when no checkpoint store is configured (``add_result``
    values as given, and the latest tool results)."""
    gov = lg.Governor(lg.GovernorConfig(max_steps=len(planted)), sleep=lambda s: None)
    with pytest.raises(lg.FatalError) as stop, gov.task("t-partial") as scope:
        for text, _ in planted:
            scope.add_result({"summary": text, "password": text, "pair": (text, 1)})
            gov.call("echo", lambda text: text, text)
        gov.call("echo", lambda text: text, "one call over the budget")
    return stop.value.partial_results


def _spans_text(exporter: InMemorySpanExporter) -> str:
    parts: list[Any] = []
    for span in exporter.get_finished_spans():
        parts.append([span.name, dict(span.attributes or {}), span.status.description])
        parts.extend([e.name, dict(e.attributes or {})] for e in span.events)
    return json.dumps(parts, default=str)


def _files_text(root: Path) -> str:
    return "".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*")) if p.is_file())


def _context(text: str, secret: str) -> str:
    at = text.find(secret)
    return text[max(0, at - 60) : at + len(secret) + 20]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# No shrinking: a failure names the sink and shows the leaked text around the secret, and
# shrinking 40 cores through a whole governed run takes minutes.
@settings(
    max_examples=10,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(cores=_CORES)
def test_every_planted_secret_reaches_no_sink(tmp_path_factory: Any, cores: list[str]) -> None:
    tmp: Path = tmp_path_factory.mktemp("sinks")
    planted = _formats(lambda i: cores[i])
    secrets = sorted({s for _, found in planted for s in found})
    events = _Events()
    logger = logging.getLogger("loop_governor")
    logger.addHandler(events)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        model_texts, exporter = _run_governed(tmp, planted, events)
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
    partial = _partial_results(planted)

    # SQLite checkpoints, through the public API only, fed the raw texts.
    db = tmp / "ck.db"
    store = SQLiteCheckpointStore(db)
    cp = TaskCheckpoint(task_id="t-sqlite", metadata={"dsn": planted[0][0]})
    for n, (text, _) in enumerate(planted):
        cp.record_success(f"echo:{json.dumps([text])}", {"output": text, "n": n})
        cp.record_failure(
            f"fetch:{json.dumps([text, n])}",
            lg.GovernedError(error_type=lg.ErrorType.PERMANENT, tool="fetch", message=text),
        )
        cp.add_result(text)
    store.save(cp)
    store.close()

    trace = load_trace(tmp / "trace.jsonl")
    cli = {
        f"checkpoints show {kind} {fmt}": runner.invoke(
            app, ["checkpoints", "show", task, "--store", url, *flags], env={"COLUMNS": "400"}
        )
        for kind, task, url in (
            ("file", "t-secrets", f"file://{tmp / 'ck'}"),
            ("sqlite", "t-sqlite", f"sqlite:///{db}"),
        )
        for fmt, flags in (("table", []), ("json", ["--json"]))
    }
    breaker_url = f"redis://:{cores[0]}@{cores[1]}/{cores[2]}@127.0.0.1:{_closed_port()}/0"
    cli["breakers"] = runner.invoke(app, ["breakers", "--store", breaker_url])
    cli["breakers (unreachable redis)"] = runner.invoke(
        app, ["breakers", "--store", f"redis://:{cores[3]}@127.0.0.1:{_closed_port()}/0"]
    )
    sinks = {
        "model text": "\n".join(model_texts),
        "trace jsonl": (tmp / "trace.jsonl").read_text(encoding="utf-8"),
        "snapshot store": (tmp / "trace.snapshots.jsonl").read_text(encoding="utf-8"),
        "otel spans": _spans_text(exporter),
        "html report": render_report(trace),
        "file checkpoints": _files_text(tmp / "ck"),
        "subscriber events and log records": json.dumps(events.seen, default=str),
        "partial results (no checkpoint store)": json.dumps(partial, default=str),
        "sqlite checkpoints": "".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(tmp.glob("ck.db*"))),
        **{name: result.output for name, result in cli.items()},
    }
    leaks = {name: found for name, text in sinks.items() if (found := [s for s in secrets if s in text])}
    assert not leaks, {name: [_context(sinks[name], s) for s in found] for name, found in leaks.items()}
    assert {name: result.exit_code for name, result in cli.items()} == {
        **{name: 0 for name in cli if name.startswith("checkpoints")},
        "breakers": 2,  # the password holds "/": refused, without echoing it
        "breakers (unreachable redis)": 1,
    }
    # the planted texts did reach the sinks that keep them (not a vacuous pass)
    for name in (
        "model text",
        "trace jsonl",
        "snapshot store",
        "otel spans",
        "html report",
        "file checkpoints",
        "subscriber events and log records",
        "partial results (no checkpoint store)",
    ):
        assert CANARY in sinks[name], name
    assert "t-sqlite" in sinks["sqlite checkpoints"] and CANARY in sinks["checkpoints show sqlite json"]
    assert len(model_texts) == len(planted)
