"""A batch's terms: what it was created to do, said once (`batch.created`) and carried whole (`terms`) by what acts
on it; and the upcaster that lifts the flat fields of the first shape (version 1) into `terms`."""

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from contracts.api.batch import Endpoint


class BatchTerms(BaseModel):
    model_config = ConfigDict(frozen=True)

    owner_key_id: str
    """Owner of the batch, and so of its output and error files."""
    endpoint: Endpoint
    input_object_key: str
    created_at: int = 0
    """When the batch was created (seconds since the epoch): the anchor of `output_expires_after`. 0: a command
    from a scheduler before it said."""
    expires_at: int | None = None
    """When the batch expires (seconds since the epoch): no line starts after it. Always in `batch.created`; None:
    a command from a scheduler before it said (or a finalize command of version 1, which never did)."""
    output_expires_after_s: int | None = None
    """Output and error files expire this many seconds after `created_at`; None: the files' default."""


TERM_FIELDS = tuple(BatchTerms.model_fields)


class WithTerms(BaseModel):
    """A fact or command that carries a batch's terms; one of version 1 states each term as a field of its own."""

    model_config = ConfigDict(frozen=True)

    terms: BatchTerms

    @model_validator(mode="before")
    @classmethod
    def _lift_terms(cls, data: Any) -> Any:
        if isinstance(data, dict) and "terms" not in data:
            terms = {name: data[name] for name in TERM_FIELDS if name in data}
            data = {name: value for name, value in data.items() if name not in TERM_FIELDS} | {"terms": terms}
        return data
