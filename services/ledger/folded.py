"""The base of the ledger's aggregates: the last stream sequence applied and the anomalies seen (every fact is applied
once; one that does not fit is kept as an anomaly), and the ids aggregates have by kind and public id."""

import logging
from collections.abc import Collection
from copy import deepcopy
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

log = logging.getLogger(__name__)

TOPIC_MODULE = "services.ledger.domainmodel"
"""Stored event topics name this module, where every aggregate once lived; keep it, or let `register_stable_topics`
map it after a move."""
_ID_NAMESPACE = uuid5(NAMESPACE_URL, "https://sheshnag.dev/ledger")


def upcast_defaults(**added: Any) -> "staticmethod[[dict[str, Any]], None]":
    """The upcaster of a class version that added these attributes: older state takes these defaults (a copy each)."""

    def upcast(state: dict[str, Any]) -> None:
        for name, default in added.items():
            if name not in state:
                state[name] = deepcopy(default)

    return staticmethod(upcast)


@lru_cache(maxsize=1 << 16)  # a fold names the same few aggregates fact after fact; uuid5 is a SHA-1 each time
def aggregate_id(kind: str, ident: str) -> UUID:
    return uuid5(_ID_NAMESPACE, f"{kind}:{ident}")


class Folded(Aggregate):
    """Base of the ledger's aggregates: the last stream sequence applied, and the anomalies seen."""

    if TYPE_CHECKING:  # set by each subclass's creation event; annotations here would become init fields
        last_sequence: int
        anomalies: list[dict[str, Any]]

    def has_folded(self, sequence: int) -> bool:
        return sequence <= self.last_sequence

    def refuses(self, sequence: int, fact: str, state: str, allowed: Collection[str]) -> bool:
        """True when this fact must not change the aggregate: seen before, or illegal in `state`."""
        if self.has_folded(sequence):
            return True
        if state not in allowed:
            self.note_anomaly(sequence, fact, f"{fact} is not allowed while {state}")
            return True
        return False

    def note_anomaly(self, sequence: int, fact: str, reason: str) -> None:
        if self.has_folded(sequence):
            return
        log.warning("anomaly on %s at sequence %d: %s", self.id, sequence, reason)
        self._anomaly_noted(sequence=sequence, fact=fact, reason=reason)

    @event("AnomalyNoted")
    def _anomaly_noted(self, sequence: int, fact: str, reason: str) -> None:
        self.last_sequence = sequence
        self.anomalies.append({"sequence": sequence, "fact": fact, "reason": reason})
