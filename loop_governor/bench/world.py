"""The simulated world: downstream services, their seeded fault schedule, the scenarios.

Everything here is a function of the seed and of *virtual* time, never of which arm
runs: a search index that answers 429 for 40 minutes does so for the baseline, the
built-ins and the governed agent alike. Randomness ("flaky" services, model latency)
is a hash of (seed, world, tool, time slot) or (seed, task, turn), so the same seed
gives the same faults whatever the agent does in between. The exceptions are limits
that answer to load, as real ones do: a service's capacity (requests in flight) and
the API key's request limit ([`loop_governor.bench.provider`][loop_governor.bench.provider]).

The scenarios are the incidents the seeds describe, plus faults of the model call
itself (see ``SCENARIOS``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, create_model

from loop_governor.bench.clock import VirtualClock
from loop_governor.bench.determinism import CURRENT_TASK, unit_hash
from loop_governor.bench.provider import ModelFault, key_rate_limit, overloaded_burst, quota_after

# -- world constants (documented in the README of this package and printed by --json) --
TOOL_LATENCY_S = 1.5  # one downstream request, success or fast error
MODEL_BASE_S = 12.0  # one model turn: base latency ...
MODEL_PER_MESSAGE_S = 0.25  # ... plus this per message in the prompt (longer context, slower turn)
MODEL_NOISE_S = 4.0  # ... plus a seeded 0..4 s, so concurrent tasks are not in lock-step
TASK_DEADLINE_S = 45 * 60.0  # a task still running after 45 virtual minutes is stopped: failed
RESTART_DELAY_S = 60.0  # a crashed worker is restarted once, after this long
RESULT_PREFIX = "RESULT "  # what a successful tool answer starts with

VARIANT_MARK = " ~v"  # a model's "changed arguments" retry: same request, different text


class ServiceError(Exception):
    """What the fake services raise: shaped like an SDK's HTTP status error."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status_code = status
        self.headers = headers or {}


class SimulatedCrash(BaseException):
    """The worker process dies mid-task (OOM-kill, deploy): nothing in-process survives.

    A ``BaseException`` so no ``except Exception`` in a framework or the governor turns a
    process death into text; the harness restarts the task once, as a supervisor would.
    """


# -- the plan a task follows ------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One way to get a sub-task done: a tool call."""

    tool: str
    args: tuple[tuple[str, Any], ...]

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)


def opt(tool: str, **kwargs: Any) -> Option:
    return Option(tool, tuple(sorted(kwargs.items())))


def varied(option: Option, n: int) -> Option:
    """``option`` with its arguments changed for the ``n``-th time, in a way that fixes
    nothing: its first text argument gets a suffix the services ignore (``canonical``).

    A model that retries "with changed arguments" rarely finds the fix the plan does not
    list; the services treat the variant as the same request, while the governor sees a
    new call (a different key), as it would with a real model's rewording. Options with
    no text argument cannot vary: the retry is the identical call.
    """
    if n <= 0:
        return option
    for i, (key, value) in enumerate(option.args):
        if isinstance(value, str):
            args = (*option.args[:i], (key, f"{value}{VARIANT_MARK}{n}"), *option.args[i + 1 :])
            return Option(option.tool, args)
    return option


_VARIANT = re.compile(re.escape(VARIANT_MARK) + r"\d+$")


def canonical(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request a service sees: a varied argument is the argument it varies."""
    return {k: _VARIANT.sub("", v) if isinstance(v, str) else v for k, v in kwargs.items()}


@dataclass(frozen=True)
class SubTask:
    """A unit of work with its result; options are tried in order (primary first)."""

    sid: str
    options: tuple[Option, ...]
    required: bool = True


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    scenario: str
    goal: str
    plan: tuple[SubTask, ...]

    @property
    def tools(self) -> list[str]:
        return list(self.tool_schemas())

    def tool_schemas(self) -> dict[str, type[BaseModel]]:
        """One argument schema per service the plan uses (both frameworks build tools from it)."""
        fields: dict[str, dict[str, Any]] = {}
        for sub in self.plan:
            for option in sub.options:
                tool_fields = fields.setdefault(option.tool, {})
                for key, value in option.args:
                    tool_fields[key] = (type(value), ...)
        return {name: create_model(f"{name}_args", **spec) for name, spec in fields.items()}

    def answered(self, answer: str | None) -> bool:
        """Whether the run's final ``answer`` finishes the task once its sub-tasks are done
        (a plan's steps are the work; a one-goal task also needs its answer)."""
        return True

    def tool_description(self, tool: str) -> str:
        """What the model is told a tool does."""
        return f"Call the {tool} service."

    @property
    def expected_model_calls(self) -> int:
        """Model calls a model that follows the plan needs: one per step and a final answer."""
        return len(self.plan) + 1

    def delivered_from(self, requests: list[Request], answer: str | None) -> list[str]:
        """The sub-tasks a real model's work delivered, from the services' log of its
        ``requests`` and its final ``answer`` (``None``: the run was stopped): those its
        successful calls deliver ([`delivered_by`][loop_governor.bench.world.TaskSpec.delivered_by]). One-goal tasks
        score otherwise ([`loop_governor.bench.tiers.GoalTask`][loop_governor.bench.tiers.GoalTask])."""
        return self.delivered_by([(r.tool, r.args) for r in requests if r.ok])

    def delivered_by(self, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """The sub-tasks that successful ``calls`` (tool, arguments) deliver, in plan order.

        How a real model's work is scored (a scripted model lists what it delivered in its
        answer; a real one writes prose): a sub-task is delivered by a successful call of
        one of its options' tools with that option's arguments. Text compares without case
        or surrounding blanks; an argument on which two options of the same tool differ
        (the ticket's priority: the invalid one and its correction) may take any value the
        service accepts.
        """

        def norm(value: Any) -> Any:
            return value.strip().casefold() if isinstance(value, str) else value

        done = [(tool, {k: norm(v) for k, v in args.items()}) for tool, args in calls]
        out = []
        for sub in self.plan:
            for option in sub.options:
                free = {
                    key
                    for other in sub.options
                    if other.tool == option.tool
                    for key, value in other.args
                    if option.kwargs.get(key) != value
                }
                wanted = {k: norm(v) for k, v in option.args if k not in free}
                if any(t == option.tool and all(a.get(k) == v for k, v in wanted.items()) for t, a in done):
                    out.append(sub.sid)
                    break
        return out


Fault = Callable[["Downstream", str, dict[str, Any], float], BaseException | None]
"""(world, tool, args, seconds since the world started) -> the failure to raise, or None."""

Answerer = Callable[["Downstream", str, dict[str, Any], float], str]
"""(world, tool, args, seconds since the world started) -> what a successful call returns,
for a service whose answer means something (a critic's verdict, a job's progress) instead
of the ``RESULT ...`` line."""


@dataclass
class Request:
    task: str
    tool: str
    start: float
    end: float
    ok: bool
    args: dict[str, Any] = field(default_factory=dict)  # as the service read them (``canonical``)


@dataclass
class Downstream:
    """All services of one world: runs requests on virtual time, records every one."""

    clock: VirtualClock
    seed: int
    world: str
    faults: dict[str, Fault]
    capacity: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    requests: list[Request] = field(default_factory=list)
    inflight: dict[str, int] = field(default_factory=dict)
    crashed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    error_latency_s: float = TOOL_LATENCY_S  # how long a failing request takes to come back
    answers: dict[str, Answerer] = field(default_factory=dict)  # services with an answer of their own

    def call(self, tool: str, kwargs: dict[str, Any]) -> str:
        kwargs = canonical(kwargs)
        start = self.clock()
        with self.lock:
            load = self.inflight.get(tool, 0) + 1
            self.inflight[tool] = load
        fault: BaseException | None
        cap = self.capacity.get(tool)
        if cap is not None and load > cap:
            fault = ServiceError(503, f"{tool} overloaded, try later")
        else:
            rule = self.faults.get(tool)
            fault = rule(self, tool, kwargs, start - self.started_at) if rule is not None else None
        try:
            self.clock.sleep(TOOL_LATENCY_S if fault is None else self.error_latency_s)
        finally:
            with self.lock:
                self.inflight[tool] -= 1
                self.requests.append(Request(CURRENT_TASK.get(), tool, start, self.clock(), fault is None, kwargs))
        if fault is not None:
            raise fault
        answer = self.answers.get(tool)
        if answer is not None:
            return answer(self, tool, kwargs, start - self.started_at)
        arg_text = ",".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
        return f"{RESULT_PREFIX}{tool}({arg_text}) ok"

    def peak_concurrency(self, tool: str | None = None) -> int:
        """Most requests in flight at once (to ``tool``, or any single service)."""
        return _peak_in_flight([r for r in self.requests if tool is None or r.tool == tool])

    def peak_retry_rate(self, tool: str | None = None, window_s: float = 1.0) -> int:
        """Most retries to one service starting within ``window_s`` (see
        [`peak_retry_rate`][loop_governor.bench.world.Downstream.peak_retry_rate])."""
        requests = [r for r in self.requests if tool is None or r.tool == tool]
        return peak_retry_rate(requests, window_s)


def _peak_in_flight(requests: list[Request]) -> int:
    """Most of ``requests`` in flight at once at one service (an end frees its slot
    before a start at the same instant takes one)."""
    peak = 0
    for name in {r.tool for r in requests}:
        edges = sorted(
            [(r.start, 1) for r in requests if r.tool == name] + [(r.end, -1) for r in requests if r.tool == name]
        )
        level = 0
        for _, delta in edges:
            level += delta
            peak = max(peak, level)
    return peak


def retries_of(requests: list[Request]) -> list[Request]:
    """The requests that are retries: the same task's previous request to the same service
    failed (whoever re-sent it: the model, a framework's retry middleware or the
    governor). First attempts never are."""
    last_ok: dict[tuple[str, str], bool] = {}
    out: list[Request] = []
    for r in sorted(requests, key=lambda r: (r.start, r.end)):
        key = (r.task, r.tool)
        if last_ok.get(key) is False:
            out.append(r)
        last_ok[key] = r.ok
    return out


def identical_repeats(requests: list[Request]) -> int:
    """Requests that re-send, exactly (same tool, same arguments as the service read them),
    a call of the same task whose last answer was a failure, whoever re-sent it: the
    model, a framework's retry or the governor's (a retry after a fix of its cause too:
    the request is the same). Asking again for a call that last succeeded is not a
    repeat of a failure (a poll)."""
    last_ok: dict[tuple[str, str, str], bool] = {}
    count = 0
    for r in sorted(requests, key=lambda r: (r.start, r.end)):
        key = (r.task, r.tool, repr(sorted(r.args.items())))
        if last_ok.get(key) is False:
            count += 1
        last_ok[key] = r.ok
    return count


def peak_retry_rate(requests: list[Request], window_s: float = 1.0) -> int:
    """The retry-storm metric: most *retries* ([`retries_of`][loop_governor.bench.world.retries_of]) reaching one
    service within any ``window_s``.

    First attempts never count, so the first wave of concurrent tasks, which sets the
    peak concurrency, does not set this. The window slides (every ``[t, t + window_s)``),
    so the figure does not depend on where 1-second buckets fall. The result is the
    maximum over services: with the default window, retries per second.
    """
    retries: dict[str, list[float]] = {}
    for r in retries_of(requests):
        retries.setdefault(r.tool, []).append(r.start)
    peak = 0
    for starts in retries.values():
        first = 0
        for i, start in enumerate(starts):  # starts are sorted: slide the window's left edge
            while starts[first] <= start - window_s:
                first += 1
            peak = max(peak, i - first + 1)
    return peak


def peak_concurrent_retries(requests: list[Request]) -> int:
    """Most retries ([`retries_of`][loop_governor.bench.world.retries_of]) in flight at once at one service: the retry
    wave's load on the service, which jitter is meant to flatten."""
    return _peak_in_flight(retries_of(requests))


# -- fault rules --------------------------------------------------------------------------


def flaky(p: float, slot_s: float = 1.0, status: int = 503) -> Fault:
    """Fails ``p`` of the (1-second) time slots: a function of virtual time, identical for every arm."""

    def rule(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
        if unit_hash(ds.seed, ds.world, tool, int(t // slot_s)) < p:
            return ServiceError(status, f"{tool} temporarily unavailable")
        return None

    return rule


def window(start_s: float, end_s: float, make: Callable[[], BaseException], then: Fault | None = None) -> Fault:
    """``make()`` during [start_s, end_s) of world time; ``then`` (or success) otherwise."""

    def rule(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
        if start_s <= t < end_s:
            return make()
        return then(ds, tool, kwargs, t) if then is not None else None

    return rule


def always(make: Callable[[], BaseException]) -> Fault:
    return window(0.0, float("inf"), make)


def rate_limited() -> BaseException:
    return ServiceError(429, "rate limit exceeded for search", {"Retry-After": "75"})


def crash_once_at(item: int, then: Fault) -> Fault:
    """The worker dies the first time it processes ``item``."""

    def rule(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
        if kwargs.get("item") == item and tool not in ds.crashed:
            ds.crashed.add(tool)
            return SimulatedCrash(f"worker killed while processing item {item}")
        return then(ds, tool, kwargs, t)

    return rule


def bad_priority(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
    if kwargs.get("priority") not in {"low", "normal", "high"}:
        return ServiceError(422, f"invalid value {kwargs.get('priority')!r} for priority: use low|normal|high")
    return None


def missing_doc(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
    if kwargs.get("doc_id") == "Q3-report":
        return ServiceError(404, "document 'Q3-report' not found")
    return None


# -- scenarios ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One incident: the tasks that run concurrently in it and the services' faults."""

    name: str
    title: str
    tasks: Callable[[str], list[TaskSpec]]
    faults: Callable[[], dict[str, Fault]]
    capacity: dict[str, int] = field(default_factory=dict)
    model_fault: Callable[[], ModelFault] | None = None
    """Faults of the model call itself (the provider); ``None``: the provider is healthy."""
    answers: Callable[[], dict[str, Answerer]] = dict
    """Services whose successful answer is their own text (see :data:`Answerer`)."""

    @property
    def provider_fault(self) -> bool:
        return self.model_fault is not None


def _rate_limited_tasks(prefix: str) -> list[TaskSpec]:
    plan = (
        *(
            SubTask(sid, (opt("search", query=q), opt("search_backup", query=q)))
            for sid, q in (("search-a", "agent loop failures"), ("search-b", "retry storms"))
        ),
        SubTask("fetch", (opt("fetch_doc", doc_id="postmortem-7"),)),
    )
    return [TaskSpec(f"{prefix}-0", "rate_limited_search", "Research agent loop failures.", plan)]


def _missing_doc_tasks(prefix: str) -> list[TaskSpec]:
    plan = (
        SubTask("search", (opt("search", query="Q3 revenue"),)),
        SubTask("doc", (opt("fetch_doc", doc_id="Q3-report"), opt("search_archive", query="Q3 report"))),
        SubTask("prices", (opt("pricing_api", sku="sku-1"),)),
    )
    return [TaskSpec(f"{prefix}-0", "missing_document", "Summarize the Q3 report.", plan)]


def _invalid_args_tasks(prefix: str) -> list[TaskSpec]:
    plan = (
        SubTask("lookup", (opt("crm_lookup", account="acme"),)),
        SubTask(
            "ticket",
            (
                opt("create_ticket", account="acme", priority="urgent"),
                opt("create_ticket", account="acme", priority="high"),
            ),
        ),
        SubTask("notify", (opt("notify", channel="support"),)),
    )
    return [TaskSpec(f"{prefix}-0", "invalid_arguments", "Open a support ticket for ACME.", plan)]


def _credentials_tasks(prefix: str) -> list[TaskSpec]:
    plan = tuple(SubTask(f"update-{i}", (opt("crm_update", account=f"acct-{i}"),)) for i in range(1, 9))
    return [TaskSpec(f"{prefix}-0", "credentials_expire", "Update eight CRM accounts.", plan)]


def _outage_tasks(prefix: str) -> list[TaskSpec]:
    plan = (
        SubTask("orders", (opt("orders_api", day="today"),)),
        *(
            SubTask(f"stock-{s}", (opt("inventory_api", sku=s), opt("inventory_replica", sku=s)))
            for s in ("a", "b", "c")
        ),
        SubTask("report", (opt("notify", channel="ops"),)),
    )
    return [TaskSpec(f"{prefix}-0", "downstream_outage", "Reconcile today's orders with stock.", plan)]


def _workflow_tasks(prefix: str) -> list[TaskSpec]:
    plan = tuple(SubTask(f"step-{i:02d}", (opt(f"step_{i:02d}", ref="wf-1"),)) for i in range(1, 18))
    return [TaskSpec(f"{prefix}-0", "workflow_17_tools", "Run the 17-step onboarding workflow.", plan)]


def _batch_tasks(prefix: str) -> list[TaskSpec]:
    plan = tuple(SubTask(f"item-{i:02d}", (opt("process_item", item=i),)) for i in range(1, 31))
    return [TaskSpec(f"{prefix}-0", "batch_crash_at_18", "Process the 30-item batch.", plan)]


def _concurrent_tasks(prefix: str) -> list[TaskSpec]:
    out = []
    for n in range(5):
        plan = tuple(
            SubTask(f"quote-{k}", (opt("quote_service", symbol=f"S{n}{k}"), opt("quote_cache", symbol=f"S{n}{k}")))
            for k in range(3)
        )
        out.append(TaskSpec(f"{prefix}-{n}", "concurrent_flaky", f"Price basket {n}.", plan))
    return out


def _provider_storm_tasks(prefix: str) -> list[TaskSpec]:
    out = []
    for n in range(5):
        plan = tuple(SubTask(f"rate-{k}", (opt("fx_rates", pair=f"P{n}{k}"),)) for k in range(3))
        out.append(TaskSpec(f"{prefix}-{n}", "provider_429_storm", f"Convert invoice batch {n}.", plan))
    return out


def _quota_tasks(prefix: str) -> list[TaskSpec]:
    plan = tuple(SubTask(f"record-{i:02d}", (opt("enrich_record", record=f"rec-{i}"),)) for i in range(1, 11))
    return [TaskSpec(f"{prefix}-0", "quota_exhausted_mid_task", "Enrich ten customer records.", plan)]


def _overload_tasks(prefix: str) -> list[TaskSpec]:
    plan = tuple(SubTask(f"section-{i}", (opt("docs_api", section=f"s{i}"),)) for i in range(1, 7))
    return [TaskSpec(f"{prefix}-0", "provider_overloaded_529", "Summarize the six-section design doc.", plan)]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "rate_limited_search",
        "search answers 429 (Retry-After 75 s) for 40 minutes",
        _rate_limited_tasks,
        lambda: {"search": window(0, 40 * 60, rate_limited), "search_backup": flaky(0.05)},
    ),
    Scenario(
        "missing_document",
        "a document that is permanently missing (404)",
        _missing_doc_tasks,
        lambda: {"fetch_doc": missing_doc, "search": flaky(0.05)},
    ),
    Scenario(
        "invalid_arguments",
        "the model's first arguments are invalid (422)",
        _invalid_args_tasks,
        lambda: {"create_ticket": bad_priority},
    ),
    Scenario(
        "credentials_expire",
        "credentials expire mid-task (401 after the first minute)",
        _credentials_tasks,
        lambda: {"crm_update": window(60, float("inf"), lambda: ServiceError(401, "token expired"))},
    ),
    Scenario(
        "downstream_outage",
        "inventory service down for 30 minutes (503)",
        _outage_tasks,
        lambda: {"inventory_api": window(20, 20 + 30 * 60, lambda: ServiceError(503, "service unavailable"))},
    ),
    Scenario(
        "workflow_17_tools",
        "a 17-tool workflow over flaky services (8% of time slots fail)",
        _workflow_tasks,
        lambda: {f"step_{i:02d}": flaky(0.08) for i in range(1, 18)},
    ),
    Scenario(
        "batch_crash_at_18",
        "a 30-step batch whose worker crashes at step 18 (restarted once)",
        _batch_tasks,
        lambda: {"process_item": crash_once_at(18, flaky(0.05))},
    ),
    Scenario(
        "concurrent_flaky",
        "5 concurrent tasks on one flaky service (capacity 2 in flight)",
        _concurrent_tasks,
        lambda: {"quote_service": flaky(0.10)},
        capacity={"quote_service": 2},
    ),
    # -- faults of the model call itself (healthy tools) --
    Scenario(
        "provider_429_storm",
        "5 concurrent tasks on one API key limited to 12 requests/min (429 + retry-after)",
        _provider_storm_tasks,
        dict,
        model_fault=lambda: key_rate_limit(rpm=12, burst=4),
    ),
    Scenario(
        "quota_exhausted_mid_task",
        "the key's quota runs out 90 s into a 10-step task (429 insufficient_quota)",
        _quota_tasks,
        dict,
        model_fault=lambda: quota_after(90.0),
    ),
    Scenario(
        "provider_overloaded_529",
        "the provider is overloaded from 30 s to 120 s: 60% of 1-second slots answer 529",
        _overload_tasks,
        dict,
        model_fault=lambda: overloaded_burst(30.0, 120.0, 0.6),
    ),
)

SCENARIO_BY_NAME = {s.name: s for s in SCENARIOS}
