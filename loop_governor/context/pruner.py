"""ContextPruner: cache-aware pruning of an agent's message list, one instance per conversation.

Why batches: providers bill a prompt prefix identical to the previous request at 10-25% of
the price. Rewriting an old message on every turn (what "keep the last 3 results" does
naively) makes everything after it a cache miss on every turn. Here messages before a
*boundary* are in their final, pruned form and never change again; messages after it are
verbatim. The boundary only moves when the verbatim tail passes ``batch_tokens``, so
between moves the prompt only grows at the end and the provider's cache keeps hitting.

The output is a function of the message list (assuming one ``prune`` call per model
request): a pruner rebuilt after a crash decides the same boundary and produces the same
bytes, because the boundary history is replayed at every assistant message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .health import ContextHealth, ErrorPredicate, HealthCounter, call_key, default_is_error
from .text import digest, head_tail, human_size, map_content_text, map_strings, strip_blobs
from .tokens import CHARS_PER_TOKEN, TOKENS_PER_MESSAGE, TokenCounter, approx_tokens
from .view import (
    ASSISTANT,
    OPAQUE_CODEC,
    OTHER,
    SYSTEM,
    TOOL,
    USER,
    Codec,
    codec_for,
    dump_args,
    safe_text,
    text_of,
)

Mode = Literal["stub", "trim", "keep"]


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What the last ``prune`` call did (fields of the "pruning" trace event)."""

    messages: int
    tokens_before: int
    tokens_after: int
    boundary: int
    advanced: bool


class _Entry:
    """Cached per-message decisions: computed once when the message first arrives (light
    form, tokens) and once when the boundary passes it (frozen form)."""

    __slots__ = (
        "anchor",
        "call_key",
        "call_pos",
        "codec",
        "err_sig",
        "fresh",
        "frozen",
        "light",
        "obj",
        "protected",
        "raw_tokens",
        "role",
        "saving",
        "tokens",
    )

    def __init__(self, obj: Any, codec: Codec, role: str) -> None:
        self.obj = obj
        self.codec = codec
        self.role = role
        self.protected = False
        self.fresh: Any = None  # None means "the input object itself"
        self.light: Any = None
        self.frozen: Any = None
        self.tokens = 0
        self.raw_tokens = 0
        self.saving = 0
        self.anchor = -1  # tool result: index of the assistant message that called it
        self.call_pos = -1  # tool result: index of that call inside the assistant message
        self.call_key: str | None = None
        self.err_sig: str | None = None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _fingerprint(m: Any) -> tuple[Any, ...]:
    """Equality key for a message when the caller rebuilt the object (e.g. after a
    checkpoint reload); compares content by value, holds no copies."""
    c = codec_for(m)
    if c is OPAQUE_CODEC:
        return (OTHER, m if isinstance(m, (str, int, float, type(None))) else id(m))
    content = dump_args(c.content(m))
    calls = tuple((tc.id, tc.name, dump_args(tc.args)) for tc in c.tool_calls(m))
    return (c.role(m), content, calls, c.tool_call_id(m), c.name(m), c.msg_id(m), c.is_pinned(m))


class ContextPruner:
    """Prunes what the model sees; never mutates the messages it is given.

    Defaults and why:

    - ``keep_last=3``: the seeds' value and Anthropic's; the model works from its latest
      few observations.
    - ``trim_threshold=5000, trim_head=1500, trim_tail=1500``: the seeds' head/tail trim,
      used for errors (kept as text: they are the lesson), for ``mode="trim"``, and with
      ``max_verbatim_chars`` for huge fresh results.
    - ``old_results="stub"``, ``old_args="stub"``, ``stub_min_chars=1000``: once the
      model has acted on a result and three newer ones exist, a one-line stub (tool,
      argument digest, size; "call again if needed") keeps the history legible at ~30
      tokens. Below ~1000 chars (~250 tokens, a couple of stubs' worth) a stub saves
      too little to be worth losing the text. The assistant's own old tool-call arguments
      (file bodies, scripts) are the largest share left after results are handled, and
      are stubbed the same way (the effect lives on in the files).
    - ``prose_threshold=1000``: old assistant prose beyond 1000 chars keeps its head and
      tail (300+300, the seed trim's proportions). Not stubbed: unlike a tool result it
      cannot be fetched again. Providers already drop old reasoning blocks for the same
      reason: the decision it led to is in the calls that follow.
    - ``batch_tokens=3000``: the boundary moves only when freezing the messages before
      the kept window would save more than this many tokens (estimated when each message
      arrives, so the check is O(1)). A move re-bills everything after the first changed
      message once at full price; waiting longer carries unpruned tokens on every request.
      Balancing the two (re-billed window W ~2k tokens, growth g ~300 tokens a request)
      gives an optimum near sqrt(2(1-c)Wg/c): ~3.5k at cache price c=0.1, ~2k at 0.25.
      Measuring savings rather than raw tail size is also why chat-style runs with small
      tool results (tau-bench) are left almost untouched: their moves would save nothing.
    - ``max_verbatim_chars=100_000``: even the kept results are head/tail trimmed beyond
      ~25k tokens; a 10 MB tool output would otherwise overflow any context window.
    - blobs (base64, data URIs, image/audio/file blocks) are replaced by a sized
      placeholder in every message except the protected ones and the current turn (the
      messages after the last assistant message), so a screenshot is seen once.
    """

    def __init__(
        self,
        *,
        keep_last: int = 3,
        batch_tokens: int = 3000,
        old_results: Mode = "stub",
        old_args: Mode = "stub",
        stub_min_chars: int = 400,
        prose_threshold: int | None = 1000,
        trim_threshold: int = 5000,
        trim_head: int = 1500,
        trim_tail: int = 1500,
        max_verbatim_chars: int | None = 100_000,
        strip_blobs: bool = True,
        collapse_errors: bool = True,
        elide_superseded: bool = True,
        pinned_ids: Iterable[str] = (),
        is_error: ErrorPredicate | None = None,
        token_counter: TokenCounter | None = None,
    ) -> None:
        if keep_last < 0 or batch_tokens < 0 or stub_min_chars < 0:
            raise ValueError("keep_last, batch_tokens and stub_min_chars must be >= 0")
        if trim_head + trim_tail > trim_threshold:
            raise ValueError("trim_head + trim_tail must not exceed trim_threshold")
        self.keep_last = keep_last
        self.batch_tokens = batch_tokens
        self.old_results = old_results
        self.old_args = old_args
        self.stub_min_chars = stub_min_chars
        self.prose_threshold = prose_threshold
        self.trim_threshold = trim_threshold
        self.trim_head = trim_head
        self.trim_tail = trim_tail
        self.max_verbatim_chars = max_verbatim_chars
        self.strip_blobs = strip_blobs
        self.collapse_errors = collapse_errors
        self.elide_superseded = elide_superseded
        self.pinned_ids = frozenset(pinned_ids)
        self._is_error = is_error
        self._count: TokenCounter = token_counter or approx_tokens
        self.last_report: PruneReport | None = None
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        self._entries: list[_Entry] = []
        self._boundary = 0
        self._frozen_out: list[Any] = []
        self._frozen_tokens = 0
        self._tail_tokens = 0
        self._cum_saving = [0]  # prefix sums of the estimated saving of freezing each message
        self._raw_tokens = 0
        self._first_user_seen = False
        self._last_assistant = -1
        self._tool_idx: list[int] = []
        self._calls: dict[str, tuple[int, int, str]] = {}  # call id -> (msg index, position, key)
        self._last_call: dict[str, int] = {}  # call key -> index of the latest assistant making it
        self._err_last: dict[str, int] = {}
        self._result_tokens: dict[str, int] = {}  # call key -> tokens of its latest result
        self._err_count: dict[str, int] = {}
        self._health = HealthCounter()

    @property
    def boundary(self) -> int:
        """Messages before this index are in their final pruned form."""
        return self._boundary

    @property
    def health(self) -> ContextHealth:
        """Context health of the conversation so far (kept incrementally)."""
        return self._health.snapshot()

    # ------------------------------------------------------------------ public
    def prune(self, messages: Sequence[Any]) -> list[Any]:
        """The messages the model should see: same kind as given, inputs untouched."""
        entries = self._entries
        n = len(messages)
        common = min(n, len(entries))
        p = 0
        while p < common and messages[p] is entries[p].obj:
            p += 1
        while p < common and _fingerprint(messages[p]) == _fingerprint(entries[p].obj):
            entries[p].obj = messages[p]
            p += 1
        if p < len(entries):
            # History was rewritten (summary, edit, another conversation): rebuild. The
            # rebuild replays the boundary decisions, so it costs O(n) once.
            self._reset()
            entries = self._entries
            p = 0
        before = self._boundary
        for i in range(p, n):
            m = messages[i]
            codec = codec_for(m)
            role = codec.role(m)
            if role == ASSISTANT:
                self._maybe_advance(i)
            self._ingest(i, m, codec, role)
        self._maybe_advance(n)
        out = list(self._frozen_out)
        last_ai = self._last_assistant
        for i in range(self._boundary, n):
            e = entries[i]
            form = e.light if i < last_ai else e.fresh
            out.append(e.obj if form is None else form)
        self.last_report = PruneReport(
            messages=n,
            tokens_before=self._raw_tokens,
            tokens_after=self._frozen_tokens + self._tail_tokens,
            boundary=self._boundary,
            advanced=self._boundary != before,
        )
        return out

    __call__ = prune

    # ------------------------------------------------------------------ ingest
    def _error(self, m: Any, codec: Codec) -> bool:
        return self._is_error(m) if self._is_error else default_is_error(m, codec)

    def _ingest(self, i: int, m: Any, codec: Codec, role: str) -> None:
        try:
            seen = self._examine(m, codec, role)
        except Exception:
            # A shape the codecs did not foresee (arguments nested too deep to walk, a
            # counter or error predicate failing on it): the message passes through as it
            # is, never pruned. Examining touches no state, so nothing is half-recorded.
            seen = self._examine(m, OPAQUE_CODEC, OTHER)
        self._record(i, *seen)

    def _examine(self, m: Any, codec: Codec, role: str) -> tuple[_Entry, list[tuple[str | None, int, str]], Any, bool]:
        """Everything about one message that does not depend on the others (no state changes):
        its entry with light and fresh forms and tokens, its calls, the call it answers."""
        e = _Entry(m, codec, role)
        mid = codec.msg_id(m)
        if role == SYSTEM or codec.is_pinned(m) or (mid is not None and mid in self.pinned_ids):
            e.protected = True
        elif role == USER and not self._first_user_seen:
            e.protected = True
        if not e.protected:
            content = codec.content(m)
            fresh_content = content
            if role == TOOL and self.max_verbatim_chars is not None:
                cap = self.max_verbatim_chars
                fresh_content = map_content_text(content, lambda t: head_tail(t, cap // 2, cap // 2, cap))
            if fresh_content is not content:
                e.fresh = codec.replace(m, content=fresh_content)
            if self.strip_blobs:
                light_content = strip_blobs(fresh_content)
                args = self._map_args(codec, m, strip_blobs) if role == ASSISTANT else None
                if light_content is not fresh_content or args:
                    e.light = codec.replace(
                        m, content=light_content if light_content is not content else ..., args=args
                    )
                else:
                    e.light = e.fresh
            else:
                e.light = e.fresh
        e.raw_tokens = self._tokens(m, codec)
        e.tokens = e.raw_tokens if e.light is None else self._tokens(e.light, codec)
        calls: list[tuple[str | None, int, str]] = []
        tcid = None
        err = False
        if role == ASSISTANT:
            calls = [(call.id, call.index, call_key(call.name, call.args)) for call in codec.tool_calls(m)]
        elif role == TOOL:
            tcid = codec.tool_call_id(m)
            err = self._error(m, codec)
            if err:
                e.err_sig = digest(text_of(codec.content(m)), 16)
        e.saving = self._estimate_saving(e)
        return e, calls, tcid, err

    def _tokens(self, m: Any, codec: Codec) -> int:
        if codec is not OPAQUE_CODEC:
            return self._count(m)
        try:
            return self._count(m)
        except Exception:  # a counter for chat messages, handed something else
            return math.ceil(len(safe_text(m)) / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE

    def _record(self, i: int, e: _Entry, calls: list[tuple[str | None, int, str]], tcid: Any, err: bool) -> None:
        """Add an examined message to the conversation state."""
        role = e.role
        if role == USER:
            self._first_user_seen = True
        extra = 0  # tokens an earlier message will lose because of this one
        if role == ASSISTANT:
            self._last_assistant = i
            for call_id, pos, key in calls:
                self._health.add_call(call_id, key)
                if self.elide_superseded:
                    extra += self._result_tokens.get(key, 0)
                self._last_call[key] = i
                if call_id is not None:
                    self._calls[call_id] = (i, pos, key)
        elif role == TOOL:
            found = self._calls.get(tcid) if tcid is not None else None
            if found is not None:
                e.anchor, e.call_pos, e.call_key = found
            else:
                e.anchor = self._last_assistant if self._last_assistant >= 0 else i
            if e.call_key is not None:
                self._result_tokens[e.call_key] = e.tokens
            sig = e.err_sig
            if sig is not None:
                if self.collapse_errors and sig in self._err_last:
                    extra += e.tokens
                self._err_last[sig] = i
                self._err_count[sig] = self._err_count.get(sig, 0) + 1
            self._health.add_result(tcid, err)
            self._tool_idx.append(i)
        self._entries.append(e)
        e.saving += extra
        self._cum_saving.append(self._cum_saving[-1] + e.saving)
        self._raw_tokens += e.raw_tokens
        self._tail_tokens += e.tokens

    def _estimate_saving(self, e: _Entry) -> int:
        """Tokens freezing this message would likely save (ignores supersession, which
        only adds savings): what the batch budget is measured in."""
        if e.protected:
            return 0
        base = e.obj if e.light is None else e.light
        chars = 0
        if e.role == TOOL:
            n = len(text_of(e.codec.content(base)))
            if self.old_results == "stub" and n > self.stub_min_chars and e.err_sig is None:
                chars = n - 100
            elif n > self.trim_threshold:
                chars = n - self.trim_head - self.trim_tail
        elif e.role == ASSISTANT:
            if self.prose_threshold is not None:
                chars += max(0, len(text_of(e.codec.content(base))) - int(self.prose_threshold * 0.6))
            if self.old_args != "keep":
                limit = self.stub_min_chars if self.old_args == "stub" else self.trim_threshold
                for call in e.codec.tool_calls(base):
                    chars += sum(len(s) - 60 for s in _strings(call.args) if len(s) > limit)
        return int(chars / 4)

    def _map_args(self, codec: Codec, m: Any, fn: Callable[[Any], Any]) -> dict[int, Any]:
        """New arguments for the calls of ``m`` whose strings ``fn`` changes."""
        changed: dict[int, Any] = {}
        for call in codec.tool_calls(m):
            new = map_strings(call.args, fn)
            if new is not call.args:
                changed[call.index] = new
        return changed

    # ------------------------------------------------------------------ batching
    def _maybe_advance(self, end: int) -> None:
        """Move the boundary when the verbatim tail of ``messages[:end]`` is over budget,
        to just before the assistant message that made the ``keep_last``-th last call."""
        if self._cum_saving[end] - self._cum_saving[self._boundary] <= self.batch_tokens:
            return  # cheap exit: even freezing everything would not save enough
        if self.keep_last == 0:
            new_b = end
        else:
            if len(self._tool_idx) < self.keep_last:
                return
            kth = self._entries[self._tool_idx[-self.keep_last]]
            new_b = kth.anchor
        if new_b <= self._boundary or self._cum_saving[new_b] - self._cum_saving[self._boundary] <= self.batch_tokens:
            return
        for i in range(self._boundary, new_b):
            e = self._entries[i]
            try:
                e.frozen = self._freeze(i, e)
                tokens = e.tokens if e.frozen is e.light else self._count(e.frozen if e.frozen is not None else e.obj)
            except Exception:  # see _ingest: an unforeseen shape stays in its current form
                e.frozen, tokens = e.light, e.tokens
            self._tail_tokens -= e.tokens
            self._frozen_tokens += tokens
            self._frozen_out.append(e.obj if e.frozen is None else e.frozen)
        self._boundary = new_b

    # ------------------------------------------------------------------ final forms
    def _shorten(self, text: str, mode: Mode, what: str) -> str:
        if mode == "stub" and len(text) > self.stub_min_chars:
            return f"[{what}: {human_size(len(text))}, sha {digest(text)}]"
        if mode in ("stub", "trim"):
            return head_tail(text, self.trim_head, self.trim_tail, self.trim_threshold)
        return text

    def _freeze(self, i: int, e: _Entry) -> Any:
        if e.protected:
            return None
        if e.role == TOOL:
            return self._freeze_result(i, e)
        if e.role == ASSISTANT:
            base = e.obj if e.light is None else e.light
            args: dict[int, Any] = {}
            if self.old_args != "keep":
                mode = self.old_args
                args = self._map_args(e.codec, base, lambda s: self._shorten(s, mode, "elided"))
            content: Any = ...
            if self.prose_threshold is not None:
                limit = self.prose_threshold
                part = int(limit * 0.3)  # the seed trim's proportions (1500+1500 of 5000)
                old = e.codec.content(base)
                new = map_content_text(old, lambda t: head_tail(t, part, part, limit))
                if new is not old:
                    content = new
            if args or content is not ...:
                return e.codec.replace(base, content=content, args=args)
        return e.light

    def _call_label(self, e: _Entry) -> str:
        name = e.codec.name(e.obj) or "tool"
        if e.call_key is not None:
            name, _, args = e.call_key.partition("\x00")
            return f"{name} (args sha {digest(args)})"
        return name

    def _freeze_result(self, i: int, e: _Entry) -> Any:
        base = e.obj if e.light is None else e.light
        text = text_of(e.codec.content(base))
        size = len(text)
        if self.elide_superseded and e.call_key is not None and self._last_call.get(e.call_key, -1) > e.anchor:
            stub = f"[result of {self._call_label(e)} elided: superseded by a later identical call]"
            return e.codec.replace(base, content=stub)
        if e.err_sig is not None:
            if self.collapse_errors and self._err_last[e.err_sig] > i:
                stub = f"[error from {self._call_label(e)} elided: the same error occurs again later]"
                return e.codec.replace(base, content=stub)
            body = head_tail(text, self.trim_head, self.trim_tail, self.trim_threshold)
            count = self._err_count[e.err_sig]
            if self.collapse_errors and count > 1:
                body = f"{body}\n[this identical error occurred {count} times]"
            return e.light if body is text else e.codec.replace(base, content=body)
        if self.old_results == "stub" and size > self.stub_min_chars:
            stub = f"[old result of {self._call_label(e)} elided: {human_size(size)}; call again if needed]"
            return e.codec.replace(base, content=stub)
        if self.old_results in ("stub", "trim"):
            new = map_content_text(
                e.codec.content(base),
                lambda t: head_tail(t, self.trim_head, self.trim_tail, self.trim_threshold),
            )
            if new is not e.codec.content(base):
                return e.codec.replace(base, content=new)
        return e.light
