"""loop-governor: reliable agent loops.

Tool and model failures become typed signals (transient / permanent / fatal) with
retries, backoff, a task retry budget, circuit breakers and shared rate limits; see
[`Governor`][loop_governor.governor.Governor] (``call`` for tools, ``call_model`` for model calls).
"""

from loop_governor.classify import ErrorInfo, Rule, classify, normalize_message
from loop_governor.config import GovernorConfig, ModelPolicy, ModelPrice, ToolPolicy
from loop_governor.errors import (
    AgentToolError,
    BudgetExhaustedError,
    CircuitOpenError,
    ErrorType,
    FatalError,
    GovernedError,
    LoopDetectedError,
    NoProgressError,
    PermanentError,
    TransientError,
)
from loop_governor.governor import (
    Governor,
    TaskScope,
    call_key,
    default_governor,
    set_default_governor,
)
from loop_governor.redaction import redact
from loop_governor.usage import Usage

__version__ = "0.1.0"

__all__ = [
    "AgentToolError",
    "BudgetExhaustedError",
    "CircuitOpenError",
    "ErrorInfo",
    "ErrorType",
    "FatalError",
    "GovernedError",
    "Governor",
    "GovernorConfig",
    "LoopDetectedError",
    "ModelPolicy",
    "ModelPrice",
    "NoProgressError",
    "PermanentError",
    "Rule",
    "TaskScope",
    "ToolPolicy",
    "TransientError",
    "Usage",
    "__version__",
    "call_key",
    "classify",
    "default_governor",
    "normalize_message",
    "redact",
    "set_default_governor",
]
