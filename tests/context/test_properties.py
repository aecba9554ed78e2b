"""Invariants over random conversations (hypothesis): multimodal content, missing ids,
huge outputs, unicode; both message kinds."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loop_governor.context import ContextPruner

_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_BIG = st.sampled_from(["", "ab12CD" * 400, "é🚀 línea\n" * 800, "Z" * 6000])
_IMG = "data:image/png;base64," + "iVBOR0w1" * 300


@st.composite
def conversations(draw: Any, kinds: tuple[Any, Any]) -> tuple[Any, list[Any]]:
    kind = draw(st.sampled_from(kinds))
    msgs: list[Any] = [kind.system("sys " + draw(_TEXT)), kind.user("task " + draw(_TEXT))]
    n_steps = draw(st.integers(0, 14))
    for s in range(n_steps):
        action = draw(st.sampled_from(["call", "call", "call", "user", "parallel"]))
        if action == "user":
            content: Any = draw(_TEXT) + draw(_BIG)
            if draw(st.booleans()):
                content = [{"type": "text", "text": draw(_TEXT)}, {"type": "image_url", "image_url": {"url": _IMG}}]
            msgs.append(kind.user(content))
            continue
        k = 2 if action == "parallel" else 1
        missing = draw(st.booleans()) and draw(st.booleans())
        ids = [None if missing else f"id{s}_{j}" for j in range(k)]
        name = draw(st.sampled_from(["bash", "read"]))
        args = {"cmd": draw(st.sampled_from(["ls", "cat a", "cat a"])), "body": draw(_BIG)}
        msgs.append(kind.ai(draw(_TEXT), [(cid, name, args) for cid in ids]))
        for cid in ids:
            out = draw(_TEXT) + draw(_BIG)
            if draw(st.integers(0, 9)) == 0:
                out = out + " " + _IMG
            msgs.append(kind.tool(cid, out, name=name, error=draw(st.integers(0, 4)) == 0))
    return kind, msgs


def _shape(kind: Any, m: Any) -> tuple[Any, ...]:
    if kind.kind == "dict":
        calls = tuple(c["id"] for c in m.get("tool_calls") or ())
        return (m["role"], calls, m.get("tool_call_id"))
    return (m.type, tuple(c["id"] for c in getattr(m, "tool_calls", ())), getattr(m, "tool_call_id", None))


def _ends(kind: Any, msgs: list[Any]) -> list[int]:
    return kind.requests_of(msgs)  # type: ignore[no-any-return]


_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(data=st.data(), batch=st.sampled_from([0, 300, 3000]))
def test_invariants(kinds: tuple[Any, Any], data: st.DataObject, batch: int) -> None:
    kind, msgs = data.draw(conversations(kinds))
    snapshot = copy.deepcopy(msgs)
    pruner = ContextPruner(batch_tokens=batch, stub_min_chars=100)
    prev: list[Any] | None = None
    prev_boundary = 0
    prev_last_ai = 0
    for end in _ends(kind, msgs):
        out = pruner.prune(msgs[:end])
        # no orphans: same messages, same call ids and result ids at every position
        assert [_shape(kind, m) for m in out] == [_shape(kind, m) for m in msgs[:end]]
        # protected: system prompt and first user message are the very same objects
        assert out[0] is msgs[0] and out[1] is msgs[1]
        # prefix stability: frozen messages never change; between moves the request only
        # grows at the end (up to the previous current turn, whose blobs may now go)
        if prev is not None:
            assert out[:prev_boundary] == prev[:prev_boundary]
            if pruner.boundary == prev_boundary:
                assert out[:prev_last_ai] == prev[:prev_last_ai]
        assert pruner.boundary >= prev_boundary
        prev, prev_boundary = out, pruner.boundary
        prev_last_ai = max([i for i in range(end) if _shape(kind, msgs[i])[0] in ("assistant", "ai")], default=0)
    assert msgs == snapshot  # inputs never mutated
    # deterministic, and a function of the messages: a fresh pruner agrees
    assert ContextPruner(batch_tokens=batch, stub_min_chars=100).prune(msgs) == prev
    again = ContextPruner(batch_tokens=batch, stub_min_chars=100)
    for end in _ends(kind, msgs):
        last = again.prune(copy.deepcopy(msgs[:end]))
    assert last == prev


def test_ten_megabyte_outputs_in_history_do_not_survive(kinds: tuple[Any, Any]) -> None:
    for kind in kinds:
        msgs = kind.run(steps=6, result_chars=100)
        msgs[3] = kind.tool("c0", "ïñ 输出 " * 1_500_000)
        out = ContextPruner(batch_tokens=0).prune(msgs)
        assert len(kind.text(out[3])) < 300
