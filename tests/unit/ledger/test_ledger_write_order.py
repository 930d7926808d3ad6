"""The read model takes one fold's records in an order no reader can catch half-way: a file (or a user, a
provider, an organisation) is stored before the batch (or key, executor) that names it."""

import asyncio
from types import SimpleNamespace
from typing import Any, TypeVar

from nats.errors import MaxPayloadError
from pydantic import BaseModel

from contracts.readmodel import BatchRecord, FileRecord, UserRecord
from services.ledger.handlers import read_model_sink
from services.ledger.projection import Projection

R = TypeVar("R", bound=BaseModel)


class SlowReadModel:
    """The read model's `put`, a file's taking a while: each noted when it starts and when it is stored."""

    def __init__(self) -> None:
        self.said: list[str] = []

    async def put(self, key: str, value: BaseModel) -> None:
        self.said.append(f"start {key}")
        await asyncio.sleep(0.05 if key.startswith("file.") else 0.0)
        self.said.append(f"stored {key}")


def constructed(record: type[R], **fields: Any) -> R:
    """A record with only the fields its read-model key is made of."""
    return record.model_construct(**fields)


def batch(batch_id: str, output_file_id: str) -> BatchRecord:
    return constructed(BatchRecord, batch=SimpleNamespace(id=batch_id, output_file_id=output_file_id))


def file(file_id: str) -> FileRecord:
    return constructed(FileRecord, file=SimpleNamespace(id=file_id))


async def test_a_batch_is_stored_only_once_the_files_it_names_are() -> None:
    read_model = SlowReadModel()
    folded: list[Projection] = [batch("batch_a", "file-out"), constructed(UserRecord, user_id="user_a"),
                                file("file-out"), file("file-err")]
    await read_model_sink(read_model)(folded)  # type: ignore[arg-type]
    said = read_model.said
    batch_starts = said.index("start batch.batch_a")
    assert said.index("stored file.file-out") < batch_starts and said.index("stored file.file-err") < batch_starts
    assert said.index("stored user.user_a") < batch_starts
    assert said[-1] == "stored batch.batch_a"


async def test_a_fold_of_only_batches_is_stored_all_at_once() -> None:
    read_model = SlowReadModel()
    await read_model_sink(read_model)([batch("batch_a", "f1"), batch("batch_b", "f2")])  # type: ignore[arg-type]
    assert read_model.said[:2] == ["start batch.batch_a", "start batch.batch_b"]


class BoundedReadModel(SlowReadModel):
    """The broker's limit on a message: a record past it is never taken, however often it is put."""

    async def put(self, key: str, value: BaseModel) -> None:
        if key == "batch.batch_huge":
            raise MaxPayloadError
        await super().put(key, value)


async def test_a_record_too_large_for_the_broker_is_left_out_and_the_others_are_stored() -> None:
    read_model = BoundedReadModel()
    await read_model_sink(read_model)([batch("batch_huge", "f1"), batch("batch_b", "f2")])  # type: ignore[arg-type]
    assert "stored batch.batch_b" in read_model.said  # and the fold goes on: no error, so no retry for ever
