"""The prompt a chat model actually received, for the trace.

``GovernorMiddleware`` sees a model request before the middlewares inside it change it
(``ContextEditingMiddleware`` clearing old tool results, a summarizer, a tool selector):
recording ``request.messages`` would trace a prompt the model never saw. So around the
model call the middleware switches on a LangChain callback (through a configure hook, the
mechanism LangChain's own tracers use: every callback manager made while the context
variable is set includes the handler) and records the messages of the chat-model run
that ended last -- the innermost call, exactly as sent.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.tracers.context import register_configure_hook

__all__ = ["PromptCapture", "capture_prompt"]


class PromptCapture(BaseCallbackHandler):
    """Keeps the messages of the last chat-model run that finished."""

    run_inline = True  # in the caller's thread and order, also under ainvoke

    def __init__(self) -> None:
        self._started: dict[UUID, list[BaseMessage]] = {}
        self.sent: list[BaseMessage] | None = None

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if messages:
            self._started[run_id] = list(messages[0])

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        sent = self._started.pop(run_id, None)
        if sent is not None:
            self.sent = sent

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._started.pop(run_id, None)


_CAPTURE: contextvars.ContextVar[PromptCapture | None] = contextvars.ContextVar("lg_prompt_capture", default=None)
register_configure_hook(_CAPTURE, inheritable=True)


@contextlib.contextmanager
def capture_prompt(enabled: bool = True) -> Iterator[PromptCapture | None]:
    """Capture the prompts of the chat-model calls made inside the block."""
    if not enabled:
        yield None
        return
    capture = PromptCapture()
    token = _CAPTURE.set(capture)
    try:
        yield capture
    finally:
        _CAPTURE.reset(token)
