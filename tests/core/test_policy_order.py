"""The chain's written order, the fast path's check at construction, and the stop reasons'
wire values (a str enum: events, traces and log lines carry the same text as before)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import loop_governor as lg
from loop_governor import governor as governor_module
from loop_governor.call import Call, Policy, Resumed, StopReason
from loop_governor.policies.order import DEFAULT_ATTEMPT_ORDER, DEFAULT_ORDER


def _names(gov: lg.Governor) -> tuple[list[str], list[str]]:
    plan = gov._chain.plan_of("tool", in_task=True, rated=True, heard=True)
    return (
        [hook.__self__.__class__.__name__ for hook in (*plan.before, *plan.after_success, *plan.after_failure)],
        [hook.__self__.__class__.__name__ for hook in plan.before_retry],
    )


def test_the_chain_follows_the_written_order() -> None:
    gov = lg.Governor(lg.GovernorConfig(tools={"status": lg.ToolPolicy(poll=True)}), clock=lambda: 0.0)
    order = [cls.__name__ for cls in DEFAULT_ORDER]
    policies, attempts = _names(gov)
    assert sorted(set(policies), key=order.index) == [n for n in order if n in set(policies)]
    assert "Polls" in policies and "Checkpointing" not in policies  # only what the config uses
    assert attempts == [cls.__name__ for cls in DEFAULT_ATTEMPT_ORDER if cls.__name__ != "Compaction"]


class _BeforeEverywhere(Policy):
    in_task_only = False

    def __init__(self, rt: Any) -> None:
        self.rt = rt

    def before(self, call: Call) -> Resumed | None:
        return None


def test_a_before_moment_outside_a_task_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(governor_module, "DEFAULT_ORDER", (*DEFAULT_ORDER, _BeforeEverywhere))
    with pytest.raises(TypeError, match="_BeforeEverywhere: a before moment outside a task"):
        lg.Governor()


class _InTask(_BeforeEverywhere):
    in_task_only = True


def test_a_before_moment_inside_tasks_only_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(governor_module, "DEFAULT_ORDER", (*DEFAULT_ORDER, _InTask))
    assert lg.Governor().call("t", lambda: 1) == 1


def test_stop_reasons_keep_their_text() -> None:
    assert {r.value for r in StopReason} == {
        "attempts", "retry_after", "wait", "compaction", "breaker", "budget", "rate_limited",
        "known_bad", "poll_bound", "withdrawn", "stopped", "task_budget",
    }  # fmt: skip
    for reason in StopReason:
        assert reason == reason.value and str(reason) == f"{reason}" == reason.value
        assert json.dumps({"stop_reason": reason}) == json.dumps({"stop_reason": reason.value})
