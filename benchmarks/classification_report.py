"""Classification corpus report: lg.classify vs naive baselines on real SDK exceptions.

Builds the corpus of tests/classification (real exceptions raised by openai, anthropic,
httpx, requests, aiohttp, botocore, google-api-core, grpc, redis-py, sqlalchemy, psycopg,
... against peers on 127.0.0.1), then prints for each classifier the accuracy, per-class
recall/precision and the confusion table, plus every miss of lg.classify, and the median
cost of one classify() call.

Baselines:
  status-only/unknown=permanent  the HTTP status code alone (401/402 fatal, 408/425/429/5xx
                                 transient, other 4xx permanent), everything without a
                                 status -> permanent (GovernorConfig.unknown_error default)
  status-only/unknown=transient  same, but statusless errors are retried
  retry-everything               every error transient (LangChain ToolRetryMiddleware's default)

Run: .venv/bin/python benchmarks/classification_report.py [--misses-only]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "classification"))

from classification_corpus import FATAL, LABELS, PERMANENT, TRANSIENT, build_corpus
from classification_eval import (
    Outcome,
    accuracy,
    confusion_table,
    evaluate,
    evaluate_labels,
    misses_report,
    naive_status_label,
    per_library,
    precision,
    recall,
)


def summary(name: str, outcomes: list[Outcome]) -> str:
    parts = [f"{name:<32} accuracy {accuracy(outcomes):6.1%}"]
    parts += [f"{lab[:4]} R {recall(outcomes, lab):5.1%} P {precision(outcomes, lab):5.1%}" for lab in LABELS]
    return "  ".join(parts)


def classify_cost_us(cases: list, classify: object, rounds: int = 5) -> tuple[float, float, float]:
    """Median, p95 and max over exceptions of each exception's median classify() time (us)."""
    per_case = []
    for c in cases:
        runs = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            classify(c.exc)  # type: ignore[operator]
            runs.append((time.perf_counter() - t0) * 1e6)
        per_case.append(statistics.median(runs))
    per_case.sort()
    return statistics.median(per_case), per_case[int(0.95 * (len(per_case) - 1))], per_case[-1]


def main() -> int:
    t0 = time.perf_counter()
    corpus = build_corpus()
    build_s = time.perf_counter() - t0
    by_label = {lab: sum(c.expected == lab for c in corpus) for lab in LABELS}
    print(
        f"corpus: {len(corpus)} real exceptions from {len({c.library for c in corpus})} sources "
        f"({by_label}), built in {build_s:.1f}s"
    )

    baselines = {
        "status-only/unknown=permanent": evaluate_labels(corpus, lambda e: naive_status_label(e, PERMANENT)),
        "status-only/unknown=transient": evaluate_labels(corpus, lambda e: naive_status_label(e, TRANSIENT)),
        "retry-everything": evaluate_labels(corpus, lambda e: TRANSIENT),
    }
    try:
        import loop_governor as lg

        ours = evaluate(corpus, lg.classify)
    except (ImportError, AttributeError) as exc:
        print(f"loop_governor.classify unavailable: {exc!r}")
        ours = None

    print()
    if ours is not None:
        print(summary("loop_governor.classify", ours))
    for name, outcomes in baselines.items():
        print(summary(name, outcomes))

    if "--misses-only" not in sys.argv:
        for name, outcomes in baselines.items():
            print(f"\n== {name}\n{confusion_table(outcomes)}")
    if ours is not None:
        print(f"\n== loop_governor.classify\n{confusion_table(ours)}\nper library:\n{per_library(ours)}")
        print(f"\nmisses of loop_governor.classify:\n{misses_report(ours)}")
        naive = baselines["status-only/unknown=permanent"]
        fixed = sum(o.correct and not n.correct for o, n in zip(ours, naive, strict=True))
        broke = sum(n.correct and not o.correct for o, n in zip(ours, naive, strict=True))
        print(
            f"\nvs status-only: {fixed} cases fixed, {broke} cases broken; "
            f"fatal recall {recall(ours, FATAL):.1%} vs {recall(naive, FATAL):.1%}"
        )
        med, p95, worst = classify_cost_us(corpus, lg.classify)
        print(
            f"classify cost per exception (median of 5 runs each): median {med:.0f} us, p95 {p95:.0f} us, "
            f"max {worst:.0f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
