"""User-facing paths no test ran before (issue 27, item 11): provider usage shapes, call
keys of structured arguments, GovernorCallbackHandler's text-model and error paths (and
what it redacts), ``install(govern_llms=False)`` and ``loop-governor demo``."""

from __future__ import annotations

import dataclasses
from typing import Any

import anthropic.types
import openai.types.chat
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from langchain_core.language_models.fake import FakeListLLM
from pydantic import BaseModel
from typer.testing import CliRunner

import loop_governor as lg
from langchain_governor import GovernorCallbackHandler
from loop_governor.cli import app
from loop_governor.keys import call_key
from loop_governor.usage import Usage, usage_of

# ------------------------------------------------------------------ usage shapes


def test_anthropic_usage_counts_cache_reads_and_writes_in_the_input() -> None:
    message = anthropic.types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4",
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 12,  # Anthropic's input excludes the cached tokens
                "output_tokens": 5,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 200,
            },
        }
    )
    assert usage_of(message) == Usage(1212, 5, 1000, 200)


def test_deepseek_usage_reads_its_top_level_cache_hits() -> None:
    completion = openai.types.chat.ChatCompletion.model_validate(
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 1,
            "model": "deepseek-chat",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
            "usage": {
                "prompt_tokens": 1500,
                "completion_tokens": 20,
                "total_tokens": 1520,
                "prompt_cache_hit_tokens": 1280,
                "prompt_cache_miss_tokens": 220,
            },
        }
    )
    assert usage_of(completion) == Usage(1500, 20, 1280, 0)


# ------------------------------------------------------------------ call keys


class Query(BaseModel):
    table: str
    limit: int


@dataclasses.dataclass
class Point:
    x: float
    y: float


@given(st.text(max_size=20), st.integers(0, 10**6), st.text(max_size=20), st.integers(0, 10**6))
def test_call_keys_of_pydantic_models_follow_their_values(t1: str, n1: int, t2: str, n2: int) -> None:
    same = call_key("q", (Query(table=t1, limit=n1),)) == call_key("q", (Query(table=t2, limit=n2),))
    assert same == ((t1, n1) == (t2, n2))


_FLOATS = st.floats(allow_nan=False)
# the second point's coordinates: often the first's (or its negative: -0.0 for 0.0), so
# equal points are drawn in every run instead of by chance
_LIKE = st.sampled_from(["same", "negated", "other"])


def _like(first: float, how: str, other: float) -> float:
    return first if how == "same" else -first if how == "negated" else other


@given(_FLOATS, _FLOATS, _LIKE, _LIKE, _FLOATS, _FLOATS)
@example(0.0, 1.0, "negated", "same", 0.0, 0.0)  # 0.0 and -0.0: equal values, one key
@example(1.5, -2.0, "other", "same", 1.5000000000000002, 0.0)
@example(float("inf"), 0.0, "negated", "negated", 0.0, 0.0)
def test_call_keys_of_dataclasses_follow_their_values(
    x1: float, y1: float, how_x: str, how_y: str, other_x: float, other_y: float
) -> None:
    """Equal values (``==``: ``0.0 == -0.0``) share a key; different ones never do."""
    x2, y2 = _like(x1, how_x, other_x), _like(y1, how_y, other_y)
    same = call_key("p", (Point(x1, y1),)) == call_key("p", (Point(x2, y2),))
    assert same == ((x1, y1) == (x2, y2))


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_call_keys_of_bytes_follow_their_content(a: bytes, b: bytes) -> None:
    assert (call_key("b", (a,)) == call_key("b", (b,))) == (a == b)
    assert call_key("b", (a,)) == call_key("b", (bytearray(a),)) == call_key("b", (memoryview(a),))


# ------------------------------------------------------------------ callback handler


def _handler() -> tuple[GovernorCallbackHandler, list[dict[str, Any]]]:
    gov = lg.Governor()
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    return GovernorCallbackHandler(gov), events


def test_the_callback_handler_records_a_text_model_call() -> None:
    handler, events = _handler()
    llm = FakeListLLM(responses=["forty-two"])
    assert llm.invoke("what is six times seven?", config={"callbacks": [handler]}) == "forty-two"
    (call,) = [e for e in events if e["event"] == "model_call"]
    assert call["status"] == "ok"
    assert call["messages"] == [{"role": "user", "content": "what is six times seven?"}]


class _FailingLLM(FakeListLLM):
    def _call(self, prompt: str, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> str:
        raise PermissionError("401 Unauthorized: api_key=sk-proj-abcdefghijklmnopqrstuvwxyz0123456789 revoked")


def test_the_callback_handler_records_a_failed_model_call_redacted() -> None:
    handler, events = _handler()
    with pytest.raises(PermissionError):
        _FailingLLM(responses=["x"]).invoke("hi", config={"callbacks": [handler]})
    (call,) = [e for e in events if e["event"] == "model_call"]
    assert call["status"] == "error" and call["error_type"]
    assert "abcdefghijklmnopqrstuvwxyz0123456789" not in str(call)
    assert "401 Unauthorized" in call["message"]


def test_the_callback_handler_redacts_tool_input_and_error() -> None:
    from langchain_core.tools import tool

    handler, events = _handler()

    @tool
    def deploy(target: str) -> str:
        """Deploy."""
        raise RuntimeError("push to https://ci:hunter2hunter2@git.example/repo failed")

    with pytest.raises(RuntimeError):
        deploy.invoke({"target": "password=s3cr3tpassw0rd"}, config={"callbacks": [handler]})
    text = str(events)
    assert "s3cr3tpassw0rd" not in text and "hunter2hunter2" not in text
    assert [e["event"] for e in events] == ["tool_start", "tool_end"] and events[-1]["status"] == "error"


# ------------------------------------------------------------------ the CLI demo


def test_loop_governor_demo_runs_and_reports_its_figures() -> None:
    result = CliRunner().invoke(app, ["demo"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "backend calls: 25 without, 8 with the governor" in result.output
    assert "expired credential (fatal)" in result.output
