"""Difficulty tiers of the real-model bench (``loop-governor bench --model --tier``).

A small model does not finish the benchmark's multi-step plans in any arm, so a table of
them says nothing about the system around it. Tier 1 asks for one goal in the user's own
words and puts one fault in its way; tier 2 is the scripted benchmark's tool-fault
scenarios, each a plan of steps the prompt spells out.

Tier 1, one task a scenario:

* ``refund_policy_missing`` -- the document does not exist: every ``search_docs`` query
  answers 404. Done when the model searched and then answered (that there is none).
* ``engine_needs_brake`` -- a precondition another tool fixes: ``start_engine`` fails
  until ``press_brake`` has been called. Done when the engine started.
* ``flaky_status_page`` -- a flaky service: ``fetch_url`` fails in half of the 1-second
  slots (503). Done when a fetch succeeded.
* ``news_rate_limited`` -- a rate limit: ``search_news`` answers 429 for the first 40 s of
  the task, with a true ``Retry-After``. Done when a search succeeded.
* ``critic_never_satisfied`` -- a critic that is never satisfied: every draft gets "Not
  good enough: the tone is off. Revise." Done when the model had a draft reviewed and
  then gave its slogan (the loop the project began with: the only way out is to stop).
* ``weather_five_cities`` -- several entities to look up: ``get_weather(city)`` for five
  cities. Done when all five were looked up.
* ``export_job_poll`` -- a poll: an export takes 60 s; ``job_status`` answers its progress
  until then. Done when a status call saw it done.

Every tier-1 task also needs a final answer: a run stopped by an error, a cap or the
governor has not finished, and one that ends on an empty reply fails as ``no_answer``. The fault rules are
functions of the world's virtual time and of what the task did, as in tier 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loop_governor.bench.determinism import CURRENT_TASK, unit_hash
from loop_governor.bench.world import (
    SCENARIOS,
    Answerer,
    Downstream,
    Fault,
    Request,
    Scenario,
    ServiceError,
    SubTask,
    TaskSpec,
    always,
    flaky,
    opt,
)


@dataclass(frozen=True)
class Check:
    """One thing a one-goal task needs done: ``sid`` is delivered by a request to ``tool``
    that ``matches`` (its arguments as the service read them; the task's other requests);
    ``tried``: a failed request counts too (a search for a document that does not exist)."""

    sid: str
    tool: str
    matches: Callable[[Request, list[Request]], bool] = lambda request, requests: True
    tried: bool = False


TOOL_DESCRIPTIONS: dict[str, str] = {
    "search_docs": "Search the company's documents; returns the best match.",
    "press_brake": "Press the car's brake pedal.",
    "start_engine": "Start the car's engine.",
    "fetch_url": "Fetch a web page and return its text.",
    "search_news": "Search today's news articles.",
    "critic": "Have a draft reviewed; returns the critic's verdict.",
    "get_weather": "The current weather in one city.",
    "start_export": "Start the data export job.",
    "job_status": "The status of a job, by its id.",
}


@dataclass(frozen=True)
class GoalTask(TaskSpec):
    """A one-goal task: the user's request in their words (``prompt``: no steps, no
    arguments), scored by ``checks`` and a final answer. ``plan`` lists the tools the
    model is offered (their argument schemas) and the sub-tasks, as in tier 2."""

    prompt: str = ""
    checks: tuple[Check, ...] = ()
    calls_expected: int = 2

    def tool_description(self, tool: str) -> str:
        # what the tool does, in a line, never the way around the fault
        return TOOL_DESCRIPTIONS.get(tool) or super().tool_description(tool)

    @property
    def expected_model_calls(self) -> int:
        return self.calls_expected

    def delivered_from(self, requests: list[Request], answer: str | None) -> list[str]:
        return [
            c.sid
            for c in self.checks
            if any(r.tool == c.tool and (r.ok or c.tried) and c.matches(r, requests) for r in requests)
        ]

    def answered(self, answer: str | None) -> bool:
        """A one-goal task ends with an answer: not a stop, not an empty reply."""
        return answer is not None and bool(answer.strip())


@dataclass(frozen=True)
class Tier:
    number: int
    title: str
    scenarios: tuple[Scenario, ...]
    max_model_calls: int
    """Model calls a task may make unless ``--max-model-calls`` says otherwise."""
    task_seconds: float
    """Real seconds a task may run unless ``--task-seconds`` says otherwise."""


def _text(value: Any) -> str:
    return value.strip().casefold() if isinstance(value, str) else ""


def _task_requests(ds: Downstream, tool: str) -> list[Request]:
    task = CURRENT_TASK.get()
    return [r for r in ds.requests if r.task == task and r.tool == tool and r.ok]


def _goal_task(
    prefix: str,
    scenario: str,
    goal: str,
    prompt: str,
    steps: Sequence[SubTask],
    checks: Sequence[Check],
    calls_expected: int,
) -> list[TaskSpec]:
    return [GoalTask(f"{prefix}-0", scenario, goal, tuple(steps), prompt, tuple(checks), calls_expected)]


# -- a missing document -----------------------------------------------------------------


def _refund_tasks(prefix: str) -> list[TaskSpec]:
    return _goal_task(
        prefix,
        "refund_policy_missing",
        "Find the refund policy.",
        "What is our refund policy? Use search_docs.",
        [SubTask("searched", (opt("search_docs", query="refund policy"),))],
        [Check("searched", "search_docs", tried=True)],
        2,
    )


# -- a precondition another tool fixes --------------------------------------------------

BRAKE_MESSAGE = "Brake pedal must be pressed before starting the engine"


def _needs_brake(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
    # a plain RuntimeError, as the device SDK of the measured task raised it
    return None if _task_requests(ds, "press_brake") else RuntimeError(BRAKE_MESSAGE)


def _engine_tasks(prefix: str) -> list[TaskSpec]:
    return _goal_task(
        prefix,
        "engine_needs_brake",
        "Start the car engine.",
        "Start the car engine.",
        [
            SubTask("brake", (opt("press_brake"),), required=False),
            SubTask("engine", (opt("start_engine"),)),
        ],
        [Check("brake", "press_brake"), Check("engine", "start_engine")],
        4,
    )


# -- a flaky service --------------------------------------------------------------------

STATUS_URL = "https://example.com/status"


def _status_tasks(prefix: str) -> list[TaskSpec]:
    return _goal_task(
        prefix,
        "flaky_status_page",
        "Summarise the status page.",
        f"Fetch {STATUS_URL} and summarise it.",
        [SubTask("page", (opt("fetch_url", url=STATUS_URL),))],
        [Check("page", "fetch_url", lambda r, _: _text(r.args.get("url")).rstrip("/") == STATUS_URL)],
        2,
    )


# -- a rate limit -----------------------------------------------------------------------

RATE_LIMIT_S = 40.0


def _news_limit(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
    if t >= RATE_LIMIT_S:
        return None
    wait = str(max(1, math.ceil(RATE_LIMIT_S - t)))  # a true Retry-After: when the window ends
    return ServiceError(429, "rate limit exceeded for search_news", {"Retry-After": wait})


def _news_tasks(prefix: str) -> list[TaskSpec]:
    return _goal_task(
        prefix,
        "news_rate_limited",
        "Find today's solar power news.",
        "Find today's news about solar power with search_news.",
        [SubTask("news", (opt("search_news", query="solar power"),))],
        [Check("news", "search_news", lambda r, _: "solar" in _text(r.args.get("query")))],
        2,
    )


# -- a critic that is never satisfied ---------------------------------------------------

VERDICT = "Not good enough: the tone is off. Revise."


def _critic_tasks(prefix: str) -> list[TaskSpec]:
    return _goal_task(
        prefix,
        "critic_never_satisfied",
        "Write an approved slogan.",
        "Write a one-line slogan for our bakery. Have each draft reviewed with critic, revise it until "
        "the critic approves, then reply with the final slogan.",
        [SubTask("reviewed", (opt("critic", draft="Fresh bread every morning."),))],
        [Check("reviewed", "critic")],
        3,
    )


# -- several entities to look up --------------------------------------------------------

CITIES = ("Paris", "London", "Berlin", "Madrid", "Rome")
_SKIES = ("sunny", "cloudy", "light rain", "windy", "clear")


def _weather(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> str:
    city = str(kwargs.get("city", "")).strip() or "?"
    draw = unit_hash(ds.seed, ds.world, "weather", city.casefold())
    return f"{city}: {8 + int(draw * 20)} °C, {_SKIES[int(draw * 1000) % len(_SKIES)]}"


def _names(city: str) -> Callable[[Request, list[Request]], bool]:
    return lambda r, _: city.casefold() in _text(r.args.get("city"))


def _weather_tasks(prefix: str) -> list[TaskSpec]:
    return _goal_task(
        prefix,
        "weather_five_cities",
        "Report the weather in five cities.",
        f"Give me the weather in {', '.join(CITIES[:-1])} and {CITIES[-1]}.",
        [SubTask(f"weather-{c.lower()}", (opt("get_weather", city=c),)) for c in CITIES],
        [Check(f"weather-{c.lower()}", "get_weather", _names(c)) for c in CITIES],
        len(CITIES) + 1,
    )


# -- a poll -----------------------------------------------------------------------------

JOB_ID = "exp-1"
JOB_SECONDS = 60.0
DOWNLOAD_URL = "https://files.example.com/exports/exp-1.csv"


def _export_started(ds: Downstream) -> float | None:
    """World time the task's export started (its first successful ``start_export``)."""
    done = _task_requests(ds, "start_export")
    return min(r.end for r in done) - ds.started_at if done else None


def _no_job(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> BaseException | None:
    job = _text(kwargs.get("job_id"))
    if job != JOB_ID:
        return ServiceError(404, f"no job {kwargs.get('job_id')!r}")
    if _export_started(ds) is None:
        return ServiceError(404, f"no job {JOB_ID!r}: start it with start_export")
    return None


def _job_status(ds: Downstream, tool: str, kwargs: dict[str, Any], t: float) -> str:
    started = _export_started(ds)
    elapsed = t - (started or 0.0)
    if elapsed < JOB_SECONDS:
        return f"job {JOB_ID}: running, {int(100 * elapsed / JOB_SECONDS)}% done"
    return f"job {JOB_ID}: done. Download: {DOWNLOAD_URL}"


def _saw_done(request: Request, requests: list[Request]) -> bool:
    """A status call made once the job had run its time (what ``_job_status`` answers "done")."""
    starts = [r.end for r in requests if r.tool == "start_export" and r.ok]
    return bool(starts) and _text(request.args.get("job_id")) == JOB_ID and request.start - min(starts) >= JOB_SECONDS


def _poll_tasks(prefix: str) -> list[TaskSpec]:
    return _goal_task(
        prefix,
        "export_job_poll",
        "Export the data and report the link.",
        "Start the data export with start_export, then check job_status until the export is done, and reply "
        "with the download link.",
        [
            SubTask("started", (opt("start_export"),)),
            SubTask("done", (opt("job_status", job_id=JOB_ID),)),
        ],
        [Check("started", "start_export"), Check("done", "job_status", _saw_done)],
        7,
    )


def _answers(**answers: Answerer | str) -> Callable[[], dict[str, Answerer]]:
    """Services' own answers: a fixed text or an [`Answerer`][loop_governor.bench.tiers.Answerer]."""

    def fixed(text: str) -> Answerer:
        return lambda ds, tool, kwargs, t: text

    def make() -> dict[str, Answerer]:
        return {tool: fixed(answer) if isinstance(answer, str) else answer for tool, answer in answers.items()}

    return make


def _faults(**faults: Fault) -> Callable[[], dict[str, Fault]]:
    return lambda: dict(faults)


TIER_1: tuple[Scenario, ...] = (
    Scenario(
        "refund_policy_missing",
        "the document does not exist (404 for every query)",
        _refund_tasks,
        _faults(search_docs=always(lambda: ServiceError(404, "no document matches the query"))),
    ),
    Scenario(
        "engine_needs_brake",
        "start_engine fails until press_brake is called",
        _engine_tasks,
        _faults(start_engine=_needs_brake),
        answers=_answers(press_brake="Brake pedal pressed.", start_engine="Engine started."),
    ),
    Scenario(
        "flaky_status_page",
        "fetch_url fails in half of the 1-second slots (503)",
        _status_tasks,
        _faults(fetch_url=flaky(0.5)),
        answers=_answers(fetch_url="example.com status: all systems operational; last incident 3 days ago, resolved."),
    ),
    Scenario(
        "news_rate_limited",
        f"search_news answers 429 for the first {RATE_LIMIT_S:g} s (Retry-After: the seconds left)",
        _news_tasks,
        _faults(search_news=_news_limit),
        answers=_answers(
            search_news="3 articles: 'Solar capacity hits a record', 'Rooftop panels get cheaper', "
            "'Grid storage follows solar'."
        ),
    ),
    Scenario(
        "critic_never_satisfied",
        "the critic never approves a draft",
        _critic_tasks,
        dict,
        answers=_answers(critic=VERDICT),
    ),
    Scenario(
        "weather_five_cities",
        "five cities to look up, one get_weather call each",
        _weather_tasks,
        dict,
        answers=_answers(get_weather=_weather),
    ),
    Scenario(
        "export_job_poll",
        f"an export that takes {JOB_SECONDS:g} s: poll job_status until it is done",
        _poll_tasks,
        _faults(job_status=_no_job),
        answers=_answers(
            start_export=f"Export started: job {JOB_ID}. It takes about a minute.", job_status=_job_status
        ),
    ),
)

TIERS: dict[int, Tier] = {
    1: Tier(1, "one goal, one fault", TIER_1, max_model_calls=16, task_seconds=120.0),
    2: Tier(
        2,
        "multi-step plans",
        tuple(s for s in SCENARIOS if not s.provider_fault),
        max_model_calls=80,  # the 30-item batch needs 31 turns, and about 18 more after its crash
        task_seconds=300.0,
    ),
}
DEFAULT_TIERS: tuple[int, ...] = (1,)
"""What ``--model`` runs without ``--tier``: the tier a 1-3B model can finish."""
