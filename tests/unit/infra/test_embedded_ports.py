"""A chosen port is one no outgoing connection can take before its server binds it, and the embedded S3 server's
inner ports never take a port promised to another server of the stack."""

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra import embedded
from infra.embedded import (
    PORT_FLOOR,
    PORT_RANGE_ENV,
    S3Credentials,
    drawn_ports,
    ephemeral_ports,
    free_port,
    seaweed_command,
)


def test_free_port_skips_the_ports_it_is_told_to_avoid() -> None:
    first = free_port()
    assert all(free_port(frozenset({first})) != first for _ in range(50))


def test_a_free_port_is_drawn_below_the_range_outgoing_connections_take_theirs_from() -> None:
    low, _ = ephemeral_ports()
    if low <= PORT_FLOOR + 1000:
        pytest.skip(f"this host's ephemeral range starts at {low}: no room below it, the kernel chooses")
    drawn = {free_port() for _ in range(20)}
    assert all(PORT_FLOOR <= port < low for port in drawn)
    assert len(drawn) > 1, "drawn, not the same port each time (parallel test workers must not pick alike)"


@pytest.mark.parametrize(("said", "own"), [("20000-21500", True), ("1000-2000", False), ("x-y", False),
                                           ("21500-20000", False), ("", False)])
def test_a_process_told_its_slice_of_ports_draws_from_it_alone(monkeypatch: pytest.MonkeyPatch, said: str,
                                                               own: bool) -> None:
    low, _ = ephemeral_ports()
    if low <= 21500:
        pytest.skip(f"this host's ephemeral range starts at {low}")
    monkeypatch.setenv(PORT_RANGE_ENV, said)
    drawn = {free_port() for _ in range(20)}
    assert not own or all(20000 <= port < 21500 for port in drawn)
    assert drawn_ports() == ((20000, 21500) if own else (PORT_FLOOR, low)), "a slice out of the default is ignored"


def test_a_drawn_port_somebody_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        held = listener.getsockname()[1]
        other = free_port(frozenset({held}))
        draws = iter([held, other])
        monkeypatch.setattr(embedded, "_DRAW", SimpleNamespace(randrange=lambda *_: next(draws)))
        assert free_port() == other


def test_seaweeds_inner_ports_and_their_grpc_twins_avoid_the_gateway_and_broker_ports(tmp_path: Path) -> None:
    creds = S3Credentials.load_or_create(tmp_path / "s3-credentials.json")
    taken = frozenset({free_port(), free_port()})
    command = seaweed_command(tmp_path, 9333, creds, taken)
    inner = [int(arg.split("=")[1]) for arg in command if arg.split("=")[0].endswith(".port") and "s3." not in arg]
    assert inner
    for port in inner:
        assert port not in taken and port + 10000 not in taken and port - 10000 not in taken
