"""What a failed write means: a full disk (the broker's, the object store's, a local file's), a broker not taking
writes, or an object store not answering; told apart from other failures, so the gateway answers 507/503 and workers
wait for space instead of giving up. Measured: JetStream over its limit answers 503 err_code 10023 at once; on a full
disk a publish times out and the stream stays stuck until the server restarts (infra/broker_watch.py); SeaweedFS
answers 500 "No writable volumes" until minio's retries give up."""

import asyncio
import errno
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

import nats.errors
import nats.js.errors
import urllib3.exceptions
from minio.error import S3Error

log = logging.getLogger(__name__)

WriteFault = Literal["storage_full", "broker_unavailable", "object_store_unavailable"]

JETSTREAM_FULL_CODES = frozenset({10002, 10023, 10047})
"""Account resources exceeded, insufficient resources, insufficient storage resources."""
JETSTREAM_OFF_CODES = frozenset({10039, 10076})
"""JetStream not enabled for the account, not enabled at all (it disabled itself on a write error)."""
FULL_WORDS = ("no space left", "insufficient storage", "insufficient resources", "no writable volumes",
              "no free volumes", "disk is full", "storage full", "storagefull")
S3_FULL_CODES = frozenset({"XMinioStorageFull", "InsufficientStorage", "XAmzStorageFull"})
BROKER_DOWN = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError,
               nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
               nats.errors.NoServersError, nats.errors.OutboundBufferLimitError)
CHAIN_DEPTH = 6
SAID_CHARS = 300
"""How much of an object store's error answer is kept (its code and message come first)."""


class ObjectStoreAnswered(OSError):
    """The object store's error answer to a request made without its client (a presigned URL): its status and the
    start of what it said, which tell a full or failing store (a fault to wait out) from a refusal."""

    def __init__(self, what: str, status: int, said: str = "") -> None:
        said = said[:SAID_CHARS]
        super().__init__(f"{what}: HTTP {status}" + (f" ({said})" if said else ""))
        self.status, self.said = status, said


def write_fault(error: BaseException) -> WriteFault | None:
    """The fault `error` (or an error it was raised from) is, or None for any other failure."""
    seen: BaseException | None = error
    for _ in range(CHAIN_DEPTH):
        if seen is None:
            return None
        fault = _fault_of(seen)
        if fault is not None:
            return fault
        seen = seen.__cause__ or seen.__context__
    return None


def _fault_of(error: BaseException) -> WriteFault | None:
    if isinstance(error, nats.js.errors.APIError):
        if error.err_code in JETSTREAM_FULL_CODES or _says_full(error.description):
            return "storage_full"
        if error.err_code in JETSTREAM_OFF_CODES or isinstance(error, nats.js.errors.ServiceUnavailableError):
            return "broker_unavailable"
        return None
    if isinstance(error, S3Error):
        return "storage_full" if error.code in S3_FULL_CODES or _says_full(error.message) else None
    if isinstance(error, urllib3.exceptions.HTTPError):
        # minio retries a 500 until urllib3 gives up: SeaweedFS's full disk comes through here, its words lost.
        return "storage_full" if _says_full(str(error)) else "object_store_unavailable"
    if isinstance(error, ObjectStoreAnswered):
        return _answered_fault(error)
    if isinstance(error, sqlite3.OperationalError):
        return "storage_full" if _says_full(str(error)) else None
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "storage_full"
    if isinstance(error, BROKER_DOWN):
        return "broker_unavailable"
    return None


def _answered_fault(answer: ObjectStoreAnswered) -> WriteFault | None:
    if answer.status == 507 or _says_full(answer.said):
        return "storage_full"
    return "object_store_unavailable" if answer.status >= 500 else None


def _says_full(text: str | None) -> bool:
    lowered = (text or "").lower()
    return any(words in lowered for words in FULL_WORDS)


Result = TypeVar("Result")
FAULT_PATIENCE_S = 900.0
"""How long a worker keeps redoing its work through a write fault before it fails the usual way (a disk that stays
full for longer is the operator's; the batch's own completion window still bounds it)."""
FAULT_RETRY_S = (1.0, 2.0, 5.0)


async def through_write_faults(work: Callable[[], Awaitable[Result]], what: str,
                               patience_s: float = FAULT_PATIENCE_S) -> Result:
    """`work()` (idempotent), redone after a pause while it fails on a write fault, for up to `patience_s` (a full
    disk is not the work's fault: it must not spend its deliveries or attempts); any other failure is raised."""
    waited = 0.0
    tries = 0
    while True:
        try:
            return await work()
        except Exception as error:
            fault = write_fault(error)
            if fault is None or waited >= patience_s:
                raise
            delay = FAULT_RETRY_S[min(tries, len(FAULT_RETRY_S) - 1)]
            log.warning("%s: %s (%r); done again in %.0fs", what, fault, error, delay)
            await asyncio.sleep(delay)
            waited += delay
            tries += 1
