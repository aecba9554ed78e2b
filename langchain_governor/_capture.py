"""The prompt a chat model actually received, for the trace -- and its fatal failures.

``GovernorMiddleware`` sees a model request before the middlewares inside it change it
(``ContextEditingMiddleware`` clearing old tool results, a summarizer, a tool selector):
recording ``request.messages`` would trace a prompt the model never saw. So around the
model call the middleware switches on a LangChain callback (through a configure hook, the
mechanism LangChain's own tracers use: every callback manager made while the context
variable is set includes the handler) and records the messages of the chat-model run
that ended last -- the innermost call, exactly as sent.

The same callback sees a chat model's failure before any middleware between the
governor and the model does. A fatal one (an exhausted quota, a revoked key) must not be
retried there: ``ModelRetryMiddleware`` inside the governor retries every
``ModelError.is_retryable`` exception (langchain-openai's quota error is a
``ModelRateLimitError``), so an exhausted quota reached the provider three times before
the governor saw it. So the callback raises it on as a `ModelStop`, a LangGraph
``GraphBubbleUp`` -- which LangChain's retry and fallback middlewares pass through
untouched -- and the governor unwraps it (one request, then the stop). LangChain logs an
exception raised by a callback as a warning; that one line is ours and is filtered out.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.tracers.context import register_configure_hook
from langgraph.errors import GraphBubbleUp

__all__ = ["ModelStop", "PromptCapture", "capture_prompt"]


class ModelStop(GraphBubbleUp):
    """A chat model's fatal failure on its way out through the middlewares inside the
    governor (see the module doc); ``.error`` is the model's exception."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class PromptCapture(BaseCallbackHandler):
    """Keeps the messages of the last chat-model run that finished (when ``record``), and
    the exceptions chat-model runs failed with: what tells the model's own failure (the
    governor's to handle) from another middleware's or a parser's (passed through)."""

    run_inline = True  # in the caller's thread and order, also under ainvoke
    raise_error = True  # what on_llm_error raises replaces the model's exception

    def __init__(self, record: bool = True, fatal: Callable[[BaseException], bool] | None = None) -> None:
        self._record = record
        self._fatal = fatal
        self._started: dict[UUID, list[BaseMessage]] = {}
        self.sent: list[BaseMessage] | None = None
        self.errors: list[BaseException] = []

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if messages and self._record:
            self._started[run_id] = list(messages[0])

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        sent = self._started.pop(run_id, None)
        if sent is not None:
            self.sent = sent

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._started.pop(run_id, None)
        self.errors.append(error)
        if self._fatal is not None and isinstance(error, Exception) and not isinstance(error, GraphBubbleUp):
            try:
                fatal = self._fatal(error)
            except Exception:  # a classification problem never changes the model's error
                fatal = False
            if fatal:
                raise ModelStop(error)

    def raised_by_model(self, exc: BaseException) -> bool:
        """Whether ``exc`` is (or wraps) an exception a chat-model run failed with."""
        seen: set[int] = set()
        link: BaseException | None = exc
        while link is not None and id(link) not in seen:
            if any(link is error for error in self.errors):
                return True
            seen.add(id(link))
            link = link.__cause__ or link.__context__
        return False


_CAPTURE: contextvars.ContextVar[PromptCapture | None] = contextvars.ContextVar("lg_prompt_capture", default=None)
register_configure_hook(_CAPTURE, inheritable=True)


class _QuietRelay(logging.Filter):
    """Drops LangChain's warning about the `ModelStop` this callback raises on
    purpose ("Error in PromptCapture.on_llm_error callback: ...")."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and args[:2] == ("PromptCapture", "on_llm_error"))


logging.getLogger("langchain_core.callbacks.manager").addFilter(_QuietRelay())


@contextlib.contextmanager
def capture_prompt(
    record: bool = True, fatal: Callable[[BaseException], bool] | None = None
) -> Iterator[PromptCapture]:
    """Watch the chat-model calls made inside the block: their failures, and (``record``)
    their prompts; a failure ``fatal`` says is fatal is raised on as a `ModelStop`."""
    capture = PromptCapture(record, fatal)
    token = _CAPTURE.set(capture)
    try:
        yield capture
    finally:
        _CAPTURE.reset(token)
