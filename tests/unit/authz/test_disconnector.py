"""The disconnector's intake of facts: whatever bytes arrive on its subjects, it never raises, and only a real fact
of a key's revocation or an executor's registration closes connections."""

from typing import Any, cast

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from contracts.events.key import KeyRevoked
from contracts.subjects import EXECUTOR_REGISTERED, KEY_REVOKED, SERVER_CONNECTS, SERVER_DISCONNECTS
from services.authz import disconnect
from services.authz.disconnect import AdmittedConnections, Connection, Disconnector

KEY = "a" * 64
CONNECTION = Connection("server-1", 7)


def disconnector() -> tuple[Disconnector, list[Connection]]:
    admitted = AdmittedConnections()
    admitted.add(KEY, CONNECTION)
    admitted.claim("executor-1", CONNECTION, None, "key_a")
    kicked: list[Connection] = []
    made = Disconnector(cast(Client, None), admitted)
    made._kick_later = kicked.append  # type: ignore[method-assign,assignment]
    return made, kicked


def message(subject: str, data: bytes) -> Msg:
    return Msg(cast(Any, None), subject=subject, data=data)


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"type": "key.revoked"}', b"\xff" * 10,
                                  b'{"server": {"id": "s"}, "client": {"id": 1e999}}'])
async def test_bytes_that_are_no_fact_close_nothing_and_raise_nothing(data: bytes) -> None:
    made, kicked = disconnector()
    await made.on_revoked(message(KEY_REVOKED, data))
    await made.on_registered(message(EXECUTOR_REGISTERED, data))
    await made.on_connected(message(SERVER_CONNECTS, data))
    await made.on_disconnected(message(SERVER_DISCONNECTS, data))
    assert kicked == []
    assert made.admitted.by_key == {KEY: {CONNECTION}}


async def test_a_revoked_keys_connections_are_closed() -> None:
    made, kicked = disconnector()
    revoked = KeyRevoked(aggregate_id="key-a", key_sha256=KEY)
    await made.on_revoked(message(KEY_REVOKED, revoked.model_dump_json().encode()))
    assert kicked == [CONNECTION]


def test_a_connection_whose_close_was_never_heard_is_forgotten_once_its_admission_expired(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 1000.0}
    monkeypatch.setattr(disconnect.time, "monotonic", lambda: clock["now"])
    admitted = AdmittedConnections()
    admitted.add(KEY, CONNECTION, ttl_s=60.0)
    admitted.claim("executor-1", CONNECTION, None, "key_a")
    clock["now"] += 61.0
    others = [Connection("server-1", 100 + n) for n in range(disconnect.PRUNE_EVERY)]
    for other in others:  # admissions go on; the sweeps among them find the expired one
        admitted.add("b" * 64, other, ttl_s=60.0)
    assert KEY not in admitted.by_key and "executor-1" not in admitted.by_executor
    assert admitted.by_key["b" * 64] == set(others)
    for other in others:
        admitted.discard(other)
    assert admitted.by_key == {} and admitted.by_executor == {}


def test_an_admission_the_server_never_reports_opened_stops_counting_and_an_opened_one_counts_until_it_closes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 1000.0}
    monkeypatch.setattr(disconnect.time, "monotonic", lambda: clock["now"])
    admitted = AdmittedConnections()
    opened, abandoned = Connection("server-1", 1), Connection("server-1", 2)
    for connection in (opened, abandoned):
        admitted.add(KEY, connection, ttl_s=3600.0)
        admitted.hold("provider-a", connection)
    assert admitted.count("provider-a") == 2
    admitted.opened(opened)
    clock["now"] += disconnect.CONFIRM_WITHIN_S + 1
    assert admitted.count("provider-a") == 1, "an answer the server gave up on holds no place"
    clock["now"] += 3000.0
    assert admitted.count("provider-a") == 1
    admitted.discard(opened)
    assert admitted.count("provider-a") == 0


def test_connections_of_a_server_that_shut_down_count_no_more() -> None:
    admitted = AdmittedConnections()
    gone, kept = Connection("server-1", 1), Connection("server-2", 1)
    for connection in (gone, kept):
        admitted.add(KEY, connection)
        admitted.hold("provider-a", connection)
        admitted.opened(connection)
    admitted.server_gone("server-1")
    assert admitted.count("provider-a") == 1 and admitted.by_holder == {"provider-a": {kept}}


def test_after_the_reports_connection_reconnected_each_connection_counts_only_until_reported_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that restarted took its closes with it: nothing stays counted for the admission's hour."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(disconnect.time, "monotonic", lambda: clock["now"])
    reconnects = {"count": 0}
    admitted = AdmittedConnections(reconnects=lambda: reconnects["count"])
    still_open, closed_unheard = Connection("server-1", 1), Connection("server-1", 2)
    for connection in (still_open, closed_unheard):
        admitted.add(KEY, connection, ttl_s=3600.0)
        admitted.hold("provider-a", connection)
        admitted.opened(connection)
    reconnects["count"] += 1
    assert admitted.count("provider-a") == 2
    admitted.opened(still_open)  # reported again
    clock["now"] += disconnect.CONFIRM_WITHIN_S + 1
    assert admitted.count("provider-a") == 1


def test_a_connection_admitted_again_for_another_holder_counts_for_that_one_only() -> None:
    admitted = AdmittedConnections()
    admitted.add(KEY, CONNECTION)
    admitted.hold("provider-a", CONNECTION)
    admitted.hold("provider-b", CONNECTION)
    admitted.discard(CONNECTION)
    assert admitted.by_holder == {}
