"""Commands sent to one executor on the WORK stream (not facts: they are consumed and gone)."""

from pydantic import BaseModel, ConfigDict


class RunBatch(BaseModel):
    """Run every line of a validated batch that no earlier attempt committed."""

    model_config = ConfigDict(frozen=True)

    batch_id: str
    executor_id: str
    attempt: int
    lease_token: str
    owner_key_id: str
    """Owner of the batch, and so of its output and error files."""
    model: str
    endpoint: str
    input_object_key: str
    total_lines: int

    @property
    def msg_id(self) -> str:
        return f"{self.batch_id}:run:{self.attempt}"
