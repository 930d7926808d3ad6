"""Structured log records: JSON lines carrying the batch and the trace they belong to."""

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime

from services.runtime.process.telemetry import current_ids

BATCH_ID: ContextVar[str] = ContextVar("sheshnag_batch_id", default="")
"""The batch the current task works on; set where a message or request names one."""


class TraceFields(logging.Filter):
    """Stamps each record with `batch_id`, `trace_id` and `span_id` from the current context."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id, record.span_id = current_ids()
        record.batch_id = BATCH_ID.get()
        return True


def iso_utc(seconds: float) -> str:
    """`2026-12-03T14:48:46.123Z`: ISO-8601 in UTC, to the millisecond (what log stores parse without a hint)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": iso_utc(record.created), "level": record.levelname, "service": self.service,
            "logger": record.name, "message": record.getMessage(),
        }
        ids = {name: getattr(record, name, "") for name in ("batch_id", "trace_id", "span_id")}
        entry |= {name: value for name, value in ids.items() if value}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
