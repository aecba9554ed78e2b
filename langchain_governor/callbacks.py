"""``GovernorCallbackHandler``: Agent Lens events for any Runnable, chain or legacy agent.

Middleware only exists for ``create_agent``; callbacks reach everything else (LCEL
chains, LangGraph graphs, ``langchain_classic.agents.AgentExecutor``). The handler turns
LangChain's callback stream into governor events:

* ``model_call`` -- model, latency, usage (incl. prompt-cache reads/writes), finish
  reason and the exact prompt the model received (``on_chat_model_start`` fires after
  any trimming) as OpenAI-style dicts;
* ``tool_start`` / ``tool_end`` -- tool name, tool-call id, duration, status and, on
  error, the classified error type and signature (messages are redacted).

Use it *or* [`GovernorMiddleware`][langchain_governor.middleware.GovernorMiddleware]'s model events on a
``create_agent`` agent, not both, or each model call is recorded twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, LLMResult

import loop_governor as lg
from langchain_governor._common import openai_messages, usage_fields
from loop_governor.adapter import resolve_governor

PREVIEW_CHARS = 500


def _model_name(serialized: dict[str, Any] | None, metadata: dict[str, Any] | None, kwargs: Any) -> str | None:
    if metadata and isinstance(metadata.get("ls_model_name"), str):
        return str(metadata["ls_model_name"])
    params = kwargs.get("invocation_params") or {}
    for source in (params, (serialized or {}).get("kwargs") or {}):
        for key in ("model_name", "model"):
            if isinstance(source.get(key), str):
                return str(source[key])
    name = (serialized or {}).get("name")
    return name if isinstance(name, str) else None


def _preview(value: Any) -> str:
    text = value.content if isinstance(getattr(value, "content", None), str) else str(value)
    return lg.redact(text)[:PREVIEW_CHARS]


@dataclass
class _ModelStart:
    started: float
    model: str | None
    messages: list[BaseMessage]


@dataclass
class _ToolStart:
    started: float
    tool: str
    tool_call_id: str | None


class GovernorCallbackHandler(BaseCallbackHandler):
    """Record model and tool activity of any LangChain run as governor events.

    Pass it in ``config={"callbacks": [handler]}`` (or a constructor's ``callbacks=``).
    It runs inline (``run_inline``), so events keep their order and see the caller's
    task scope; it never raises into the run.
    """

    run_inline = True
    raise_error = False

    def __init__(
        self,
        governor: lg.Governor | None = None,
        *,
        record_messages: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.governor = resolve_governor(governor)
        self.record_messages = record_messages
        self._clock = clock
        self._lock = threading.Lock()
        self._models: dict[UUID, _ModelStart] = {}
        self._tools: dict[UUID, _ToolStart] = {}

    # -- models -------------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        prompt = list(messages[0]) if messages else []
        start = _ModelStart(self._clock(), _model_name(serialized, metadata, kwargs), prompt)
        with self._lock:
            self._models[run_id] = start

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # Text-completion models: record the prompt as one user message.
        prompt: list[BaseMessage] = [HumanMessage(content=prompts[0])] if prompts else []
        start = _ModelStart(self._clock(), _model_name(serialized, metadata, kwargs), prompt)
        with self._lock:
            self._models[run_id] = start

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            start = self._models.pop(run_id, None)
        if start is None:
            return
        generation = response.generations[0][0] if response.generations and response.generations[0] else None
        message = generation.message if isinstance(generation, ChatGeneration) else None
        fields: dict[str, Any] = {
            "model": start.model,
            "latency_s": self._clock() - start.started,
            "status": "ok",
            **usage_fields(message),
        }
        if message is None and response.llm_output:
            usage = response.llm_output.get("token_usage") or {}
            fields["input_tokens"] = usage.get("prompt_tokens")
            fields["output_tokens"] = usage.get("completion_tokens")
        if self.record_messages:
            fields["messages"] = openai_messages(start.messages)
        self.governor.emit("model_call", **fields)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            start = self._models.pop(run_id, None)
        if start is None:
            return
        info = lg.classify(error) if isinstance(error, Exception) else None
        self.governor.emit(
            "model_call",
            model=start.model,
            latency_s=self._clock() - start.started,
            status="error",
            error_type=None if info is None else str(info.error_type),
            signature=None if info is None else info.signature,
            message=lg.redact(str(error))[:PREVIEW_CHARS],
        )

    # -- tools --------------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        tool = str((serialized or {}).get("name") or kwargs.get("name") or "tool")
        tool_call_id = kwargs.get("tool_call_id")
        with self._lock:
            self._tools[run_id] = _ToolStart(self._clock(), tool, tool_call_id)
        self.governor.emit(
            "tool_start",
            tool=tool,
            tool_call_id=tool_call_id,
            run_id=str(run_id),
            input=lg.redact(input_str)[:PREVIEW_CHARS],
        )

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            start = self._tools.pop(run_id, None)
        if start is None:
            return
        # A tool can report its own failure as content (ToolMessage status="error").
        status = "error" if getattr(output, "status", "success") == "error" else "ok"
        self.governor.emit(
            "tool_end",
            tool=start.tool,
            tool_call_id=start.tool_call_id,
            run_id=str(run_id),
            status=status,
            duration_s=self._clock() - start.started,
            output=_preview(output),
        )

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            start = self._tools.pop(run_id, None)
        if start is None:
            return
        info = lg.classify(error, tool=start.tool) if isinstance(error, Exception) else None
        self.governor.emit(
            "tool_end",
            tool=start.tool,
            tool_call_id=kwargs.get("tool_call_id") or start.tool_call_id,
            run_id=str(run_id),
            status="error",
            duration_s=self._clock() - start.started,
            error_type=None if info is None else str(info.error_type),
            signature=None if info is None else info.signature,
            message=lg.redact(str(error))[:PREVIEW_CHARS],
        )
