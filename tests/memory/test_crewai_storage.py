"""crewai_governor.GovernedStorage: crewAI 1.15's StorageBackend protocol, each filter, a
backend that fails and recovers, and install(memory=True) through crewAI's storage factory."""

from __future__ import annotations

import asyncio
from typing import Any

import lg_crewai
import pytest
from crewai.memory.storage import factory
from crewai.memory.storage.backend import StorageBackend
from crewai.memory.storage.lancedb_storage import LanceDBStorage
from crewai.memory.unified_memory import Memory

import loop_governor as lg
from crewai_governor import GovernedStorage, install


def test_it_is_a_storage_backend(storage: Any, governor: lg.Governor, tmp_path: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    assert isinstance(storage, StorageBackend)
    assert isinstance(wrapped, StorageBackend)
    assert isinstance(GovernedStorage(LanceDBStorage(path=str(tmp_path / "lance")), governor), StorageBackend)
    assert wrapped.guard.tool == "memory:DictStorage"


def test_misuse_names_the_parameter(governor: lg.Governor) -> None:
    with pytest.raises(TypeError, match="inner"):
        GovernedStorage(object(), governor)  # type: ignore[arg-type]


def test_failures_stay_out(storage: Any, governor: lg.Governor, events: list[dict[str, Any]], mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)

    wrapped.save(
        [
            mk.record(f"search_docs answered {mk.GOVERNED_JSON}"),
            mk.record(mk.TRACEBACK),
            mk.record("Paris is the capital of France"),
            mk.record("ok", metadata={"tool_result": "Error: HTTP 404\nPermanent failure: fix the path."}),
        ]
    )

    assert storage.contents() == ["Paris is the capital of France"]
    assert [e["reason"] for e in mk.named(events, "memory_dropped")] == [
        "governed_error",
        "traceback",
        "governed_error",
    ]
    assert wrapped.stats["dropped"] == 3 and wrapped.stats["written"] == 1


def test_records_that_only_mention_an_error_are_kept(storage: Any, governor: lg.Governor, mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    texts = [
        "Error executing tool: timeout (crewAI's words, not the governor's)",
        f"The nightly job failed with this, fixed by pinning numpy:\n{mk.TRACEBACK}",
        "Error: 'disk full' means the volume is at 100%; clean /tmp first.",
    ]

    wrapped.save([mk.record(t) for t in texts] + [mk.record("the result", metadata={"status": "error"})])

    assert sorted(storage.contents()) == sorted([*texts, "the result"])
    assert wrapped.stats["dropped"] == 0 and wrapped.stats["written"] == 4


def test_secrets_are_redacted_in_content_and_metadata(storage: Any, governor: lg.Governor, mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    record = mk.record(f"use api_key={mk.SECRET} for staging", metadata={"api_key": "abc", "agent": "ops"})

    wrapped.save([record])

    (stored,) = storage.records.values()
    assert mk.SECRET not in stored.content and "[REDACTED]" in stored.content
    assert stored.metadata == {"api_key": "[REDACTED]", "agent": "ops"}
    assert stored.embedding == record.embedding and stored.id == record.id
    assert mk.SECRET in record.content  # the caller's record is not mutated


def test_each_record_keeps_its_id_and_a_repeat_is_only_counted(
    storage: Any, governor: lg.Governor, events: list[dict[str, Any]], mk: Any
) -> None:
    wrapped = GovernedStorage(storage, governor)
    first = mk.record("Deploy 41 finished in 12s", scope="/ops")
    other = mk.record("Deploy 42 finished in 9s", scope="/ops")
    same = mk.record("Deploy  41 finished in 12s", scope="/ops")  # whitespace aside, the same
    elsewhere = mk.record("Deploy 41 finished in 12s", scope="/dev")
    wrapped.save([first])
    wrapped.save([other, same])
    wrapped.save([elsewhere])

    assert {r.id: r.content for r in storage.records.values()} == {
        r.id: r.content for r in (first, other, same, elsewhere)
    }
    (repeat,) = mk.named(events, "memory_repeat")
    assert repeat["key"] == same.id and repeat["same_as"] == first.id
    assert wrapped.stats["repeats"] == 1 and wrapped.stats["written"] == 4


def test_blobs_and_size(storage: Any, governor: lg.Governor, mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    wrapped.save([mk.record("chart data:image/png;base64," + "iVBORw0KGgo" * 300), mk.record("A" + "b" * 9000 + "Z")])

    blob, long = storage.contents()
    assert blob.startswith("chart [image/png data removed:")
    assert long.startswith("Ab") and long.endswith("bZ") and "chars trimmed" in long and len(long) < 3100


def test_update_is_filtered_too(storage: Any, governor: lg.Governor, mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    record = mk.record("the build is green")
    wrapped.save([record])

    wrapped.update(record.model_copy(update={"content": mk.TRACEBACK}))
    wrapped.update(record.model_copy(update={"content": f"the build is green; password={mk.SECRET}"}))

    assert storage.contents() == ["the build is green; password=[REDACTED]"]


def test_backend_fails_once_then_recovers(
    storage: Any, governor: lg.Governor, events: list[dict[str, Any]], mk: Any
) -> None:
    wrapped = GovernedStorage(storage, governor)
    storage.faults.queue = [mk.HTTPError(503, "lance: commit conflict")]

    wrapped.save([mk.record("kept despite the blip")])
    hits = wrapped.search(mk.hash_embedder(["kept"])[0])

    assert storage.contents() == ["kept despite the blip"]
    assert storage.faults.calls == 3  # save failed, save retried, search
    assert [h[0].content for h in hits] == ["kept despite the blip"]
    assert not mk.named(events, "memory_save_failed")
    assert governor.breaker_state("memory:DictStorage").value == "closed"


def test_a_backend_that_stays_down_degrades_then_the_breaker_opens(
    storage: Any, governor: lg.Governor, events: list[dict[str, Any]], mk: Any
) -> None:
    wrapped = GovernedStorage(storage, governor)
    storage.faults.forever = mk.HTTPError(503, "vector db down")

    for i in range(4):
        wrapped.save([mk.record(f"fact number {'abcd'[i]}")])  # never raises

    failures = mk.named(events, "memory_save_failed")
    assert len(failures) == 4 and wrapped.stats["save_failures"] == 4
    assert governor.breaker_state("memory:DictStorage").value == "open"
    calls = storage.faults.calls
    wrapped.save([mk.record("one more")])
    assert storage.faults.calls == calls  # refused by the open breaker: the backend is spared
    with pytest.raises(lg.CircuitOpenError):
        wrapped.count()  # a read raises the typed error instead


def test_reads_pass_through_untouched(storage: Any, governor: lg.Governor, mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    record = mk.record("Lyon is in France", scope="/geo", categories=["city"])
    storage.records[record.id] = record  # written behind the wrapper's back

    assert wrapped.get_record(record.id) is record
    assert wrapped.search(record.embedding)[0][0] is record
    assert wrapped.list_records("/geo")[0] is record
    assert wrapped.count() == 1 and wrapped.list_categories() == {"city": 1}
    assert wrapped.list_scopes("/") == ["/geo"] and wrapped.get_scope_info("/geo").record_count == 1
    assert wrapped.delete(record_ids=[record.id]) == 1
    wrapped.reset()


def test_async_twins(storage: Any, governor: lg.Governor, mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    storage.faults.queue = [mk.HTTPError(503, "blip")]

    async def main() -> Any:
        await wrapped.asave([mk.record("async fact 1"), mk.record(mk.TRACEBACK)])
        await wrapped.asave([mk.record("async fact 2")])
        hits = await wrapped.asearch(mk.hash_embedder(["async fact 2"])[0])
        deleted = await wrapped.adelete(record_ids=[hits[0][0].id])
        return hits, deleted

    hits, deleted = asyncio.run(main())
    assert sorted(h[0].content for h in hits) == ["async fact 1", "async fact 2"]
    assert hits[0][0].content == "async fact 2"
    assert deleted == 1 and storage.contents() == ["async fact 1"]


def test_a_deleted_record_is_not_a_repeat_of_a_new_one(storage: Any, governor: lg.Governor, mk: Any) -> None:
    wrapped = GovernedStorage(storage, governor)
    first = mk.record("fact 1")
    wrapped.save([first])
    wrapped.delete(record_ids=[first.id])
    second = mk.record("fact 1")
    wrapped.save([second])
    assert list(storage.records) == [second.id] and wrapped.stats["repeats"] == 0


def test_extra_backend_methods_pass_through(storage: Any, governor: lg.Governor) -> None:
    storage.touch_records = lambda ids: ids
    assert GovernedStorage(storage, governor).touch_records(["a"]) == ["a"]


def test_install_memory_wraps_every_memory_built_while_active(tmp_path: Any, governor: lg.Governor) -> None:
    spec = str(tmp_path / "lance")
    before = factory._factory

    with install(governor, memory=True):
        governed = Memory(storage=spec, embedder=lambda texts: [[0.0] * 8 for _ in texts])
    plain = Memory(storage=spec, embedder=lambda texts: [[0.0] * 8 for _ in texts])

    assert isinstance(governed._storage, GovernedStorage)
    assert isinstance(governed._storage.inner, LanceDBStorage) and governed._storage.governor is governor
    assert isinstance(plain._storage, LanceDBStorage)
    assert factory._factory is before


def test_install_memory_global_until_uninstalled_and_chains_a_user_factory(governor: lg.Governor, storage: Any) -> None:
    factory.set_memory_storage_factory(lambda spec: storage if spec == "mine" else None)
    try:
        installation = install(governor, memory=True, scoped=False)
        memory = Memory(storage="mine", embedder=lambda texts: [[0.0] for _ in texts])
        installation.uninstall()
        assert isinstance(memory._storage, GovernedStorage) and memory._storage.inner is storage
        assert factory.resolve_memory_storage("mine") is storage  # the user's factory is back
    finally:
        factory.set_memory_storage_factory(None)


def test_install_without_memory_leaves_the_factory_alone(governor: lg.Governor) -> None:
    before = factory._factory
    with install(governor):
        assert factory._factory is before


def test_changed_records_are_embedded_again_with_the_memorys_embedder(
    storage: Any, governor: lg.Governor, mk: Any
) -> None:
    other = mk.DictStorage()
    secret = mk.record(f"the key is api_key={mk.SECRET}")
    clean = mk.record("nothing to hide here")

    GovernedStorage(other, governor).save([secret])
    GovernedStorage(storage, governor, embedder=mk.hash_embedder).save([secret, clean])

    assert other.records[secret.id].embedding == secret.embedding  # crewAI's vector of the original text
    stored = storage.records[secret.id]
    assert stored.embedding == mk.hash_embedder([stored.content])[0] != secret.embedding
    assert storage.records[clean.id].embedding == clean.embedding  # unchanged: not embedded again
    with pytest.raises(TypeError, match="embedder"):
        GovernedStorage(storage, governor, embedder="openai")  # type: ignore[arg-type]


def test_install_memory_governs_a_crew_built_with_memory_true(governor: lg.Governor) -> None:
    llm = lg_crewai.ScriptedLLM(model="scripted", script=[lg_crewai.Final("ok")])
    build = {"role": "r", "goal": "g", "tasks": [("t", "o")], "max_iter": 2, "memory": True}

    with install(governor, memory=True):
        governed = lg_crewai.make_crew(llm, **build)
    plain = lg_crewai.make_crew(llm, **build)

    assert isinstance(governed._memory._storage, GovernedStorage)
    assert isinstance(governed._memory._storage.inner, LanceDBStorage)
    assert isinstance(plain._memory._storage, LanceDBStorage)
