"""Thin handlers: executors' requests in, the leading scheduler's answers out, judged on its term's book. The table
(`scheduler_router`): the book's fold, four answers subscribed for a leader's term alone (a standby's executors get
"no responders" at once), the auth callout and the relays of executors' JetStream requests every scheduler answers,
and the facts the scheduler publishes."""

from dataclasses import replace
from typing import Annotated, Any

from contracts.commands import AdvertReceipt, AdvertUpdate, ExecutorRegistration, RegistrationAnswer
from contracts.events.batch import (
    AttemptFailed,
    BatchAssigned,
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchExpired,
    BatchFailed,
    BatchFinalizing,
    BatchWaiting,
)
from contracts.events.executor import ExecutorLost, ExecutorRegistered
from contracts.events.file import FileStored
from contracts.fact_desk import FactReceipt, FactSubmission, LogPage, LogRead
from contracts.objects import ObjectGrant, ObjectRequest
from contracts.permissions import asker_inbox
from services.authz.callout import CALLOUT, ExecutorAuthority
from services.authz.relay import ACKS, ADMISSIONS, ADVERTS, PULLS, admission_terms, relay_ack, relay_pull, write_advert
from services.runtime.nats.delivery import Answer, LogFollower, ServiceRouter
from services.runtime.nats.follower import Fact
from services.runtime.process.params import Context, Path
from services.scheduler.book import book_facts
from services.scheduler.desk import READS, SUBMISSIONS
from services.scheduler.objects import OBJECT_REQUESTS
from services.scheduler.observe import note_registration
from services.scheduler.registration import REGISTRATIONS
from services.scheduler.term import Term


async def fold_into_book(term: Term, facts: list[Fact], head_seen: int) -> None:
    term.fold(facts)


BOOK = LogFollower("scheduler", book_facts(), "Each leader's book: every batch's plan and the fleet, folded from "
                                              "the whole log at the start of its term, then live.",
                   take=fold_into_book, caught_up=lambda term: term.caught_up.set(), leader_only=True)


async def register(request: ExecutorRegistration, connected_as: Annotated[str, Path()],
                   term: Annotated[Term, Context()]) -> RegistrationAnswer:
    return note_registration(await term.registrar.answer(connected_as, request))


async def grant_objects(request: ObjectRequest, executor_id: Annotated[str, Path()],
                        term: Annotated[Term, Context()]) -> ObjectGrant:
    return await term.objects.answer(executor_id, request)


async def take_fact(submission: FactSubmission, executor_id: Annotated[str, Path()],
                    term: Annotated[Term, Context()]) -> FactReceipt:
    return await term.desk.submit(executor_id, submission)


async def show_log(request: LogRead, executor_id: Annotated[str, Path()],
                   term: Annotated[Term, Context()]) -> LogPage:
    return await term.desk.read(executor_id, request)


async def take_advert(update: AdvertUpdate, executor_id: Annotated[str, Path()],
                      term: Annotated[Term, Context()]) -> AdvertReceipt:
    registered = executor_id in term.book.known_executors if term.caught_up.is_set() else None
    return await write_advert(update, executor_id, term.fleet, registered)


def scheduler_router(callout: bool = True) -> ServiceRouter:
    """The scheduler's table; with `callout`, the broker's auth callout on the `ExecutorAuthority` dependencies.
    (A fresh router each call: faststream lets a router belong to one broker only.)"""
    router = ServiceRouter("scheduler", dependencies="authority")
    router.follows(BOOK)

    def executors(answer: Answer[Any]) -> Answer[Any]:
        """With admissions, executors' answers go to the asking executor's inbox alone: a request may name any reply
        subject, and the answer is published with the scheduler's own rights (on a stream's subject, a KV key)."""
        return replace(answer, reply_prefix=asker_inbox) if callout else answer

    if callout:
        router.answers(CALLOUT, ExecutorAuthority.on_request, "Tell the broker who a connecting executor is.")
    router.answers(PULLS, relay_pull, "Relay an executor's pull on its own durable, answered to its own inbox.")
    router.answers(ACKS, relay_ack, "Relay an executor's ack of its own durable's message.")
    router.answers(executors(ADVERTS), take_advert, "Write an executor's advert under its own key.")
    router.answers(executors(ADMISSIONS), admission_terms, "Say how long an executor's admission lasts.")
    router.answers(executors(REGISTRATIONS), register, "Admit an executor with a live worker key to the fleet.")
    router.answers(executors(OBJECT_REQUESTS), grant_objects,
                   "Presign a URL for an object of the asking executor's own work (or list its result chunks).")
    router.answers(executors(SUBMISSIONS), take_fact,
                   "Store a fact the asking executor may state (its attempt's, or its finalized batch's end).")
    router.answers(executors(READS), show_log, "A page of the execution facts of a batch the asking executor holds.")
    router.emits(ExecutorRegistered, BatchAssigned, BatchWaiting, AttemptFailed, ExecutorLost,
                 BatchCancelRequested,  # a revoked key's batch (`StopRevoked`)
                 # the control plane's own finalize (`closer`): the files of a batch no executor can end, and its end
                 BatchFinalizing, FileStored, BatchCompleted, BatchCancelled, BatchExpired, BatchFailed)
    return router
