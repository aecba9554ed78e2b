"""What governing a model call costs on the success path, against LangChain's own retry.

Each case calls a model-call handler that answers at once (a scripted chat model's
reply, already built), so what is timed is the wrapper alone:

* ``GovernorMiddleware.wrap_model_call`` (inside the run's task, no trace subscriber)
  against ``ModelRetryMiddleware.wrap_model_call`` (its defaults) and the bare handler;
* the core ``Governor.call_model`` against a bare call, outside and inside a task.

Interleaved rounds, medians (and minima); these machines are noisy. Target: governed
model-call overhead <= 20 us a call.

    .venv/bin/python benchmarks/model_call_overhead.py [--rounds 31] [--calls 2000] [--messages 40]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import ModelRequest, ModelResponse, ModelRetryMiddleware
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

import loop_governor as lg
from langchain_governor import GovernorMiddleware


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def medians(cases: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, tuple[float, float]]:
    for fn in cases.values():  # warm caches (policies, governed model copies)
        per_call_us(fn, 200)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    gc.disable()
    try:
        for _ in range(rounds):  # interleaved: drift hits every case alike
            for name, fn in cases.items():
                samples[name].append(per_call_us(fn, calls))
    finally:
        gc.enable()
    return {name: (statistics.median(v), min(v)) for name, v in samples.items()}


def conversation(n: int) -> list[Any]:
    messages: list[Any] = [HumanMessage("find the refund policy")]
    for i in range(n // 2):
        messages.append(
            AIMessage("", tool_calls=[{"name": "search", "args": {"q": f"q{i}"}, "id": f"c{i}", "type": "tool_call"}])
        )
        messages.append(ToolMessage(f"result {i} " * 20, tool_call_id=f"c{i}"))
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=40)
    opts = parser.parse_args()

    reply = AIMessage("done", usage_metadata={"input_tokens": 900, "output_tokens": 5, "total_tokens": 905})
    response = ModelResponse(result=[reply])
    model = FakeMessagesListChatModel(responses=[reply])
    request = ModelRequest(
        model=model,
        messages=conversation(opts.messages),
        system_message=SystemMessage("be brief"),
        state={"messages": []},
        runtime=None,
    )

    def handler(_request: ModelRequest[Any]) -> ModelResponse[Any]:
        return response

    governor = lg.Governor()
    governed = GovernorMiddleware(governor, record_messages=False)
    retrying = ModelRetryMiddleware()

    def bare_fn(prompt: Any) -> Any:
        return response

    with governor.task("bench"):
        middleware = medians(
            {
                "bare handler": lambda: handler(request),
                "ModelRetryMiddleware": lambda: retrying.wrap_model_call(request, handler),
                "GovernorMiddleware": lambda: governed.wrap_model_call(request, handler),
            },
            opts.rounds,
            opts.calls,
        )
        in_task = medians(
            {"call_model (in task)": lambda: governor.call_model("fake:model", bare_fn, request)},
            opts.rounds,
            opts.calls,
        )
    core = medians(
        {
            "bare call": lambda: bare_fn(request),
            "call_model": lambda: governor.call_model("fake:model", bare_fn, request),
        },
        opts.rounds,
        opts.calls,
    )
    results = {**middleware, **core, **in_task}
    print(f"model-call success path, {opts.messages} messages, {opts.rounds} rounds x {opts.calls} calls")
    print(f"{'case':28} {'us/call (median)':>17} {'(min)':>8}")
    for name, (median, best) in results.items():
        print(f"{name:28} {median:17.2f} {best:8.2f}")
    bare = results["bare handler"][0]
    gov_over = results["GovernorMiddleware"][0] - bare
    retry_over = results["ModelRetryMiddleware"][0] - bare
    print(f"\nGovernorMiddleware overhead: {gov_over:.2f} us a call (target <= 20)")
    print(f"ModelRetryMiddleware overhead: {retry_over:.2f} us a call")
    print(f"ratio governed / ModelRetry overhead: {gov_over / retry_over:.2f}x" if retry_over > 0 else "")
    core_over = results["call_model"][0] - results["bare call"][0]
    task_over = results["call_model (in task)"][0] - results["bare call"][0]
    print(f"core call_model overhead: {core_over:.2f} us outside a task, {task_over:.2f} us inside")


if __name__ == "__main__":
    main()
