"""Model endpoints: secrets in names and echoed keys, fallbacks on a refused key (issue 27,
items 6 and 7).

Real ChatOpenAI (directly through ``governor.call_model``, and in ``create_agent`` +
``GovernorMiddleware``) and a real crewAI ``LLM`` against local OpenAI-compatible servers.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_openai import ChatOpenAI
from lg_openai_server import Fault, OpenAIServer, insufficient_quota, invalid_api_key
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.testing import CliRunner

import loop_governor as lg
from langchain_governor import GovernorMiddleware
from loop_governor.cli import app
from loop_governor.trace import install, load_trace, render_report

MODEL, FALLBACK = "gpt-4o-mini", "gpt-4o"
KEY = "sk-test-0000abcd"
FATAL = {"401": invalid_api_key, "insufficient_quota": insufficient_quota}


@pytest.fixture
def second_server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _otel_sdk_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)


def chat(server: OpenAIServer, model: str = MODEL, key: str = KEY) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=server.url, api_key=key)


# ------------------------------------------------------------------ item 6: fallbacks


@pytest.mark.parametrize("fault", FATAL.values(), ids=FATAL.keys())
def test_langchain_a_refused_key_moves_to_the_fallback_on_another_server(
    openai_server: OpenAIServer, second_server: OpenAIServer, fault: Any
) -> None:
    gov = lg.Governor()
    openai_server.fail_forever(fault())
    second_server.set_script(["from the fallback"])
    agent = create_agent(
        chat(openai_server), [], middleware=[GovernorMiddleware(gov, fallback_models=[chat(second_server, FALLBACK)])]
    )
    state = agent.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t"}})
    assert state["messages"][-1].content == "from the fallback"
    assert openai_server.count() == 1 and second_server.count() == 1


@pytest.mark.parametrize("fault", FATAL.values(), ids=FATAL.keys())
def test_crewai_a_refused_key_moves_to_the_fallback_on_another_server(
    openai_server: OpenAIServer, second_server: OpenAIServer, fault: Any
) -> None:
    import crewai

    from crewai_governor.llm import govern_llm

    gov = lg.Governor()
    openai_server.fail_forever(fault())
    second_server.set_script(["from the fallback"])
    primary = crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY)
    fallback = crewai.LLM(model=f"openai/{FALLBACK}", base_url=second_server.url, api_key=KEY)
    assert govern_llm(primary, gov, fallbacks=[fallback]).call("hi") == "from the fallback"
    assert openai_server.count() == 1 and second_server.count() == 1


def test_with_every_fallback_refused_the_run_stops_fatal(
    openai_server: OpenAIServer, second_server: OpenAIServer
) -> None:
    gov = lg.Governor()
    openai_server.fail_forever(invalid_api_key())
    second_server.fail_forever(insufficient_quota())
    primary = ChatOpenAI(model=MODEL, base_url=openai_server.url, api_key=KEY, max_retries=0)
    fallback = ChatOpenAI(model=FALLBACK, base_url=second_server.url, api_key=KEY, max_retries=0)
    with pytest.raises(lg.FatalError) as stop:
        gov.call_model("openai:a", primary.invoke, "hi", fallbacks=[("openai:b", fallback.invoke)])
    assert stop.value.info.code == "insufficient_quota"  # the last endpoint's own error
    assert openai_server.count() == 1 and second_server.count() == 1


def test_a_budget_stop_is_the_tasks_own_and_does_not_fall_back(
    openai_server: OpenAIServer, second_server: OpenAIServer
) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_model_calls=1))
    primary, fallback = chat(openai_server), chat(second_server, FALLBACK)
    with gov.task("t"):
        gov.call_model("openai:a", primary.invoke, "hi", fallbacks=[("openai:b", fallback.invoke)])
        with pytest.raises(lg.BudgetExhaustedError):
            gov.call_model("openai:a", primary.invoke, "hi", fallbacks=[("openai:b", fallback.invoke)])
    assert second_server.count() == 0


@pytest.mark.parametrize(
    ("model", "fallbacks"),
    [
        ("openai:a", ["openai:a"]),
        ("openai:a", ["openai:b", "openai:b"]),
        ("https://u:pw@llm.example/v1", ["https://u:pw@llm.example/v1"]),
    ],
)
def test_a_fallback_naming_the_models_own_endpoint_is_refused(
    openai_server: OpenAIServer, model: str, fallbacks: list[str]
) -> None:
    gov = lg.Governor()
    primary = chat(openai_server)
    with pytest.raises(ValueError, match="fallbacks") as refused:
        gov.call_model(model, primary.invoke, "hi", fallbacks=[(f, primary.invoke) for f in fallbacks])
    assert "pw" not in str(refused.value)
    assert openai_server.count() == 0  # refused before any request


def test_crewai_a_fallback_on_the_same_endpoint_is_refused(openai_server: OpenAIServer) -> None:
    import crewai

    from crewai_governor.llm import govern_llm

    gov = lg.Governor()
    primary = crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY)
    same = crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY)
    with pytest.raises(ValueError, match="fallbacks"):
        govern_llm(primary, gov, fallbacks=[same])  # refused when configured
    assert openai_server.count() == 0


def test_langchain_a_fallback_named_twice_is_refused_when_configured(openai_server: OpenAIServer) -> None:
    with pytest.raises(ValueError, match="fallback_models"):
        GovernorMiddleware(
            lg.Governor(), fallback_models=[chat(openai_server, FALLBACK), chat(openai_server, FALLBACK)]
        )


# ------------------------------------------------------------------ item 7: redaction

ALNUM = string.ascii_letters + string.digits
runner = CliRunner()


def _echoing_key(key: str) -> Fault:
    """401 whose message quotes the whole key back (some gateways and providers do)."""
    message = f"Incorrect API key provided: {key}. You can find your API key in your account."
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    return Fault("echoed_key", 401, body)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=st.text(ALNUM, min_size=12, max_size=24), key_core=st.text(ALNUM, min_size=40, max_size=60))
def test_an_endpoint_password_and_an_echoed_key_reach_no_sink(
    openai_server: OpenAIServer, tmp_path_factory: Any, password: str, key_core: str
) -> None:
    tmp: Path = tmp_path_factory.mktemp("endpoint")
    key = f"sk-proj-{key_core}"
    openai_server.clear_faults()
    openai_server.fail_forever(_echoing_key(key))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store_url = f"sqlite:///{tmp / 'state.db'}"
    gov = lg.Governor(lg.GovernorConfig(store_url=store_url), sleep=lambda s: None)
    lens = install(gov, tmp / "trace.jsonl", tracer_provider=provider)
    endpoint = f"http://agent:{password}@127.0.0.1:{openai_server.port}/v1"
    model = chat(openai_server, key=key)
    errors: list[str] = []
    with gov.task("t"):
        with pytest.raises(lg.FatalError) as direct:
            gov.call_model(endpoint, model.invoke, "hi")
        errors += [str(direct.value), repr(direct.value)]
    agent = create_agent(model, [], middleware=[GovernorMiddleware(gov)])
    with pytest.raises(lg.FatalError) as through_agent:
        agent.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "a"}})
    errors += [str(through_agent.value), repr(through_agent.value), str(through_agent.value.args)]
    errors.append(json.dumps(getattr(through_agent.value, "body", None)))
    lens.close()
    provider.shutdown()
    spans = json.dumps(
        [[s.name, dict(s.attributes or {}), s.status.description] for s in exporter.get_finished_spans()], default=str
    )
    sinks = {
        "errors": "\n".join(errors),
        "trace": (tmp / "trace.jsonl").read_text(),
        "report": render_report(load_trace(tmp / "trace.jsonl")),
        "spans": spans,
        "breakers": runner.invoke(app, ["breakers", "--store", store_url], env={"COLUMNS": "400"}).output,
    }
    leaks = {name: [s for s in (password, key_core) if s in text] for name, text in sinks.items()}
    assert not any(leaks.values()), leaks
    assert "127.0.0.1" in sinks["trace"] and "127.0.0.1" in sinks["breakers"]  # the endpoint is there, masked


def test_a_bare_token_argument_is_masked_in_the_snapshot_store_and_report(tmp_path: Path) -> None:
    token, cursor = secrets.token_hex(16), secrets.token_hex(8)
    gov = lg.Governor()
    lens = install(gov, tmp_path / "trace.jsonl")
    calls = [
        ("login", {"user": "ann", "password": "pw", "token": token}),
        ("list_pages", {"next_token": cursor, "page_token": cursor, "cursor": cursor}),
    ]
    with gov.task("t"):
        for n, (name, args) in enumerate(calls):
            call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            gov.emit(
                "model_call",
                model="m",
                input_tokens=2000,  # large enough for the snapshot store to keep the prompt
                messages=[
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                ],
            )
    lens.close()
    snapshots = (tmp_path / "trace.snapshots.jsonl").read_text()
    report = render_report(load_trace(tmp_path / "trace.jsonl"))
    assert token not in snapshots and token not in report
    assert cursor in snapshots  # cursors stay: a resumed call must see the same page
