"""With a metrics base port, `sheshnag up`'s embedded servers serve their own metrics after the services' ports:
SeaweedFS's Prometheus counters (S3 requests by type) on the metrics address, and the broker's monitoring endpoint
on loopback only."""

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from infra.embedded import (
    S3_READY_S,
    S3Credentials,
    ServerMetrics,
    free_port,
    launch,
    nats_command,
    seaweed_command,
    stop_process,
    wait_for_port,
)
from infra.nats_auth import NatsAuth


def read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def test_the_object_store_counts_its_requests_on_its_metrics_port(tmp_path: Path) -> None:
    creds = S3Credentials.load_or_create(tmp_path / "s3-credentials.json")
    s3_port = free_port()
    metrics = ServerMetrics(s3_port=free_port(frozenset({s3_port})))
    process = launch(seaweed_command(tmp_path, s3_port, creds, metrics=metrics), tmp_path / "s3.log",
                     cwd=tmp_path / "s3")
    try:
        wait_for_port(s3_port, process, S3_READY_S, "seaweedfs s3")
        wait_for_port(metrics.s3_port, process, S3_READY_S, "seaweedfs metrics")
        assert "SeaweedFS_" in read(f"http://127.0.0.1:{metrics.s3_port}/metrics")
    finally:
        stop_process(process)


def test_the_broker_serves_its_monitoring_endpoint_on_loopback_only(tmp_path: Path) -> None:
    port = free_port()
    metrics = ServerMetrics(broker_port=free_port(frozenset({port})))
    config = NatsAuth.load_or_create(tmp_path).write_server_config(tmp_path, metrics.broker_config())
    process = launch(nats_command(tmp_path, port, config, host="0.0.0.0"), tmp_path / "nats.log")
    try:
        wait_for_port(metrics.broker_port, process, 15, "nats-server monitoring")
        wait_for_port(port, process, 15, "nats-server clients")  # opened after the monitoring port (JetStream first)
        assert json.loads(read(f"http://127.0.0.1:{metrics.broker_port}/varz"))["port"] == port
        # The client port is on every address (127.0.0.2 reaches a 0.0.0.0 bind too); the monitoring one is not.
        with socket.create_connection(("127.0.0.2", port), timeout=5):
            pass
        for address in ["127.0.0.2", *_other_addresses()]:
            with pytest.raises(OSError):
                read(f"http://{address}:{metrics.broker_port}/varz")
    finally:
        stop_process(process)


def _other_addresses() -> list[str]:
    """This host's IPv4 addresses besides loopback (none on a machine without a network)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos} - {"127.0.0.1"})
