"""Every Prometheus metric Sheshnag exposes, in one registry per process, and the per-service `/metrics` server.

Each process counts what it does (requests, lines validated, lines run, tokens, folds). Fleet-wide gauges
(batches per status, the validated queue, consumer lag) are computed from NATS when the gateway is scraped
(`services/runtime/overview.py`). Services other than the gateway serve `/metrics` on `SHESHNAG_METRICS_PORT`
when it is set (`sheshnag up` gives each its own port from that base, in SERVICES order).
"""

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

HTTP_REQUESTS = Counter("sheshnag_http_requests", "HTTP requests served by the gateway.",
                        ["method", "route", "status"])
HTTP_LATENCY = Histogram("sheshnag_http_request_duration_seconds", "Gateway request latency.", ["method", "route"])

VALIDATED_LINES = Counter("sheshnag_validator_lines", "Input lines checked by the validator.", ["outcome"])

SLOTS_BUSY = Gauge("sheshnag_executor_slots_busy", "Engine slots running a line now.", ["model"])
SLOT_WAIT = Histogram("sheshnag_executor_slot_wait_seconds", "Time a line waited for a free engine slot.")
EXECUTED_LINES = Counter("sheshnag_executor_lines", "Lines run by the executor, by HTTP status class.",
                         ["model", "outcome"])
COMPLETION_TOKENS = Counter("sheshnag_executor_completion_tokens", "Completion tokens generated.", ["model"])
ENGINE_ERRORS = Counter("sheshnag_executor_engine_errors", "Engine calls that raised or answered 5xx.", ["model"])

CONSUMER_PENDING = Gauge("sheshnag_consumer_pending_messages",
                         "Messages not yet delivered to a durable consumer, as seen by its own process.",
                         ["durable"])
FOLDED_EVENTS = Counter("sheshnag_ledger_folded_events", "Events folded by the ledger.")
FOLD_LAG = Gauge("sheshnag_ledger_fold_lag_events", "Stream sequence seen by the ledger minus sequence folded.")

BATCHES = Gauge("sheshnag_batches", "Batches in the read model, by status.", ["status"])
QUEUE_DEPTH = Gauge("sheshnag_queue_depth_batches", "Validated batches waiting for an executor, by model.",
                    ["model"])
QUEUE_AGE = Gauge("sheshnag_queue_oldest_age_seconds", "Age of the oldest validated batch waiting, by model.",
                  ["model"])
CONSUMER_LAG = Gauge("sheshnag_jetstream_consumer_lag_messages",
                     "Messages a durable consumer has yet to receive (num_pending).", ["stream", "durable"])
CONSUMER_UNACKED = Gauge("sheshnag_jetstream_consumer_ack_pending_messages",
                         "Messages delivered to a durable consumer and not yet acknowledged.", ["stream", "durable"])
EXECUTORS = Gauge("sheshnag_executors", "Live executors (fresh adverts in the fleet bucket).")


def serve_metrics(port: int) -> None:
    """Serve this process's registry on `port` (0: not served)."""
    if port <= 0:
        return
    try:
        start_http_server(port, addr="127.0.0.1")
    except OSError as error:
        # Metrics are not worth a crash loop: the service runs on without them.
        log.warning("metrics not served on port %d: %r", port, error)
        return
    log.info("metrics on http://127.0.0.1:%d/metrics", port)
