"""Issue 34 must-show: events handed to subscribers and ``partial_results`` are redacted like
every other sink, and a governed call never lets the governor's own error escape, whatever
shape its arguments have (each odd shape gets a stable key of its own)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from lg_langchain import ScriptedChatModel, tool_call
from pydantic import BaseModel

import loop_governor as lg
from langchain_governor import GovernorMiddleware
from loop_governor.keys import call_key

SECRETS = {
    "openai": "sk-proj-Q7w8e9r0t1y2u3i4o5p6a7s8",
    "aws": "AKIAQ7W8E9R0T1Y2U3I4",
    "github": "ghp_Q7w8e9r0t1y2u3i4o5p6a7s8d9f0g1h2",
    "bearer": "Q7w8e9r0t1y2u3i4o5p6bearer",
    "password": "hunter2-Q7w8e9",
    "url": "Q7w8e9r0pw",
    "slack": "xoxb-1234567890-Q7w8e9r0t1",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.Q7w8e9r0t1y2u3i4o5p6",
    "hf": "hf_Q7w8e9r0t1y2u3i4o5p6a7s8d9",
}
PROMPT = (
    f"deploy with OPENAI_API_KEY={SECRETS['openai']} and aws {SECRETS['aws']}; token {SECRETS['github']}; "
    f"Authorization: Bearer {SECRETS['bearer']}; password={SECRETS['password']}; "
    f"db postgres://app:{SECRETS['url']}@db.internal/app; slack {SECRETS['slack']}; jwt {SECRETS['jwt']}; "
    f"hf {SECRETS['hf']}"
)


def _script(messages: list[BaseMessage]) -> AIMessage:
    if not any(isinstance(m, ToolMessage) for m in messages):
        return tool_call("deploy", {"note": PROMPT}, "c1")
    return AIMessage(content="deployed")


def test_model_call_events_a_subscriber_receives_carry_no_secret() -> None:
    """The issue's case: 9 planted secrets in the prompt of a create_agent run; every
    ``model_call`` event (with the prompt: ``record_messages`` is on) reaches the
    subscriber redacted."""

    @tool
    def deploy(note: str) -> str:
        """Deploy."""
        return f"done: {note}"

    governor = lg.Governor()
    events: list[dict[str, Any]] = []
    governor.subscribe(events.append)
    agent = create_agent(ScriptedChatModel(script=_script), [deploy], middleware=[GovernorMiddleware(governor)])

    agent.invoke({"messages": [("user", PROMPT)]})

    calls = [e for e in events if e["event"] == "model_call"]
    assert len(calls) == 2 and all(e["messages"] for e in calls)  # the prompt is there...
    assert "db.internal" in str(calls[-1]["messages"])
    seen = repr(events)
    assert [name for name, secret in SECRETS.items() if secret in seen] == []  # ...its secrets are not


def test_the_trace_still_gets_the_event_as_built_and_redacts_it_itself(tmp_path: Path) -> None:
    from loop_governor.trace import install

    governor = lg.Governor()
    raw: list[dict[str, Any]] = []
    governor.subscribe(raw.append, raw=True)
    lens = install(governor, tmp_path / "trace.jsonl")
    governor.emit("model_call", model="m", messages=[{"role": "user", "content": PROMPT}])
    lens.close()

    assert SECRETS["openai"] in raw[0]["messages"][0]["content"]  # raw: as built
    written = (tmp_path / "trace.jsonl").read_text() + (tmp_path / "trace.snapshots.jsonl").read_text()
    assert "db.internal" in written and not [s for s in SECRETS.values() if s in written]


class Summary(BaseModel):
    title: str
    api_key: str


def test_partial_results_are_redacted_without_a_checkpoint_store() -> None:
    governor = lg.Governor(lg.GovernorConfig(max_steps=1))
    with pytest.raises(lg.FatalError) as stop, governor.task("t1") as scope:
        scope.add_result({"note": PROMPT, "password": "hunter2", "pair": ("a", f"token={SECRETS['github']}")})
        scope.add_result(Summary(title="half done", api_key=SECRETS["openai"]))
        scope.add_result(("plain", 1))
        governor.call("step", lambda: "ok")
        governor.call("step", lambda: "over the budget")

    first, second, third, *tools = stop.value.partial_results
    assert first["password"] == "[REDACTED]" and first["pair"] == ("a", "token=[REDACTED]")
    assert "db.internal" in first["note"] and not [s for s in SECRETS.values() if s in repr(first)]
    assert second == {"title": "half done", "api_key": "[REDACTED]"}  # an object: its redacted JSON form
    assert third == ("plain", 1)  # nothing to hide: as given
    assert tools == [{"tool": "step", "result": "ok"}]


# -- call keys of odd argument shapes ------------------------------------------------------------


def _deep(levels: int) -> list[Any]:
    root: list[Any] = []
    cur = root
    for _ in range(levels):
        cur.append([])
        cur = cur[0]
    return root


def _cycle() -> list[Any]:
    value: list[Any] = ["x"]
    value.append(value)
    return value


ODD = {
    "tuple keys": lambda: {(1, 2): "a", (3,): "b"},
    "mixed int and str keys": lambda: {1: "a", "b": 2},
    "int and str of the same name": lambda: {1: "a", "1": "b"},
    "2,000 deep": lambda: _deep(2000),
    "a cycle": _cycle,
    "a set of mixed members": lambda: {1, "a", (2, 3)},
    "an int of 5,000 digits": lambda: {"n": 10**5000, "beside": [10**4400]},
}


@pytest.mark.parametrize("shape", list(ODD))
def test_a_failing_call_with_odd_arguments_raises_only_the_typed_error(shape: str) -> None:
    governor = lg.Governor()
    calls: list[int] = []

    def lookup(arg: Any) -> None:
        calls.append(1)
        raise ValueError("no such record")

    with governor.task("t1"):
        for _ in range(2):
            with pytest.raises(lg.PermanentError):
                governor.call("lookup", lookup, ODD[shape]())
        assert governor.call("other", lambda arg: "fine", ODD[shape]()) == "fine"
    assert len(calls) == 1  # the same (rebuilt) value has the same key: replayed as known-bad


@pytest.mark.parametrize("shape", list(ODD))
def test_odd_shapes_get_stable_keys_of_their_own(shape: str) -> None:
    key = call_key("t", (ODD[shape](),))
    assert key == call_key("t", (ODD[shape](),))
    others = {name: call_key("t", (make(),)) for name, make in ODD.items() if name != shape}
    assert key not in others.values()
    assert call_key("t", ({(1, 2): "a"},)) != call_key("t", ({(1, 2): "b"},))
    assert call_key("t", ({1: "a", "1": "b"},)) != call_key("t", ({1: "b", "1": "a"},))
    assert call_key("t", (_deep(2000),)) != call_key("t", (_deep(1999),))


def test_odd_shapes_get_the_same_key_in_another_process() -> None:
    code = (
        "import sys; sys.setrecursionlimit(1000)\n"
        "from loop_governor.keys import call_key\n"
        "root = cur = []\n"
        "for _ in range(2000):\n    cur.append([]); cur = cur[0]\n"
        "print(call_key('t', ({(1, 2): 'a', 1: 'b', 'c': root},), {'k': frozenset({3, 'x'})}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == call_key("t", ({(1, 2): "a", 1: "b", "c": _deep(2000)},), {"k": frozenset({3, "x"})})


def test_plain_json_arguments_keep_the_keys_they_had() -> None:
    """Checkpoints written before keep resuming: JSON-encodable arguments are keyed as before."""
    payload = json.dumps([["units"], {"page": 2}], sort_keys=True, separators=(",", ":"))
    assert call_key("search", ("units",), {"page": 2}) == f"search:{hashlib.sha256(payload.encode()).hexdigest()[:32]}"


@dataclasses.dataclass
class Point:
    x: float
    y: float


def test_equal_values_share_a_key_and_negative_zero_is_zero() -> None:
    assert call_key("p", (0.0,)) == call_key("p", (-0.0,))
    assert call_key("p", (Point(-0.0, 1.0),)) == call_key("p", (Point(0.0, 1.0),))
    assert call_key("p", ({"v": [-0.0]},)) == call_key("p", ({"v": [0.0]},))
    assert call_key("p", ({-0.0},)) == call_key("p", ({0.0},))
    # equal to Python but not to a tool, which reads different JSON: different keys
    assert len({call_key("p", (v,)) for v in (1, 1.0, True)}) == 3
    assert call_key("p", (-0.001,)) != call_key("p", (0.001,))
    assert call_key("p", ("-0.0",)) != call_key("p", ("0.0",))
