"""Structured log records: JSON lines carrying the batch and the trace they belong to."""

import json
import logging
from contextvars import ContextVar

from services.runtime.telemetry import current_ids

BATCH_ID: ContextVar[str] = ContextVar("sheshnag_batch_id", default="")
"""The batch the current task works on; set where a message or request names one."""


class TraceFields(logging.Filter):
    """Stamps each record with `batch_id`, `trace_id` and `span_id` from the current context."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id, record.span_id = current_ids()
        record.batch_id = BATCH_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record), "level": record.levelname, "service": self.service,
            "logger": record.name, "message": record.getMessage(),
        }
        for field in ("batch_id", "trace_id", "span_id"):
            value = getattr(record, field, "")
            if value:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
