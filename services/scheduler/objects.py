"""The object broker: presigned URLs for executors, who hold no S3 credentials, to their own work's objects only,
judged on the leading scheduler's book (who runs which attempt, finalizes which batch, is in the fleet)."""

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import urllib3
from minio import Minio
from minio.error import S3Error

from contracts.catalogue import MODEL_OBJECTS_PREFIX
from contracts.ids import error_file_id, output_file_id
from contracts.objects import (
    LIST_PAGE,
    GrantedObject,
    ObjectGrant,
    ObjectRequest,
    SignedObject,
    WantedObject,
)
from contracts.subjects import (
    input_object_key,
    object_requests,
    parse_result_chunk_key,
    rejections_key,
    results_prefix,
)
from services.runtime.nats.delivery import Answer
from services.runtime.process.settings import ConnectionSettings
from services.runtime.process.skip_log import SkipLog
from services.runtime.storage.objectstore import ObjectStore
from services.scheduler.book import BatchPlan, Book

log = logging.getLogger(__name__)

SIGNING_REGION = "us-east-1"
"""Set, so that signing never asks the server for the bucket's region (presigning stays a local computation)."""
OBJECT_REQUESTS = Answer(object_requests("{executor_id}"), ObjectRequest,
                         lambda why: ObjectGrant(granted=False, reason=f"Malformed object request: {why}"))


def authorize(book: Book, executor_id: str, request: ObjectRequest) -> str | None:
    """None when `executor_id` may do `request`; else why not.

    While it holds a live attempt of a batch, or was sent its finalize command, an executor the batch's placement
    allows reads its input, rejections and result chunks, and writes its own attempt's chunks (and the output and
    error files when it finalizes). Nothing else, but the model weights every executor of the fleet reads."""
    if request.key.startswith(MODEL_OBJECTS_PREFIX):
        return model_refusal(book, executor_id, request)
    batch_id = request.batch_id
    plan = book.plans.get(batch_id)
    if plan is None or plan.phase == "ended":
        return f"batch {batch_id} is not running or being finalized"
    if not book.placements.allows(executor_id, plan):
        return (f"executor {executor_id} may not run batch {batch_id}: its provider is not one the batch's "
                f"placement ({plan.placement}) allows")
    held = {run.attempt for run in plan.shards.values() if run.executor_id == executor_id}
    finalizing = plan.finalizer == executor_id
    if not held and not finalizing:
        return (f"executor {executor_id} holds no live attempt of batch {batch_id}, and the batch is not being "
                "finalized")
    if not _plain(request.key):
        return f"{request.key!r} is not a plain object key"
    if request.operation in ("get", "list"):
        return _read_refusal(plan, request)
    return _write_refusal(plan, executor_id, request, held, finalizing)


def _read_refusal(plan: BatchPlan, request: ObjectRequest) -> str | None:
    """A holder reads the batch's input, rejections and result chunks, and lists the chunks or rejections."""
    key, batch_id, results = request.key, plan.batch_id, results_prefix(plan.batch_id)
    if request.operation == "get":
        readable = (plan.terms.input_object_key, rejections_key(batch_id), plan.rejections_object_key or None)
        return None if key in readable or key.startswith(results) else f"{key} is not an object of {batch_id}"
    return None if key.startswith(results) or key == rejections_key(batch_id) else (
        f"{key} is not a prefix of {batch_id}'s result chunks")


def _write_refusal(plan: BatchPlan, executor_id: str, request: ObjectRequest, held: set[int],
                   finalizing: bool) -> str | None:
    """A holder writes its own attempt's chunks; the output and error files, when it finalizes (or holds the one
    unit of an unsharded batch)."""
    key, batch_id = request.key, plan.batch_id
    chunk = parse_result_chunk_key(key)
    if chunk is not None:
        if chunk[:2] != (batch_id, request.attempt):
            return f"{key} is not a chunk of attempt {request.attempt} of {batch_id}"
        if request.attempt not in held:
            return f"attempt {request.attempt} of {batch_id} is not executor {executor_id}'s live attempt"
        lines = plan.unit_lines(plan.attempt_shard.get(request.attempt, 0))
        if chunk[2] >= lines:  # each chunk commits at least one of the unit's lines
            return f"attempt {request.attempt} of {batch_id} runs {lines} lines: it has no chunk {chunk[2]}"
        return None
    if key in (input_object_key(output_file_id(batch_id)), input_object_key(error_file_id(batch_id))):
        one_shard = plan.layout is None or plan.layout.shards == 1
        if finalizing or (held and one_shard):
            return None
        return f"{batch_id} has several shards: its files are written by the executor that finalizes it"
    return f"{key} is not a result chunk or an output or error file of {batch_id}"


def model_refusal(book: Book, executor_id: str, request: ObjectRequest) -> str | None:
    """Model weights are read (whatever batch is named) by an executor admitted and not declared lost since; nobody
    lists or writes them here (operators upload them with their own credentials: `sheshnag models push`)."""
    key = request.key
    if request.operation != "get" or not _plain(key) or key.endswith("/"):
        return f"{key} is a model object: executors only read one, by its key"
    if executor_id not in book.admitted:
        return f"executor {executor_id} is not admitted to the fleet (it registers with a worker key first)"
    if executor_id in book.lost:
        return f"executor {executor_id} was declared lost; it reads model objects again once it heartbeats"
    return None


def _plain(key: str) -> bool:
    """No `.`, `..` or (but last) empty segment: a server that cleans paths must not resolve it to another object."""
    *parents, last = key.split("/")
    return "\\" not in key and last not in (".", "..") and all(part not in ("", ".", "..") for part in parents)


@dataclass
class ObjectSigner:
    """Holds the S3 credentials; signs URLs locally and lists with its own access."""

    presigner: Minio
    store: ObjectStore
    expiry_s: int

    @classmethod
    def from_settings(cls, connection: ConnectionSettings, url_endpoint: str, expiry_s: int) -> "ObjectSigner":
        """`url_endpoint`: host:port (with the store's own scheme), or `https://host:port`, that URLs name."""
        scheme, _, rest = url_endpoint.rpartition("://")
        secure = scheme == "https" if scheme else connection.s3_secure
        presigner = Minio(rest or connection.s3_endpoint, access_key=connection.s3_access_key,
                          secret_key=connection.s3_secret_key, secure=secure, region=SIGNING_REGION)
        return cls(presigner, ObjectStore.from_settings(connection), expiry_s)

    def url(self, method: Literal["GET", "PUT"], key: str) -> str:
        return self.presigner.get_presigned_url(method, self.store.bucket, key, timedelta(seconds=self.expiry_s))

    def page(self, prefix: str, start_after: str) -> tuple[list[str], bool]:
        """Up to LIST_PAGE keys under `prefix` after `start_after`, and whether more follow (blocking)."""
        listed = self.store.client.list_objects(self.store.bucket, prefix=prefix, recursive=True,
                                                start_after=start_after or None)
        keys = [obj.object_name for obj in itertools.islice(listed, LIST_PAGE + 1) if obj.object_name]
        return keys[:LIST_PAGE], len(keys) > LIST_PAGE


@dataclass
class ObjectBroker:
    """One leader term's answers: judged on that term's book, and only once it has read the whole log."""

    signer: ObjectSigner
    book: Book
    caught_up: asyncio.Event
    refusals: SkipLog = field(default_factory=lambda: SkipLog(log, "refused"))

    async def answer(self, executor_id: str, request: ObjectRequest) -> ObjectGrant:
        if not self.caught_up.is_set():
            return ObjectGrant(granted=False, retry=True, reason="The scheduler is still reading the log.")
        refusal = authorize(self.book, executor_id, request)
        if refusal is not None:
            self.refusals.skipped(f"executor {executor_id}", f"a {request.operation} of {request.key}: {refusal}")
            return ObjectGrant(granted=False, reason=refusal)
        expires = self.signer.expiry_s
        if request.operation != "list":
            return ObjectGrant(granted=True, url=self._url(request), expires_in_s=expires,
                               ahead=self._ahead(executor_id, request))
        try:
            keys, truncated = await asyncio.to_thread(self.signer.page, request.key, request.start_after)
        except (S3Error, urllib3.exceptions.HTTPError, OSError) as error:
            log.warning("listing %s for executor %s failed: %r", request.key, executor_id, error)
            return ObjectGrant(granted=False, retry=True, reason="The object store did not answer.")
        objects = [SignedObject(key=key, url=self.signer.url("GET", key)) for key in keys
                   if authorize(self.book, executor_id, request.model_copy(update={"operation": "get", "key": key}))
                   is None]
        return ObjectGrant(granted=True, objects=objects, next_after=keys[-1] if truncated else None,
                           expires_in_s=expires)

    def _url(self, request: ObjectRequest | WantedObject) -> str:
        return self.signer.url("GET" if request.operation == "get" else "PUT", request.key)

    def _ahead(self, executor_id: str, request: ObjectRequest) -> list[GrantedObject]:
        """The objects asked for ahead that `executor_id` may reach, each judged as if asked alone."""
        alone = [(wanted, request.model_copy(update={"operation": wanted.operation, "key": wanted.key, "ahead": []}))
                 for wanted in request.ahead]
        return [GrantedObject(operation=wanted.operation, key=wanted.key, url=self._url(wanted))
                for wanted, asked in alone if authorize(self.book, executor_id, asked) is None]
