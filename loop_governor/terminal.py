"""Text safe to print on an operator's terminal: stored names cannot drive it.

The CLIs print names that came from agents and stores, not from the operator: task ids,
tool names, call keys, error messages. One holding ``ESC [ 2 J`` clears the screen, an
OSC 8 sequence plants a link, a bidi override makes ``rm`` target a different id than the
one shown. Every CLI table cell and message built from such data goes through
[`cell`][loop_governor.terminal.cell] (rich markup escaped too) or [`printable`][loop_governor.terminal.printable]
(plain ``typer.echo`` output). Control characters are shown as visible escapes (``\\x1b``) rather than dropped, so two
ids that differ only in them still look different.
"""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape

# C0 and C1 controls (ESC, CSI, BEL, backspace, CR, newline...), DEL, line/paragraph
# separators and the bidirectional overrides/isolates ("Trojan Source").
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(value: Any) -> str:
    """``str(value)`` with every control character replaced by its visible escape."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(_visible, text)


def cell(value: Any) -> str:
    """[`printable`][loop_governor.terminal.printable] text with rich markup escaped: for tables and
    ``console.print``."""
    return escape(printable(value))
