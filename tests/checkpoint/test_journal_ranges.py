"""Journal records and snapshots out of range are corrupt, not valid (issue 27, item 9).

JSON parses ``1e999`` as infinity and bounds no integer: a record with ``t=1e999`` or
``step=10**30`` used to load as a valid checkpoint, and every later comparison or write
(SQLite INTEGER, a timestamp in a report) broke on it instead.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loop_governor.checkpoint import TaskCheckpoint
from loop_governor.checkpoint.codec import CorruptData, checksum
from loop_governor.checkpoint.journal import replay


def _snapshot(step: int = 1, updated_at: object = 1_700_000_000.0) -> tuple[int, str, bytes]:
    body = TaskCheckpoint(task_id="t", step=1).encode_body(1_700_000_000.0)
    doc = json.loads(body)
    doc["step"], doc["updated_at"] = step, updated_at
    raw = json.dumps(doc).replace('"__inf__"', "1e999").encode()
    return 1, checksum(1, raw), raw


def _record(t: str, step: str) -> tuple[int, str, bytes]:
    payload = f'{{"v":2,"t":{t},"step":{step}}}'.encode()
    return 2, checksum(2, payload), payload


GOOD_T = st.floats(0, 1e11, allow_nan=False).map(repr)
GOOD_STEP = st.integers(0, 2**63 - 1).map(str)
BAD_T = st.one_of(
    st.sampled_from(["1e999", "-1e999", "-1", "1e300", "true", '"soon"']),
    st.floats(1.0001e11, 1e308).map(repr),
    st.floats(max_value=-1e-9, allow_infinity=False, allow_nan=False).map(repr),
)
BAD_STEP = st.one_of(st.integers(2**63, 10**40), st.integers(max_value=-1)).map(str)


@given(GOOD_T, GOOD_STEP)
def test_a_record_in_range_loads(t: str, step: str) -> None:
    cp = replay("t", _snapshot(), [_record(t, step)])
    assert cp.step == int(step) and cp.updated_at == float(t)


@given(st.one_of(st.tuples(BAD_T, GOOD_STEP), st.tuples(GOOD_T, BAD_STEP)))
def test_a_record_out_of_range_is_corrupt_journal_data(bad: tuple[str, str]) -> None:
    with pytest.raises(CorruptData) as corrupt:
        replay("t", _snapshot(), [_record(*bad)])
    assert corrupt.value.part == "journal" and corrupt.value.index == 0


@pytest.mark.parametrize(("step", "updated_at"), [(10**30, 1.0), (1, "__inf__"), (1, -5.0), (-1, 1.0)])
def test_a_snapshot_out_of_range_is_corrupt(step: int, updated_at: object) -> None:
    with pytest.raises(CorruptData):
        replay("t", _snapshot(step, updated_at))
