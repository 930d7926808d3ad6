"""A fact the ledger refused, as the admin route `/v1/admin/anomalies` shows it (a Sheshnag extension)."""

from typing import Literal

from pydantic import BaseModel

from contracts.readmodel import AnomalyKind


class Anomaly(BaseModel):
    object: Literal["ledger.anomaly"] = "ledger.anomaly"
    sequence: int
    """Stream sequence of the fact the ledger refused."""
    aggregate_type: AnomalyKind
    aggregate_id: str
    event_type: str
    """e.g. `batch.completed`."""
    reason: str
    created_at: int
    """Seconds since the epoch: when the refused fact happened."""
