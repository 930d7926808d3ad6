"""Every Prometheus metric Sheshnag exposes, each family registered only in the processes that own it, and the
per-service `/metrics` server.

Each process counts what it does (requests, lines validated, assignments, lines run, tokens, folds) and exports only
its own families (`register(service)` at its composition root): a validator never exports the executor's counters
at 0.
Fleet-wide gauges (batches per status, the validated queue, consumer lag, live executors) are the gateway's,
recomputed from NATS on a timer, never by a scrape (`services/gateway/background/fleet_gauges.py`). Every service serves
`/metrics` without a key on its own `SHESHNAG_<SERVICE>_METRICS_PORT`, else `SHESHNAG_METRICS_PORT`, when set, at
`SHESHNAG_METRICS_ADDRESS` (`sheshnag up` gives each its own port from that base, in SERVICES order); the gateway's
HTTP port serves it to admin keys only.
"""

import logging
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

log = logging.getLogger(__name__)

OWNED = None
"""Each family is made outside the default registry (`registry=OWNED`); `register` adds it where it is owned."""

HTTP_REQUESTS = Counter("sheshnag_http_requests", "HTTP requests served by the gateway.",
                        ["method", "route", "status"], registry=OWNED)
HTTP_LATENCY = Histogram("sheshnag_http_request_duration_seconds", "Gateway request latency.", ["method", "route"],
                         registry=OWNED)

VALIDATED_LINES = Counter("sheshnag_validator_lines", "Input lines checked by the validator.", ["outcome"],
                          registry=OWNED)

SLOTS_BUSY = Gauge("sheshnag_executor_slots_busy", "Engine slots running a line now.", ["model"], registry=OWNED)
SLOT_WAIT = Histogram("sheshnag_executor_slot_wait_seconds", "Time a line waited for a free engine slot.",
                      registry=OWNED)
EXECUTED_LINES = Counter("sheshnag_executor_lines", "Lines run by the executor, by HTTP status class.",
                         ["model", "outcome"], registry=OWNED)
COMPLETION_TOKENS = Counter("sheshnag_executor_completion_tokens", "Completion tokens generated.", ["model"],
                            registry=OWNED)
ENGINE_ERRORS = Counter("sheshnag_executor_engine_errors", "Engine calls that raised or answered 5xx.", ["model"],
                        registry=OWNED)

SCHEDULER_LEADER = Gauge("sheshnag_scheduler_leader", "1 while this scheduler leads, 0 while it stands by.",
                         registry=OWNED)
SCHEDULER_BATCHES = Gauge("sheshnag_scheduler_batches",
                          "Unfinished batches as the leading scheduler's book sees them, by state (validating, "
                          "queued, held, running); a standby exports none.", ["state"], registry=OWNED)
SCHEDULER_ASSIGNMENTS = Counter("sheshnag_scheduler_assignments",
                                "Units of batches assigned to an executor: a unit's first attempt, or a retry.",
                                ["kind"], registry=OWNED)
SCHEDULER_FENCED = Counter("sheshnag_scheduler_attempts_fenced",
                           "Attempts whose lease the scheduler revoked, by code (executor_lost: its lease expired "
                           "with its executor's heartbeats; executor_restarted, placement_withdrawn, the batch's "
                           "end).", ["code"], registry=OWNED)
SCHEDULER_EXECUTORS_LOST = Counter("sheshnag_scheduler_executors_lost",
                                   "Executors declared lost after their heartbeats stopped.", registry=OWNED)
SCHEDULER_REGISTRATIONS = Counter("sheshnag_scheduler_registrations",
                                  "Executor registrations answered, by outcome (admitted, refused, retry).",
                                  ["outcome"], registry=OWNED)

CONSUMER_PENDING = Gauge("sheshnag_consumer_pending_messages",
                         "Messages not yet delivered to a durable consumer, as seen by its own process.",
                         ["durable"], registry=OWNED)
FOLDED_EVENTS = Counter("sheshnag_ledger_folded_events", "Events folded by the ledger.", registry=OWNED)
FOLD_LAG = Gauge("sheshnag_ledger_fold_lag_events", "Stream sequence seen by the ledger minus sequence folded.",
                 registry=OWNED)

BATCHES = Gauge("sheshnag_batches", "Batches in the read model, by status.", ["status"], registry=OWNED)
QUEUE_DEPTH = Gauge("sheshnag_queue_depth_batches",
                    "Validated batches waiting for an executor, by model (held batches are not).", ["model"],
                    registry=OWNED)
QUEUE_AGE = Gauge("sheshnag_queue_oldest_age_seconds",
                  "Age of the oldest validated batch waiting for an executor, by model (held batches are not).",
                  ["model"], registry=OWNED)
HELD = Gauge("sheshnag_held_batches", "Validated batches held by their owner (hold: true) until released, by model.",
             ["model"], registry=OWNED)
CONSUMER_LAG = Gauge("sheshnag_jetstream_consumer_lag_messages",
                     "Messages a durable consumer has yet to receive (num_pending).", ["stream", "durable"],
                     registry=OWNED)
CONSUMER_UNACKED = Gauge("sheshnag_jetstream_consumer_ack_pending_messages",
                         "Messages delivered to a durable consumer and not yet acknowledged.", ["stream", "durable"],
                         registry=OWNED)
EXECUTORS = Gauge("sheshnag_executors", "Live executors (fresh adverts in the fleet bucket).", registry=OWNED)
STORAGE_FREE = Gauge("sheshnag_storage_free_bytes", "Free space on a watched volume (broker, object store).",
                     ["volume"], registry=OWNED)
STORAGE_TOTAL = Gauge("sheshnag_storage_total_bytes", "Size of a watched volume.", ["volume"], registry=OWNED)
STORAGE_RESERVE = Gauge("sheshnag_storage_reserve_bytes",
                        "Free space a watched volume keeps in reserve: below it new uploads and batches get 507.",
                        ["volume"], registry=OWNED)
STORAGE_LEVEL = Gauge("sheshnag_storage_level",
                      "A watched volume's level: 0 ok, 1 warning (under twice its reserve), 2 refusing new work "
                      "(under its reserve).", ["volume"], registry=OWNED)
WEBHOOK_ATTEMPTS = Counter("sheshnag_webhook_attempts", "Webhook delivery attempts made by this gateway.",
                           ["outcome"], registry=OWNED)


FAMILIES: dict[str, tuple[MetricWrapperBase, ...]] = {
    "gateway": (HTTP_REQUESTS, HTTP_LATENCY, BATCHES, QUEUE_DEPTH, QUEUE_AGE, HELD, CONSUMER_LAG, CONSUMER_UNACKED,
                EXECUTORS, WEBHOOK_ATTEMPTS, STORAGE_FREE, STORAGE_TOTAL, STORAGE_RESERVE, STORAGE_LEVEL),
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
