"""OTLP/HTTP export through the standard exporter, received by a local collector stand-in."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import loop_governor as lg
from loop_governor.trace import install


class _Collector(BaseHTTPRequestHandler):
    """Decodes OTLP/HTTP protobuf bodies like a collector would."""

    requests: list[ExportTraceServiceRequest]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert self.path == "/v1/traces"
        assert self.headers["Content-Type"] == "application/x-protobuf"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).requests.append(request)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    handler = type("Collector", (_Collector,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", handler.requests
    finally:
        server.shutdown()
        server.server_close()


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = (
            list(v.string_value for v in value.array_value.values) if kind == "array_value" else getattr(value, kind)
        )
    return out


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_arrive_at_an_otlp_http_collector_with_semconv_attributes(
    governor: lg.Governor,
    collector: tuple[str, list[ExportTraceServiceRequest]],
    conversation: Any,
    emit_model_call: Any,
    compression: Compression,
) -> None:
    endpoint, received = collector
    provider = TracerProvider(resource=Resource.create({"service.name": "docs-agent"}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=10, compression=compression))
    )
    lens = install(governor, None, tracer_provider=provider)

    def flaky_search(q: str, failures: list[int] = [1]) -> str:  # noqa: B006 - one failure, then ok
        if failures:
            failures.pop()
            raise TimeoutError("upstream timed out")
        return "found"

    with governor.task("t1"):
        emit_model_call(governor, conversation(1)[0], cache_read=0, input_tokens=1200)
        governor.call("search_docs", flaky_search, "rotate")
    lens.close()
    assert provider.force_flush(10_000)
    provider.shutdown()

    spans = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"invoke_agent t1", "chat scripted-model", "execute_tool search_docs"}
    service = {
        kv.key: kv.value.string_value for r in received for rs in r.resource_spans for kv in rs.resource.attributes
    }
    assert service["service.name"] == "docs-agent"

    chat = _attrs(by_name["chat scripted-model"])
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.request.model"] == "scripted-model"
    assert chat["gen_ai.usage.input_tokens"] == 1200
    assert chat["gen_ai.usage.cache_read.input_tokens"] == 0
    assert chat["gen_ai.response.finish_reasons"] == ["tool_calls"]
    tool_span = by_name["execute_tool search_docs"]
    tool = _attrs(tool_span)
    assert tool["gen_ai.tool.name"] == "search_docs"
    assert tool["loop_governor.tool.attempts"] == 2
    assert [e.name for e in tool_span.events] == ["loop_governor.retry"]
    task = by_name["invoke_agent t1"]
    assert tool_span.parent_span_id == task.span_id
    assert tool_span.trace_id == task.trace_id
