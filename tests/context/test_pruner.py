"""Behaviour of each pruning policy, on OpenAI-style dicts and on LangChain messages."""

from __future__ import annotations

import copy
from typing import Any

from loop_governor.context import PIN_KEY, ContextPruner, context_health


def _run_incremental(pruner: ContextPruner, msgs: list[Any], kind: Any) -> list[list[Any]]:
    return [pruner.prune(msgs[:i]) for i in kind.requests_of(msgs)]


def test_last_three_results_verbatim_older_long_ones_stubbed(kind: Any) -> None:
    msgs = kind.run(steps=12, result_chars=3000)
    out = ContextPruner(batch_tokens=0).prune(msgs)
    tool_pos = [i for i, m in enumerate(msgs) if i % 2 == 1 and i > 1]
    for i in tool_pos[-3:]:
        assert out[i] is msgs[i]
    for i in tool_pos[:-3]:
        text = kind.text(out[i])
        assert text.startswith("[old result of bash (args sha ")
        assert "chars" in text or "KB" in text
        assert len(text) < 200
    assert len(out) == len(msgs)


def test_short_old_results_are_kept(kind: Any) -> None:
    msgs = kind.run(steps=8, result_chars=200)
    out = ContextPruner(batch_tokens=0).prune(msgs)
    assert [kind.text(m) for m in out] == [kind.text(m) for m in msgs]


def test_trim_mode_keeps_head_and_tail_beyond_5000_chars(kind: Any) -> None:
    msgs = kind.run(steps=6, result_chars=3000)
    big = "HEAD" + "x" * 9000 + "TAIL"
    msgs[3] = kind.tool("c0", big)
    out = ContextPruner(batch_tokens=0, old_results="trim").prune(msgs)
    text = kind.text(out[3])
    assert text.startswith("HEAD") and text.endswith("TAIL")
    assert "chars trimmed" in text and len(text) < 3100
    assert kind.text(out[5]) == kind.text(msgs[5])  # 3000 chars: under the trim threshold


def test_old_tool_call_arguments_stubbed_recent_kept(kind: Any) -> None:
    msgs = kind.run(steps=8, result_chars=100, arg_chars=4000)
    out = ContextPruner(batch_tokens=0).prune(msgs)
    old_args, new_args = kind.args(out[2]), kind.args(out[-2])
    assert old_args["command"] == "cat f0.py"  # short strings stay
    assert old_args["body"].startswith("[elided: ") and "sha" in old_args["body"]
    assert new_args == kind.args(msgs[-2])


def test_langchain_raw_tool_calls_follow_trimmed_args() -> None:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    body = "z" * 5000
    raw = [{"id": "c0", "type": "function", "function": {"name": "write", "arguments": f'{{"body": "{body}"}}'}}]
    msgs: list[Any] = [SystemMessage("s"), HumanMessage("task")]
    msgs.append(
        AIMessage(
            "",
            tool_calls=[{"id": "c0", "name": "write", "args": {"body": body}}],
            additional_kwargs={"tool_calls": raw},
        )
    )
    msgs.append(ToolMessage("ok", tool_call_id="c0"))
    for s in range(1, 5):
        msgs.append(AIMessage("", tool_calls=[{"id": f"c{s}", "name": "ls", "args": {}}]))
        msgs.append(ToolMessage("ok", tool_call_id=f"c{s}"))
    out = ContextPruner(batch_tokens=0).prune(msgs)
    assert out[2].tool_calls[0]["args"]["body"].startswith("[elided")
    assert body not in out[2].additional_kwargs["tool_calls"][0]["function"]["arguments"]
    assert msgs[2].additional_kwargs["tool_calls"][0]["function"]["arguments"].count("z") == 5000


def test_base64_and_images_replaced_by_sized_placeholder(kind: Any) -> None:
    png = "iVBORw0KGgo" + "A" * 20_000
    msgs = kind.run(steps=2, result_chars=100)
    msgs.insert(
        2,
        kind.user(
            [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
            ]
        ),
    )
    msgs.append(kind.ai("shot", [("s1", "screenshot", {})]))
    msgs.append(kind.tool("s1", f"saved data:image/jpeg;base64,{png} done"))
    out = ContextPruner().prune(msgs)
    placeholder = out[2].content if isinstance(out[2], dict) is False else out[2]["content"]
    assert "image_url removed: image/png" in str(placeholder) and png not in str(placeholder)
    # The current turn (after the last assistant message) is shown once as it is.
    assert png in kind.text(out[-1])
    msgs.append(kind.ai("next", [("s2", "ls", {})]))
    msgs.append(kind.tool("s2", "ok"))
    out = ContextPruner().prune(msgs)
    text = kind.text(out[-3])
    assert png not in text and "[image/jpeg data removed:" in text and text.endswith(" done")


def test_protected_messages_untouched(kind: Any) -> None:
    blob = "data:image/png;base64," + "B" * 5000
    msgs = kind.run(steps=8, result_chars=3000)
    msgs[0] = kind.system("policy " + blob)
    msgs[1] = kind.user("task " + blob)
    if kind.kind == "dict":
        pinned = {"role": "user", "content": "remember " + "p" * 3000, PIN_KEY: True}
    else:
        pinned = kind.user("remember " + "p" * 3000, additional_kwargs={PIN_KEY: True})
    msgs.insert(4, pinned)
    msgs.insert(5, kind.user("later " + blob))
    out = ContextPruner(batch_tokens=0).prune(msgs)
    assert out[0] is msgs[0] and out[1] is msgs[1] and out[4] is msgs[4]
    assert blob not in str(kind.text(out[5]))


def test_pinned_by_id(kind: Any) -> None:
    msgs = kind.run(steps=8, result_chars=3000)
    if kind.kind == "dict":
        msgs[3] = {**msgs[3], "id": "keep-me"}
    else:
        msgs[3] = msgs[3].model_copy(update={"id": "keep-me"})
    out = ContextPruner(batch_tokens=0, pinned_ids=["keep-me"]).prune(msgs)
    assert out[3] is msgs[3]
    assert kind.text(out[5]).startswith("[old result")


def test_identical_errors_collapse_with_count(kind: Any) -> None:
    msgs = [kind.system("s"), kind.user("task")]
    for s in range(6):
        msgs.append(kind.ai("", [(f"c{s}", "deploy", {"try": s})]))
        msgs.append(kind.tool(f"c{s}", "connection refused", error=True))
    for s in range(6, 10):
        msgs.append(kind.ai("", [(f"c{s}", "ls", {"n": s})]))
        msgs.append(kind.tool(f"c{s}", "ok"))
    out = ContextPruner(batch_tokens=0).prune(msgs)
    errors = [kind.text(out[3 + 2 * s]) for s in range(6)]
    assert all(e.startswith("[error from deploy") and "same error occurs again" in e for e in errors[:5])
    assert "connection refused" in errors[5] and "occurred 6 times" in errors[5]


def test_superseded_result_elided(kind: Any) -> None:
    msgs = [kind.system("s"), kind.user("task")]
    msgs += [kind.ai("", [("a", "read", {"path": "x.py"})]), kind.tool("a", "v1 of x")]
    msgs += [kind.ai("", [("b", "read", {"path": "x.py"})]), kind.tool("b", "v2 of x")]
    for s in range(4):
        msgs += [kind.ai("", [(f"c{s}", "ls", {"n": s})]), kind.tool(f"c{s}", "ok")]
    out = ContextPruner(batch_tokens=0).prune(msgs)
    assert "superseded by a later identical call" in kind.text(out[3])
    assert kind.text(out[5]) == "v2 of x"


def test_input_not_mutated_and_same_kind_out(kind: Any) -> None:
    msgs = kind.run(steps=10, result_chars=6000, arg_chars=3000)
    snapshot = copy.deepcopy(msgs)
    out = ContextPruner(batch_tokens=0).prune(msgs)
    assert msgs == snapshot
    assert all(type(a) is type(b) for a, b in zip(out, msgs, strict=True))
    assert out != msgs


def test_batches_keep_prefix_identical_between_moves(kind: Any) -> None:
    msgs = kind.run(steps=40, result_chars=2000, arg_chars=1500)
    pruner = ContextPruner(batch_tokens=3000)
    prev: list[Any] | None = None
    moves = 0
    for end in kind.requests_of(msgs):
        out = pruner.prune(msgs[:end])
        report = pruner.last_report
        assert report is not None
        if prev is not None:
            if report.advanced:
                moves += 1
            else:
                assert out[: len(prev)] == prev  # the request only grew at the end
        prev = out
    assert 2 <= moves <= 20  # batched: far fewer moves than the 41 requests
    raw = sum(len(str(m)) for m in msgs)
    assert sum(len(str(m)) for m in prev or []) < raw / 2


def test_rebuilt_pruner_reproduces_the_same_bytes(kind: Any) -> None:
    msgs = kind.run(steps=30, result_chars=2500, arg_chars=1200)
    live = _run_incremental(ContextPruner(), msgs, kind)[-1]
    assert ContextPruner().prune(msgs) == live
    assert ContextPruner().prune(copy.deepcopy(msgs)) == live


def test_history_rewrite_resets_cleanly(kind: Any) -> None:
    msgs = kind.run(steps=20, result_chars=3000)
    pruner = ContextPruner()
    pruner.prune(msgs)
    shorter = msgs[:2] + msgs[10:]
    assert pruner.prune(shorter) == ContextPruner().prune(shorter)


def test_pluggable_token_counter_drives_batching(kind: Any) -> None:
    msgs = kind.run(steps=10, result_chars=3000)
    calls: list[Any] = []

    def counter(m: Any) -> int:
        calls.append(m)
        return 1

    pruner = ContextPruner(token_counter=counter, batch_tokens=10)
    pruner.prune(msgs)
    assert calls and pruner.last_report is not None
    assert pruner.last_report.tokens_before == len(msgs)


def test_context_health_counts_errors_and_repeats(kind: Any) -> None:
    msgs = [kind.system("s"), kind.user("t")]
    msgs += [kind.ai("", [("a", "read", {"p": 1})]), kind.tool("a", "boom", error=True)]
    msgs += [kind.ai("", [("b", "read", {"p": 1})]), kind.tool("b", "fine")]
    msgs += [kind.ai("", [("c", "read", {"p": 2})]), kind.tool("c", "fine")]
    msgs += [kind.ai("", [("d", "read", {"p": 3})]), kind.tool("d", "fine")]
    h = context_health(msgs)
    assert (h.tool_results, h.errors, h.duplicates) == (4, 1, 1)
    assert h.score == 0.5
    pruner = ContextPruner()
    pruner.prune(msgs)
    assert pruner.health == h


def test_ten_megabyte_output_is_capped_even_when_recent(kind: Any) -> None:
    msgs = kind.run(steps=1, result_chars=100)
    huge = "log line ünïcode 🚀\n" * 550_000
    msgs.append(kind.ai("", [("h", "bash", {"command": "cat big.log"})]))
    msgs.append(kind.tool("h", huge))
    out = ContextPruner().prune(msgs)
    assert len(kind.text(out[-1])) < 110_000 and "chars trimmed" in kind.text(out[-1])
    assert kind.text(msgs[-1]) is huge
