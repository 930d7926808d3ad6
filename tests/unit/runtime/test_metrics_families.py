"""Each process exports only the metric families it owns: a validator's `/metrics` has the validator's counters and
none of the executor's or the gateway's fleet gauges at 0 (each service in a fresh process, as it runs)."""

import subprocess
import sys

import pytest

from services.runtime.process.metrics import FAMILIES

SCRAPE = """
import sys
from prometheus_client import generate_latest
from services.runtime.process import metrics
metrics.register(sys.argv[1])
metrics.register(sys.argv[1])  # a second composition root in the process changes nothing
sys.stdout.write(generate_latest().decode())
"""


def family_names(service: str) -> set[str]:
    return {family._name for family in FAMILIES[service]}


@pytest.mark.parametrize("service", sorted(FAMILIES))
def test_a_service_process_exports_its_own_families_and_no_other(service: str) -> None:
    scraped = subprocess.run([sys.executable, "-c", SCRAPE, service], capture_output=True, text=True, check=True,
                             timeout=60).stdout
    exported = {line.split()[2] for line in scraped.splitlines() if line.startswith("# TYPE sheshnag_")}
    exported = {name.removesuffix("_created").removesuffix("_total") for name in exported}
    assert exported == family_names(service)
    others = set().union(*(family_names(other) for other in FAMILIES if other != service)) - family_names(service)
    assert not exported & others
    if service != "gateway":
        assert "sheshnag_executors " not in scraped


@pytest.mark.parametrize("service", sorted(FAMILIES))
def test_every_service_exports_the_pending_count_its_durable_consumers_set(service: str) -> None:
    # Each service runs a durable through services/runtime/nats/delivery.py (the gateway: its webhook intake).
    assert "sheshnag_consumer_pending_messages" in family_names(service)
