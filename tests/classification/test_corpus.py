"""lg.classify over a corpus of real exceptions from real SDK clients (issue 2, "Must show").

The labels are what a careful operator wants (see classification_corpus.py); the thresholds
are pinned to the figures the corpus reaches (issue 27): every case right, so no single case
can regress unseen.  On failure the confusion table and every miss (with the exception's
attributes and cause chain) are printed.
"""

from __future__ import annotations

from collections import Counter

import pytest
from classification_corpus import FATAL, LABELS, PERMANENT, TRANSIENT, Case
from classification_eval import (
    accuracy,
    confusion_table,
    evaluate,
    misses_report,
    per_library,
    recall,
)

import loop_governor as lg

LIBRARIES = (
    "openai",
    "anthropic",
    "httpx",
    "requests",
    "aiohttp",
    "botocore",
    "google-api-core",
    "grpc",
    "redis",
    "sqlalchemy",
    "psycopg",
    "sqlite3",
    "pydantic",
    "json",
    "builtins",
    "urllib",
    "asyncio",
    "tenacity",
    "wrapped",
    "grouped",
)


def test_corpus_is_large_and_covers_every_class(corpus: list[Case]) -> None:
    counts = Counter(c.expected for c in corpus)
    assert len(corpus) >= 130, len(corpus)
    assert counts[TRANSIENT] >= 40 and counts[PERMANENT] >= 40 and counts[FATAL] >= 30, counts
    descriptions = [c.description for c in corpus]
    assert len(set(descriptions)) == len(descriptions), "descriptions must identify cases uniquely"


@pytest.mark.parametrize("library", LIBRARIES)
def test_each_library_contributes_real_cases(corpus: list[Case], library: str) -> None:
    cases = [c for c in corpus if c.library == library]
    assert len(cases) >= 2, f"{library} contributed {len(cases)} cases"
    for c in cases:
        assert isinstance(c.exc, BaseException)
        assert c.expected in LABELS


def test_classify_never_raises_and_gives_a_signature(corpus: list[Case]) -> None:
    problems = []
    for case in corpus:
        try:
            info = lg.classify(case.exc)
        except Exception as exc:
            problems.append(f"{case.description}: classify raised {exc!r}")
            continue
        if not isinstance(info.signature, str) or not info.signature:
            problems.append(f"{case.description}: signature={info.signature!r}")
        if str(getattr(info.error_type, "value", info.error_type)) not in LABELS:
            problems.append(f"{case.description}: error_type={info.error_type!r}")
    assert not problems, "\n".join(problems)


def test_accuracy_and_fatal_recall(corpus: list[Case]) -> None:
    outcomes = evaluate(corpus, lg.classify)
    acc, fatal_recall = accuracy(outcomes), recall(outcomes, FATAL)
    report = f"\n{confusion_table(outcomes)}\nper library:\n{per_library(outcomes)}\nmisses:\n{misses_report(outcomes)}"
    print(report)  # visible with -s / -rP even when the thresholds hold
    misses = [o for o in outcomes if not o.correct]
    assert acc == 1.0 and fatal_recall == 1.0 and not misses, (
        f"accuracy {acc:.1%} (pinned at 100%), fatal recall {fatal_recall:.1%} (pinned at 100%)" + report
    )


def test_retry_after_from_the_server_is_reported(corpus: list[Case]) -> None:
    """A 429 that says Retry-After: N must reach the retry policy as retry_after == N."""
    cases = [c for c in corpus if c.retry_after is not None]
    assert len(cases) >= 4
    wrong = []
    for c in cases:
        info = lg.classify(c.exc)
        if info.retry_after is None or abs(float(info.retry_after) - c.retry_after) > 1e-6:
            wrong.append(f"{c.description}: retry_after={info.retry_after!r}, server said {c.retry_after}")
    assert not wrong, "\n".join(wrong)


ANTHROPIC_LIMITS = (
    "anthropic messages.create 429 rate_limit_error: monthly spend limit",
    "anthropic messages.create 400 specified API usage limits reached",
    "anthropic messages.create 429 extra usage required",
    "anthropic messages.create 403 permission_error on a resource",
    "anthropic messages.create 429 account rate limit",
    "anthropic messages.create 403 organization has been disabled",
    # per-minute quotas stay transient next to the new spend-limit texts
    "google-api-core (grpc_helpers) RateExhausted",
    "grpc server aborts RateExhausted",
)


def test_anthropic_spend_limits_are_fatal_and_a_resource_permission_is_permanent(corpus: list[Case]) -> None:
    # Issue 17: the spend-limit 429 was retried as a rate limit; a permission_error on one
    # resource stopped the whole run as if the key were bad.
    by_description = {c.description: c for c in corpus}
    got = {d: str(lg.classify(by_description[d].exc).error_type) for d in ANTHROPIC_LIMITS}
    assert got == {d: by_description[d].expected for d in ANTHROPIC_LIMITS}
    assert [by_description[d].expected for d in ANTHROPIC_LIMITS] == [
        *(FATAL, FATAL, FATAL, PERMANENT, TRANSIENT, FATAL),
        *(TRANSIENT, TRANSIENT),
    ]


QUOTAS = {
    # issue 27: a quota that refills (per minute, per day) or names a retry delay is a throttle
    "openai chat.completions 429 rate_limit_exceeded whose text says quota": TRANSIENT,
    "openai chat.completions 429 Gemini free-tier per-minute quota (OpenAI-compatible endpoint)": TRANSIENT,
    "google-api-core from_http_response 429 RESOURCE_EXHAUSTED Gemini free-tier per-minute quota, retry in 20s": (
        TRANSIENT
    ),
    "google-api-core from_http_response 429 RESOURCE_EXHAUSTED Vertex requests_per_minute quota": TRANSIENT,
    # ... and only billing or plan exhaustion is fatal
    "openai chat.completions 429 insufficient_quota (quota exhausted, billing)": FATAL,
    "openai chat.completions 400 billing_hard_limit_reached": FATAL,
    "AsyncOpenAI 429 insufficient_quota": FATAL,
}


def test_a_refilling_quota_is_a_throttle_and_only_plan_exhaustion_is_fatal(corpus: list[Case]) -> None:
    by_description = {c.description: c for c in corpus}
    got = {}
    for description in QUOTAS:
        info = lg.classify(by_description[description].exc)
        got[description] = str(info.error_type)
        if info.error_type == TRANSIENT:
            assert info.throttled, description  # waited out as a rate limit, not as an outage
    assert got == QUOTAS
    gemini = lg.classify(by_description[next(iter(d for d in QUOTAS if "free-tier" in d))].exc)
    assert gemini.retry_after == pytest.approx(20.04)
