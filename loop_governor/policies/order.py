"""The order of the chain: which policies a governed call runs through, first to last.

``before`` runs first to last, and so do ``after_success`` and ``after_failure``; a policy
whose config leaves it nothing to do ([`applies`][loop_governor.call.Policy.applies]) is
left out. The order is part of the behaviour, so it is written once, here:

* [`Report`][loop_governor.policies.report.Report] first: it sees every call, refused ones included.
* Resume ([`Checkpointing`][loop_governor.policies.checkpointing.Checkpointing]) before any guard: a
  call the checkpoint answers was never made in this run.
* [`Withdrawn`][loop_governor.policies.ladder.Withdrawn] before the memory and the budgets: a call of
  a withdrawn tool is refused or ends the run, and spends nothing.
* [`KnownBad`][loop_governor.policies.known_bad.KnownBad] before the budgets: an answer from memory
  is no call.
* The budgets, then the guards that read the outcome (polls, repeated errors, escalation,
  no progress, cycles).
* [`World`][loop_governor.policies.known_bad.World] after the guards: they judge this very call in
  the world it was made in, then a success of a tool that may change state moves it on.
* [`Failures`][loop_governor.policies.report.Failures]: the failure as the model reads it, once every
  policy shaped it.
* [`RunStop`][loop_governor.policies.checkpointing.RunStop] last: whatever stopped the run, its
  checkpoint is saved.

Around each attempt, the rate limit comes first: a call it holds back or refuses must not
hold the breaker's one half-open probe, nor have spent a unit of the task's retry budget.
"""

from __future__ import annotations

from loop_governor.call import AttemptPolicy, Policy
from loop_governor.policies.breaker import Breaker
from loop_governor.policies.budget import RetryBudget, TaskBudget, TokenBudget
from loop_governor.policies.checkpointing import Checkpointing, RunStop
from loop_governor.policies.compaction import Compaction
from loop_governor.policies.cycles import Cycles
from loop_governor.policies.escalation import Escalation
from loop_governor.policies.known_bad import KnownBad, World
from loop_governor.policies.ladder import Withdrawn
from loop_governor.policies.polls import Polls
from loop_governor.policies.progress import NoProgress
from loop_governor.policies.ratelimit import RateLimit
from loop_governor.policies.repeats import RepeatedErrors
from loop_governor.policies.report import Failures, Report

DEFAULT_ORDER: tuple[type[Policy], ...] = (
    Report,
    Checkpointing,
    Withdrawn,
    KnownBad,
    TaskBudget,
    TokenBudget,
    Polls,
    RepeatedErrors,
    Escalation,
    NoProgress,
    Cycles,
    World,
    Failures,
    RunStop,
)
"""The policies around the whole call, first to last."""

DEFAULT_ATTEMPT_ORDER: tuple[type[AttemptPolicy], ...] = (RateLimit, Breaker, RetryBudget, Compaction)
"""The policies around each attempt, first to last."""

__all__ = ["DEFAULT_ATTEMPT_ORDER", "DEFAULT_ORDER"]
