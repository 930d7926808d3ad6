"""Core request/reply answers: of one contract (`Answer`), or of none (`RawAnswer`); and the middleware that runs each
request in the requester's trace and answers a malformed one with its refusal."""

import logging
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from faststream import BaseMiddleware, ContextRepo
from faststream.message import StreamMessage
from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind, Tracer
from pydantic import BaseModel, ValidationError

from services.runtime.process.skip_log import SkipLog
from services.runtime.process.telemetry import extract_context

log = logging.getLogger(__name__)
_MALFORMED = SkipLog(log, "refused")
"""Requests that are not their answer's contract: logged at most once a minute per subject (an executor's)."""
_MISDIRECTED = SkipLog(log, "not answered")
"""Requests whose reply subject is not the asker's inbox: logged at most once a minute per subject."""

Request = TypeVar("Request", bound=BaseModel)


class Refused(Exception):
    """A request that is not its answer's contract: `reply` (the answer's refusal) goes back instead."""

    def __init__(self, reply: BaseModel) -> None:
        super().__init__(reply)
        self.reply = reply


@dataclass(frozen=True)
class Answer(Generic[Request]):
    """A core request/reply subscription: requests of one contract on `subject`, each answered by its handler's
    returned model. Core NATS, not JetStream: with nobody subscribed, a request fails at once ("no responders")."""

    subject: str
    """May name path parameters (`svc.facts.{executor_id}`: a handler takes `executor_id` as a `Path()`)."""
    request: type[Request]
    refuse: Callable[[str], BaseModel]
    """The reply to a request that is not a `request`, given why (a malformed request is answered, never dropped)."""
    leader_only: bool = True
    """Subscribed only during a leadership term (`ServiceRouter.leading`); else whenever the broker runs."""
    queue: str = ""
    """Queue group: with several processes subscribed, one of them takes each request ("": every one does)."""
    reply_prefix: Callable[[str], str] | None = None
    """The request's subject → the only prefix its reply subject may have (the asker's own inbox). A request naming
    any other reply subject (or none) is not handled and not answered: the answer is published with this service's
    rights, so an asker could otherwise have it written on any subject (a stream's, a KV key's: the leader lease).
    None: answered wherever asked (the service's own clients only)."""

    def decode(self, data: bytes) -> Request:
        """The request, or `Refused` with the answer's refusal."""
        try:
            return self.request.model_validate_json(data)
        except ValidationError as error:
            raise Refused(self.refuse(error.errors()[0]["msg"])) from error

    async def decoder(self, message: StreamMessage[Any]) -> BaseModel:
        """faststream's decoder for the answer's requests: the request model itself, or `Refused` (unanswered when
        its reply subject is not the asker's, see `reply_prefix`)."""
        if self.reply_prefix is not None:
            asked_on = typing.cast(Msg, message.raw_message).subject
            if not (message.reply_to or "").startswith(self.reply_prefix(asked_on)):
                _MISDIRECTED.skipped(asked_on, f"a request whose reply goes to {message.reply_to[:120]!r}")
                message.reply_to = ""  # faststream publishes the handler's answer on it: nowhere
                raise Refused(self.refuse("the reply subject is not the asker's inbox"))
        return self.decode(message.body)


@dataclass(frozen=True)
class RawAnswer:
    """A core request/reply subscription for requests of no contract (the auth callout's sealed JWTs), each handed as
    its nats-py message to a handler that replies itself or not at all (a forged request). Subscribed whenever the
    broker runs, in `queue` ("": every process takes each). `traced`: a span each (not for frequent notices)."""

    subject: str
    queue: str
    traced: bool = True


RawHandler = Callable[[Any, Msg], Awaitable[None]]
"""A raw answer's handler: (the service's dependencies, the request as nats-py received it)."""


class Answering(BaseMiddleware):
    """One request, from its arrival to its answer: handled in a span continuing the requester's trace (what the
    handler publishes joins it); a request that is not its contract answered with its refusal."""

    def __init__(self, msg: Any, /, *, context: ContextRepo, tracer: Tracer | None) -> None:
        super().__init__(msg, context=context)
        self.tracer = tracer
        """None: no span (an untraced raw answer's notices)."""

    async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: StreamMessage[Any]) -> Any:
        if self.tracer is None:
            return await call_next(msg)
        subscriber = self.context.get_local("handler_")
        pattern = getattr(subscriber, "subject", "")  # span names stay few: the declared subject, ids in attributes
        with self.tracer.start_as_current_span(
                f"answer {pattern}", context=extract_context(msg.headers), kind=SpanKind.SERVER,
                attributes={"messaging.destination.name": typing.cast(Msg, msg.raw_message).subject}):
            try:
                return await call_next(msg)
            except Refused as refused:
                _MALFORMED.skipped(typing.cast(Msg, msg.raw_message).subject, "a malformed request")
                return refused.reply
