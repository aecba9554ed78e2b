"""Issue 34 must-show: the memory wrappers never lose or mix a record.

* a record is a repeat only if it is the same content (whitespace aside) in the same scope;
  numbers, ids, quoted values and paths make two facts different, and every record is
  written under the caller's own key (the issue's two customer cases, and a property);
* only the governor's own failure texts (both renderings) and bare tracebacks are dropped;
  records that merely mention an error are kept;
* every dropped, trimmed or lost record is a WARNING of the ``loop_governor`` logger naming
  its key and the reason, and ``stats`` counts each.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from crewai.memory.storage.lancedb_storage import LanceDBStorage
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from langgraph.store.memory import InMemoryStore

import loop_governor as lg
from crewai_governor import GovernedStorage
from langchain_governor import GovernedStore
from loop_governor.errors import ErrorType, GovernedError, read_model_text
from loop_governor.memory import MemoryGuard, failure_reason

NS = ("crm", "orders")

# -- 1. records never mix ----------------------------------------------------------------------


def test_the_issues_two_orders_stay_two_records(governor: lg.Governor) -> None:
    inner = InMemoryStore()
    store = GovernedStore(inner, governor)

    store.put(NS, "order-1042", {"text": "Customer 1042 ordered 3 units of SKU 5531"})
    store.put(NS, "order-2291", {"text": "Customer 2291 ordered 7 units of SKU 8812"})

    assert store.get(NS, "order-1042").value == {"text": "Customer 1042 ordered 3 units of SKU 5531"}
    assert store.get(NS, "order-2291").value == {"text": "Customer 2291 ordered 7 units of SKU 8812"}
    assert store.stats["repeats"] == 0 and store.stats["written"] == 2


def test_two_customers_credit_limits_stay_apart_in_crewai_memory(tmp_path: Any, governor: lg.Governor, mk: Any) -> None:
    lance = LanceDBStorage(path=str(tmp_path / "lance"))
    storage = GovernedStorage(lance, governor)
    a = mk.record("Customer 1042 has a credit limit of 5000 EUR", scope="/crm/customers")
    b = mk.record("Customer 8810 has a credit limit of 90000 EUR", scope="/crm/customers")

    storage.save([a])
    storage.save([b])

    assert storage.get_record(a.id).content == "Customer 1042 has a credit limit of 5000 EUR"
    assert storage.get_record(b.id).content == "Customer 8810 has a credit limit of 90000 EUR"
    assert lance.count() == 2


_TEMPLATES = [
    "Customer {n} ordered {m} units of SKU {k}",
    "ticket {n} assigned to 'user-{m}' at /srv/app/{k}.log",
    'credit limit of customer {n} is "{m} EUR" (ref {k})',
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    template=st.sampled_from(_TEMPLATES),
    first=st.tuples(st.integers(0, 99_999), st.integers(0, 999), st.integers(0, 9_999)),
    second=st.tuples(st.integers(0, 99_999), st.integers(0, 999), st.integers(0, 9_999)),
    spaces=st.sampled_from(["", " ", "\n  "]),
)
@example(template=_TEMPLATES[0], first=(1042, 3, 5531), second=(2291, 7, 8812), spaces="")
@example(template=_TEMPLATES[0], first=(1042, 3, 5531), second=(1042, 3, 5531), spaces="\n  ")
def test_a_record_is_a_repeat_only_of_the_same_content(
    governor: lg.Governor, template: str, first: tuple[int, int, int], second: tuple[int, int, int], spaces: str
) -> None:
    """Whatever the numbers, ids, quoted values and paths: each key reads back its own value,
    and a repeat is counted exactly when the two contents are equal but for whitespace."""
    store = GovernedStore(InMemoryStore(), governor)
    one = template.format(n=first[0], m=first[1], k=first[2])
    two = spaces + template.format(n=second[0], m=second[1], k=second[2]).replace(" ", " " + spaces, 1)

    store.put(NS, "a", {"text": one})
    store.put(NS, "b", {"text": two})

    assert store.get(NS, "a").value == {"text": one}
    assert store.get(NS, "b").value == {"text": two}
    assert store.stats["repeats"] == (1 if first == second else 0)


# -- 2. only the governor's failures are dropped ---------------------------------------------

# Records about an error, not failures (the issue's five): each must be kept.
MENTIONS = [
    "Note from the incident: the job died with\nTraceback (most recent call last):\n"
    '  File "etl.py", line 12, in run\nMemoryError\nFixed by streaming the rows.',
    {"job": "nightly-etl", "status": "error", "exit_code": 2, "owner": "data-team"},
    "Error: ENOSPC means the volume is full; run `make clean` and retry the build.",
    "Error handling policy: retry twice, then page the on-call. Fatal errors page at once.",
    {"error": "timeout after 30s", "retries": 3, "endpoint": "/v1/orders"},
]


@pytest.mark.parametrize("value", MENTIONS, ids=["note", "job", "howto", "policy", "field"])
def test_records_that_mention_an_error_are_kept(governor: lg.Governor, value: Any, make_store: Any) -> None:
    inner = make_store()
    store = GovernedStore(inner, governor)
    record = value if isinstance(value, dict) else {"text": value}

    store.put(NS, "k", record)

    assert inner.get(NS, "k").value == record and store.stats["dropped"] == 0


def _rendered(kind: ErrorType, message: str, advice: str | None, fmt: str) -> str:
    info = GovernedError(
        error_type=kind,
        retryable=False,
        tool="search_docs",
        message=message,
        advice=advice,
        attempts=3 if kind is ErrorType.TRANSIENT else 1,
        status=404,
    )
    return info.to_json_text() if fmt == "json" else info.to_plain_text()


_MESSAGES = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=200)


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(list(ErrorType)),
    message=_MESSAGES,
    advice=st.one_of(st.none(), st.text(st.characters(blacklist_categories=["Cs", "Zl", "Zp", "Cc"]), max_size=80)),
    fmt=st.sampled_from(["plain", "json"]),
    framing=st.sampled_from(["{}", "The search said: {}", "Task: look it up\nResult: {}\nThat was all."]),
)
def test_both_renderings_of_every_governed_failure_are_dropped(
    kind: ErrorType, message: str, advice: str | None, fmt: str, framing: str
) -> None:
    text = _rendered(kind, message, advice, fmt)
    assert read_model_text(text) is not None  # the governor's own reader agrees it is one
    assert failure_reason(framing.format(text)) == "governed_error"
    assert failure_reason({"fact": framing.format(text)}) == "governed_error"


def test_a_bare_traceback_is_dropped_also_a_chained_one(mk: Any) -> None:
    chained = (
        f"{mk.TRACEBACK}\n\nThe above exception was the direct cause of the following exception:\n\n"
        'Traceback (most recent call last):\n  File "/app/y.py", line 9, in g\n    h()\n    ~^^\nRuntimeError: wrapped'
    )
    assert failure_reason(mk.TRACEBACK) == failure_reason(chained) == "traceback"
    assert failure_reason(f"{mk.TRACEBACK}\nI fixed it by adding the key.") is None


# -- logging and counting ---------------------------------------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The memory guard's own WARNING lines (a failed backend call has a line of its own too)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "loop_governor"
        and r.levelno == logging.WARNING
        and str(getattr(r, "lg_event", {}).get("event", "")).startswith("memory")
    ]


def test_every_dropped_trimmed_or_lost_record_is_a_warning_with_its_key_and_counted(
    governor: lg.Governor, mk: Any, make_store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="loop_governor")
    inner = make_store()
    store = GovernedStore(inner, governor)

    store.put(NS, "failed-search", {"text": _rendered(ErrorType.PERMANENT, "no page", "fix the path", "plain")})
    store.put(NS, "stack", {"text": mk.TRACEBACK})
    store.put(NS, "long-log", {"text": "start " + "x" * 9000 + " end"})
    store.put(NS, "screenshot", {"png": "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUg" * 50})
    inner.faults.forever = mk.HTTPError(503, "store down")
    store.put(NS, "lost-1", {"text": "kept only if the store answers"})

    lines = _warnings(caplog)
    assert len(lines) == 5, lines
    dropped, stack, long_log, shot, lost = lines
    assert "failed-search" in dropped and "governor's failure text" in dropped
    assert "stack" in stack and "nothing but a Python traceback" in stack
    assert "long-log" in long_log and "chars removed" in long_log
    assert "screenshot" in shot and "base64 blob" in shot
    assert "lost 1 record (crm/orders/lost-1)" in lost and "transient" in lost
    assert {k: store.stats[k] for k in ("dropped", "trimmed", "lost", "save_failures", "written")} == {
        "dropped": 2,
        "trimmed": 2,
        "lost": 1,
        "save_failures": 1,
        "written": 2,
    }


def test_a_failed_crewai_batch_names_every_lost_id(
    governor: lg.Governor, storage: Any, mk: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="loop_governor")
    wrapped = GovernedStorage(storage, governor)
    storage.faults.forever = mk.HTTPError(503, "vector db down")
    records = [mk.record(f"fact {c}") for c in "abc"]

    wrapped.save(records)

    (line,) = _warnings(caplog)
    assert all(r.id in line for r in records) and "lost 3 records" in line
    assert wrapped.stats["lost"] == 3 and wrapped.stats["save_failures"] == 1


def test_odd_shapes_never_raise_from_the_filter(governor: lg.Governor) -> None:
    """Tuple keys, mixed keys, a cycle, 2,000 levels: the guard decides, never raises."""
    deep: list[Any] = []
    cur = deep
    for _ in range(2000):
        cur.append([])
        cur = cur[0]
    cyclic: list[Any] = ["x"]
    cyclic.append(cyclic)
    guard = MemoryGuard(governor, "Dict")

    for i, value in enumerate([{(1, 2): "a"}, {1: "a", "1": "b"}, deep, cyclic]):
        write = guard.admit("/", f"k{i}", {"v": value})
        assert write.action == "store"
    assert guard.stats.trimmed == 2  # the deep one and the cycle lose what is past 64 levels
