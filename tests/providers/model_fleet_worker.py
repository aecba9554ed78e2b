"""One agent process of a fleet sharing a provider key's request limit through Redis.

``python model_fleet_worker.py '<json plan>'``: waits at a Redis barrier for the whole
fleet, then makes ``calls`` governed model calls with the real openai SDK (its own
retries off) to the test's OpenAI-compatible server, and prints one JSON report line.
"""

from __future__ import annotations

import json
import sys
import time

import openai
import redis

import loop_governor as lg


def main() -> None:
    plan = json.loads(sys.argv[1])
    client = openai.OpenAI(base_url=plan["server"], api_key="sk-test-fleet-0000abcd", max_retries=0)
    try:  # open the connection before the start: a first request's setup would skew its arrival
        client.models.list()
    except openai.APIError:
        pass  # the test server has no /models: a 404, not a completion
    raw = redis.Redis.from_url(plan["redis"], decode_responses=True)
    key = f"{plan['ns']}:start"
    raw.incr(key)
    deadline = time.monotonic() + 60
    while int(raw.get(key) or 0) < plan["n"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the fleet never gathered")
        time.sleep(0.005)
    limit = lg.ModelPolicy(rpm=plan["rpm"], rpm_burst=plan["burst"])
    config = lg.GovernorConfig(store_url=f"{plan['redis']}?namespace={plan['ns']}", models={"openai": limit})
    gov = lg.Governor(config)
    gov.store.breaker_get("warm-up")  # the Redis connection too
    waited = []
    gov.subscribe(lambda e: waited.append(e["delay_s"]) if e["event"] == "rate_limited" else None)
    admitted: list[float] = []  # wall-clock time each request was let through

    def send(messages: list[dict[str, str]]) -> object:
        admitted.append(time.time())
        return client.chat.completions.create(model="gpt-4o-mini", messages=messages)

    for i in range(plan["calls"]):
        gov.call_model("openai:gpt-4o-mini", send, [{"role": "user", "content": f"worker {plan['id']} call {i}"}])
    report = {"id": plan["id"], "waits": len(waited), "fallbacks": gov.store.fallbacks, "admitted": admitted}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
