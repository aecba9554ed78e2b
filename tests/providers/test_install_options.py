"""``install(govern_llms=False)`` (issue 27, item 11): tools governed, the crew's own LLM
left as the user built it -- its model calls go to the provider as they are.

A real crewAI crew on its native OpenAI provider against the local server.
"""

from __future__ import annotations

from typing import Any

import pytest
from lg_openai_server import OpenAIServer, server_error, tool_reply

import loop_governor as lg

KEY = "sk-test-install-0000abcd"


def _crew(server: OpenAIServer, gov: lg.Governor, seen: list[bool]) -> Any:
    import crewai
    from crewai.tools import BaseTool
    from lg_crewai import make_crew

    from crewai_governor import govern_tools
    from crewai_governor.llm import is_governed_llm

    class Probe(BaseTool):
        name: str = "probe"
        description: str = "Report whether the agent's model is governed."

        def _run(self) -> str:
            seen.append(is_governed_llm(crew.agents[0].llm))
            return "probed"

    llm = crewai.LLM(model="openai/gpt-4o-mini", base_url=server.url, api_key=KEY)
    crew = make_crew(
        llm, govern_tools([Probe()], gov), role="prober", goal="probe", tasks=[("Probe.", "done")], max_iter=5
    )
    return crew


@pytest.mark.parametrize("govern_llms", [True, False])
def test_install_governs_the_crews_llm_only_when_asked(openai_server: OpenAIServer, govern_llms: bool) -> None:
    from crewai_governor import install

    gov = lg.Governor()
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    openai_server.set_script([tool_reply("probe"), "done"])
    seen: list[bool] = []
    crew = _crew(openai_server, gov, seen)
    with install(gov, govern_llms=govern_llms):
        assert crew.kickoff().raw == "done"
    assert seen == [govern_llms]  # the LLM during the kickoff
    assert [e["tool"] for e in events if e["event"] == "tool_call"] == ["probe"]  # tools governed either way
    governed_model_calls = [e for e in events if e["event"] == "model_call" and e.get("endpoint")]
    assert bool(governed_model_calls) == govern_llms


def test_without_governed_llms_a_failing_model_is_not_the_governors_error(openai_server: OpenAIServer) -> None:
    from crewai_governor import install

    gov = lg.Governor(lg.GovernorConfig(retry_max_attempts=5))
    openai_server.fail_forever(server_error())
    with install(gov, govern_llms=False), pytest.raises(Exception) as failed:
        _crew(openai_server, gov, []).kickoff()
    assert not isinstance(failed.value, lg.AgentToolError)  # crewAI's own error, as without the governor
