"""Validator settings (`SHESHNAG_VALIDATOR_*`)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from contracts.api.request_line import MAX_LINE_BYTES
from services.runtime.process.settings import ServiceSettings


class ValidatorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_VALIDATOR_", extra="ignore")

    max_lines: int = 50_000
    """Requests one file may hold (`too_many_tasks` past it)."""
    max_embedding_inputs: int = 50_000
    """Embedding inputs one file may hold, all lines together (`too_many_tasks` past it)."""
    max_line_bytes: int = Field(default=MAX_LINE_BYTES, ge=1, le=MAX_LINE_BYTES)
    """The longest line, in bytes (`invalid_json_line` past it). At most the default: the gateway counts no worst
    case for a longer line."""
    inherit_line_model: bool = False
    """A line without body.model runs on the model an earlier line named (Reliquary's files). Off (OpenAI's rule):
    each line names its model unless the batch names one for all (metadata.model, or the upload's x-litellm-model
    header or ?model=), which is always honoured."""
    max_published_per_code: int = 100
    """Line errors of each code published as events; the rest are only counted."""
    validations_at_once: int = Field(default=2, ge=1, le=16)
    """Files checked at once, one per owner at most (owners take turns): another owner's batch starts beside a long
    one rather than after it."""
    count_tokens: bool = True
    """Check each prompt against the model's context with the model's own tokenizer."""
    check_processes: int = 0
    """Worker processes that check a file's lines beside the validator itself (each ~60 MB with its tokenizers);
    0 (the default): the validator checks every line itself; -1: one fewer than the machine's cores. Off by default
    for now: with one on, the 3-node NATS cluster e2e lost its stream leaders after a node's SIGKILL in about half of
    its runs on 2 cores (cause not found yet)."""

    def worker_processes(self, cores: int | None) -> int:
        return max((cores or 1) - 1, 0) if self.check_processes < 0 else self.check_processes
