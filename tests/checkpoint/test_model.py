"""TaskCheckpoint: what the governor records is JSON, detached, redacted, found again."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import sys
import threading

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from lg_checkpoint import apply_edit, edits
from pydantic import ValidationError

from loop_governor.checkpoint import (
    CheckpointSerializationError,
    FileCheckpointStore,
    MemoryCheckpointStore,
    TaskCheckpoint,
)
from loop_governor.errors import ErrorType, GovernedError
from loop_governor.redaction import redact, redact_obj

NOT_FOUND = GovernedError(error_type=ErrorType.PERMANENT, tool="fetch", status=404, message="no such page")


def test_defaults_match_the_documented_constructor() -> None:
    cp = TaskCheckpoint(task_id="t")
    assert (cp.step, cp.completed, cp.known_bad, cp.results, cp.metadata, cp.version) == (0, {}, {}, [], {}, 0)
    assert cp.schema_version == 1


def test_record_success_is_found_by_the_same_call_key_only() -> None:
    cp = TaskCheckpoint(task_id="t")
    cp.record_success('search:{"q":"a"}', {"hits": [1, 2]})
    assert cp.get_result('search:{"q":"a"}') == (True, {"hits": [1, 2]})
    assert cp.get_result('search:{"q":"b"}') == (False, None)


def test_none_is_a_stored_result_distinct_from_missing() -> None:
    cp = TaskCheckpoint(task_id="t")
    cp.record_success("noop:{}", None)
    assert cp.get_result("noop:{}") == (True, None)


def test_stored_result_is_detached_from_the_tools_return_value() -> None:
    cp = TaskCheckpoint(task_id="t")
    result = {"items": [1]}
    cp.record_success("k", result)
    result["items"].append(2)
    assert cp.get_result("k") == (True, {"items": [1]})


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (object(), "object is not JSON"),
        ((1, 2), "tuple is not JSON"),
        ({1, 2}, "set is not JSON"),
        (b"bytes", "bytes is not JSON"),
        (math.nan, "float is not JSON"),
        ({"ok": {3: "int key"}}, "dict key 3 is a int"),
    ],
)
def test_non_json_result_raises_a_typed_error_naming_the_call(value: object, fragment: str) -> None:
    cp = TaskCheckpoint(task_id="t")
    with pytest.raises(CheckpointSerializationError, match=fragment) as info:
        cp.record_success("tool:{}", value)
    assert "tool:{}" in str(info.value)
    assert isinstance(info.value, TypeError)
    assert cp.completed == {}


def test_a_non_json_value_is_named_by_where_it_sits() -> None:
    cp = TaskCheckpoint(task_id="t")
    with pytest.raises(CheckpointSerializationError) as info:
        cp.record_success("tool:{}", {"a": [1, {"b": dt.date(2025, 1, 1)}]})
    assert str(info.value).startswith("result of 'tool:{}'['a'][1]['b']: date is not JSON")


@dataclasses.dataclass
class Page:
    url: str
    fetched: dt.datetime


def _to_json(obj: object) -> object:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, dt.datetime):
        return obj.isoformat()
    raise TypeError(type(obj).__name__)


def test_serializer_on_the_checkpoint_converts_nested_values() -> None:
    cp = TaskCheckpoint(task_id="t", serializer=_to_json)
    cp.record_success("fetch:{}", Page("https://x.org", dt.datetime(2025, 1, 2, 3, 4, 5)))
    assert cp.get_result("fetch:{}") == (True, {"url": "https://x.org", "fetched": "2025-01-02T03:04:05"})


def test_serializer_on_the_store_converts_values_put_in_directly(tmp_path: object) -> None:
    store = MemoryCheckpointStore(serializer=_to_json)
    cp = TaskCheckpoint(task_id="t")
    cp.metadata["when"] = dt.datetime(2025, 1, 1)
    store.save(cp)
    loaded = store.load("t")
    assert loaded is not None and loaded.metadata == {"when": "2025-01-01T00:00:00"}


def test_save_without_serializer_refuses_non_json_put_in_directly() -> None:
    store = MemoryCheckpointStore()
    cp = TaskCheckpoint(task_id="t")
    cp.results.append({"when": dt.date(2025, 1, 1)})
    with pytest.raises(CheckpointSerializationError, match="date is not JSON"):
        store.save(cp)
    assert store.load("t") is None and cp.version == 0


def test_record_failure_accepts_governed_error_or_its_dict() -> None:
    cp = TaskCheckpoint(task_id="t")
    cp.record_failure("fetch:a", NOT_FOUND)
    cp.record_failure("fetch:b", NOT_FOUND.model_dump(mode="json"))
    assert cp.get_failure("fetch:a") == NOT_FOUND
    assert cp.get_failure("fetch:b") == NOT_FOUND
    assert cp.get_failure("fetch:c") is None


def test_success_after_failure_clears_the_known_bad_entry() -> None:
    cp = TaskCheckpoint(task_id="t")
    cp.record_failure("k", NOT_FOUND)
    cp.record_success("k", "fine now")
    assert cp.get_failure("k") is None and cp.get_result("k") == (True, "fine now")


def test_add_result_appends_detached_json() -> None:
    cp = TaskCheckpoint(task_id="t")
    sub = {"summary": "a"}
    cp.add_result(sub)
    cp.add_result("b")
    sub["summary"] = "changed"
    assert cp.results == [{"summary": "a"}, "b"]
    with pytest.raises(CheckpointSerializationError):
        cp.add_result(object())


SECRET = "sk-proj-abcdefghijklmnop1234567890"


def test_secrets_never_reach_the_stored_bytes(tmp_path: object) -> None:
    from pathlib import Path

    store = FileCheckpointStore(Path(str(tmp_path)))
    cp = TaskCheckpoint(task_id="t")
    key_with_secret = f'call_api:{{"api_key":"{SECRET}","q":"x"}}'
    cp.record_success(key_with_secret, {"echo": f"used key {SECRET}", "password": "hunter2-secret"})
    cp.record_failure(
        'fetch:{"url":"https://bob:pa55word@db.example"}',
        GovernedError(error_type=ErrorType.PERMANENT, message=f"Authorization: Bearer {SECRET}"),
    )
    cp.add_result(f"token {SECRET}")
    cp.metadata["conn"] = "postgres://bob:pa55word@db.example/x"
    store.save(cp)
    data = store.path_for("t").read_bytes()
    for secret in (SECRET, "hunter2-secret", "pa55word"):
        assert secret.encode() not in data
    loaded = store.load("t")
    assert loaded is not None
    # the call whose key held a secret is still found by the same key after a reload
    found, result = loaded.get_result(key_with_secret)
    assert found and isinstance(result, dict)
    assert result["echo"].startswith("used key ") and SECRET not in result["echo"]
    assert result["password"] != "hunter2-secret"


def test_task_id_must_be_a_non_empty_valid_string() -> None:
    with pytest.raises(ValidationError):
        TaskCheckpoint(task_id="")
    with pytest.raises(ValidationError):
        TaskCheckpoint(task_id="bad\udc80surrogate")


def test_replacing_a_value_after_a_save_stores_the_new_value() -> None:
    store = MemoryCheckpointStore()
    cp = TaskCheckpoint(task_id="t")
    cp.record_success("k", {"v": 1})
    cp.add_result("first")
    store.save(cp)
    cp.record_success("k", {"v": 2})
    cp.results[0] = "replaced"
    cp.completed["direct"] = [1, 2]
    store.save(cp)
    loaded = store.load("t")
    assert loaded is not None
    assert loaded.completed == {"k": {"v": 2}, "direct": [1, 2]}
    assert loaded.results == ["replaced"]


# dict keys from an alphabet that spells no secret name ("pwd", "token"...): values under
# such keys are redacted on purpose (see test_secrets_never_reach_the_stored_bytes)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text("xyz019 _-.", max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)


@settings(max_examples=150, deadline=None)
@given(value=_json_values, key=st.text(min_size=1, max_size=30))
def test_any_json_result_comes_back_equal_after_a_store_round_trip(value: object, key: str) -> None:
    assume(redact_obj(value) == value and redact(key) == key)  # secrets are meant to change
    store = MemoryCheckpointStore()
    cp = TaskCheckpoint(task_id="t")
    cp.record_success(key, value)
    store.save(cp)
    loaded = store.load("t")
    assert loaded is not None and loaded.get_result(key) == (True, value)


def test_a_secret_named_field_is_masked_whole_whatever_its_characters(tmp_path: object) -> None:
    # Regression: only the first run of a value (up to a space, comma or ;) was masked, so
    # "[REDACTED] horse battery staple" and "ab,cdef0123456789" reached the disk.
    from pathlib import Path

    store = FileCheckpointStore(Path(str(tmp_path)))
    cp = TaskCheckpoint(task_id="t")
    fields = {
        "password": "correct horse battery staple",
        "api_key": "ab,cdef0123456789",
        "OPENAI_API_KEY": "k9;f8d7s6a5",
        "userPassword": "two words",
        "session_token": "tok_live_0123456789abcdef",
        "credentials": {"password": ["p;ssw0rd-long-secret"]},
        "q": "kept as is",
    }
    cp.record_success("login\x00{}", fields)
    cp.metadata["auth"] = {"client_secret": "a b c d"}
    store.save(cp)
    data = store.path_for("t").read_bytes()
    for leaked in ("horse", "battery", "cdef0123456789", "f8d7s6a5", "words", "tok_live", "ssw0rd", "b c d"):
        assert leaked.encode() not in data, leaked
    loaded = store.load("t")
    assert loaded is not None
    assert loaded.get_result("login\x00{}") == (
        True,
        {
            "password": "[REDACTED]",
            "api_key": "[REDACTED]",
            "OPENAI_API_KEY": "[REDACTED]",
            "userPassword": "[REDACTED]",
            "session_token": "[REDACTED]",
            "credentials": {"password": ["[REDACTED]"]},
            "q": "kept as is",
        },
    )
    assert loaded.metadata["auth"] == {"client_secret": "[REDACTED]"}


@settings(max_examples=200, deadline=None)
@given(ops=edits("save"))
# a key replaced by another holding the very same (cached small int) object
@example(ops=[("success", "search:1", 0), ("save", "", None), ("delete", "search:1", None), ("success", "search:2", 0)])
def test_saves_after_any_edits_encode_what_a_fresh_copy_encodes(ops: list[tuple[str, str, object]]) -> None:
    # Values recorded through record_* are encoded as they are, values put in directly
    # are converted on the way; whatever the edits (appends, replacements, deletions,
    # in-place metadata), the bytes must equal those of a fresh checkpoint with the same
    # content, all of whose values are converted.
    cp = TaskCheckpoint(task_id="t")
    for i, (op, key, value) in enumerate(ops):
        apply_edit(cp, op, key, value)
        if op == "save" or i == len(ops) - 1:
            fresh = TaskCheckpoint.model_validate(cp.model_dump())
            assert cp.encode_body(1.0) == fresh.encode_body(1.0)


def _encode_until(cp: TaskCheckpoint, stop: threading.Event, errors: list[BaseException]) -> None:
    while not stop.is_set():
        try:
            cp.encode_body(1.0)
        except BaseException as exc:  # reported by the test
            errors.append(exc)


def test_a_checkpoint_saved_while_another_thread_records_still_encodes_its_content() -> None:
    # Parallel tool calls record into one task checkpoint while another call saves it:
    # the encoding reused between saves must never pair one state's keys with another
    # state's values or bytes, not even transiently.
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for _ in range(20):
            cp = TaskCheckpoint(task_id="t")
            stop = threading.Event()
            errors: list[BaseException] = []

            thread = threading.Thread(target=_encode_until, args=(cp, stop, errors))
            thread.start()
            for i in range(150):
                cp.add_result(i)
                cp.record_success(f"k{i}", i)
                cp.encode_body(1.0)
            stop.set()
            thread.join()
            assert errors == []
            assert cp.encode_body(1.0) == TaskCheckpoint.model_validate(cp.model_dump()).encode_body(1.0)
    finally:
        sys.setswitchinterval(old_interval)
