"""Token rate limits charge what the provider really used (issue 27, items 2-4).

Real ChatOpenAI (in ``create_agent`` + ``GovernorMiddleware``) and a real crewAI ``LLM``
(governed by ``install``) against the local OpenAI-compatible server; the governor waits on
a virtual clock, so a minute of pacing costs no time. A spy store records what each
admission took from the token bucket.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_openai import ChatOpenAI
from lg_openai_server import OpenAIServer, Reply, context_length_exceeded
from lg_testing import VirtualClock

import loop_governor as lg
from langchain_governor import GovernorMiddleware
from loop_governor.context import ContextPruner
from loop_governor.state.bucket import Bucket
from loop_governor.stores.memory import MemoryStore

KEY = "sk-test-rate-0000abcd"
MODEL = "gpt-4o-mini"
TPM = 6000  # 100 tokens/s; the default token burst is ten seconds' worth: 1000


class SpyStore(MemoryStore):
    """The memory store, recording the token-bucket cost of each admitted attempt (in the
    order the requests were sent) and each settlement after one."""

    def __init__(self) -> None:
        super().__init__()
        self.admitted: list[float] = []
        self.settled: list[float] = []

    def rate_acquire_all(self, buckets: Sequence[Bucket], now: float) -> float:
        wait = super().rate_acquire_all(buckets, now)
        admission = sys._getframe(1).f_code.co_name == "before_attempt"
        if wait <= 0:
            costs = [b[3] for b in buckets if b[0].endswith(":tokens")]
            (self.admitted if admission else self.settled).extend(costs)
        return wait


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def store() -> SpyStore:
    return SpyStore()


@pytest.fixture
def gov(clock: VirtualClock, store: SpyStore) -> lg.Governor:
    config = lg.GovernorConfig(models={"openai": lg.ModelPolicy(tpm=TPM)})
    return lg.Governor(config, store=store, clock=clock, sleep=clock.sleep, asleep=clock.asleep)


def agent(server: OpenAIServer, gov: lg.Governor, **middleware: Any) -> Any:
    model = ChatOpenAI(model=MODEL, base_url=server.url, api_key=KEY)
    return create_agent(model, [], middleware=[GovernorMiddleware(gov, **middleware)])


def ask(agent: Any, text: str = "hi", thread: str = "t") -> Any:
    return agent.invoke({"messages": [("user", text)]}, {"configurable": {"thread_id": thread}})


def crew_llm(server: OpenAIServer, gov: lg.Governor, *, compact: bool = False) -> Any:
    """A real crewAI LLM on its native OpenAI provider, governed as ``install`` governs it."""
    import crewai

    from crewai_governor.llm import govern_llm

    return govern_llm(crewai.LLM(model=f"openai/{MODEL}", base_url=server.url, api_key=KEY), gov, compact=compact)


def used_tokens(server: OpenAIServer) -> list[int]:
    return [(r.prompt_tokens or 0) + 5000 for r in server.completions if r.status == 200]


# ------------------------------------------------------------------------- item 2


def _assert_within_tpm(server: OpenAIServer, elapsed_s: float) -> None:
    used = used_tokens(server)
    # A call's completion is settled after it (from the next admission when the bucket
    # is short): what all but the last two used fits in one burst plus the refill.
    assert sum(used[:-2]) <= 1000 + TPM / 60 * elapsed_s + 1, (used, elapsed_s)


def test_langchain_completion_tokens_count_against_the_token_limit(
    openai_server: OpenAIServer, gov: lg.Governor, clock: VirtualClock
) -> None:
    openai_server.set_script(lambda r: Reply("long answer", usage={"completion_tokens": 5000}))
    bot, start = agent(openai_server, gov), clock()
    for i in range(5):
        ask(bot, thread=f"t{i}")
    assert openai_server.count() == 5
    _assert_within_tpm(openai_server, clock() - start)  # 25k tokens: ~4 minutes, not 0 s


def test_crewai_completion_tokens_count_against_the_token_limit(
    openai_server: OpenAIServer, gov: lg.Governor, clock: VirtualClock
) -> None:
    openai_server.set_script(lambda r: Reply("long answer", usage={"completion_tokens": 5000}))
    llm, start = crew_llm(openai_server, gov), clock()
    for _ in range(4):
        assert llm.call("hi") == "long answer"
    _assert_within_tpm(openai_server, clock() - start)


# ------------------------------------------------------------------------- item 3


def test_langchain_a_refused_prompt_gives_its_tokens_back(
    openai_server: OpenAIServer, gov: lg.Governor, clock: VirtualClock
) -> None:
    openai_server.fail_when_prompt_over(2000)  # 400 context_length_exceeded, not processed
    bot = agent(openai_server, gov)
    with pytest.raises(lg.PermanentError):
        ask(bot, "word " * 20_000, thread="big")  # ~25k tokens: the bucket went ~24k into debt
    start = clock()
    assert ask(bot, "hi", thread="small")["messages"][-1].content  # no 4-minute debt to wait out
    assert clock() - start < 1.0


def test_crewai_a_refused_prompt_gives_its_tokens_back(
    openai_server: OpenAIServer, gov: lg.Governor, clock: VirtualClock
) -> None:
    openai_server.fail_when_prompt_over(2000)
    llm = crew_llm(openai_server, gov)
    with pytest.raises(lg.PermanentError):
        llm.call("word " * 20_000)
    start = clock()
    assert llm.call("hi")
    assert clock() - start < 1.0


# ------------------------------------------------------------------------- item 4


def fetch_tool() -> Any:
    from langchain_core.tools import tool

    @tool
    def fetch_page(page: int) -> str:
        """Fetch one page of rows."""
        return f"page {page}: " + "row " * 400

    return fetch_page


def pages(n: int) -> list[Reply | str]:
    from lg_openai_server import tool_reply

    return [*(tool_reply("fetch_page", {"page": i}) for i in range(n)), "done"]


def test_langchain_the_compacted_retry_is_charged_its_own_size(
    openai_server: OpenAIServer, gov: lg.Governor, store: SpyStore
) -> None:
    openai_server.set_script(pages(4))
    openai_server.fail_at(4, fault=context_length_exceeded(1000))
    model = ChatOpenAI(model=MODEL, base_url=openai_server.url, api_key=KEY)
    bot = create_agent(model, [fetch_tool()], middleware=[GovernorMiddleware(gov, pruner_factory=ContextPruner)])
    assert ask(bot, "collect the pages")["messages"][-1].content == "done"
    refused, retried = openai_server.completions[3], openai_server.completions[4]
    assert refused.status == 400 and retried.status == 200
    refused, retried = store.admitted[3], store.admitted[4]  # one admission per request sent
    # the refused prompt's tokens were given back (all but what it paid for earlier calls)
    assert min(store.settled) <= -0.8 * refused, store.settled
    assert retried < refused / 2, store.admitted  # not the original prompt's estimate again


def test_crewai_the_compacted_retry_is_charged_its_own_size(
    openai_server: OpenAIServer, gov: lg.Governor, store: SpyStore
) -> None:
    import crewai
    from crewai.tools import BaseTool
    from lg_crewai import make_crew
    from pydantic import BaseModel

    from crewai_governor import govern_tools, install

    class PageArgs(BaseModel):
        page: int

    class FetchPage(BaseTool):
        name: str = "fetch_page"
        description: str = "Fetch one page of rows."
        args_schema: type[BaseModel] = PageArgs

        def _run(self, page: int) -> str:
            return f"page {page}: " + "row " * 400

    openai_server.set_script(pages(4))
    openai_server.fail_at(4, fault=context_length_exceeded(1000))
    llm = crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY)
    crew = make_crew(
        llm,
        govern_tools([FetchPage()], gov),
        role="collector",
        goal="collect pages",
        tasks=[("Collect the pages.", "done")],
        max_iter=30,
    )
    with install(gov, pruner_factory=ContextPruner):
        assert crew.kickoff().raw == "done"
    assert [r.status for r in openai_server.completions[3:5]] == [400, 200]
    refused, retried = store.admitted[3], store.admitted[4]
    assert min(store.settled) <= -0.8 * refused, store.settled
    assert retried < refused / 2, store.admitted
