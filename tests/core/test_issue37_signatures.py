"""The guards' argument signatures: the faster forms compute the same values (issue 37).

Failure counts are keyed on a call's entity and shared through the store by a fleet, so the
entity a guard computes alone (``args_entity``) must be the very digest ``args_subject`` gives,
for any arguments a model or a framework sends.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import loop_governor as lg
from loop_governor.call import TOOL, Call
from loop_governor.fingerprint import args_entity, args_subject

_NAMES = st.sampled_from(["id", "order_id", "query", "page", "text", "amount", "x", "name", "Offset", "attempt", "cmd"])
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=80),
    st.sampled_from(["INV-2024-0001", "2024-03-01T10:00", "New York City", "  spaced  out  ", "line\nbreak"]),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_NAMES, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_VALUES, max_size=3), st.dictionaries(_NAMES, _VALUES, max_size=3))
def test_the_entity_alone_is_the_subjects_entity(args: list[Any], kwargs: dict[str, Any]) -> None:
    assert args_entity(tuple(args), kwargs) == args_subject(tuple(args), kwargs)[0]


def test_an_argument_whose_repr_fails_falls_back_alike() -> None:
    huge = 10**5000  # its repr raises (Python's limit on int-to-str digits)
    args: tuple[Any, ...] = ({"amount": huge, "order_id": "#W1"},)
    kwargs: dict[str, Any] = {}
    assert args_entity(args, kwargs) == args_subject(args, kwargs)[0] == hash((id(args), id(kwargs)))


def test_a_calls_signatures_are_computed_once() -> None:
    gov = lg.Governor()
    call = Call(TOOL, "lookup", gov.rt.policy(TOOL, "lookup"), None, len, ({"order_id": "#W1"},), {})
    assert call.entity == call.subject[0]
    assert call.args_signature is call.args_signature
    assert call.entity is call.entity
