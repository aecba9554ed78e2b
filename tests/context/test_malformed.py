"""Issue 17: malformed messages never make the pruner, the summarizer or the replay raise;
shapes they do not know pass through untouched."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from loop_governor.context import ContextPruner, IncrementalSummarizer, approx_tokens, context_health
from loop_governor.context.replay import Run, default_policies, load_runs, replay

BIG = "result line with some text\n" * 400  # ~10 KB: old results get stubbed


def _conversation(extra: list[Any]) -> list[Any]:
    """A dict conversation long enough to move the boundary, with ``extra`` spliced in early."""
    msgs: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}, *extra]
    for i in range(12):
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"{i} {BIG}"})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


MALFORMED = {
    "tool_calls is an int": [{"role": "assistant", "content": "x", "tool_calls": 5}],
    "function is a string": [{"role": "assistant", "content": "", "tool_calls": [{"id": "f1", "function": "str"}]}],
    "deeply nested arguments": [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "d1", "function": {"name": "f", "arguments": "[" * 100_000 + "]" * 100_000}}],
        },
        {"role": "tool", "tool_call_id": "d1", "content": "ok"},
    ],
    "moderately deep arguments": [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "d2", "function": {"name": "f", "arguments": "[" * 900 + "]" * 900}}],
        },
        {"role": "tool", "tool_call_id": "d2", "content": "ok"},
    ],
    "a list as tool-call id": [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": ["x"], "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": ["x"], "content": BIG},
    ],
    "None as a message": [None],
    "a bare string as a message": ["just text"],
    "an int, a list and an object": [7, [1, 2], object()],
    "role is a list": [{"role": ["user"], "content": "x"}],
    "content of odd types": [{"role": "tool", "content": {"nested": [1, {"a": None}]}}, {"role": "tool", "content": 5}],
    "blocks of odd types": [
        {"role": "user", "content": [None, 3, {"type": ["image"]}, {"type": "image", "x": [[[]]]}]}
    ],
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_the_pruner_never_raises_and_passes_unknown_shapes_through(case: str) -> None:
    msgs = _conversation(MALFORMED[case])
    pristine = [m if type(m) is object else copy.deepcopy(m) for m in msgs]
    pruner = ContextPruner(batch_tokens=200)
    for end in range(3, len(msgs) + 1):
        out = pruner.prune(msgs[:end])
        assert len(out) == end
    assert pruner.boundary > 2  # the well-formed rest was still pruned
    for k, m in enumerate(MALFORMED[case], start=2):
        if not isinstance(m, dict):
            assert out[k] is m  # no known kind: the very same object
        elif case in ("tool_calls is an int", "function is a string"):
            assert out[k]["tool_calls"] == m["tool_calls"]  # an unreadable tool_calls value is kept as it is
    assert msgs == pristine  # inputs untouched
    ContextPruner(batch_tokens=200).prune(msgs)  # a rebuilt pruner too (the replay of the boundary)
    context_health(msgs)
    assert all(approx_tokens(m) > 0 for m in msgs)


def test_the_summarizer_keeps_what_it_cannot_read_and_never_raises() -> None:
    odd: list[Any] = [None, "a bare string", {"role": "assistant", "tool_calls": 5, "content": "x" * 2000}]
    msgs = _conversation(odd)
    summarizer = IncrementalSummarizer(lambda prompt: "summary of the work", trigger_tokens=2000, keep_tokens=500)
    out = summarizer.summarize(msgs)
    assert len(out) < len(msgs)
    assert out[3] is None and out[4] == "a bare string"  # kept after the summary, untouched
    assert summarizer.rounds == 1


def test_replay_skips_unreadable_files_and_counts_runs_a_policy_fails_on(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe not json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "cut.json.gz").write_bytes(b"\x1f\x8b\x08\x00 truncated")
    good = _conversation(MALFORMED["tool_calls is an int"] + MALFORMED["role is a list"])
    (tmp_path / "run.json").write_text(json.dumps({"messages": good}))
    unreadable: list[Path] = []
    runs = load_runs([tmp_path], unreadable)
    assert sorted(p.name for p in unreadable) == ["bad.json", "cut.json.gz", "deep.json"]
    assert len(runs) == 1
    broken = Run("broken", [{"role": "assistant", "tool_calls": 5, "content": None}] * 3)
    rows = {r["policy"]: r for r in replay([*runs, broken], default_policies())}
    assert rows["ours"]["failed_runs"] == 0 and rows["raw"]["failed_runs"] == 0
    assert rows["ours"]["requests"] == rows["raw"]["requests"] > 0


# -- fuzzing ---------------------------------------------------------------------------------
_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_id = st.sampled_from(["a", "b", "c"]) | _junk
_LONG = "some output line\n" * 40  # long enough to be stubbed once old
_args = st.sampled_from(['{"q": 1}', "{", "", "[" * 3000 + "]" * 3000]) | _junk


@st.composite
def _dict_message(draw: st.DrawFn) -> Any:
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return draw(_junk)  # not a message at all
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "function", "other"]) | _junk)
    m: dict[str, Any] = {"role": role, "content": draw(st.text(max_size=30) | st.just(_LONG) | _junk)}
    if draw(st.booleans()):
        calls = draw(
            st.lists(
                st.fixed_dictionaries(
                    {"id": _id, "function": st.fixed_dictionaries({"name": _junk, "arguments": _args})}
                )
                | _junk,
                max_size=3,
            )
            | _junk
        )
        m["tool_calls"] = calls
    if draw(st.booleans()):
        m["tool_call_id"] = draw(_id)
    return m


@st.composite
def _lc_message(draw: st.DrawFn) -> Any:
    shape = draw(st.integers(0, 5))
    content = draw(st.text(max_size=30) | st.just(_LONG))
    if shape == 0:
        return HumanMessage(content=content)
    if shape == 1:
        return ToolMessage(content=content, tool_call_id=draw(st.sampled_from(["a", "b", "c"])))
    if shape == 2:  # built without validation, as a foreign integration might hand it over
        return AIMessage.model_construct(content=draw(_junk), tool_calls=draw(_junk), id=draw(_junk))
    if shape == 3:
        return ToolMessage.model_construct(content=draw(_junk), tool_call_id=draw(_id), status=draw(_junk))
    if shape == 4:
        return AIMessage(
            content=content, tool_calls=[{"id": draw(st.sampled_from(["a", "b"])), "name": "f", "args": {}}]
        )
    return draw(_junk)


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(body=st.lists(_dict_message(), max_size=14), batch=st.sampled_from([0, 50, 3000]))
def test_fuzzed_dict_conversations_never_raise(body: list[Any], batch: int) -> None:
    _check([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, *body], batch)


@_SETTINGS
@given(body=st.lists(_lc_message(), max_size=14), batch=st.sampled_from([0, 50, 3000]))
def test_fuzzed_langchain_conversations_never_raise(body: list[Any], batch: int) -> None:
    _check([SystemMessage(content="s"), HumanMessage(content="u"), *body], batch)


def _check(msgs: list[Any], batch: int) -> None:
    pruner = ContextPruner(batch_tokens=batch, stub_min_chars=50)
    for end in range(1, len(msgs) + 1):
        out = pruner.prune(msgs[:end])
        assert len(out) == end
        for before, after in zip(msgs[:end], out, strict=True):
            if not isinstance(before, dict) and not hasattr(before, "content"):
                assert after is before
    ContextPruner(batch_tokens=batch, stub_min_chars=50).prune(msgs)  # all at once, as after a restart
    context_health(msgs)
    IncrementalSummarizer(lambda prompt: "s", trigger_tokens=100, keep_tokens=20).summarize(msgs)
    replay([Run("fuzz", [m for m in msgs if isinstance(m, dict)])], {"ours": default_policies()["ours"]})
