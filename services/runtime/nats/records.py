"""Read-model values decoded, a value that is no record skipped (logged at most once a minute). Only the ledger writes
the read model, yet the broker itself writes its own answers on whatever subject a request names as its reply (an
executor's JetStream request may name a read-model key), so a value may be junk: readers take it as absent, writers
as empty, and no tenant's reads nor the ledger's fold fail on it."""

import logging
from collections.abc import Iterable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from services.runtime.process.skip_log import SkipLog

log = logging.getLogger(__name__)
_SKIPPED = SkipLog(log)
"""By model (a bounded set of sources, however many keys hold junk)."""

Record = TypeVar("Record", bound=BaseModel)


def record(model: type[Record], raw: bytes | None, where: str = "") -> Record | None:
    """The value as `model`; None for no value, or one that is not such a record."""
    if not raw:
        return None
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        _SKIPPED.skipped(f"read-model {model.__name__} values", f"{where or '?'}, which is no record "
                         f"({error.errors()[0]['msg']})")
        return None


def records(model: type[Record], values: Iterable[bytes], where: str = "") -> list[Record]:
    """Those of `values` that are `model` records, in order."""
    return [found for value in values if (found := record(model, value, where)) is not None]


def keyed_records(model: type[Record], entries: Iterable[tuple[str, bytes]]) -> list[tuple[str, Record]]:
    """(key, record) of those entries whose value is a `model` record, in order."""
    return [(key, found) for key, value in entries if (found := record(model, value, key)) is not None]
