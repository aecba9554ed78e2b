"""Which governor an adapter call uses when the caller passes none.

``govern_tool(tool)`` without a governor must still share one breaker table and one
retry budget with every other tool in the process (a governor per tool would let each
tool trip its own breaker in isolation), so it is the core's process-wide
``loop_governor.default_governor()``.
"""

from __future__ import annotations

import loop_governor as lg


def resolve_governor(governor: lg.Governor | None = None) -> lg.Governor:
    """``governor`` itself, else the process-wide default governor."""
    if governor is None:
        return lg.default_governor()
    if not isinstance(governor, lg.Governor):  # at construction, naming the parameter
        hint = " (build one: governor=lg.Governor(config))" if isinstance(governor, lg.GovernorConfig) else ""
        raise TypeError(f"governor must be a loop_governor.Governor or None, not {type(governor).__name__}{hint}")
    return governor
