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
  something.

Tools declared ``ToolPolicy(read_only=True)`` never fix anything. The task keeps its latest
state-changing successes (the ``World`` policy records them, as references: nothing is
computed for a healthy call) and the question is answered only when a repeat asks it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loop_governor.fingerprint import command_of, reads_only, says_only

if TYPE_CHECKING:
    from loop_governor.call import Call

MOVERS_KEPT = 32  # the latest state-changing successes a task keeps; more since a repeat: work happened


def did_something(call: Call) -> bool:
    """Whether this successful, state-changing call may have fixed something (computed once)."""
    known = call.fixed
    if known is None:
        try:
            command = command_of(call.args, call.kwargs)
            known = not reads_only(command) if command is not None else not says_only(call.args, call.kwargs)
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
