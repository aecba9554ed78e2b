"""``loop-governor bench --model``, tier 2 (the multi-step plans): a real model client
against the local OpenAI-compatible test server (127.0.0.1, scripted replies, empty and
malformed ones among them). Tier 1 is ``test_model_tiers.py``.

What a user relies on: every arm of every framework runs every chosen scenario to an
outcome whatever the model replies, each task ends within its caps, the JSON names the
model and its endpoint (no credential) and has the per-arm figures, and the work a real
model does is scored from what reached the services.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lg_openai_server import OpenAIServer, RecordedRequest, Reply, Slow, ToolCall, deny_remote_connections
from typer.testing import CliRunner

from loop_governor.bench.harness import ARMS
from loop_governor.bench.model_bench import Plan, arms_for, run_model_bench, select
from loop_governor.bench.prompts import SYSTEM_PROMPT, scenario_prompts, task_prompt
from loop_governor.bench.real_model import ModelSettings, redact_url
from loop_governor.bench.runner import select_scenarios
from loop_governor.bench.tiers import TIERS
from loop_governor.bench.world import SCENARIO_BY_NAME
from loop_governor.cli import app

DOCS = Path(__file__).resolve().parents[2] / "docs" / "real-model-bench.md"
CALL = re.compile(r"(\w+)\((.*?)\)")
ARG = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|-?\d+)')
OUTCOMES = {"ok", "incomplete", "model_call_cap", "model_time_cap", "deadline"}


def _bench(
    settings: ModelSettings, scenarios: list[str], frameworks: tuple[str, ...] = ("langchain", "crewai")
) -> dict[str, Any]:
    """One run of tier-2 ``scenarios`` through every arm."""
    plan = Plan(settings, tuple(select((2,), scenarios)), tuple(arms_for()), frameworks, runs=1)
    return run_model_bench(plan)


def _steps(request: RecordedRequest) -> list[tuple[str, dict[str, Any]]]:
    """The first call of each step in the task prompt (what a model that reads it would do)."""
    prompt = next(m["content"] for m in request.messages if m.get("role") == "user")
    steps = []
    for line in str(prompt).splitlines():
        if re.match(r"^\d+\. ", line):
            match = CALL.search(line)
            assert match is not None, line
            steps.append((match.group(1), {k: json.loads(v) for k, v in ARG.findall(match.group(2))}))
    return steps


def _naive_model(request: RecordedRequest) -> Reply | str:
    """Follows the steps, repeats a failing call, answers when done; and replies badly on
    purpose: in the invalid-arguments task an unknown tool on its 2nd turn and an empty reply
    on its 3rd; in the missing-document task it never gives up on the missing document."""
    steps = _steps(request)
    results = [str(m.get("content") or "") for m in request.messages if m.get("role") == "tool"]
    if any(name == "create_ticket" for name, _ in steps):
        if request.turn == 1:
            return Reply(tool_calls=(ToolCall("no_such_tool", {"x": 1}),))
        if request.turn == 2:
            return Reply(text="")
    done = sum(1 for r in results if "RESULT" in r)
    if done >= len(steps):
        return "All steps done."
    name, args = steps[done]
    return Reply(tool_calls=(ToolCall(name, args),))


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(_naive_model) as srv:
        yield srv


CAP = 6


@pytest.fixture(scope="module")
def real_run() -> Iterator[tuple[dict[str, Any], OpenAIServer]]:
    """Both frameworks, every arm, two scenarios, one run (about 10 s)."""
    with OpenAIServer(_naive_model) as srv, deny_remote_connections() as attempts:
        settings = ModelSettings.parse("openai:lg-test-model", base_url=srv.url, max_model_calls=CAP, task_seconds=60)
        result = _bench(settings, ["missing_document", "invalid_arguments"])
        assert not srv.errors and not attempts
        yield result, srv


@pytest.fixture
def real_result(real_run: tuple[dict[str, Any], OpenAIServer]) -> dict[str, Any]:
    return real_run[0]


def test_every_arm_runs_every_chosen_scenario_to_an_outcome(real_result: dict[str, Any]) -> None:
    tasks = real_result["tasks"]
    seen = {(t["framework"], t["arm"], t["scenario"]) for t in tasks}
    assert seen == {
        (f, a, s) for f in ("langchain", "crewai") for a in ARMS for s in ("missing_document", "invalid_arguments")
    }
    for t in tasks:
        assert 1 <= t["model_calls"] <= CAP, t
        assert t["reason"] in OUTCOMES or t["reason"].endswith("Error"), t
        assert t["policy"] == "openai:lg-test-model"


def test_empty_and_malformed_replies_are_counted_model_turns(real_result: dict[str, Any]) -> None:
    bad = [t for t in real_result["tasks"] if t["scenario"] == "invalid_arguments"]
    for t in bad:
        # the unknown tool on turn 2 and the empty reply on turn 3 both reached the model log
        assert t["malformed_replies"] >= 1 and t["empty_replies"] >= 1, t
        assert t["failed"], t  # the ticket was never created
        assert t["delivered"] <= 1  # at most the CRM lookup
    lc = [t for t in bad if t["framework"] == "langchain"]
    # LangChain's agent ends on a reply without tool calls: exactly three turns
    assert all(t["model_calls"] == 3 and t["reason"] == "incomplete" for t in lc), lc
    per_arm = real_result["tiers"]["2"]["arms"]
    for arm in ARMS:
        assert per_arm[arm]["empty_replies"] >= 2 and per_arm[arm]["malformed_replies"] >= 2


def test_a_model_that_never_gives_up_is_stopped_by_its_cap_or_the_governor(real_result: dict[str, Any]) -> None:
    missing = {(t["framework"], t["arm"]): t for t in real_result["tasks"] if t["scenario"] == "missing_document"}
    # the naive model repeats the 404 forever: bare agents run into the call cap
    assert missing["langchain", "baseline"]["reason"] == "model_call_cap"
    assert missing["langchain", "baseline"]["model_calls"] == CAP
    governed = missing["langchain", "governed"]
    assert governed["failed"] and governed["delivered"] == 1  # the search result, checkpointed
    assert governed["tool_calls"] <= missing["langchain", "baseline"]["tool_calls"]


def test_the_json_names_the_model_and_has_per_arm_figures(real_run: tuple[dict[str, Any], OpenAIServer]) -> None:
    real_result, server = real_run
    model = real_result["model"]
    assert model["model"] == "openai:lg-test-model" and model["name"] == "lg-test-model"
    assert model["endpoint"] == server.url
    assert model["api_key"] == "none (a dummy key)"
    assert real_result["tiers_run"] == [2] and real_result["arms"] == list(ARMS)
    assert real_result["scenarios"] == ["missing_document", "invalid_arguments"]
    tier = real_result["tiers"]["2"]
    assert tier["caps"] == {"max_model_calls": CAP, "task_seconds": 60}
    for part in (tier, *tier["per_framework"].values(), *tier["per_scenario"].values()):
        assert part["verdict"]["kind"] in ("too_weak", "differ", "no_difference")
        for arm in ARMS:
            figures = part["arms"][arm]
            assert figures["tasks"] > 0
            for key in (
                "success_ci95",
                "tool_calls_per_task",
                "model_calls_per_task",
                "identical_repeats_per_task",
                "subtasks_delivered_on_failure",
                "model_wall_s_per_call",
            ):
                assert key in figures
            assert figures["model_calls_per_task"] > 0
    # the requests really went to the endpoint, with the scenario's prompt and the dummy key
    requests = server.completions
    assert sum(t["model_calls"] for t in real_result["tasks"]) == len(requests)
    assert {r.model for r in requests} == {"lg-test-model"}
    assert all(r.tools for r in requests)  # tool calls in the structured form only, in both frameworks
    first = requests[0]
    assert first.messages[0]["content"] == SYSTEM_PROMPT or SYSTEM_PROMPT in json.dumps(first.messages)


def test_a_slow_model_is_stopped_by_the_time_cap(no_network: list[str]) -> None:
    with OpenAIServer(lambda request: Slow(1.5, then=Reply(text="late"))) as server:
        settings = ModelSettings.parse("openai:slow", base_url=server.url, max_model_calls=10, task_seconds=0.5)
        result = _bench(settings, ["missing_document"], ("langchain",))
    for t in result["tasks"]:
        assert t["reason"] == "model_time_cap", t
        assert t["model_calls"] >= 1 and t["failed_model_calls"] == t["model_calls"]  # no response: failed calls
        assert t["tool_calls"] == 0 and t["failed"]


def test_cli_runs_a_model_and_keeps_credentials_out(
    server: OpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[str]
) -> None:
    monkeypatch.setenv("LG_BENCH_TEST_KEY", "sk-lgtest-0123456789abcdef")
    monkeypatch.chdir(tmp_path)
    url = server.url.replace("http://", "http://alice:hunter2@")
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--model",
            "openai:lg-test-model",
            "--base-url",
            url,
            "--api-key-env",
            "LG_BENCH_TEST_KEY",
            "--frameworks",
            "langchain",
            "--tier",
            "2",
            "--scenarios",
            "invalid_arguments",
            "--max-model-calls",
            "4",
            "--runs",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    # 3 arms x (3 steps + a final answer); 3 tasks x the cap of 4
    said = " ".join(result.output.split())
    assert "about 12 model calls" in said and "at most 12" in said
    assert "openai:lg-test-model" in said
    data = json.loads((tmp_path / "loop-governor-bench.json").read_text())
    assert data["runs"] == 1 and data["tiers_run"] == [2]
    assert data["model"]["endpoint"] == redact_url(url) and "hunter2" not in data["model"]["endpoint"]
    assert data["model"]["api_key"] == "from $LG_BENCH_TEST_KEY"
    everything = result.output + json.dumps(data) + (tmp_path / "loop-governor-bench.html").read_text()
    for secret in ("hunter2", "sk-lgtest-0123456789abcdef", "0123456789abcdef"):
        assert secret not in everything
    assert server.completions and all(r.headers.get("authorization") for r in server.completions)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again: nothing listens there


def test_cli_rejects_bad_model_options() -> None:
    runner = CliRunner()
    for args, needle in (
        (["--model", "gpt-4o"], "PROVIDER:NAME"),
        (["--model", "acme:big"], "acme"),
        (["--model", "openai:x", "--api-key-env", "LG_SURELY_UNSET_VAR"], "LG_SURELY_UNSET_VAR"),
        (["--model", "openai:x", "--base-url", "ftp://h/v1"], "http"),
        (["--model", "openai:x", "--scenarios", "provider_429_storm"], "provider"),
        (["--scenarios", "nope"], "nope"),
        (["--base-url", "http://127.0.0.1:1/v1"], "--model"),
        (["--model", "openai:x", "--base-url", f"http://127.0.0.1:{_closed_port()}/v1"], "cannot reach"),
    ):
        result = runner.invoke(app, ["bench", *args])
        assert result.exit_code != 0, args
        assert needle in result.output, (args, result.output)


# -- units --------------------------------------------------------------------------------


def test_redact_url_drops_credentials() -> None:
    assert redact_url("https://u:p@api.example.com:8443/v1?key=abc") == "https://***@api.example.com:8443/v1?***"
    assert redact_url("http://127.0.0.1:11434/v1") == "http://127.0.0.1:11434/v1"
    assert redact_url(None) is None


def test_local_providers_have_default_endpoints() -> None:
    assert ModelSettings.parse("ollama:qwen2.5:1.5b").base_url == "http://127.0.0.1:11434/v1"
    assert ModelSettings.parse("ollama:qwen2.5:1.5b").name == "qwen2.5:1.5b"
    assert ModelSettings.parse("llamacpp:m").base_url == "http://127.0.0.1:8080/v1"
    assert ModelSettings.parse("vllm:m", base_url="http://127.0.0.1:9/v1").base_url == "http://127.0.0.1:9/v1"


def test_work_is_scored_from_successful_calls() -> None:
    spec = SCENARIO_BY_NAME["invalid_arguments"].tasks("w")[0]
    # the corrected priority (any value the service took), case and blanks ignored elsewhere
    calls = [("crm_lookup", {"account": " ACME "}), ("create_ticket", {"account": "acme", "priority": "normal"})]
    assert spec.delivered_by(calls) == ["lookup", "ticket"]
    assert spec.delivered_by([("crm_lookup", {"account": "other"})]) == []
    batch = SCENARIO_BY_NAME["batch_crash_at_18"].tasks("w")[0]
    assert batch.delivered_by([("process_item", {"item": 3})]) == ["item-03"]


def test_estimate_and_scenario_choice() -> None:
    # tier 2 is every tool-fault scenario; the provider-fault ones are the endpoint's to have
    tier_2 = [s for _, s in select((2,), None)]
    assert tier_2 and not any(s.provider_fault for s in tier_2)
    assert len(tier_2) + 3 == len(select_scenarios(None)) == len(SCENARIO_BY_NAME)
    assert [s for _, s in select(None, None)] == list(TIERS[1].scenarios)  # the default: tier 1
    assert [s.name for _, s in select(None, ["missing_document", "engine_needs_brake"])] == [
        "engine_needs_brake",
        "missing_document",
    ]
    settings = ModelSettings.parse("openai:x", max_model_calls=7)
    plan = Plan(settings, tuple(select((2,), ["missing_document"])), tuple(arms_for()), runs=1)
    # 3 arms x 2 frameworks: one call per step and a final answer (4), or the cap of 7
    assert plan.calls() == (4 * 6, 6 * 7) and plan.tasks() == 6
    tier_default = Plan(ModelSettings.parse("openai:x"), tuple(select((1,), None)), tuple(arms_for()), runs=1)
    assert tier_default.tier_settings(TIERS[1]).calls_cap == TIERS[1].max_model_calls


def test_prompts_are_written_once_and_shown_in_the_docs() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert SYSTEM_PROMPT in text
    for name, item in scenario_prompts().items():
        for line in item["prompt"].splitlines():
            if line:
                assert line in text, (name, line)
    # the prompt gives the steps' exact arguments and other-tool fallbacks, never the fix
    prompt = task_prompt(SCENARIO_BY_NAME["invalid_arguments"].tasks("w")[0])
    assert 'priority="urgent"' in prompt and "high" not in prompt
    assert "search_archive" in task_prompt(SCENARIO_BY_NAME["missing_document"].tasks("w")[0])


def test_docs_code_blocks_are_shell_or_python() -> None:
    fences = re.findall(r"^```(\S*)", DOCS.read_text(encoding="utf-8"), flags=re.M)
    langs = fences[0::2]
    assert langs and set(langs) <= {"bash", "python"}, langs


def test_cli_prints_the_prompts() -> None:
    result = CliRunner().invoke(app, ["bench", "prompts"])
    assert result.exit_code == 0, result.output
    assert SYSTEM_PROMPT.split(":")[0] in result.output
    assert 'fetch_doc(doc_id="Q3-report")' in result.output
