"""Why a governed call ended short of its answer: the one vocabulary policies, events,
log lines and the trace share (a module of its own, importing nothing, so the event
readers below the policies use it too)."""

from __future__ import annotations

from enum import Enum


class StopReason(str, Enum):
    """Why a call ended short of its answer: ``Call.stop_reason``, and the ``stop_reason``
    of its ``tool_call`` / ``model_call`` events. A ``str`` enum: the events, the trace
    and the log lines carry its value, the same text as before it was an enum.

    Why the retry loop ended: ``ATTEMPTS`` (the attempt limit), ``RETRY_AFTER`` (the service
    asked for a longer pause than the call may wait), ``WAIT`` (waiting on would pass the
    call's wait limit), ``COMPACTION`` (the prompt cannot be cut shorter). Why an attempt
    was refused (first attempt: the call was never made), also a policy's veto of further
    retries: ``BREAKER``, ``BUDGET`` (the task's retry budget), ``RATE_LIMITED``. Why a call
    was answered without running: ``KNOWN_BAD``, ``POLL_BOUND``, ``WITHDRAWN`` (the tool is
    withdrawn: refused, the run goes on), ``STOPPED`` (a withdrawn tool called anyway: the
    run ends), ``TASK_BUDGET`` (a task budget is spent: reported as ``budget_exhausted``).
    """

    ATTEMPTS = "attempts"
    RETRY_AFTER = "retry_after"
    WAIT = "wait"
    COMPACTION = "compaction"
    BREAKER = "breaker"
    BUDGET = "budget"
    RATE_LIMITED = "rate_limited"
    KNOWN_BAD = "known_bad"
    POLL_BOUND = "poll_bound"
    WITHDRAWN = "withdrawn"
    STOPPED = "stopped"
    TASK_BUDGET = "task_budget"

    def __str__(self) -> str:
        return self.value
