"""Generated agent runs for the loop-guard benchmark: everyday healthy patterns that a guard
must never stop, and real loops that it must stop.

Recorded corpora hold few of either on purpose, so ``benchmarks/loop_guard_calibration.py``
also replays these suites (same replay, same head-to-head with trajectory-fuse, see
``benchmarks/loop_replay.py``). Every case is a :class:`loop_replay.Run` of kind ``"tau"``:
a result starting with ``"Error"`` raises, as a real tool would. Deterministic for a seed:
each case draws its names and numbers from ``random.Random(f"{seed}:{pattern}:{i}")``.

Healthy (``HEALTHY``): each case marks the calls that retry or repeat something and must
run for real (``Case.must_run``): a guard that answers them from memory, or stops the run,
breaks a working agent. Loops (``LOOPS``): each case is a short healthy prefix, then the
loop from ``Case.loop_start`` on; a stop inside the loop is a catch, its calls spent are
counted from ``loop_start``; a stop before it is a false stop.

Per-tool policies a user would declare travel with the run (``Run.policies``, the fields of
``ToolPolicy``): the polls declare ``poll=True`` (and ``max_calls``), the read-only lookup
between failing retries declares ``read_only=True``. The replay drops fields the installed
loop-governor does not know, and the report says which.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field

import loop_replay as lr

Step = lr.Step


@dataclass(frozen=True)
class Case:
    suite: str  # "healthy" or "loop"
    pattern: str
    run: lr.Run
    loop_start: int = 0  # loops: index of the first looping step (healthy: unused)
    must_run: tuple[int, ...] = ()  # healthy: steps that retry something; they must execute
    policies: dict[str, dict[str, object]] = field(default_factory=dict)


Turns = list[list[Step]]


def _j(value: object) -> str:
    return json.dumps(value)


def _user(rng: random.Random) -> str:
    first = rng.choice(("mia", "omar", "sofia", "liam", "yara", "noah", "ava", "ivan"))
    last = rng.choice(("li", "davis", "kim", "garcia", "novak", "okafor", "silva"))
    return f"{first}_{last}_{rng.randint(1000, 9999)}"


def _token(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def _prefix(rng: random.Random) -> Turns:
    """One to three ordinary lookups that start a conversation."""
    user = _user(rng)
    turns: Turns = [[Step("get_user_details", {"user_id": user}, _j({"user_id": user, "membership": "gold"}))]]
    for _ in range(rng.randint(0, 2)):
        order = f"#W{rng.randint(1000000, 9999999)}"
        body = _j({"order_id": order, "status": rng.choice(("pending", "delivered")), "items": rng.randint(1, 4)})
        turns.append([Step("get_order_details", {"order_id": order}, body)])
    return turns


def _steps(turns: Turns) -> int:
    return sum(len(t) for t in turns)


# -- healthy patterns ------------------------------------------------------------------------

# (tool, args, error, fix tool, fix args, fix result, success)
_PRECONDITIONS = (
    (
        "startEngine",
        {"startButtonPressed": True},
        "Error: Brake pedal must be pressed when starting the engine. Please press the brake pedal first.",
        "pressBrakePedal",
        {"pedalPosition": 1.0},
        _j({"brakePedalStatus": "pressed", "brakePedalForce": 1000.0}),
        _j({"engineState": "started", "fuelLevel": 47, "batteryVoltage": 12.6}),
    ),
    (
        "upload_file",
        {"folder": "reports", "name": "q3.pdf"},
        "Error: folder 'reports' not found: create it first",
        "create_folder",
        {"name": "reports"},
        _j({"folder": "reports", "created": True}),
        _j({"file": "reports/q3.pdf", "bytes": 48213, "status": "uploaded"}),
    ),
    (
        "post_message",
        {"channel": "ops-alerts", "text": "deploy finished"},
        "Error: channel 'ops-alerts' is archived: unarchive it before posting",
        "unarchive_channel",
        {"channel": "ops-alerts"},
        _j({"channel": "ops-alerts", "archived": False}),
        _j({"ok": True, "ts": "1715781234.000200"}),
    ),
    (
        "checkout_cart",
        {"cart_id": "C-5512"},
        "Error: no payment method on file. Add a payment method first.",
        "add_payment_method",
        {"type": "credit_card", "last4": "4242"},
        _j({"payment_method_id": "pm_8812", "status": "active"}),
        _j({"order_id": "#W5812034", "status": "placed", "total": 182.4}),
    ),
)


def precondition_fix_retry(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A call fails on a precondition; another tool fixes it; the first call, unchanged, works."""
    tool, args, error, fix, fix_args, fix_result, ok = rng.choice(_PRECONDITIONS)
    turns = _prefix(rng)
    turns.append([Step(tool, args, error, "error")])
    turns.append([Step(fix, fix_args, fix_result)])
    turns.append([Step(tool, args, ok)])
    retried = _steps(turns) - 1
    turns.append([])  # the model answers
    return turns, (retried,)


def fix_then_rerun(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """The tests fail; the agent edits the file; the same test command passes (1 or 2 rounds)."""
    path = rng.choice(("src/app/core.py", "src/app/io.py", "lib/parse.py"))
    args = {"command": "pytest -q tests/"}
    passed = rng.randint(8, 40)
    turns: Turns = [[Step("read_file", {"path": path}, f"def load(x):\n    return x  # {rng.randint(1, 99)} lines\n")]]
    must: list[int] = []
    for round_ in range(rng.choice((1, 2))):
        test = ("test_load", "test_dump", "test_roundtrip")[round_]
        fail = f"Error: 1 failed, {passed} passed in 0.{rng.randint(10, 99)}s\nFAILED tests/test_core.py::{test}"
        turns.append([Step("run_tests", args, fail, "error")])
        if round_:
            must.append(_steps(turns) - 1)
        body = f"def load(x):\n    return x or {round_}\n"
        turns.append([Step("write_file", {"path": path, "content": body}, f"wrote {len(body)} bytes to {path}")])
    turns.append([Step("run_tests", args, f"{passed + 1} passed in 0.{rng.randint(10, 99)}s")])
    must.append(_steps(turns) - 1)
    turns.append([])
    return turns, tuple(must)


_CITIES = ("Paris", "Lagos", "Lima", "Osaka", "Oslo", "Denver", "Cairo", "Perth", "Quito", "Hanoi", "Turin", "Pune")


def _weather(rng: random.Random) -> str:
    t, h, w = rng.randint(-5, 35), rng.randint(20, 95), rng.randint(0, 40)
    return f"Temperature {t} C, humidity {h}%, wind {w} km/h, partly cloudy"


def multi_entity_lookup(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """The same lookup over 5-10 entities whose answers differ only in numbers: weather
    by city (one call per turn, or all in one turn) or account balances."""
    n = rng.randint(5, 10)
    kind = rng.choice(("weather", "weather_parallel", "balance"))
    if kind == "balance":
        accounts = rng.sample(range(10000, 99999), n)
        calls = [
            Step(
                "get_account_balance",
                {"account_id": f"ACC-{a}"},
                _j({"balance": round(rng.uniform(10, 9000), 2), "currency": "USD", "as_of": "2024-05-15T10:00:00Z"}),
            )
            for a in accounts
        ]
    else:
        calls = [Step("get_weather", {"city": c}, _weather(rng)) for c in rng.sample(_CITIES, n)]
    turns: Turns = [calls] if kind == "weather_parallel" else [[c] for c in calls]
    turns.append([])
    return turns, tuple(range(n))


def poll(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A job's status polled with identical answers until it changes (declared ``poll=True``)."""
    job = f"J-{rng.randint(1000, 9999)}"
    n = rng.randint(3, 12)
    running = _j({"job_id": job, "state": "running", "detail": "waiting for the build runner"})
    turns: Turns = [[Step("start_job", {"pipeline": "nightly"}, _j({"job_id": job, "state": "queued"}))]]
    turns += [[Step("get_job_status", {"job_id": job}, running)] for _ in range(n)]
    done = _j({"job_id": job, "state": "succeeded", "artifact": f"s3://builds/{job}.tgz"})
    turns.append([Step("get_job_status", {"job_id": job}, done)])
    turns.append([])
    return turns, tuple(range(1, n + 2))


_LOGIN_ERRORS = (
    "Error: User not authenticated. Please log in",
    "Error: Session expired. Please log in again.",
    "Error: not logged in: call login first",
)


def login_then_retry(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A tool says the user must log in; the agent logs in with another tool and retries."""
    user = _user(rng)
    tool, args = rng.choice((("get_orders", {"user_id": user}), ("get_profile", {"username": user})))
    turns: Turns = [[Step(tool, args, rng.choice(_LOGIN_ERRORS), "error")]]
    turns.append([Step("login", {"username": user}, _j({"logged_in": True, "user": user}))])
    ok = _j({"user": user, "orders": [f"#W{rng.randint(1000000, 9999999)}" for _ in range(2)]})
    turns.append([Step(tool, args, ok)])
    turns.append([])
    return turns, (2,)


_PER_ID = ("get_order_details", "get_order_status", "get_shipping_info", "get_invoice")


def parallel_same_id(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """One turn asks several lookups of one id at once: the identical call 2-4 times (models
    do send duplicates), or 2-4 different tools; then the agent acts on the answer."""
    order = f"#W{rng.randint(1000000, 9999999)}"
    k = rng.randint(2, 4)
    body = _j({"order_id": order, "status": "delivered", "items": rng.randint(1, 5), "total": rng.randint(20, 400)})
    if rng.random() < 0.5:
        turn = [Step("get_order_details", {"order_id": order}, body)] * k
    else:
        turn = [
            Step(tool, {"order_id": order}, _j({"order_id": order, "tool": tool, "n": rng.randint(1, 99)}))
            for tool in rng.sample(_PER_ID, k)
        ]
    turns: Turns = [*_prefix(rng), turn]
    first = _steps(turns) - k
    turns.append([Step("return_items", {"order_id": order, "item_ids": ["1"]}, _j({"status": "return requested"}))])
    turns.append([])
    return turns, tuple(range(first, first + k))


def cursor_pagination(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A cursor walk: every page a different answer (ids differ, the shape does not)."""
    user = _user(rng)
    pages = rng.randint(3, 8)
    cursor: str | None = None
    turns: Turns = []
    for page in range(pages):
        items = [{"order_id": f"#W{rng.randint(1000000, 9999999)}", "status": "delivered"} for _ in range(3)]
        nxt = _token(rng) if page < pages - 1 else None
        args: dict[str, object] = {"user_id": user, "limit": 3}
        if cursor is not None:
            args["cursor"] = cursor
        turns.append([Step("list_orders", args, _j({"items": items, "next_cursor": nxt}))])
        cursor = nxt
    turns.append([])
    return turns, tuple(range(pages))


_FIXES = (
    ("toggle_airplane_mode", {"enable": False}, "Airplane mode is now OFF."),
    ("reset_apn_settings", {}, "APN settings reset to the carrier defaults."),
    ("grant_app_permission", {"app": "messaging", "permission": "storage"}, "Permission granted."),
    ("reboot_device", {}, "Device rebooted."),
)


def recheck_after_fixes(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A status check re-run after each fix (tau2 telecom): the same answer while the fixes
    do not help, a different one once one does."""
    fixes = rng.sample(_FIXES, rng.randint(2, 4))
    broken = "Your messaging app cannot send MMS messages. Check your device settings."
    turns: Turns = [[Step("can_send_mms", {}, broken)]]
    must = []
    for i, (tool, args, result) in enumerate(fixes):
        turns.append([Step(tool, args, result)])
        last = i == len(fixes) - 1
        turns.append([Step("can_send_mms", {}, "Your messaging app can send MMS messages." if last else broken)])
        must.append(_steps(turns) - 1)
    turns.append([])
    return turns, tuple(must)


def id_batch(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """The same lookup over 10-30 ids with separators (INV-2024-0001...), dates or SKUs, often
    with the identical answer ("paid"); one per turn, or 10 in one turn."""
    n = rng.randint(10, 30)
    kind = rng.choice(("invoice", "date", "sku", "parallel"))
    if kind in ("invoice", "parallel"):
        start = rng.randint(1, 500)
        calls = [
            Step("get_invoice_status", {"invoice_id": f"INV-2024-{start + i:04d}"}, _j({"status": "paid"}))
            for i in range(n if kind == "invoice" else 10)
        ]
    elif kind == "date":
        calls = [
            Step("get_daily_report", {"date": f"2024-03-{1 + i:02d}"}, "No incidents reported.")
            for i in range(min(n, 28))
        ]
    else:
        base = rng.randint(1000, 8000)
        calls = [Step("check_stock", {"sku": f"SKU-{base + i}"}, "in stock (warehouse A)") for i in range(n)]
    turns: Turns = [calls] if kind == "parallel" else [[c] for c in calls]
    turns.append([])
    return turns, tuple(range(len(calls)))


def deleted_orders(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A batch over 10 order ids that were all deleted: ten 404s on different ids."""
    ids = [f"#W{rng.randint(1000000, 9999999)}" for _ in range(10)]
    turns: Turns = [[Step("get_order_details", {"order_id": o}, f"Error: order {o} not found", "error")] for o in ids]
    kept = f"#W{rng.randint(1000000, 9999999)}"
    turns.append([Step("get_order_details", {"order_id": kept}, _j({"order_id": kept, "status": "delivered"}))])
    turns.append([])
    return turns, tuple(range(11))


def outage_recovers(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A service down for 20 s, then back; the agent asks every turn (5 s apart) until it gets
    an answer. The calls once it may be back (the breaker's 60 s cool-down over) must run."""
    query = {"query": rng.choice(("refund policy", "baggage rules", "pet policy"))}
    answer = "3 results: the policy page, the FAQ, the terms"
    turns: Turns = [[Step("search_kb", query, answer, down_until=20.0 + lr.STEP_SECONDS)] for _ in range(14)]
    turns.append([])
    return turns, (13,)  # t+70 s: offered again, and answered


def long_poll(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """A 20-minute job (declared poll) polled about once a minute, a wait tool between polls,
    the poll's arguments sometimes carrying an attempt counter."""
    job = f"J-{rng.randint(1000, 9999)}"
    counter = rng.random() < 0.5
    running = _j({"job_id": job, "state": "running"})
    turns: Turns = [[Step("start_job", {"pipeline": "nightly"}, _j({"job_id": job, "state": "queued"}))]]
    polls = 20
    for i in range(polls):
        args: dict[str, object] = {"job_id": job, "attempt": i + 1} if counter else {"job_id": job}
        turns.append([Step("get_job_status", args, running)])
        turns.append([Step("wait", {"seconds": 55}, "waited 55 seconds", wait_s=55.0)])
    done = _j({"job_id": job, "state": "succeeded"})
    turns.append([Step("get_job_status", {"job_id": job, "attempt": polls + 1} if counter else {"job_id": job}, done)])
    turns.append([])
    return turns, (_steps(turns) - 1,)


def critic_converges(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """Revised drafts whose verdict changes each round until the critic approves."""
    notes = ["the tone is off", "the refund amount is missing", "the dates are wrong", "cite the policy"]
    rounds = rng.randint(2, 4)
    turns: Turns = []
    for i in range(rounds):
        turns.append(
            [Step("critic", {"draft": f"Draft {i}: {_token(rng, 30)}"}, f"Not good enough: {notes[i]}. Revise.")]
        )
    turns.append([Step("critic", {"draft": f"Draft {rounds}: {_token(rng, 30)}"}, "Approved: ready to send.")])
    turns.append([])
    return turns, tuple(range(rounds + 1))


def search_rewrites(rng: random.Random) -> tuple[Turns, tuple[int, ...]]:
    """The agent rewrites its query until it finds the page; each search answers differently."""
    topics = rng.sample(("refund window", "refunds for cancelled flights", "cancellation fees", "vouchers"), 3)
    turns: Turns = []
    for topic in topics:
        hits = ", ".join(f"'{topic} {_token(rng, 5)}'" for _ in range(rng.randint(1, 3)))
        turns.append([Step("search_kb", {"query": topic}, f"results: {hits}")])
        turns.append([Step("think", {"thought": f"Not quite it; rephrase {topic}."}, "")])
    turns.append([])
    return turns, tuple(range(0, 2 * len(topics), 2))


# -- real loops ------------------------------------------------------------------------------

LOOP_LEN = 10  # calls in each generated loop


def _failing(rng: random.Random) -> Step:
    paid = rng.randint(10, 60)
    return Step(
        "update_reservation_flights",
        {"reservation_id": "ZFA04Y", "payment_id": "gift_card_7815826", "amount": paid},
        f"Error: payment amount does not add up, total price is {rng.randint(150, 900)}, but paid {paid}",
        "error",
    )


def _lookups(rng: random.Random, k: int) -> list[Step]:
    pool = [
        Step("search_kb", {"query": "refund policy"}, "3 results: the refund policy, the returns page, the FAQ"),
        Step("open_page", {"url": "https://help.example/refunds"}, "Refunds are processed within 14 days."),
        Step("get_order_details", {"order_id": "#W2378156"}, _j({"order_id": "#W2378156", "status": "delivered"})),
        Step("get_user_details", {"user_id": "mia_li_3668"}, _j({"user_id": "mia_li_3668", "membership": "gold"})),
    ]
    return rng.sample(pool, k)


def same_failure(rng: random.Random) -> Turns:
    step = _failing(rng)
    return [[step] for _ in range(LOOP_LEN)]


def same_success(rng: random.Random) -> Turns:
    """The identical call with the identical answer (tau2: transfer_to_human_agents x100)."""
    step = rng.choice(
        (
            Step("transfer_to_human_agents", {"summary": "user wants a refund"}, "Transfer successful"),
            Step("get_details_by_id", {"id": "L1002"}, _j({"line_id": "L1002", "status": "Active", "plan": "P1002"})),
        )
    )
    return [[step] for _ in range(LOOP_LEN)]


def ab_cycle(rng: random.Random) -> Turns:
    a, b = _lookups(rng, 2)
    return [[s] for _ in range(LOOP_LEN // 2) for s in (a, b)]


def abc_cycle(rng: random.Random) -> Turns:
    a, b, c = _lookups(rng, 3)
    return [[s] for _ in range(LOOP_LEN) for s in (a, b, c)][: 3 * (LOOP_LEN // 2) + 3]


def critic(rng: random.Random) -> Turns:
    """The same draft reviewed again and again; the verdict differs in a score and a time."""
    draft = "Offer the passenger a refund for the cancelled flight."
    turns: Turns = []
    for i in range(LOOP_LEN):
        verdict = (
            f"Score {rng.randint(4, 7)}/10 (reviewed 12:{rng.randint(0, 59):02d}:{i:02d}): "
            "the conclusion is still unsupported."
        )
        turns.append([Step("review_draft", {"draft": draft}, verdict)])
    return turns


def varied_args(rng: random.Random) -> Turns:
    """The same call whose arguments vary only in whitespace and key order (failing, or with
    the same answer)."""
    failing = rng.random() < 0.5
    turns: Turns = []
    for i in range(LOOP_LEN):
        query = ("refund  policy", " refund policy", "refund policy ", "refund\tpolicy")[i % 4]
        args = {"query": query, "limit": 5} if i % 2 else {"limit": 5, "query": query}
        if failing:
            turns.append([Step("search_kb", args, "Error: search index unavailable for this tenant", "error")])
        else:
            turns.append([Step("search_kb", args, "3 results: the refund policy, the returns page, the FAQ")])
    return turns


def page_walk_same(rng: random.Random) -> Turns:
    """A page argument walks on; the answer is the same (non-empty) page every time."""
    user = _user(rng)
    body = _j({"items": [{"order_id": "#W2378156", "status": "delivered"}], "page": 1, "total_pages": 1})
    return [[Step("list_orders", {"user_id": user, "page": p}, body)] for p in range(2, 2 + LOOP_LEN)]


def repeat_after_nothing(rng: random.Random) -> Turns:
    """A failing call, then the same call again with no other tool in between (a model turn
    without tool calls between the attempts), many times."""
    step = _failing(rng)
    turns: Turns = []
    for _ in range(LOOP_LEN):
        turns += [[step], []]
    return turns


def failure_between_lookups(rng: random.Random) -> Turns:
    """The same failing call with a read-only lookup (declared ``read_only=True``) between."""
    step = _failing(rng)
    look = Step(
        "get_reservation_details", {"reservation_id": "ZFA04Y"}, _j({"reservation_id": "ZFA04Y", "cabin": "economy"})
    )
    return [[s] for _ in range(LOOP_LEN // 2 + 1) for s in (step, look)]


def think_interleaved_failure(rng: random.Random) -> Turns:
    """The identical failing call alternated with a varied think, a note or a new search
    (the failure the old world rule let through: something succeeded in between)."""
    failing = Step(
        "fetch_doc", {"name": "refunds-2019.pdf"}, "Error: HTTP 404: no document named refunds-2019.pdf", "error"
    )
    between = rng.choice(("think", "log_note", "search_kb"))
    turns: Turns = []
    for i in range(LOOP_LEN):
        turns.append([failing])
        if between == "think":
            turns.append([Step("think", {"thought": f"Maybe it is there now ({i})."}, "")])
        elif between == "log_note":
            turns.append([Step("log_note", {"note": f"attempt {i} failed"}, f"note {i} saved")])
        else:
            turns.append([Step("search_kb", {"query": f"refunds {i}"}, f"{rng.randint(1, 9)} results for refunds {i}")])
    return turns


def critic_revised(rng: random.Random) -> Turns:
    """A critic handed a new draft each round (v0, v1...), the same verdict but for a score."""
    return [
        [Step("critic", {"draft": f"v{i}"}, f"Score {rng.randint(3, 6)}/10. Not good enough: the tone is off. Revise.")]
        for i in range(LOOP_LEN)
    ]


def revised_payment(rng: random.Random) -> Turns:
    """The same booking sent again with another amount each time, failing the same way, with a
    think or a calculate between (tau-bench's book_reservation)."""
    total = rng.randint(300, 900)
    turns: Turns = []
    for _i in range(LOOP_LEN):
        paid = rng.randint(100, total - 1)
        args = {
            "user_id": "mia_li_3668",
            "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}],
            "payment_methods": [{"payment_id": "credit_card_4421486", "amount": paid}],
        }
        text = f"Error: Payment amount does not add up, total price is {total}, but paid {paid}"
        turns.append([Step("book_reservation", args, text, "error")])
        if rng.random() < 0.5:
            turns.append([Step("calculate", {"expression": f"{total} - {paid}"}, str(total - paid))])
        else:
            turns.append([Step("think", {"thought": f"The total is {total}; I paid {paid}."}, "")])
    return turns


def poll_forever(rng: random.Random) -> Turns:
    """A declared poll of a job that never finishes, an attempt counter in its arguments."""
    job = f"J-{rng.randint(1000, 9999)}"
    turns: Turns = []
    for i in range(100):
        turns.append(
            [Step("get_job_status", {"job_id": job, "attempt": i + 1}, _j({"job_id": job, "state": "running"}))]
        )
        turns.append([Step("wait", {"seconds": 20}, "waited 20 seconds", wait_s=20.0)])
    return turns


HealthyMaker = Callable[[random.Random], tuple[Turns, tuple[int, ...]]]
LoopMaker = Callable[[random.Random], Turns]

HEALTHY: dict[str, HealthyMaker] = {
    "precondition_fix_retry": precondition_fix_retry,
    "fix_then_rerun": fix_then_rerun,
    "multi_entity_lookup": multi_entity_lookup,
    "poll": poll,
    "login_then_retry": login_then_retry,
    "parallel_same_id": parallel_same_id,
    "cursor_pagination": cursor_pagination,
    "recheck_after_fixes": recheck_after_fixes,
    "id_batch": id_batch,
    "deleted_orders": deleted_orders,
    "outage_recovers": outage_recovers,
    "long_poll": long_poll,
    "critic_converges": critic_converges,
    "search_rewrites": search_rewrites,
}
LOOPS: dict[str, LoopMaker] = {
    "same_failure": same_failure,
    "same_success": same_success,
    "ab_cycle": ab_cycle,
    "abc_cycle": abc_cycle,
    "critic": critic,
    "varied_args": varied_args,
    "page_walk_same": page_walk_same,
    "repeat_after_nothing": repeat_after_nothing,
    "failure_between_lookups": failure_between_lookups,
    "think_interleaved_failure": think_interleaved_failure,
    "critic_revised": critic_revised,
    "revised_payment": revised_payment,
    "poll_forever": poll_forever,
}
HELP = {
    "precondition_fix_retry": "fails on a precondition (press the brake, create the folder) -> fix -> same call ok",
    "fix_then_rerun": "run_tests fails -> write_file -> the same run_tests passes (1-2 rounds)",
    "multi_entity_lookup": "weather for 5-10 cities / account balances: answers alike but for numbers",
    "poll": "job status polled 3-12 times with identical answers until it changes (poll=True)",
    "login_then_retry": "'not authenticated, please log in' -> login -> retry ok",
    "parallel_same_id": "2-4 lookups of one id in one turn (identical or different tools)",
    "cursor_pagination": "next_cursor walk, a different page every time",
    "recheck_after_fixes": "a status check after each of 2-4 different fixes; the same answer until the last",
    "id_batch": "10-30 lookups over ids with separators, dates or SKUs, often the identical answer",
    "deleted_orders": "10 different order ids, each a 404",
    "outage_recovers": "a service down for 20 s, asked every 5 s; the calls after it may be back must run",
    "long_poll": "a 20-minute job polled once a minute with a wait tool between (poll=True), args with a counter",
    "critic_converges": "revised drafts, the verdict changes each round until approved",
    "search_rewrites": "rewritten queries, a different answer each time, a think between",
    "same_failure": "the identical failing call, 10 times",
    "same_success": "the identical call with the identical answer, 10 times",
    "ab_cycle": "A-B, results unchanged, x5",
    "abc_cycle": "A-B-C, results unchanged, x6",
    "critic": "the same draft reviewed; the verdict changes only in a score and a time, x10",
    "varied_args": "the same call, arguments varied in whitespace and key order, x10",
    "page_walk_same": "page=2,3,... with the same non-empty answer, x10",
    "repeat_after_nothing": "fails, then the same call again after a turn without tools, x10",
    "failure_between_lookups": "the same failing call with a read-only lookup between, x6",
    "think_interleaved_failure": "the identical failing call alternated with a varied think / note / search, x10",
    "critic_revised": "a critic handed drafts v0..v9, the same verdict but for a score",
    "revised_payment": "the same booking with another amount, failing alike, a think or calculate between, x10",
    "poll_forever": "a declared poll that never finishes, an attempt counter in its args, a wait between",
}
POLICIES: dict[str, dict[str, dict[str, object]]] = {
    "poll": {"get_job_status": {"poll": True, "max_calls": 30}},
    "failure_between_lookups": {"get_reservation_details": {"read_only": True}},
    "long_poll": {"get_job_status": {"poll": True}},
    "poll_forever": {"get_job_status": {"poll": True}},
}


def _case(suite: str, pattern: str, i: int, turns: Turns, must: tuple[int, ...], loop_start: int) -> Case:
    policies = POLICIES.get(pattern, {})
    run = lr.Run(f"generated-{suite}", f"{pattern}#{i}", "tau", suite == "healthy", turns, suite, dict(policies))
    return Case(suite, pattern, run, loop_start, must, policies)


def healthy_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """``n`` cases of every healthy pattern."""
    out = []
    for pattern, make in HEALTHY.items():
        for i in range(n):
            turns, must = make(random.Random(f"{seed}:{pattern}:{i}"))
            out.append(_case("healthy", pattern, i, turns, must, 0))
    return out


def loop_cases(n: int = 20, seed: int = 0) -> list[Case]:
    """``n`` cases of every loop pattern, each after a short healthy prefix."""
    out = []
    for pattern, make in LOOPS.items():
        for i in range(n):
            rng = random.Random(f"{seed}:{pattern}:{i}")
            prefix = _prefix(rng)
            turns = [*prefix, *make(rng), []]
            out.append(_case("loop", pattern, i, turns, (), _steps(prefix)))
    return out
