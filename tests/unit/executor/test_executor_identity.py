"""Who an executor is (issue 27, points 1, 2 and 3): an id belongs to the provider that first registered it, a worker
key serves one live executor, stated times never run ahead of the scheduler's clock, an advert is its KV key's, and
only an executor holding every unit's lease finalizes a batch (else the control plane does)."""

import time

import pytest

from contracts.events.batch import AttemptFailed, ShardFinished
from contracts.events.executor import ExecutorAdvert, ExecutorRegistered
from contracts.events.key import KeyCreated
from contracts.readmodel import ApiKeyRecord
from services.runtime.nats.fleet import read_advert
from services.scheduler.book import NEW_EXECUTOR_IDS_PER_WINDOW, NEW_EXECUTOR_IDS_WINDOW_MS, Book
from services.scheduler.decisions import choose_finalizer
from services.scheduler.registration import identity_refusal
from tests.unit.scheduler.test_object_broker import assigned, created

NOW = int(time.time() * 1000)
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000


def advert(executor_id: str, heartbeat_at: int = NOW) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="1", models=["m"],
                          loaded_models=[], devices=[], slots=2, heartbeat_at=heartbeat_at)


def worker_key(key_id: str, provider_id: str | None) -> ApiKeyRecord:
    return ApiKeyRecord(key_id=key_id, role="worker", label="w", provider_id=provider_id)


def registered(book: Book, executor_id: str, key: ApiKeyRecord, started_at: int = NOW) -> None:
    book.apply(ExecutorRegistered(aggregate_id=executor_id, advert=advert(executor_id, started_at),
                                  started_at=started_at, worker_key_id=key.key_id, provider_id=key.provider_id,
                                  occurred_at=NOW))  # the log's time is the test's clock, not when it runs


def test_an_executor_id_belongs_to_the_provider_that_registered_it_first() -> None:
    book = Book()
    victim, rotated, attacker = worker_key("k1", "prov_a"), worker_key("k2", "prov_a"), worker_key("k3", "prov_evil")
    registered(book, "gpu-1", victim)
    assert identity_refusal(book, "gpu-1", attacker, NOW) is not None
    book.lost["gpu-1"] = NOW  # gone, and still not the attacker's
    assert identity_refusal(book, "gpu-1", attacker, NOW) is not None
    assert identity_refusal(book, "gpu-1", rotated, NOW) is None, "another key of the same provider may"


def test_an_operators_executor_id_is_its_keys_alone() -> None:
    book = Book()
    registered(book, "local-0", worker_key("k-op", None))
    assert identity_refusal(book, "local-0", worker_key("k-other-op", None), NOW) is not None


def test_a_worker_key_serves_one_live_executor_at_a_time() -> None:
    book = Book()
    key = worker_key("k1", "prov_a")
    registered(book, "gpu-1", key)
    refusal = identity_refusal(book, "gpu-2", key, NOW)
    assert refusal is not None and "gpu-1" in refusal
    assert identity_refusal(book, "gpu-1", key, NOW) is None, "the same executor registers again (a restart)"
    book.lost["gpu-1"] = NOW
    assert identity_refusal(book, "gpu-2", key, NOW) is None, "once the first is gone, the key may move"


def test_times_from_the_future_are_read_as_the_scheduler_stated_the_registration() -> None:
    book = Book()
    registered(book, "gpu-1", worker_key("k1", "prov_a"), started_at=NOW + TEN_YEARS_MS)
    assert book.incarnations["gpu-1"] <= int(time.time() * 1000)
    assert book.known_executors["gpu-1"] <= int(time.time() * 1000)


def test_an_advert_is_its_keys_whatever_its_body_says_and_its_heartbeat_never_in_the_future() -> None:
    read = read_advert("evil-1", advert("local-0", heartbeat_at=NOW + TEN_YEARS_MS).model_dump_json().encode(), NOW)
    assert read.executor_id == "evil-1" and read.heartbeat_at == NOW


@pytest.mark.parametrize("value", [b"{}", b"null", b"\xff", b'{"executor_id": "x", "slots": -1}',
                                   advert("a").model_copy(update={"parallel_attempts": 10**9}).model_dump_json()
                                   .encode(),
                                   advert("a").model_dump_json().encode().replace(b'"devices":[]', b'"devices":[{'
                                   b'"name":"g","total_bytes":1,"free_bytes":2}]')])
def test_an_advert_that_does_not_parse_or_is_nonsense_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        read_advert("a", value, NOW)


def test_a_batch_that_never_ran_is_finalized_by_the_control_plane() -> None:
    book = Book()
    created(book, "b1", "file-1")
    assert choose_finalizer(book.plans["b1"], {"alpha": advert("alpha")}) is None


def test_the_executor_holding_every_units_lease_finalizes_it_and_no_other() -> None:
    book = Book()
    created(book, "b1", "file-1")
    assigned(book, "b1", "alpha", 1, shard=0, shards=2)
    assigned(book, "b1", "alpha", 2, shard=1, shards=2)
    live = {"alpha": advert("alpha"), "bravo": advert("bravo")}
    assert choose_finalizer(book.plans["b1"], live) == "alpha"
    assert choose_finalizer(book.plans["b1"], {"bravo": advert("bravo")}) is None, "alpha gone: the control plane"
    book.apply(AttemptFailed(aggregate_id="b1", attempt=2, executor_id="alpha", code="executor_lost", reason="x"))
    assigned(book, "b1", "bravo", 3, shard=1, shards=2)
    book.apply(ShardFinished(aggregate_id="b1", attempt=3, shard=1, executor_id="bravo"))
    assert choose_finalizer(book.plans["b1"], live) is None, "units on two executors: neither writes the other's"


def test_a_registration_from_before_it_named_the_provider_is_the_keys_providers() -> None:
    book = Book()
    book.apply(KeyCreated(aggregate_id="k_old", key_id="key_old", key_sha256="0" * 64, role="worker", label="w",
                          provider_id="prov_a"))
    book.apply(ExecutorRegistered(aggregate_id="gpu-1", advert=advert("gpu-1"), started_at=NOW,
                                  worker_key_id="key_old"))  # no provider_id: an older scheduler stated it
    assert book.placements.runner("gpu-1").organization is not None, "a provider's executor, not the platform's"
    assert identity_refusal(book, "gpu-1", worker_key("key_new", "prov_a"), NOW + 60_000) is None


def test_a_provider_brings_at_most_100_new_executor_ids_a_day_and_its_known_ids_stay_welcome() -> None:
    book, day_ms = Book(), NEW_EXECUTOR_IDS_WINDOW_MS
    keys = [worker_key(f"k{n}", "prov_churn") for n in range(NEW_EXECUTOR_IDS_PER_WINDOW)]
    for n, key in enumerate(keys):  # a key per host, each id new
        assert identity_refusal(book, f"gpu-{n}", key, NOW) is None
        registered(book, f"gpu-{n}", key)
    spare = worker_key("k-spare", "prov_churn")

    refusal = identity_refusal(book, "gpu-new", spare, NOW)

    assert refusal is not None and "prov_churn" in refusal and "100 new executor ids" in refusal
    book.lost["gpu-0"] = NOW
    assert identity_refusal(book, "gpu-0", spare, NOW) is None, "an id it had before is still its own"
    assert identity_refusal(book, "gpu-new", worker_key("k-other", "prov_other"), NOW) is None, "each provider's own"
    assert identity_refusal(book, "gpu-new", spare, NOW + day_ms + 60_000) is None, "a day later it may bring new ones"


def test_a_key_of_no_provider_counts_its_new_executor_ids_on_its_own() -> None:
    book, key = Book(), worker_key("k-op", None)
    for n in range(NEW_EXECUTOR_IDS_PER_WINDOW):
        book.apply(ExecutorRegistered(aggregate_id=f"op-{n}", advert=advert(f"op-{n}"), started_at=NOW,
                                      worker_key_id=key.key_id, provider_id=None, occurred_at=NOW))
        book.lost[f"op-{n}"] = NOW

    assert identity_refusal(book, "op-new", key, NOW) is not None
    assert identity_refusal(book, "op-new", worker_key("k-op-2", None), NOW) is None
    assert book.new_ids_of("key k-op", NOW + NEW_EXECUTOR_IDS_WINDOW_MS) == 0, "forgotten once out of the window"
    assert book.new_ids_of("key never-seen", NOW) == 0 and "key never-seen" not in book.new_ids
