"""The embedded S3 server's inner ports never take a port promised to another server of the stack."""

from pathlib import Path

from infra.embedded import S3Credentials, free_port, seaweed_command


def test_free_port_skips_the_ports_it_is_told_to_avoid() -> None:
    first = free_port()
    assert all(free_port(frozenset({first})) != first for _ in range(50))


def test_seaweeds_inner_ports_and_their_grpc_twins_avoid_the_gateway_and_broker_ports(tmp_path: Path) -> None:
    creds = S3Credentials.load_or_create(tmp_path / "s3-credentials.json")
    taken = frozenset({free_port(), free_port()})
    command = seaweed_command(tmp_path, 9333, creds, taken)
    inner = [int(arg.split("=")[1]) for arg in command if arg.split("=")[0].endswith(".port") and "s3." not in arg]
    assert inner
    for port in inner:
        assert port not in taken and port + 10000 not in taken and port - 10000 not in taken
