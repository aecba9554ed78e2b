"""IncrementalSummarizer: replace whole old turns by a running summary, never losing a request.

Summaries written by a model drop things; the one thing an agent must not drop is a user
request it has not finished. So the request ledger is kept *by this code*, verbatim, and
the model only writes the narrative and says which requests are DONE. Each round sends
the previous summary plus the newly folded turns only (incremental: the cost of a round
does not grow with the conversation).
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .text import head_tail, strip_blobs_text
from .tokens import TokenCounter, approx_tokens
from .view import ASSISTANT, OPAQUE_CODEC, SYSTEM, TOOL, USER, Codec, codec_for, dump_args, text_of

SUMMARY_HEADER = "[Conversation summary: earlier turns were replaced by this summary]"
SYSTEM_PROMPT = (
    "You maintain the running summary of an AI agent's conversation. Merge the previous "
    "summary with the new messages into one concise summary: decisions, facts found, files "
    "and values that matter, what failed and why. Do not restate the user requests list; "
    "it is kept separately. End with exactly one line `DONE: <ids>` naming the request ids "
    "(like R2) that are now fully completed, or `DONE: none`."
)
_DONE_LINE = re.compile(r"^\s*DONE:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_REQ_ID = re.compile(r"\bR(\d+)\b")
_LEDGER_LINE = re.compile(r"^- \[(DONE|PENDING)\] R(\d+): (.*)$")


@dataclass
class _Round:
    """A summary round planned but not yet answered.

    The ledger is built aside and adopted only in ``_commit``, once the model has
    answered: a failed model call followed by a retry must not add the same requests
    twice. Shared by ``summarize`` and ``asummarize``, which differ only in the call.
    """

    msgs: list[Any]
    head_end: int
    cut: int
    kept: list[Any]
    requests: list[UserRequest]
    prompt: str


@dataclass
class UserRequest:
    """One user request seen in the folded turns (``done`` once the model says so)."""

    id: int
    text: str
    done: bool = False


Model = Any
"""A LangChain chat model (anything with ``.invoke(messages)`` returning ``.content``;
``asummarize`` prefers ``.ainvoke``) or a callable ``str -> str`` (an async one with
``asummarize``)."""


def _reply_text(reply: Any) -> str:
    if isinstance(reply, str):
        return reply
    content = getattr(reply, "content", reply)
    return text_of(content) if not isinstance(content, str) else content


def _chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]


def _is_async_callable(model: Any) -> bool:
    return inspect.iscoroutinefunction(model) or inspect.iscoroutinefunction(type(model).__call__)


def _one_line(text: str) -> str:
    """``text`` on one line: every line separator ``str.splitlines`` knows (``\\r``,
    ``\\u2028``, ``\\x1c``...) becomes a space, so a ledger line reloads whole."""
    return " ".join(text.splitlines())


class IncrementalSummarizer:
    """Folds old turns into one summary message once the conversation passes ``trigger_tokens``.

    ``summarize(messages)`` (or ``await asummarize(messages)``, which does not block the
    event loop) returns a new list (same message kind): the system messages and
    the first user message, the summary (a user message), pinned messages, then the most
    recent turns (about ``keep_tokens``). Cuts fall only before a user or assistant
    message, so no tool call is separated from its result.
    """

    def __init__(
        self,
        model: Model,
        *,
        trigger_tokens: int = 60_000,
        keep_tokens: int = 12_000,
        max_request_chars: int = 4000,
        max_message_chars: int = 2000,
        token_counter: TokenCounter | None = None,
        pinned_ids: Sequence[str] = (),
    ) -> None:
        if keep_tokens >= trigger_tokens:
            raise ValueError("keep_tokens must be below trigger_tokens")
        self.model = model
        self.trigger_tokens = trigger_tokens
        self.keep_tokens = keep_tokens
        self.max_request_chars = max_request_chars
        self.max_message_chars = max_message_chars
        self._count: TokenCounter = token_counter or approx_tokens
        self.pinned_ids = frozenset(pinned_ids)
        self.summary = ""
        self.requests: list[UserRequest] = []
        self.rounds = 0

    # ------------------------------------------------------------------ helpers
    def _is_summary(self, m: Any, codec: Codec) -> bool:
        content = codec.content(m)
        return isinstance(content, str) and content.startswith(SUMMARY_HEADER)

    def _pinned(self, m: Any, codec: Codec) -> bool:
        mid = codec.msg_id(m)
        return codec.is_pinned(m) or (mid is not None and mid in self.pinned_ids)

    def _render(self, m: Any, codec: Codec) -> str:
        role = codec.role(m)
        lim = self.max_message_chars
        text = head_tail(strip_blobs_text(text_of(codec.content(m))), lim // 2, lim // 2, lim)
        if role == ASSISTANT:
            calls = [f"{c.name}({head_tail(dump_args(c.args), 200, 100, 400)})" for c in codec.tool_calls(m)]
            if calls:
                text = f"{text}\n[calls: {'; '.join(calls)}]".strip()
        if role == TOOL:
            return f"tool result ({codec.name(m) or codec.tool_call_id(m) or '?'}): {text}"
        return f"{role}: {text}"

    def render_summary(self) -> str:
        lines = [SUMMARY_HEADER, self.summary.strip() or "(no summary yet)"]
        if self.requests:
            lines.append("User requests (PENDING ones are still to be done):")
            for r in self.requests:
                lines.append(f"- [{'DONE' if r.done else 'PENDING'}] R{r.id}: {r.text}")
        return "\n".join(lines)

    def _load_ledger(self, text: str) -> None:
        """Rebuild state from a summary message (e.g. after a restart)."""
        body, requests = [], []
        for line in text.splitlines()[1:]:
            m = _LEDGER_LINE.match(line)
            if m:
                requests.append(UserRequest(int(m.group(2)), m.group(3), m.group(1) == "DONE"))
            elif not line.startswith("User requests (PENDING"):
                body.append(line)
        self.summary, self.requests = "\n".join(body), requests

    def _ask(self, prompt: str) -> str:
        if hasattr(self.model, "invoke"):
            reply = self.model.invoke(_chat(prompt))
        elif callable(self.model):
            reply = self.model(f"{SYSTEM_PROMPT}\n\n{prompt}")
        else:
            raise TypeError("model must have .invoke(messages) or be a callable str -> str")
        if inspect.isawaitable(reply):  # never adopt "<coroutine object ...>" as the summary
            if inspect.iscoroutine(reply):
                reply.close()
            raise TypeError("the model is async: call asummarize")
        return _reply_text(reply)

    async def _aask(self, prompt: str) -> str:
        """[`_ask`][loop_governor.context.summarizer.IncrementalSummarizer._ask] without blocking the event loop:
        ``ainvoke`` or an async callable is awaited, a synchronous model runs in a worker thread."""
        model = self.model
        if hasattr(model, "ainvoke"):
            reply = await model.ainvoke(_chat(prompt))
        elif hasattr(model, "invoke"):
            reply = await asyncio.to_thread(model.invoke, _chat(prompt))
        elif callable(model):
            text = f"{SYSTEM_PROMPT}\n\n{prompt}"
            reply = model(text) if _is_async_callable(model) else await asyncio.to_thread(model, text)
        else:
            raise TypeError("model must have .invoke(messages) or be a callable str -> str")
        if inspect.isawaitable(reply):  # an async function, or a plain one returning an awaitable
            reply = await reply
        return _reply_text(reply)

    # ------------------------------------------------------------------ main
    def _cut(self, messages: Sequence[Any], start: int, codecs: list[Codec]) -> int:
        """Earliest safe cut at or after ``start`` whose tail fits ``keep_tokens``."""
        total = 0
        cut = len(messages)
        best = len(messages)
        for i in range(len(messages) - 1, start - 1, -1):
            total += self._count(messages[i])
            role = codecs[i].role(messages[i])
            if role in (USER, ASSISTANT):
                if total > self.keep_tokens and best < len(messages):
                    break
                best = i
            cut = best
        return cut

    def summarize(self, messages: Sequence[Any]) -> list[Any]:
        """``messages`` with old turns folded into the summary, or a copy of the list
        unchanged when under ``trigger_tokens``. Never mutates the given messages."""
        plan = self._plan(messages)
        return plan if isinstance(plan, list) else self._commit(plan, self._ask(plan.prompt))

    async def asummarize(self, messages: Sequence[Any]) -> list[Any]:
        """[`summarize`][loop_governor.context.summarizer.IncrementalSummarizer.summarize] for async agents: the model
        call does not block the loop."""
        plan = self._plan(messages)
        return plan if isinstance(plan, list) else self._commit(plan, await self._aask(plan.prompt))

    def _plan(self, messages: Sequence[Any]) -> list[Any] | _Round:
        """Everything before the model call: the messages unchanged, or the round to ask."""
        msgs = list(messages)
        if not msgs or sum(self._count(m) for m in msgs) <= self.trigger_tokens:
            return msgs
        codecs = [codec_for(m) for m in msgs]
        # Protected head: leading system messages and the first user message.
        head_end = 0
        first_user: Any = None
        for i, (m, c) in enumerate(zip(msgs, codecs, strict=False)):
            role = c.role(m)
            if role == SYSTEM:
                continue
            if role == USER and first_user is None:
                first_user = m
                head_end = i + 1
            break
        if first_user is None:
            return msgs
        start = head_end
        if start < len(msgs) and self._is_summary(msgs[start], codecs[start]):
            if self.rounds == 0 or self.render_summary() != codecs[start].content(msgs[start]):
                self._load_ledger(codecs[start].content(msgs[start]))
            start += 1
        cut = self._cut(msgs, start, codecs)
        if cut <= start:
            return msgs
        folded = msgs[start:cut]
        # Pinned messages stay; a pinned tool exchange stays whole (no orphans).
        keep_ids: set[str] = set()
        for m, c in zip(folded, codecs[start:cut], strict=False):
            if self._pinned(m, c):
                keep_ids.update(str(tc.id) for tc in c.tool_calls(m))
                if c.tool_call_id(m):
                    keep_ids.add(str(c.tool_call_id(m)))
        for m, c in zip(folded, codecs[start:cut], strict=False):
            call_ids = {str(tc.id) for tc in c.tool_calls(m)}
            if call_ids & keep_ids:  # an assistant message kept whole keeps all its results
                keep_ids |= call_ids
        kept: list[Any] = []
        to_fold: list[Any] = []
        for m, c in zip(folded, codecs[start:cut], strict=False):
            ids = {str(tc.id) for tc in c.tool_calls(m)}
            if c.tool_call_id(m):
                ids.add(str(c.tool_call_id(m)))
            # A message of no known kind is not the summarizer's to fold: it stays, untouched.
            keep = c is OPAQUE_CODEC or self._pinned(m, c) or bool(ids & keep_ids)
            (kept if keep else to_fold).append(m)
        # The new ledger is built aside and committed only once the model has answered: a
        # failed model call followed by a retry must not add the same requests twice.
        requests = [UserRequest(r.id, r.text, r.done) for r in self.requests]
        next_id = max((r.id for r in requests), default=1) + 1
        if not any(r.id == 1 for r in requests):
            first_text = text_of(codecs[head_end - 1].content(first_user))
            requests.insert(0, UserRequest(1, _one_line("(the first user message above) " + first_text[:200])))
        for m in to_fold:
            c = codec_for(m)
            if c.role(m) == USER:
                half = self.max_request_chars // 2
                text = _one_line(head_tail(text_of(c.content(m)), half, half, self.max_request_chars))
                requests.append(UserRequest(next_id, text))
                next_id += 1
        ledger = "\n".join(f"R{r.id} [{'DONE' if r.done else 'PENDING'}]: {r.text}" for r in requests)
        new_turns = "\n".join(self._render(m, codec_for(m)) for m in to_fold)
        prompt = (
            f"Previous summary:\n{self.summary or '(none)'}\n\nUser requests so far:\n{ledger}\n\n"
            f"New messages to fold into the summary:\n{new_turns}"
        )
        return _Round(msgs, head_end, cut, kept, requests, prompt)

    def _commit(self, plan: _Round, reply: str) -> list[Any]:
        """The model answered: adopt the new ledger and summary, build the new messages."""
        msgs, head_end, requests = plan.msgs, plan.head_end, plan.requests
        done_ids: set[int] = set()
        for match in _DONE_LINE.finditer(reply):
            done_ids.update(int(x) for x in _REQ_ID.findall(match.group(1)))
        for r in requests:
            r.done = r.done or r.id in done_ids
        self.requests = requests
        self.summary = _DONE_LINE.sub("", reply).strip()
        self.rounds += 1
        first_user = msgs[head_end - 1]
        summary_msg = codec_for(first_user).new_user(first_user, self.render_summary())
        return [*msgs[:head_end], summary_msg, *plan.kept, *msgs[plan.cut :]]

    __call__ = summarize

    @property
    def pending(self) -> list[UserRequest]:
        return [r for r in self.requests if not r.done]
