"""Cache-aware context pruning, poisoning control and incremental summaries.

Works on LangChain message lists and OpenAI-style dict lists (CrewAI) through a small view
protocol; imports no agent framework.
"""

from .health import ContextHealth, context_health, default_is_error
from .pruner import ContextPruner, PruneReport
from .summarizer import IncrementalSummarizer, UserRequest
from .tokens import TokenCounter, approx_tokens
from .view import PIN_KEY

__all__ = [
    "PIN_KEY",
    "ContextHealth",
    "ContextPruner",
    "IncrementalSummarizer",
    "PruneReport",
    "TokenCounter",
    "UserRequest",
    "approx_tokens",
    "context_health",
    "default_is_error",
]
