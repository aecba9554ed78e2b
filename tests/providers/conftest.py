"""Provider-client tests: real SDK clients (openai, langchain-openai, crewAI's native OpenAI
provider) against the local OpenAI-compatible server, no governor.

crewAI is switched offline at module top, before anything imports it. Every test here runs
with the network refused beyond loopback (``no_network``): clients are always given the
server's ``base_url``, and a test that tried to reach api.openai.com would fail.
"""

from __future__ import annotations

from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-providers-home-")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(no_network: list[str]) -> list[str]:
    return no_network
