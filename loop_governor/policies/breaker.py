"""The breaker policy: every attempt of a call asks the tool's (or model endpoint's) breaker.

The breaker's rules -- closed, open, half-open and the one probe -- are pure functions in
[`loop_governor.state.breaker`][loop_governor.state.breaker], shared by every store; this module is the policy that
applies them to a governed call's attempts, and what it tells the model and the trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loop_governor.call import AttemptPolicy, Call, Refused, StopReason
from loop_governor.errors import ErrorType
from loop_governor.outcome import circuit_open
from loop_governor.policies.budget import retry_budget_spent
from loop_governor.state.breaker import ADMIT, ADMIT_DIRTY, BreakerState, Transition

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

# How often a call that waits behind another caller's half-open probe asks again.
_PROBE_POLL_S = 1.0


class Breaker(AttemptPolicy):
    """The call's breaker (per tool, per model endpoint), consulted on every attempt.

    A first attempt may be admitted as the half-open probe. A retry runs only while the
    breaker is closed (another caller's failures may have opened it during our backoff),
    unless the call may wait (below). A permanent failure is an answer -- the service is
    up -- so it counts as a success for the breaker; transient and fatal ones count
    against it. A throttle (429) is neutral: the service is up and pacing us, so it
    neither opens the breaker (seconds of pacing would become a cooldown for the whole
    fleet) nor resets its count of consecutive failures (a gateway answering some
    requests of an outage with 429 would keep it closed); a throttled probe closes it.

    A call that may wait (``max_wait``: model calls) and has no fallback left waits for
    an open breaker's cooldown when it ends within the wait left, then goes in as the
    probe: failing instead would end the agent's step with nowhere else to go. Behind
    another caller's half-open probe it polls (every ``_PROBE_POLL_S``) rather than
    sleeping until that probe would go stale, so it goes in soon after the probe closes
    the breaker. Before a waiting retry takes the probe it checks the task's retry
    budget: a retry the budget then refuses must not hold the probe.
    """

    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before_attempt(self, call: Call) -> float:
        rt, key = self.rt, call.breaker_key
        admission = call.admission
        waits = call.may_wait
        if call.attempt or admission is None:  # else: admitted by the governor's fast path
            if call.attempt:
                if not waits and rt.store.breaker_get(key).state is not BreakerState.CLOSED:
                    raise Refused(StopReason.BREAKER)
                if waits and retry_budget_spent(rt, call):
                    raise Refused(StopReason.BUDGET)  # before a probe is taken, not after (RetryBudget refuses it)
            admission, transition = rt.store.breaker_admit(key, rt.clock, call.policy.breaker)
            if transition is not None:
                self.transition(key, transition, call)
        if not admission.allowed:
            wait = admission.retry_in
            if admission.state is BreakerState.HALF_OPEN:
                wait = min(wait, _PROBE_POLL_S)  # the probe may close it any moment
            if waits and 0 < wait <= call.wait_left:
                call.admission = None  # ask again after the wait
                if not call.breaker_waiting:  # not once per poll behind a half-open probe
                    call.breaker_waiting = True
                    rt.events.emit("breaker_wait", tool=call.name, delay_s=wait, state=admission.state.value)
                return wait
            if call.attempt:
                raise Refused(StopReason.BREAKER)
            raise Refused(StopReason.BREAKER, circuit_open(call.kind, call.name, admission))
        call.admission = admission
        call.breaker_waiting = False
        return 0.0

    def after_attempt_failure(self, call: Call) -> None:
        info, admission = call.info, call.admission
        if info is None:
            return
        probe = admission is not None and admission.probe
        if not info.throttled or probe:  # a throttle is neutral, except as the probe's answer
            self.record(call, info.error_type is ErrorType.PERMANENT or info.throttled, probe)
        call.admission = ADMIT_DIRTY
        if (
            not call.veto
            and not call.may_wait
            and self.rt.store.breaker_get(call.breaker_key).state is BreakerState.OPEN
        ):
            call.veto = StopReason.BREAKER  # our failure (or another caller's) opened it: don't sleep for nothing

    def after_attempt_success(self, call: Call) -> None:
        # Recorded even when admitted clean: another call's failure may have completed
        # while this one ran, and a success completing after it resets the count (the
        # stores skip the write when there is nothing to reset).
        admission = call.admission
        if admission is not None:
            self.record(call, True, admission.probe)
            if admission.probe:
                call.admission = ADMIT  # answered: nothing left to hand back

    def after_attempt_cancelled(self, call: Call) -> None:
        """A half-open probe cancelled in flight gave no verdict. Held, it would keep every
        other caller out for a cooldown; handed back, the next caller probes at once:
        recorded as a failed probe as of one cooldown ago (the stores' own atomic update,
        so the breaker reopens with its cooldown already over). A probe held past a
        cooldown may have been replaced as stale: the newer probe is then the one handed
        back, and at worst two probes run at once."""
        admission = call.admission
        if admission is None or not admission.probe:
            return
        call.admission = None
        rt, key, policy = self.rt, call.breaker_key, call.policy.breaker
        if rt.store.breaker_get(key).state is not BreakerState.HALF_OPEN:
            return  # nothing to hand back (an operator forced it, or the probe went stale)
        rt.store.breaker_record(key, False, True, rt.clock(), policy, backdate_s=policy.cooldown_s)
        rt.events.emit("breaker_probe_abandoned", tool=key)

    def record(self, call: Call, ok: bool, probe: bool) -> None:
        rt = self.rt
        transition = rt.store.breaker_record(call.breaker_key, ok, probe, rt.clock(), call.policy.breaker)
        if transition is not None:
            # the failure that opened it (or kept it open), in the tool's own words
            self.transition(call.breaker_key, transition, call, None if ok or call.info is None else call.info.message)

    def transition(self, key: str, transition: Transition, call: Call, message: str | None = None) -> None:
        opened = transition[1] is BreakerState.OPEN
        self.rt.events.emit(
            "breaker",
            tool=key,
            from_state=transition[0].value,
            to_state=transition[1].value,
            message=message,
            cooldown_s=call.policy.breaker.cooldown_s if opened else None,
        )
