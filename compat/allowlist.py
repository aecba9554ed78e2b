"""Tests that assert exactly what the governor changes on purpose.

Keyed by (suite, mode) -- mode "*" for every mode of the suite -- then test id (JUnit
``classname::name``) with the reason. Keep it short: anything else that passes unchanged
and fails with the governor in is a bug in the governor.
"""

from __future__ import annotations

_LC = "tests.unit_tests.agents"
_RETRY = f"{_LC}.middleware.implementations.test_tool_retry"
_ERROR = f"{_LC}.middleware.implementations.test_tool_error"

# With GovernorMiddleware in (first or last):
_MIDDLEWARE = {
    # The graph drawing shows the governor's own nodes (before_agent, after_agent).
    f"{_LC}.middleware.core.test_diagram::test_create_agent_diagram": "graph drawing",
    f"{_LC}.middleware.core.test_decorators::test_async_middleware_with_can_jump_to_graph_snapshot": "graph drawing",
    # create_agent skips its unknown-tool check when any middleware has a tool hook
    # (ToolRetry, ToolError, HumanInTheLoop alike); governing tool calls needs one. A
    # tool-less agent keeps the check (those variants pass).
    f"{_LC}.middleware.core.test_tools::test_unknown_tool_raises_error": "unknown-tool check",
    f"{_LC}.middleware.core.test_dynamic_tools::test_dynamic_tool_without_handler_raises_error"
    "[with_static_tools-True]": "unknown-tool check",
    f"{_LC}.middleware.core.test_dynamic_tools::test_dynamic_tool_without_handler_raises_error"
    "[with_static_tools-False]": "unknown-tool check",
    # A tool exception that nothing handles ends a create_agent run; the governor answers
    # the model with its structured error instead -- the reason it exists.
    f"{_ERROR}::test_tool_error_none_propagates": "unhandled tool error answered",
    f"{_RETRY}::test_tool_retry_failing_tool_raises": "unhandled tool error answered",
    f"{_RETRY}::test_tool_retry_non_retryable_exception_reraises": "unhandled tool error answered",
    f"{_RETRY}::test_tool_retry_custom_exception_filter": "unhandled tool error answered",
    f"{_RETRY}::test_tool_retry_deprecated_raise_behavior": "unhandled tool error answered",
}

# In every LangChain mode:
_EVERY_MODE = {
    # "Temporary failure" reads as transient: the governor retries it itself (on virtual
    # time here) and the call succeeds before ToolRetryMiddleware ever has to wait; the
    # test times ToolRetry's own sleeps.
    f"{_RETRY}::test_tool_retry_constant_backoff": "governor retried first",
    # The streaming run expects the unhandled tool error to end the run (see above).
    f"{_LC}.test_agent_streaming.TestAgentStreamV3Sync::test_tool_error_sets_error_field": (
        "unhandled tool error answered"
    ),
}

# LangGraph's ToolNode suite with every tool wrapped by govern_tool:
_TOOL_NODE = {
    # A governed failure's text is the governor's JSON, not the plain exception's
    # (str(), repr() in ToolNode's "Please fix your mistakes" template).
    "tests.test_tool_node::test_tool_node_error_handling": "exact text of a plain tool exception",
    "tests.test_tool_node::test_tool_node_error_handling_callable": "exact text of a plain tool exception",
    "tests.test_tool_node::test_tool_node_handle_tool_errors_false": "exact text of a plain tool exception",
    # The default ToolNode re-raises a plain tool exception; a governed one is answered.
    "tests.test_tool_node::test_tool_node_error_handling_default_exception": "unhandled tool error answered",
    "tests.test_tool_call_transformer.TestToolCallTransformerEndToEnd::test_tool_error_populates_error_field": (
        "unhandled tool error answered"
    ),
    # The tool's own handle_tool_error text is replaced by the governor's structured error
    # (GovernedTool bypasses it on purpose; the ToolNode's own handling still applies).
    "tests.test_tool_node::test_tool_node_individual_tool_error_handling": "tool's own error text replaced",
}

# crewAI's suites with every agent's and task's tools wrapped by govern_tool: a governed
# tool is a wrapper object (``.inner`` is the user's tool; README), so isinstance checks
# on the user's tool class and list equality with the user's tools change.
_CREW = "tests.test_crew::"
_CREWAI = {
    f"{_CREW}test_crew_with_delegating_agents_should_not_override_task_tools": "tool is a wrapper",
    f"{_CREW}test_task_tools_override_agent_tools": "tool is a wrapper",
    f"{_CREW}test_task_tools_override_agent_tools_with_allow_delegation": "tool is a wrapper",
    f"{_CREW}test_task_tools_preserve_code_execution_tools": "tool is a wrapper",
    "tests.test_task::test_task_tool_reflect_agent_tools": "tool is a wrapper",
    "tests.test_task::test_task_tool_takes_precedence_over_agent_tools": "tool is a wrapper",
}

ALLOWED: dict[tuple[str, str], dict[str, str]] = {
    ("crewai", "crewai"): _CREWAI,
    ("langgraph-toolnode", "toolnode"): _TOOL_NODE,
    ("langchain-agents", "*"): _EVERY_MODE,
    ("langchain-agents", "lc-first"): _MIDDLEWARE,
    ("langchain-agents", "lc-last"): _MIDDLEWARE,
}
