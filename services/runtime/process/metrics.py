"""Every Prometheus metric Sheshnag exposes, each family registered only in the processes that own it
(`register(service)` at its composition root: a validator never exports the executor's counters at 0), and the
per-service `/metrics` server (`SHESHNAG_<SERVICE>_METRICS_PORT`, else `SHESHNAG_METRICS_PORT`, at
`SHESHNAG_METRICS_ADDRESS`; the gateway's HTTP port serves it to admin keys only). Fleet-wide gauges are the
gateway's, recomputed from NATS on a timer, never by a scrape (`services/gateway/background/fleet_gauges.py`).
"""

import logging
from functools import partial
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

log = logging.getLogger(__name__)

# Each family is made outside the default registry: `register` adds it where it is owned.
_counter = partial(Counter, registry=None)
_gauge = partial(Gauge, registry=None)
_histogram = partial(Histogram, registry=None)

HTTP_REQUESTS = _counter("sheshnag_http_requests", "HTTP requests served by the gateway.",
                         ["method", "route", "status"])
HTTP_LATENCY = _histogram("sheshnag_http_request_duration_seconds", "Gateway request latency.", ["method", "route"])

VALIDATED_LINES = _counter("sheshnag_validator_lines", "Input lines checked by the validator.", ["outcome"])

SLOTS_BUSY = _gauge("sheshnag_executor_slots_busy", "Engine slots running a line now.", ["model"])
SLOT_WAIT = _histogram("sheshnag_executor_slot_wait_seconds", "Time a line waited for a free engine slot.")
EXECUTED_LINES = _counter("sheshnag_executor_lines", "Lines run by the executor, by HTTP status class.",
                          ["model", "outcome"])
COMPLETION_TOKENS = _counter("sheshnag_executor_completion_tokens", "Completion tokens generated.", ["model"])
ENGINE_ERRORS = _counter("sheshnag_executor_engine_errors", "Engine calls that raised or answered 5xx.", ["model"])

SCHEDULER_LEADER = _gauge("sheshnag_scheduler_leader", "1 while this scheduler leads, 0 while it stands by.")
SCHEDULER_BATCHES = _gauge("sheshnag_scheduler_batches",
                           "Unfinished batches as the leading scheduler's book sees them, by state (validating, "
                           "queued, held, running); a standby exports none.", ["state"])
SCHEDULER_ASSIGNMENTS = _counter("sheshnag_scheduler_assignments",
                                 "Units of batches assigned to an executor: a unit's first attempt, or a retry.",
                                 ["kind"])
SCHEDULER_FENCED = _counter("sheshnag_scheduler_attempts_fenced",
                            "Attempts whose lease the scheduler revoked, by code (executor_lost: its lease expired "
                            "with its executor's heartbeats; executor_restarted, placement_withdrawn, the batch's "
                            "end).", ["code"])
SCHEDULER_EXECUTORS_LOST = _counter("sheshnag_scheduler_executors_lost",
                                    "Executors declared lost after their heartbeats stopped.")
SCHEDULER_REGISTRATIONS = _counter("sheshnag_scheduler_registrations",
                                   "Executor registrations answered, by outcome (admitted, refused, retry).",
                                   ["outcome"])

CONSUMER_PENDING = _gauge("sheshnag_consumer_pending_messages",
                          "Messages not yet delivered to a durable consumer, as seen by its own process.", ["durable"])
FOLDED_EVENTS = _counter("sheshnag_ledger_folded_events", "Events folded by the ledger.")
FOLD_LAG = _gauge("sheshnag_ledger_fold_lag_events", "Stream sequence seen by the ledger minus sequence folded.")

BATCHES = _gauge("sheshnag_batches", "Batches in the read model, by status.", ["status"])
QUEUE_DEPTH = _gauge("sheshnag_queue_depth_batches",
                     "Validated batches waiting for an executor, by model (held batches are not).", ["model"])
QUEUE_AGE = _gauge("sheshnag_queue_oldest_age_seconds",
                   "Age of the oldest validated batch waiting for an executor, by model (held batches are not).",
                   ["model"])
HELD = _gauge("sheshnag_held_batches", "Validated batches held by their owner (hold: true) until released, by model.",
              ["model"])
CONSUMER_LAG = _gauge("sheshnag_jetstream_consumer_lag_messages",
                      "Messages a durable consumer has yet to receive (num_pending).", ["stream", "durable"])
CONSUMER_UNACKED = _gauge("sheshnag_jetstream_consumer_ack_pending_messages",
                          "Messages delivered to a durable consumer and not yet acknowledged.", ["stream", "durable"])
EXECUTORS = _gauge("sheshnag_executors", "Live executors (fresh adverts in the fleet bucket).")
STORAGE_FREE = _gauge("sheshnag_storage_free_bytes", "Free space on a watched volume (broker, object store).",
                      ["volume"])
STORAGE_TOTAL = _gauge("sheshnag_storage_total_bytes", "Size of a watched volume.", ["volume"])
STORAGE_RESERVE = _gauge("sheshnag_storage_reserve_bytes",
                         "Free space a watched volume keeps in reserve: below it new uploads and batches get 507.",
                         ["volume"])
STORAGE_LEVEL = _gauge("sheshnag_storage_level",
                       "A watched volume's level: 0 ok, 1 warning (under twice its reserve), 2 refusing new work "
                       "(under its reserve).", ["volume"])
WEBHOOK_ATTEMPTS = _counter("sheshnag_webhook_attempts", "Webhook delivery attempts made by this gateway.",
                            ["outcome"])


FAMILIES: dict[str, tuple[MetricWrapperBase, ...]] = {
    "gateway": (HTTP_REQUESTS, HTTP_LATENCY, BATCHES, QUEUE_DEPTH, QUEUE_AGE, HELD, CONSUMER_LAG, CONSUMER_UNACKED,
                CONSUMER_PENDING, EXECUTORS, WEBHOOK_ATTEMPTS, STORAGE_FREE, STORAGE_TOTAL, STORAGE_RESERVE,
                STORAGE_LEVEL),
    "validator": (VALIDATED_LINES, CONSUMER_PENDING),
    "scheduler": (SCHEDULER_LEADER, SCHEDULER_BATCHES, SCHEDULER_ASSIGNMENTS, SCHEDULER_FENCED,
                  SCHEDULER_EXECUTORS_LOST, SCHEDULER_REGISTRATIONS, CONSUMER_PENDING),
    "executor": (SLOTS_BUSY, SLOT_WAIT, EXECUTED_LINES, COMPLETION_TOKENS, ENGINE_ERRORS, CONSUMER_PENDING),
    "ledger": (FOLDED_EVENTS, FOLD_LAG, CONSUMER_PENDING),
}
"""The families each service owns (a process running several, as some tests do, exports all of theirs)."""
_registered: set[int] = set()


def register(service: str) -> None:
    """Export `service`'s families from this process (once each, however often it is asked)."""
    for family in FAMILIES[service]:
        if id(family) not in _registered:
            REGISTRY.register(family)
            _registered.add(id(family))


def serve_metrics(port: int, address: str = "127.0.0.1") -> WSGIServer | None:
    """Serve this process's registry on `address`:`port` (0: not served); the server, to shut down, if it binds."""
    if port <= 0:
        return None
    try:
        server, _ = start_http_server(port, addr=address)
    except OSError as error:
        # Metrics are not worth a crash loop: the service runs on without them.
        log.warning("metrics not served on %s port %d: %r (two services on one host need a port each: "
                    "SHESHNAG_<SERVICE>_METRICS_PORT)", address, port, error)
        return None
    log.info("metrics on http://%s:%d/metrics", address, port)
    return server
