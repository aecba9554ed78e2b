"""What may have fixed something: the successes that excuse a repeat.

A failing call tried again after something that may have fixed its cause is iterating, not
looping -- a coding agent re-running its tests after each edit, a status re-checked after
each of several fixes. The same call after a ``think``, a note or a new search is a loop: those
say something, they change nothing the call depends on. So the loop guards ask, for the
successes between two occurrences of a repeat, whether one of them *did* something:

* a shell command that writes (``sed -i``, ``cat > f``, ``pip install``): a command made only
  of programs that read (``cat``, ``grep``, ``echo``, ``git diff``...) changes nothing;
* any other call whose arguments are not only free text: an edit naming a file, a toggle, a
  call with no arguments at all (``press_brake()``, ``reboot_device()``) -- but not
  ``think(thought=...)``, ``log_note(note=...)``, ``search(query=...)``, which only say
  something, nor a tool whose name says it reads (``get_...``, ``search_...``, ``list_...``):
  a flight search between two identical failing bookings changes nothing the booking needs.

Tools declared ``ToolPolicy(read_only=True)`` never fix anything. The task keeps its latest
state-changing successes (the ``World`` policy records them, as references: nothing is
computed for a healthy call) and the question is answered only when a repeat asks it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loop_governor.fingerprint import command_of, reads_only, says_only

if TYPE_CHECKING:
    from loop_governor.call import Call

MOVERS_KEPT = 32  # the latest state-changing successes a task keeps; more since a repeat: work happened

# the first word of a tool's name when it says the tool reads or thinks: ``get_order``,
# ``searchFlights``, ``list-files``, ``calculate``
_READING_VERBS = frozenset(
    {
        "get", "search", "list", "find", "read", "fetch", "lookup", "look", "query", "check", "show", "view",
        "describe", "count", "calculate", "compute", "think", "reason", "plan", "reflect", "note",
        "inspect", "browse", "peek", "retrieve", "summarize", "summarise", "explain",
    }
)  # fmt: skip
# a later word of the name that says the tool writes after all: ``search_replace``,
# ``find_and_replace``, ``get_or_create_user``
_WRITING_VERBS = frozenset(
    {
        "replace", "update", "create", "set", "write", "delete", "remove", "apply", "save", "add",
        "insert", "put", "post", "edit", "patch", "move", "rename", "install", "submit", "cancel",
        "reset", "modify", "change", "upsert", "commit", "push", "upload", "toggle", "enable",
        "disable", "grant", "revoke", "assign", "register", "transfer", "execute", "exec", "run",
    }
)  # fmt: skip
_WORD = re.compile(r"[A-Za-z][a-z0-9]*")
# free text under these names is code or a statement to run, not something said
_CODE_ARGS = frozenset({"code", "sql", "script", "statement", "source", "patch", "diff"})


def reads_by_name(tool: str) -> bool:
    """Whether a tool's name says it only reads (or thinks): its first word is such a verb
    and no later word says it writes."""
    words = [w.lower() for w in _WORD.findall(tool)]
    return bool(words) and words[0] in _READING_VERBS and not _WRITING_VERBS.intersection(words[1:])


def did_something(call: Call) -> bool:
    """Whether this successful, state-changing call may have fixed something (computed once)."""
    known = call.fixed
    if known is None and reads_by_name(call.name):
        known = call.fixed = False
    if known is None:
        try:
            command = command_of(call.args, call.kwargs)
            if command is not None:
                known = not reads_only(command)
            else:
                known = bool(_CODE_ARGS.intersection(call.kwargs or ())) or not says_only(call.args, call.kwargs)
        except Exception:  # arguments that cannot be read: assume they did something
            known = True
        call.fixed = known
    return known


def fixed_since(call: Call, step: int) -> bool:
    """Whether something that may have fixed ``call``'s cause succeeded after tool call
    ``step`` of the task (its own earlier success aside)."""
    scope = call.scope
    if scope is None:
        return False
    movers = scope.movers
    if not movers or movers[-1][0] <= step:
        return False
    if len(movers) == MOVERS_KEPT and movers[0][0] > step:
        return True  # more state-changing work since than the task keeps: some of it did something
    return any(at > step and did_something(mover) for at, mover in movers)
