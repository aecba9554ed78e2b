"""LangChain / LangGraph adapter for loop-governor.

Thin by design: governance (classification, retries, breakers, budgets, known-bad
calls, checkpoints) lives in [`loop_governor`][loop_governor]; this package only plugs it into
LangChain's extension points.
"""

from langchain_governor.callbacks import GovernorCallbackHandler
from langchain_governor.errors import GovernedFatalError
from langchain_governor.journal import ToolCallJournal, ToolJournalMiddleware
from langchain_governor.memory import GovernedChatMessageHistory, make_pre_model_hook
from langchain_governor.middleware import GovernorMiddleware, GovernorState
from langchain_governor.store import GovernedStore
from langchain_governor.tools import GovernedTool, GovernedToolError, govern_tool, govern_tools
from loop_governor.adapter import MessagePruner

__all__ = [
    "GovernedChatMessageHistory",
    "GovernedFatalError",
    "GovernedStore",
    "GovernedTool",
    "GovernedToolError",
    "GovernorCallbackHandler",
    "GovernorMiddleware",
    "GovernorState",
    "MessagePruner",
    "ToolCallJournal",
    "ToolJournalMiddleware",
    "govern_tool",
    "govern_tools",
    "make_pre_model_hook",
]
