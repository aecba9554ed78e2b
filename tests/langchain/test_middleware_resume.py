"""GovernorMiddleware alone (plain tools, no journal) resumes from the governor's checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool

import loop_governor as lg
from langchain_governor import GovernorMiddleware


def test_completed_tool_calls_are_not_repeated_after_a_fatal_stop(lc: Any, tmp_path: Path) -> None:
    sent: list[str] = []
    expired = {"crm": True}

    @tool
    def send_invoice(customer: str) -> str:
        """Send an invoice (a side effect)."""
        sent.append(customer)
        return f"invoice sent to {customer}"

    @tool
    def crm_lookup(customer: str) -> str:
        """Look a customer up in the CRM."""
        if expired["crm"]:
            raise lc.HTTPError(401, "token expired")
        return f"{customer}: premium"

    def script(messages: list[BaseMessage]) -> AIMessage:
        done = [m for m in messages if isinstance(m, ToolMessage)]
        plan = [("send_invoice", "acme"), ("send_invoice", "globex"), ("crm_lookup", "acme")]
        if len(done) >= len(plan):
            return AIMessage(content="all done")
        name, customer = plan[len(done)]
        call = {"name": name, "args": {"customer": customer}, "id": f"call_{len(done)}", "type": "tool_call"}
        return AIMessage(content="", tool_calls=[call])

    def run() -> dict[str, Any]:
        gov = lg.Governor(lg.GovernorConfig(checkpoint_url=f"file://{tmp_path / 'cps'}"), sleep=lambda s: None)
        model = lc.ScriptedChatModel(script=script)
        agent = create_agent(model, [send_invoice, crm_lookup], middleware=[GovernorMiddleware(gov)])
        return agent.invoke({"messages": [("user", "bill them")]}, {"configurable": {"thread_id": "billing-7"}})

    with pytest.raises(lg.FatalError):
        run()  # the credential expired after two invoices went out
    assert sent == ["acme", "globex"]

    expired["crm"] = False  # an operator fixed the credential; the same task runs again
    result = run()
    assert result["messages"][-1].content == "all done"
    assert sent == ["acme", "globex"]  # resumed from the checkpoint: no second invoice
    replayed = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in replayed[:2]] == ["invoice sent to acme", "invoice sent to globex"]
    assert [m.tool_call_id for m in replayed] == ["call_0", "call_1", "call_2"]
