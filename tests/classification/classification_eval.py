"""Scoring helpers shared by the corpus test and benchmarks/classification_report.py.

Kept apart from the corpus so the report script and the test print the same confusion table
and the same miss descriptions.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

from classification_corpus import FATAL, LABELS, PERMANENT, TRANSIENT, Case


@dataclass
class Outcome:
    case: Case
    got: str | None  # predicted label, None when classify raised
    info: Any = None
    error: BaseException | None = None

    @property
    def correct(self) -> bool:
        return self.got == self.case.expected


def label_of(error_type: Any) -> str:
    """ErrorType is a str enum; accept the enum or its value."""
    return str(getattr(error_type, "value", error_type))


def evaluate(cases: Sequence[Case], classify: Callable[[BaseException], Any]) -> list[Outcome]:
    out: list[Outcome] = []
    for case in cases:
        try:
            info = classify(case.exc)
        except Exception as exc:
            out.append(Outcome(case, None, None, exc))
            continue
        out.append(Outcome(case, label_of(info.error_type), info))
    return out


def evaluate_labels(cases: Sequence[Case], predict: Callable[[BaseException], str]) -> list[Outcome]:
    return [Outcome(c, predict(c.exc)) for c in cases]


def accuracy(outcomes: Sequence[Outcome]) -> float:
    return sum(o.correct for o in outcomes) / len(outcomes)


def recall(outcomes: Sequence[Outcome], label: str) -> float:
    relevant = [o for o in outcomes if o.case.expected == label]
    return sum(o.correct for o in relevant) / len(relevant) if relevant else 1.0


def precision(outcomes: Sequence[Outcome], label: str) -> float:
    predicted = [o for o in outcomes if o.got == label]
    return sum(o.correct for o in predicted) / len(predicted) if predicted else 1.0


def confusion_table(outcomes: Sequence[Outcome]) -> str:
    counts = Counter((o.case.expected, o.got or "raised") for o in outcomes)
    cols = [*LABELS, "raised"]
    lines = ["expected \\ got " + "".join(f"{c:>11}" for c in cols) + f"{'recall':>9}"]
    for exp in LABELS:
        row = "".join(f"{counts[(exp, c)]:>11}" for c in cols)
        lines.append(f"{exp:<15}{row}{recall(outcomes, exp):>9.1%}")
    lines.append(f"accuracy {accuracy(outcomes):.1%} over {len(outcomes)} cases")
    return "\n".join(lines)


def per_library(outcomes: Sequence[Outcome]) -> str:
    libs = sorted({o.case.library for o in outcomes})
    lines = []
    for lib in libs:
        sub = [o for o in outcomes if o.case.library == lib]
        lines.append(f"  {lib:<16}{sum(o.correct for o in sub):>4}/{len(sub):<4}")
    return "\n".join(lines)


_EXC_ATTRS = ("status_code", "status", "code", "error_code", "reason", "errno", "body", "message")


def exception_facts(exc: BaseException, depth: int = 0) -> str:
    """Type, text and the attributes a classifier would look at, plus the cause chain."""
    facts = [f"{type(exc).__module__}.{type(exc).__qualname__}: {str(exc)[:300]!r}"]
    for attr in _EXC_ATTRS:
        try:
            value = getattr(exc, attr, None)
            if callable(value):
                value = value()
        except Exception:
            continue
        if value is not None:
            facts.append(f"{attr}={str(value)[:200]!r}")
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        facts.append(
            f"response.Error={response.get('Error')} http={response.get('ResponseMetadata', {}).get('HTTPStatusCode')}"
        )
    elif response is not None:
        facts.append(f"response.status={getattr(response, 'status_code', getattr(response, 'status', None))}")
    pad = "      " * (depth + 1)
    text = f"\n{pad}".join(facts)
    if depth < 3:
        if isinstance(exc, BaseExceptionGroup):
            for member in exc.exceptions:
                text += f"\n{pad}member: " + exception_facts(member, depth + 1)
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is not None:
            text += f"\n{pad}cause: " + exception_facts(nxt, depth + 1)
    return text


def describe_miss(o: Outcome) -> str:
    got = o.got if o.error is None else f"RAISED {o.error!r}"
    head = f"- [{o.case.library}] {o.case.description}\n    expected={o.case.expected} got={got}"
    if o.info is not None:
        fields = {k: getattr(o.info, k, None) for k in ("status", "code", "signature", "retry_after", "message")}
        head += f"\n    info={ {k: (str(v)[:160] if v is not None else None) for k, v in fields.items()} }"
    return head + "\n    exc: " + exception_facts(o.case.exc)


def misses_report(outcomes: Sequence[Outcome]) -> str:
    misses = [o for o in outcomes if not o.correct]
    return "\n".join(describe_miss(o) for o in misses) if misses else "(no misses)"


# ----------------------------------------------------------------------------- naive baseline


def http_status(exc: BaseException) -> int | None:
    """The HTTP status a status-code-only heuristic would read, from the usual attributes."""
    for attr in ("status_code", "status", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return value if isinstance(value, int) else None
    for attr in ("status_code", "status"):
        value = getattr(response, attr, None)
        if isinstance(value, int):
            return value
    return None


def naive_status_label(exc: BaseException, unknown: str = PERMANENT) -> str:
    """Status-code-only: 401/402 fatal, 408/425/429/5xx transient, other 4xx permanent."""
    status = http_status(exc)
    if status is None:
        return unknown
    if status in (401, 402):
        return FATAL
    if status in (408, 425, 429) or status >= 500:
        return TRANSIENT
    return PERMANENT if 400 <= status < 500 else unknown
