"""Issues 24 and 39, end to end: the loop guards never end a healthy agent's everyday work,
and still end every real loop.

Scripted models play each pattern through ``create_agent`` with ``GovernorMiddleware`` (plain
tools, and tools wrapped with ``govern_tools``) and through a real crew (``install`` +
governed tools). The tools are small stateful services that count every real execution:

* healthy patterns (precondition-fix-retry, fix-then-rerun, multi-entity lookups with
  numeric answers, a declared poll, login-then-retry, parallel lookups of one id in one turn,
  a cursor walk): the run completes, and the call that retries or repeats something really
  ran again (the service's count), its success reaching the model;
* real loops (the same failing call, A-B and A-B-C cycles, a critic whose verdict changes
  only in numbers, arguments varied in whitespace and key order, a page walk with the same
  answer, a failing call repeated with nothing in between, a failing call between read-only
  lookups, a login never done, an identical transfer, a poll past its ``max_calls``): the
  run ends with ``lg.FatalError`` within 8 model calls, whatever the model would do next;
* issue 39: batches over ids with separators, dates and SKUs (one per turn, and ten in one
  turn), ten deleted orders, an undeclared wait between polls, a declared poll whose
  arguments carry an attempt counter, a critic that is finally satisfied, all healthy; the
  critic loop with revised drafts ``v0..vN`` and the same verdict, and the identical failing
  call alternated with a varied ``think``, a note or a new search, all loops;
* what the model reads after a failed precondition: the tool's own message first, and any
  "do not repeat" speaks of repeating the call unchanged (issue 24, Build 6).

The scripted models are open-loop (they never read the governor's text), so a healthy run
only completes if nothing ended it, and a loop only ends if a guard ended it. These tests
are the spec of issue 24's Build section, ``ToolPolicy(poll=True)`` and
``ToolPolicy(read_only=True)`` included.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import lg_crewai
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field, create_model

import crewai_governor
import langchain_governor
import loop_governor as lg

ROUNDS = 200  # a looping model would go on this long
MAX_MODEL_CALLS = 8  # a loop must end within this many model calls

Call = tuple[str, dict[str, Any]]
Turn = list[Call]


class World:
    """The tools' backends, with the state a fix changes; ``ran`` counts real executions."""

    def __init__(self, polls_until: int | None = 6) -> None:
        self.ran: Counter[str] = Counter()
        self.results: list[tuple[str, str]] = []  # (tool, result) of every execution that returned
        self._lock = threading.Lock()  # parallel tool calls run on threads
        self.brake = False
        self.fixed = False
        self.logged_in = False
        self.polls = 0
        self.polls_until = polls_until  # the job finishes after this many polls (None: never)

    def _count(self, tool: str) -> None:
        with self._lock:
            self.ran[tool] += 1

    def _ok(self, tool: str, result: str) -> str:
        with self._lock:
            self.results.append((tool, result))
        return result

    # -- the car
    def start_engine(self) -> str:
        self._count("start_engine")
        if not self.brake:
            raise ValueError(
                "Brake pedal must be pressed when starting the engine. Please press the brake pedal first."
            )
        return self._ok("start_engine", "Engine started. Fuel level 47%, battery 12.6 V.")

    def press_brake_pedal(self) -> str:
        self._count("press_brake_pedal")
        self.brake = True
        return self._ok("press_brake_pedal", "Brake pedal pressed (force 1000 N).")

    def get_vehicle_status(self) -> str:
        self._count("get_vehicle_status")
        return self._ok("get_vehicle_status", json.dumps({"engine": "off", "brake_pedal": "released", "gear": "P"}))

    # -- a repository
    def run_tests(self, path: str) -> str:
        self._count("run_tests")
        if not self.fixed:
            raise RuntimeError(f"1 failed, 12 passed in 0.41s\nFAILED {path}test_core.py::test_load - AssertionError")
        return self._ok("run_tests", "13 passed in 0.43s")

    def write_file(self, path: str, content: str) -> str:
        self._count("write_file")
        self.fixed = True
        return self._ok("write_file", f"wrote {len(content)} bytes to {path}")

    # -- lookups whose answers differ only in numbers
    def get_weather(self, city: str) -> str:
        self._count("get_weather")
        n = sum(map(ord, city))
        return self._ok("get_weather", f"Temperature {n % 30} C, humidity {n % 60 + 30}%, wind {n % 25} km/h, cloudy")

    def get_account_balance(self, account_id: str) -> str:
        self._count("get_account_balance")
        cents = sum(map(ord, account_id)) * 7919 % 900_000
        body = {"balance": cents / 100, "currency": "USD", "as_of": "2024-05-15T10:00:00Z"}
        return self._ok("get_account_balance", json.dumps(body))

    # -- a job
    def start_job(self, pipeline: str) -> str:
        self._count("start_job")
        return self._ok("start_job", json.dumps({"job_id": "J-4821", "state": "queued"}))

    def get_job_status(self, job_id: str) -> str:
        self._count("get_job_status")
        with self._lock:
            self.polls += 1
            done = self.polls_until is not None and self.polls > self.polls_until
        state = {"state": "succeeded", "artifact": "s3://builds/J-4821.tgz"} if done else {"state": "running"}
        return self._ok("get_job_status", json.dumps({"job_id": job_id, **state, "detail": "build runner"}))

    # -- an account that needs a login
    def login(self, username: str) -> str:
        self._count("login")
        self.logged_in = True
        return self._ok("login", json.dumps({"logged_in": True, "user": username}))

    def get_orders(self, user_id: str) -> str:
        self._count("get_orders")
        if not self.logged_in:
            raise ValueError("User not authenticated. Please log in")
        return self._ok("get_orders", json.dumps({"user": user_id, "orders": ["#W2378156", "#W4817420"]}))

    # -- orders
    def get_order_details(self, order_id: str) -> str:
        self._count("get_order_details")
        body = {"order_id": order_id, "status": "delivered", "items": 3, "total": 182.4}
        return self._ok("get_order_details", json.dumps(body))

    def get_order_status(self, order_id: str) -> str:
        self._count("get_order_status")
        return self._ok("get_order_status", json.dumps({"order_id": order_id, "status": "delivered"}))

    def return_items(self, order_id: str) -> str:
        self._count("return_items")
        return self._ok("return_items", json.dumps({"order_id": order_id, "status": "return requested"}))

    def list_orders(self, user_id: str, cursor: str = "", page: int = 0) -> str:
        """A cursor walk over 5 pages (``cursor``); ``page`` is ignored (an API that always
        answers its first page, the page-walk loop)."""
        self._count("list_orders")
        index = int(cursor.removeprefix("cur")) if cursor else 0
        items = [{"order_id": f"#W{4000000 + 10 * index + k}", "status": "delivered"} for k in range(3)]
        nxt = f"cur{index + 1}" if index < 4 else None
        return self._ok("list_orders", json.dumps({"items": items, "next_cursor": nxt}))

    # -- loop-only tools
    def fetch_doc(self, doc: str) -> str:
        self._count("fetch_doc")
        raise LookupError(f"document {doc} not found (404)")

    def search_kb(self, query: str, limit: int = 5) -> str:
        self._count("search_kb")
        return self._ok("search_kb", "3 results: the refund policy, the returns page, the FAQ")

    def open_page(self, url: str) -> str:
        self._count("open_page")
        return self._ok("open_page", "Refunds are processed within 14 days of receiving the item.")

    def get_faq(self, topic: str) -> str:
        self._count("get_faq")
        return self._ok("get_faq", "FAQ: refunds go back to the original payment method.")

    def review_draft(self, draft: str) -> str:
        self._count("review_draft")
        n = self.ran["review_draft"]
        score = (6, 7, 6, 5, 7)[n % 5]
        return self._ok("review_draft", f"Score {score}/10 (reviewed 12:0{n % 10}:1{n % 6}): the claim is unsupported.")

    def transfer_to_human_agents(self, summary: str) -> str:
        self._count("transfer_to_human_agents")
        return self._ok("transfer_to_human_agents", "Transfer successful")

    # -- issue 39
    def get_invoice_status(self, invoice_id: str) -> str:
        self._count("get_invoice_status")
        if invoice_id.endswith("-deleted"):
            raise LookupError(f"invoice {invoice_id.removesuffix('-deleted')} not found (404)")
        return self._ok("get_invoice_status", json.dumps({"status": "paid"}))

    def get_daily_report(self, date: str) -> str:
        self._count("get_daily_report")
        return self._ok("get_daily_report", "No incidents reported for this day.")

    def check_stock(self, sku: str) -> str:
        self._count("check_stock")
        return self._ok("check_stock", "in stock (warehouse A)")

    def wait(self, seconds: int) -> str:
        self._count("wait")
        return self._ok("wait", f"waited {seconds} seconds")

    def think(self, thought: str) -> str:
        self._count("think")
        return self._ok("think", "")

    def log_note(self, note: str) -> str:
        self._count("log_note")
        return self._ok("log_note", "Note saved.")

    def critic(self, draft: str) -> str:
        self._count("critic")
        if "final" in draft:
            return self._ok("critic", "Approved: ready to send.")
        n = self.ran["critic"]
        return self._ok("critic", f"Score {(4, 5, 6)[n % 3]}/10. Not good enough: the tone is off. Revise.")


# name -> (description, {argument: (type, default or ...)})
TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "start_engine": ("Start the car's engine.", {}),
    "press_brake_pedal": ("Press the brake pedal.", {}),
    "get_vehicle_status": ("Read the car's status.", {}),
    "run_tests": ("Run the test suite under a path.", {"path": (str, ...)}),
    "write_file": ("Write a file.", {"path": (str, ...), "content": (str, ...)}),
    "get_weather": ("Current weather of a city.", {"city": (str, ...)}),
    "get_account_balance": ("Balance of an account.", {"account_id": (str, ...)}),
    "start_job": ("Start a build pipeline.", {"pipeline": (str, ...)}),
    "get_job_status": ("Status of a build job.", {"job_id": (str, ...)}),
    "login": ("Log a user in.", {"username": (str, ...)}),
    "get_orders": ("A user's orders.", {"user_id": (str, ...)}),
    "get_order_details": ("Details of an order.", {"order_id": (str, ...)}),
    "get_order_status": ("Status of an order.", {"order_id": (str, ...)}),
    "return_items": ("Return an order's items.", {"order_id": (str, ...)}),
    "list_orders": (
        "A page of a user's orders.",
        {"user_id": (str, ...), "cursor": (str, ""), "page": (int, 0)},
    ),
    "fetch_doc": ("Fetch a document by id.", {"doc": (str, ...)}),
    "search_kb": ("Search the help center.", {"query": (str, ...), "limit": (int, 5)}),
    "open_page": ("Open a help-center page.", {"url": (str, ...)}),
    "get_faq": ("Read the FAQ on a topic.", {"topic": (str, ...)}),
    "review_draft": ("Ask the critic to review a draft.", {"draft": (str, ...)}),
    "transfer_to_human_agents": ("Hand the user over to a human agent.", {"summary": (str, ...)}),
    "get_invoice_status": ("Status of an invoice.", {"invoice_id": (str, ...)}),
    "get_daily_report": ("The incident report of a day.", {"date": (str, ...)}),
    "check_stock": ("Stock of a product.", {"sku": (str, ...)}),
    "wait": ("Wait a number of seconds.", {"seconds": (int, ...)}),
    "think": ("Think out loud.", {"thought": (str, ...)}),
    "log_note": ("Keep a note.", {"note": (str, ...)}),
    "critic": ("Ask the critic to judge a draft.", {"draft": (str, ...)}),
}
SCHEMAS: dict[str, type[BaseModel]] = {
    name: create_model(f"{name.title().replace('_', '')}Args", **fields) for name, (_, fields) in TOOLS.items()
}


# -- the patterns ------------------------------------------------------------------------------
# A script is the turns the model plays (each turn: the tool calls of one assistant message),
# then a final answer. Loops repeat their turns until ROUNDS.


class Healthy(BaseModel):
    turns: list[Turn]
    # (tool, executions): the service must really have run the tool this many times
    must_run: dict[str, int]
    # (tool, text): the last result of the tool the model got must contain the text
    last_result: dict[str, str] = Field(default_factory=dict)
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    polls_until: int | None = 6


CITIES = ["Paris", "Lagos", "Lima", "Osaka", "Oslo", "Denver", "Cairo"]

HEALTHY: dict[str, Healthy] = {
    "precondition-fix-retry": Healthy(
        turns=[[("start_engine", {})], [("press_brake_pedal", {})], [("start_engine", {})]],
        must_run={"start_engine": 2, "press_brake_pedal": 1},
        last_result={"start_engine": "Engine started"},
    ),
    "fix-then-rerun": Healthy(
        turns=[
            [("run_tests", {"path": "tests/"})],
            [("write_file", {"path": "src/core.py", "content": "def load(x):\n    return x or {}\n"})],
            [("run_tests", {"path": "tests/"})],
        ],
        must_run={"run_tests": 2, "write_file": 1},
        last_result={"run_tests": "13 passed"},
    ),
    "multi-entity weather": Healthy(
        turns=[[("get_weather", {"city": city})] for city in CITIES],
        must_run={"get_weather": len(CITIES)},
        last_result={"get_weather": "Temperature"},
    ),
    "multi-entity weather in one turn": Healthy(
        turns=[[("get_weather", {"city": city}) for city in CITIES[:5]], [("get_weather", {"city": CITIES[5]})]],
        must_run={"get_weather": 6},
        last_result={"get_weather": "Temperature"},
    ),
    "multi-entity balances": Healthy(
        turns=[[("get_account_balance", {"account_id": f"ACC-{10017 + 131 * i}"})] for i in range(7)],
        must_run={"get_account_balance": 7},
        last_result={"get_account_balance": "balance"},
    ),
    "poll until it changes": Healthy(
        turns=[[("start_job", {"pipeline": "nightly"})]] + [[("get_job_status", {"job_id": "J-4821"})]] * 7,
        must_run={"get_job_status": 7},
        last_result={"get_job_status": "succeeded"},
        policies={"get_job_status": {"poll": True, "max_calls": 20}},
    ),
    "login-then-retry": Healthy(
        turns=[
            [("get_orders", {"user_id": "mia_li_3668"})],
            [("login", {"username": "mia_li_3668"})],
            [("get_orders", {"user_id": "mia_li_3668"})],
        ],
        must_run={"get_orders": 2, "login": 1},
        last_result={"get_orders": "#W2378156"},
    ),
    "parallel lookups of one id": Healthy(
        turns=[
            [("get_order_details", {"order_id": "#W2378156"})] * 3 + [("get_order_status", {"order_id": "#W2378156"})],
            [("return_items", {"order_id": "#W2378156"})],
        ],
        must_run={"get_order_status": 1, "return_items": 1},
        last_result={"get_order_details": "#W2378156", "return_items": "return requested"},
    ),
    "a batch over ids with separators": Healthy(
        turns=[[("get_invoice_status", {"invoice_id": f"INV-2024-{i:04d}"})] for i in range(1, 31)],
        must_run={"get_invoice_status": 30},
        last_result={"get_invoice_status": "paid"},
    ),
    "ten id lookups in one turn": Healthy(
        turns=[[("get_invoice_status", {"invoice_id": f"INV-2024-{i:04d}"}) for i in range(1, 11)]],
        must_run={"get_invoice_status": 10},
        last_result={"get_invoice_status": "paid"},
    ),
    "a batch over dates": Healthy(
        turns=[[("get_daily_report", {"date": f"2024-03-{d:02d}"})] for d in range(1, 21)],
        must_run={"get_daily_report": 20},
        last_result={"get_daily_report": "No incidents"},
    ),
    "a batch over SKUs": Healthy(
        turns=[[("check_stock", {"sku": f"SKU-{5531 + i}"})] for i in range(15)],
        must_run={"check_stock": 15},
        last_result={"check_stock": "in stock"},
    ),
    "ten deleted orders": Healthy(
        turns=[[("get_invoice_status", {"invoice_id": f"INV-2023-{i:04d}-deleted"})] for i in range(10)]
        + [[("get_invoice_status", {"invoice_id": "INV-2024-0001"})]],
        must_run={"get_invoice_status": 11},
        last_result={"get_invoice_status": "paid"},
    ),
    "an undeclared wait between polls": Healthy(
        turns=[[("start_job", {"pipeline": "nightly"})]]
        + [
            turn for _ in range(7) for turn in ([("get_job_status", {"job_id": "J-4821"})], [("wait", {"seconds": 13})])
        ],
        must_run={"get_job_status": 7, "wait": 7},
        last_result={"get_job_status": "succeeded"},
        policies={"get_job_status": {"poll": True}},
    ),
    "a critic satisfied at the fourth draft": Healthy(
        turns=[[("critic", {"draft": f"v{i}"})] for i in range(3)] + [[("critic", {"draft": "v3 final"})]],
        must_run={"critic": 4},
        last_result={"critic": "Approved"},
    ),
    "cursor pagination": Healthy(
        turns=[[("list_orders", {"user_id": "mia_li_3668"})]]
        + [[("list_orders", {"user_id": "mia_li_3668", "cursor": f"cur{i}"})] for i in range(1, 5)],
        must_run={"list_orders": 5},
        last_result={"list_orders": "#W4000040"},
    ),
}


class Loop(BaseModel):
    turns: list[Turn]  # played in a cycle until ROUNDS
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    polls_until: int | None = 6


_VARIED = [
    {"query": "refund  policy", "limit": 5},
    {"limit": 5, "query": " refund policy"},
    {"query": "refund policy ", "limit": 5},
    {"limit": 5, "query": "refund\tpolicy"},
]

LOOPS: dict[str, Loop] = {
    "same failing call": Loop(turns=[[("fetch_doc", {"doc": "42"})]]),
    "A-B cycle": Loop(turns=[[("search_kb", {"query": "refund policy"})], [("open_page", {"url": "https://x/r"})]]),
    "A-B-C cycle": Loop(
        turns=[
            [("search_kb", {"query": "refund policy"})],
            [("open_page", {"url": "https://x/r"})],
            [("get_faq", {"topic": "refunds"})],
        ]
    ),
    "critic verdict changing only in numbers": Loop(turns=[[("review_draft", {"draft": "Offer a refund."})]]),
    "arguments varied in whitespace and key order": Loop(turns=[[("search_kb", args)] for args in _VARIED]),
    "page walk with the same answer": Loop(
        turns=[[("list_orders", {"user_id": "mia_li_3668", "page": p})] for p in range(2, 2 + ROUNDS)]
    ),
    "failing precondition repeated with nothing in between": Loop(turns=[[("start_engine", {})]]),
    "failing call between read-only lookups": Loop(
        turns=[[("start_engine", {})], [("get_vehicle_status", {})]],
        policies={"get_vehicle_status": {"read_only": True}},
    ),
    "retry without the login": Loop(turns=[[("get_orders", {"user_id": "mia_li_3668"})]]),
    "the same transfer again and again": Loop(
        turns=[[("transfer_to_human_agents", {"summary": "The user wants a refund for order #W2378156."})]]
    ),
    "critic with revised drafts v0..vN and the same verdict": Loop(
        turns=[[("critic", {"draft": f"v{i}"})] for i in range(ROUNDS)]
    ),
    "failing call with a varied think between": Loop(
        turns=[
            t
            for i in range(ROUNDS)
            for t in (
                [("fetch_doc", {"doc": "refunds-2019.pdf"})],
                [("think", {"thought": f"Maybe it exists now ({i})."})],
            )
        ]
    ),
    "failing call with a note between": Loop(
        turns=[
            t
            for i in range(ROUNDS)
            for t in ([("fetch_doc", {"doc": "refunds-2019.pdf"})], [("log_note", {"note": f"attempt {i} failed"})])
        ]
    ),
    "failing call with a new search between": Loop(
        turns=[
            t
            for i in range(ROUNDS)
            for t in ([("fetch_doc", {"doc": "refunds-2019.pdf"})], [("search_kb", {"query": f"refunds 2019 ({i})"})])
        ]
    ),
    "a poll past its max_calls": Loop(
        turns=[[("get_job_status", {"job_id": "J-4821"})]],
        policies={"get_job_status": {"poll": True, "max_calls": 5}},
        polls_until=None,
    ),
}


def _config(policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The governor's per-tool policies, through the public API (``ToolPolicy``)."""
    return {"tools": {tool: lg.ToolPolicy(**fields) for tool, fields in policies.items()}} if policies else {}


def _turn_of(script: list[Turn], n: int, loop: bool) -> Turn | None:
    if loop:
        return script[n % len(script)] if n < ROUNDS else None
    return script[n] if n < len(script) else None


# -- create_agent -------------------------------------------------------------------------------
def lc_tools(world: World) -> list[Any]:
    return [
        StructuredTool.from_function(
            func=getattr(world, name), name=name, description=description, args_schema=SCHEMAS[name]
        )
        for name, (description, _) in TOOLS.items()
    ]


def lc_script(script: list[Turn], loop: bool) -> Callable[[list[BaseMessage]], AIMessage]:
    def reply(messages: list[BaseMessage]) -> AIMessage:
        n = sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)  # turns played
        turn = _turn_of(script, n, loop)
        if turn is None:
            return AIMessage(content="All done.")
        calls = [
            {"name": name, "args": dict(args), "id": f"call_{n}_{k}", "type": "tool_call"}
            for k, (name, args) in enumerate(turn)
        ]
        return AIMessage(content="", tool_calls=calls)

    return reply


WIRINGS = ["middleware", "governed tools"]


def lc_agent(kit: Any, governor: lg.Governor, world: World, script: Any, wiring: str) -> tuple[Any, Any]:
    model = kit.ScriptedChatModel(script=script)
    tools = lc_tools(world)
    if wiring == "governed tools":
        tools = langchain_governor.govern_tools(tools, governor)
    return model, create_agent(model, tools, middleware=[langchain_governor.GovernorMiddleware(governor)])


def _last_results(messages: list[BaseMessage]) -> dict[str, ToolMessage]:
    return {str(m.name): m for m in messages if isinstance(m, ToolMessage)}


@pytest.mark.parametrize("wiring", WIRINGS)
@pytest.mark.parametrize("pattern", HEALTHY, ids=list(HEALTHY))
def test_create_agent_healthy_patterns_complete_and_the_retry_runs(
    kit: Any, make_governor: Callable[..., lg.Governor], pattern: str, wiring: str
) -> None:
    case = HEALTHY[pattern]
    governor = make_governor(**_config(case.policies))
    world = World(case.polls_until)
    model, agent = lc_agent(kit, governor, world, lc_script(case.turns, loop=False), wiring)

    state = agent.invoke({"messages": [("user", "please take care of it")]})

    assert state["messages"][-1].content == "All done."  # the run completed
    for tool, times in case.must_run.items():
        assert world.ran[tool] == times, f"{tool} really ran {world.ran[tool]} times, expected {times}"
    last = _last_results(state["messages"])
    for tool, text in case.last_result.items():
        assert last[tool].status != "error" and text in str(last[tool].content), last[tool].content
    assert len(model.prompts) == len(case.turns) + 1


@pytest.mark.parametrize("wiring", WIRINGS)
@pytest.mark.parametrize("pattern", LOOPS, ids=list(LOOPS))
def test_create_agent_real_loops_end_within_8_model_calls(
    kit: Any, make_governor: Callable[..., lg.Governor], pattern: str, wiring: str
) -> None:
    case = LOOPS[pattern]
    governor = make_governor(**_config(case.policies))
    world = World(case.polls_until)
    model, agent = lc_agent(kit, governor, world, lc_script(case.turns, loop=True), wiring)

    with pytest.raises(lg.FatalError):
        agent.invoke({"messages": [("user", "please take care of it")]})

    assert len(model.prompts) <= MAX_MODEL_CALLS
    assert sum(world.ran.values()) <= MAX_MODEL_CALLS


# -- a real crew --------------------------------------------------------------------------------
class Parallel(BaseModel):
    """Several tool calls in one assistant message (crewAI runs them as one batch)."""

    steps: list[lg_crewai.ToolStep]


class TurnsLLM(lg_crewai.ScriptedLLM):
    """The shared scripted crewAI LLM (native tool calls), able to ask for several calls in
    one reply: the first carries the turn's ``call_N`` id (how the script counts turns), the
    others ids of their own."""

    native: bool = True
    usage: dict[str, Any] = Field(default_factory=lambda: {"prompt_tokens": 100, "completion_tokens": 10})
    context_window: int | None = 200_000

    def _reply(self, step: Any, turn: int) -> Any:
        if not isinstance(step, Parallel):
            return super()._reply(step, turn)
        return [
            {
                "id": f"call_{turn}" if k == 0 else f"parallel_{turn}_{k}",
                "type": "function",
                "function": {"name": s.name, "arguments": json.dumps(s.args)},
            }
            for k, s in enumerate(step.steps)
        ]


def crew_tools(world: World) -> list[Any]:
    return [
        lg_crewai.CallableTool(getattr(world, name), name=name, description=description, args_schema=SCHEMAS[name])
        for name, (description, _) in TOOLS.items()
    ]


def crew_script(script: list[Turn], loop: bool) -> Callable[[list[dict[str, Any]], int], Any]:
    def choose(messages: list[dict[str, Any]], turn: int) -> Any:
        calls = _turn_of(script, turn, loop)
        if calls is None:
            return lg_crewai.Final("All done.")
        steps = [lg_crewai.ToolStep(name, dict(args)) for name, args in calls]
        return steps[0] if len(steps) == 1 else Parallel(steps=steps)

    return choose


def _crew(kit: Any, governor: lg.Governor, world: World, script: Any) -> tuple[TurnsLLM, Any]:
    llm = TurnsLLM(model="scripted", script=script)
    tools = crewai_governor.govern_tools(crew_tools(world), governor)
    return llm, kit.make_crew(llm, tools, max_iter=ROUNDS + 5)


@pytest.mark.parametrize("pattern", HEALTHY, ids=list(HEALTHY))
def test_crew_healthy_patterns_complete_and_the_retry_runs(
    kit: Any, make_governor: Callable[..., lg.Governor], pattern: str
) -> None:
    case = HEALTHY[pattern]
    governor = make_governor(**_config(case.policies))
    world = World(case.polls_until)
    llm, crew = _crew(kit, governor, world, crew_script(case.turns, loop=False))

    with crewai_governor.install(governor):
        output = crew.kickoff()

    assert "All done." in str(output.raw)  # the run completed
    for tool, times in case.must_run.items():
        assert world.ran[tool] == times, f"{tool} really ran {world.ran[tool]} times, expected {times}"
    last_prompt = llm.received[-1]
    for tool, text in case.last_result.items():
        # the last execution of the tool worked, and its answer reached the model
        result = [r for t, r in world.results if t == tool][-1]
        assert text in result
        assert any(m.get("role") == "tool" and result in str(m.get("content")) for m in last_prompt)
    assert len(llm.received) == len(case.turns) + 1


@pytest.mark.parametrize("pattern", LOOPS, ids=list(LOOPS))
def test_crew_real_loops_end_within_8_model_calls(
    kit: Any, make_governor: Callable[..., lg.Governor], pattern: str
) -> None:
    case = LOOPS[pattern]
    governor = make_governor(**_config(case.policies))
    world = World(case.polls_until)
    llm, crew = _crew(kit, governor, world, crew_script(case.turns, loop=True))

    with pytest.raises(lg.FatalError), crewai_governor.install(governor):
        crew.kickoff()

    assert len(llm.received) <= MAX_MODEL_CALLS
    assert sum(world.ran.values()) <= MAX_MODEL_CALLS


# -- what the model reads after a failed precondition -----------------------------------------
# the model reads the tool's own words first: the governor's JSON opens with them
_OWN_MESSAGE = re.compile(
    r'^(?:\{"error":\{"message":"|Error: )?(?:\w+: )?Brake pedal must be pressed when starting the engine'
)


def _reads_as_fix_then_retry(text: str) -> None:
    """The tool's own message comes first; "do not repeat" speaks of repeating unchanged."""
    assert _OWN_MESSAGE.match(text.strip()), text
    if "do not repeat" in text.lower():
        assert "unchanged" in text.lower(), text


def test_create_agent_a_failed_precondition_reads_as_fix_then_retry(
    kit: Any, make_governor: Callable[..., lg.Governor]
) -> None:
    world = World()
    case = HEALTHY["precondition-fix-retry"]
    _, agent = lc_agent(kit, make_governor(), world, lc_script(case.turns, loop=False), "middleware")

    state = agent.invoke({"messages": [("user", "start the car")]})

    failed = next(m for m in state["messages"] if isinstance(m, ToolMessage) and m.name == "start_engine")
    assert failed.status == "error"
    _reads_as_fix_then_retry(str(failed.content))


def test_crew_a_failed_precondition_reads_as_fix_then_retry(
    kit: Any, make_governor: Callable[..., lg.Governor]
) -> None:
    world = World()
    case = HEALTHY["precondition-fix-retry"]
    governor = make_governor()
    llm, crew = _crew(kit, governor, world, crew_script(case.turns, loop=False))

    with crewai_governor.install(governor):
        crew.kickoff()

    # the prompt after the first start_engine: its tool result is what the model read
    failed = [m for m in llm.received[1] if m.get("role") == "tool"][-1]
    _reads_as_fix_then_retry(str(failed.get("content")))
