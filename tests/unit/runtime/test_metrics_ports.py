"""Services sharing a host each serve `/metrics` on their own port (`SHESHNAG_<SERVICE>_METRICS_PORT`, over the
shared `SHESHNAG_METRICS_PORT`), at the address `SHESHNAG_METRICS_ADDRESS` chooses."""

import urllib.error
import urllib.request

import pytest

from infra.embedded import free_port
from services.ledger.settings import LedgerSettings
from services.runtime.process.metrics import serve_metrics
from services.scheduler.settings import SchedulerSettings
from services.validator.settings import ValidatorSettings

CHOSEN = "127.0.0.2"
"""A loopback address other than the default 127.0.0.1: binding it shows the address is honoured."""


def scrape(address: str, port: int) -> int:
    with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=5) as answer:
        return int(answer.status)


def test_two_services_on_one_host_bind_their_own_metrics_ports_at_the_chosen_address(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shared, validator_port, ledger_port = free_port(), free_port(), free_port()
    monkeypatch.setenv("SHESHNAG_METRICS_PORT", str(shared))
    monkeypatch.setenv("SHESHNAG_METRICS_ADDRESS", CHOSEN)
    monkeypatch.setenv("SHESHNAG_VALIDATOR_METRICS_PORT", str(validator_port))
    monkeypatch.setenv("SHESHNAG_LEDGER_METRICS_PORT", str(ledger_port))
    endpoints = [ValidatorSettings().metrics_endpoint(), LedgerSettings().metrics_endpoint()]
    assert endpoints == [(CHOSEN, validator_port), (CHOSEN, ledger_port)]
    assert SchedulerSettings().metrics_endpoint() == (CHOSEN, shared), "a service without its own: the shared one"

    servers = [serve_metrics(port, address) for address, port in endpoints]
    try:
        assert all(server is not None for server in servers), "each bound its own"
        assert [scrape(CHOSEN, port) for _, port in endpoints] == [200, 200]
        with pytest.raises(urllib.error.URLError):
            scrape("127.0.0.1", validator_port)  # only where it was told to listen
    finally:
        for server in servers:
            if server is not None:
                server.shutdown()
                server.server_close()


def test_a_port_already_taken_leaves_the_service_running_without_metrics() -> None:
    port = free_port()
    first = serve_metrics(port)
    try:
        assert first is not None and serve_metrics(port) is None
    finally:
        assert first is not None
        first.shutdown()
        first.server_close()
