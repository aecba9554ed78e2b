"""Task budgets: iterations, model and tool calls, tokens, cost, wall time -- and retries.

Every budget is a hard stop, checked *before* the call it would exceed, so a cap is
exact: ``max_steps=4`` lets 4 agent iterations run and refuses the 5th model call with
[`BudgetExhaustedError`][loop_governor.errors.BudgetExhaustedError], carrying the partial results.

An iteration is what the frameworks' own loops count: one model decision and the tool
calls it asked for. A task whose tools are governed but whose model is not (plain
Python, a legacy executor) has no decisions to count, so there every tool call is an
iteration of its own.

[`RetryBudget`][loop_governor.policies.budget.RetryBudget] is the task-level retry budget shared by every tool and model
call of the task: retries beyond it are not made, whatever the per-call attempt limit says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import MODEL, TOOL, AttemptPolicy, Call, Policy, Refused, Resumed, StopReason
from loop_governor.errors import BudgetExhaustedError, ErrorType, GovernedError

if TYPE_CHECKING:
    from loop_governor.config import GovernorConfig
    from loop_governor.runtime import Runtime
    from loop_governor.task import TaskScope
    from loop_governor.usage import Usage


def _spent(
    config: GovernorConfig,
    scope: TaskScope,
    kind: str,
    name: str | None,
    limit: int | None,
    now: float,
    wall: float | None = None,
    key: str | None = None,
) -> tuple[str, float, float] | None:
    """The first budget this call would exceed, as (name, limit, used)."""
    if kind == MODEL:
        if config.max_steps is not None and scope.steps >= config.max_steps:
            return "max_steps", config.max_steps, scope.steps
        if config.max_model_calls is not None and scope.model_calls >= config.max_model_calls:
            return "max_model_calls", config.max_model_calls, scope.model_calls
    else:
        if scope.model_calls == 0 and config.max_steps is not None and scope.steps >= config.max_steps:
            return "max_steps", config.max_steps, scope.steps
        if config.max_tool_calls is not None and scope.tool_calls >= config.max_tool_calls:
            return "max_tool_calls", config.max_tool_calls, scope.tool_calls
        key = key or name
        if limit is not None and key is not None and scope.calls_of(key) >= limit:
            return "max_calls", limit, scope.calls_of(key)
        if wall is not None and key is not None:
            first = scope.first_call_at.setdefault(key, now)
            if now - first >= wall:
                return "max_wall_s", wall, now - first
    if config.max_tokens is not None and scope.tokens >= config.max_tokens:
        return "max_tokens", config.max_tokens, scope.tokens
    if config.max_cost is not None and scope.cost >= config.max_cost:
        return "max_cost", config.max_cost, scope.cost
    if config.max_wall_s is not None and now - scope.started_at >= config.max_wall_s:
        return "max_wall_s", config.max_wall_s, now - scope.started_at
    return None


def charge(
    rt: Runtime,
    scope: TaskScope,
    kind: str,
    name: str | None,
    limit: int | None = None,
    wall: float | None = None,
    key: str | None = None,
) -> None:
    """Count one ``"model"`` or ``"tool"`` call against the task; raise
    BudgetExhaustedError (with the partial results) instead when a budget is spent.
    ``limit`` is the tool's own ``max_calls``; ``wall`` its own ``max_wall_s`` (seconds
    from its first call in the task: a poll's bound); ``key`` what those two count by
    (default ``name``; a poll's polled arguments)."""
    if rt.limited:
        spent = _spent(rt.config, scope, kind, name, limit, rt.clock(), wall, key)
        if spent is not None:
            raise _exhausted(rt, scope, name, *spent)
    if kind == MODEL:
        scope.steps += 1
        scope.model_calls += 1
        return
    if scope.model_calls == 0:
        scope.steps += 1
    scope.tool_calls += 1
    counted = key or name
    if limit is not None and counted is not None:
        scope.count_call(counted)


def _exhausted(
    rt: Runtime, scope: TaskScope, name: str | None, budget: str, limit: float, used: float
) -> BudgetExhaustedError:
    info = GovernedError(
        error_type=ErrorType.FATAL,
        tool=name,
        code=budget,
        message=f"task {scope.task_id} spent its budget {budget}={limit:g} (used {used:g})",
        signature=f"{name or '-'}:BudgetExhaustedError:{budget}",
        advice="the task budget is spent: stop and report what was done",
    )
    rt.events.emit("budget_exhausted", budget=budget, limit=limit, used=used, tool=name)
    return BudgetExhaustedError(info, partial_results=scope.results)


def record_usage(rt: Runtime, scope: TaskScope, model: str | None, usage: Usage) -> None:
    """Add one model call's tokens (and their price) to the task: ``max_tokens`` and
    ``max_cost`` stop the next call."""
    scope.tokens += usage.input_tokens + usage.output_tokens
    prices = rt.config.prices
    if not prices:
        return
    # "openai:gpt-4o" is priced as "openai:gpt-4o", else as "gpt-4o", else as "default"
    name = model or ""
    price = prices.get(name) or prices.get(name.rpartition(":")[2]) or prices.get("default")
    if price is not None:
        scope.cost += price.cost(
            usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_creation_tokens
        )
    else:
        rt.events.emit("unpriced_model", model=model)


class TaskBudget(Policy):
    """Counts every call of a task and refuses the one that would exceed a budget."""

    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before(self, call: Call) -> Resumed | None:
        scope = call.scope
        assert scope is not None
        if call.kind == TOOL and not self.rt.tools_limited:  # the common case, inline: count and go
            if scope.model_calls == 0:
                scope.steps += 1
            scope.tool_calls += 1
            return None
        try:
            if call.kind == TOOL:  # (a poll's own bounds are per job: loop_governor.policies.polls)
                charge(self.rt, scope, TOOL, call.name, call.policy.max_calls, call.policy.max_wall)
            else:
                charge(self.rt, scope, call.kind, call.name)
        except BudgetExhaustedError:
            call.stop_reason = StopReason.TASK_BUDGET  # reported as budget_exhausted, not as a failed call
            raise
        return None


class TokenBudget(Policy):
    """Adds each model call's usage (reported, or estimated) to the task's tokens and cost."""

    kinds = frozenset({MODEL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_success(self, call: Call, result: Any) -> Any:
        if call.usage is not None and call.scope is not None:
            record_usage(self.rt, call.scope, call.name, call.usage)
        return result


def retry_takes_unit(call: Call) -> bool:
    """Whether the attempt ``call`` is about to make takes a unit of the task's retry
    budget: not a first attempt, a retry after compaction (a new request) or after a
    throttle waited out (a turn waited for, bounded by max_wait)."""
    return call.scope is not None and call.pending is None and not call.waits_out_throttle


def retry_budget_spent(rt: Runtime, call: Call) -> bool:
    """Whether the retry ``call`` is about to make would take a unit of the task's retry
    budget that is gone: what `RetryBudget` refuses, asked ahead (the breaker asks before
    a waiting retry takes the half-open probe)."""
    scope = call.scope
    if scope is None or not retry_takes_unit(call):
        return False
    return rt.store.budget_used(scope.task_id) >= rt.config.task_retry_budget


class RetryBudget(AttemptPolicy):
    """The task's retry budget: each retry takes one unit, shared by all of the task's calls."""

    first_attempt = False
    __slots__ = ("limit", "rt")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.limit = rt.config.task_retry_budget

    def before_attempt(self, call: Call) -> float:
        scope = call.scope
        if scope is None or not retry_takes_unit(call):
            return 0.0
        if not self.rt.store.budget_take(scope.task_id, self.limit):
            raise Refused(StopReason.BUDGET)  # another call of the task spent it during our sleep
        return 0.0

    def after_attempt_failure(self, call: Call) -> None:
        scope, info = call.scope, call.info
        if scope is None or info is None or info.error_type is not ErrorType.TRANSIENT or call.veto:
            return
        if call.waits_out_throttle:
            return
        if self.rt.store.budget_used(scope.task_id) >= self.limit:
            call.veto = StopReason.BUDGET  # the unit is taken when the retry really runs, after the sleep
