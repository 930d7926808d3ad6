"""Thin handlers: a created batch in, line errors and a verdict out."""

import logging
from dataclasses import dataclass

from nats.aio.msg import Msg

from contracts.catalogue import Catalogue
from contracts.events.batch import BatchCreated, BatchFailed, BatchValidated, BatchValidationFailed, LineRejected
from contracts.events.registry import decode_event
from services.runtime.bus import EventBus, PoisonMessage
from services.runtime.objectstore import ObjectNotFound, ObjectStore
from services.validator.domain import FileValidation, Limits
from services.validator.rules import LineIssue

log = logging.getLogger(__name__)


@dataclass
class Validator:
    bus: EventBus
    store: ObjectStore
    catalogue: Catalogue
    limits: Limits
    max_published_errors: int

    async def on_message(self, message: Msg) -> None:
        event = decode_event(message.data)
        if not isinstance(event, BatchCreated):
            raise PoisonMessage(f"validator got {event.type}")
        await self.validate(event)

    async def on_poison(self, message: Msg, error: BaseException) -> None:
        event = decode_event(message.data)
        await self.bus.publish(BatchFailed(aggregate_id=event.aggregate_id, code="validation_error",
                                           reason=f"The input file could not be validated: {error}",
                                           causation_id=event.event_id))

    async def validate(self, created: BatchCreated) -> None:
        validation = FileValidation(created.endpoint, self.catalogue, self.limits)
        published = 0

        async def report(line: int | None, issue: LineIssue) -> None:
            nonlocal published
            if published < self.max_published_errors:
                await self.bus.publish(LineRejected(
                    aggregate_id=created.aggregate_id, line=line, code=issue.code, param=issue.param,
                    message=issue.message, causation_id=created.event_id,
                    correlation_id=created.aggregate_id))
                published += 1

        line_no = 0
        try:
            async for raw in self.store.iter_lines(created.input_object_key):
                line_no += 1
                for issue in validation.feed(line_no, raw):
                    await report(line_no, issue)
        except ObjectNotFound as error:
            raise PoisonMessage(f"input file {created.input_file_id} is missing from the object store") \
                from error
        for issue in validation.finish():
            await report(None, issue)
        log.info("batch %s: %d lines, %d errors", created.aggregate_id, validation.total_lines,
                 validation.error_count)
        await self.bus.publish(self._verdict(created, validation))

    @staticmethod
    def _verdict(created: BatchCreated, validation: FileValidation) -> BatchValidated | BatchValidationFailed:
        common = {"aggregate_id": created.aggregate_id, "causation_id": created.event_id,
                  "correlation_id": created.aggregate_id, "total_lines": validation.total_lines}
        if validation.passed and validation.model_id is not None:
            return BatchValidated(**common, model=validation.model_id, owner_key_id=created.owner_key_id,
                                  endpoint=created.endpoint, input_object_key=created.input_object_key)
        return BatchValidationFailed(**common, error_count=validation.error_count,
                                     counts_by_code=validation.counts_by_code)
