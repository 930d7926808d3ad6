"""A model as `GET /v1/models` lists it."""

from typing import Literal

from pydantic import BaseModel

MAX_MODEL_NAME = 256
"""The longest model id or alias a request may name: no catalogue model's is longer."""


class Model(BaseModel):
    id: str
    """The catalogue id; aliases resolve to it."""
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    revision: str | None = None
    """Extension: the model's revision as served here, what a batch pins with `metadata.revision`."""
    supports_tools: bool = False
    """Extension: whether chat lines may offer this model tools (its chat template reads them and it answers with
    `tool_calls`); otherwise such a line is refused with `tools_unavailable`."""
