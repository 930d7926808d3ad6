"""KV bucket helpers: open-or-create with direct reads on, and reading every key's latest value without a consumer.

A scan is a series of batched direct gets on the bucket's stream (`$JS.API.DIRECT.GET.<stream>` with
`next_by_subj` and `batch`): it creates no consumer and no watch, so a request that lists can leak nothing on the
server whatever happens to it, and it reads to the stream's end, so an answer is never cut short by a quiet spell.
"""

import nats.errors
import nats.js.errors
import orjson
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from services.runtime.bus import EventBus

SCAN_PAGE = 256
"""Messages asked for per direct get; the server ends each batch with an EOB status saying how many remain."""
REPLY_TIMEOUT_S = 5.0
"""How long one message of a page may take to arrive before the scan fails (instead of answering short)."""
MAX_CHASE = 16
"""A scan reads to the stream's end so that no key is missed; if writes to the keys it lists outrun it for this
many times the pages it first saw, it fails rather than chase them forever (or answer short)."""
KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"


class ScanFailed(nats.errors.Error):
    """The server refused or broke off a scan: the caller gets an error, never a partial list."""


async def open_bucket(bus: EventBus, bucket: str, ttl_s: float | None = None, *, scans: bool = False) -> KeyValue:
    """The bucket, created (with direct reads) when missing. `scans`: this caller lists the bucket, so a bucket
    made before direct reads existed is switched to them (only core services may, and do, ask for that)."""
    try:
        kv = await bus.js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        try:
            return await bus.js.create_key_value(bucket=bucket, history=1, ttl=ttl_s, direct=True)
        except nats.js.errors.BadRequestError:  # another process created it first
            kv = await bus.js.key_value(bucket)
    if scans and not kv._direct:
        info = await bus.js.stream_info(kv._stream)
        info.config.allow_direct = True
        await bus.js.update_stream(info.config)
        kv = await bus.js.key_value(bucket)
    return kv


async def latest_values(kv: KeyValue, key_filter: str = ">") -> list[bytes]:
    """The current value of every live key matching `key_filter` (deleted keys are skipped), in key order."""
    return [value for _, value in await latest_entries(kv, key_filter)]


async def latest_entries(kv: KeyValue, key_filter: str = ">") -> list[tuple[str, bytes]]:
    """Every live key matching `key_filter` with its current value (deleted and expired keys are skipped).

    A key written while the scan runs is seen at its newest value: its new revision lies further on in the stream,
    and the newest revision of each key wins."""
    nc = kv._js._nc
    api_subject = f"{kv._js._prefix}.DIRECT.GET.{kv._stream}"
    subject = f"{kv._pre}{key_filter}"
    latest: dict[str, tuple[int, bytes | None]] = {}
    inbox = nc.new_inbox()
    replies = await nc.subscribe(inbox)
    try:
        start: int | None = 1
        pages = 0
        while start is not None:
            pages += 1
            if pages > MAX_CHASE * (1 + len(latest) // SCAN_PAGE):
                raise ScanFailed(f"writes to {key_filter} outran a scan of them")
            request = orjson.dumps({"seq": start, "next_by_subj": subject, "batch": SCAN_PAGE})
            await nc.publish(api_subject, request, reply=inbox)
            start = await _read_page(replies, kv._pre, latest)
    finally:
        await replies.unsubscribe()
    return [(key, value) for key, (_, value) in sorted(latest.items()) if value]


async def _read_page(replies: Subscription, prefix: str, latest: dict[str, tuple[int, bytes | None]]) -> int | None:
    """Fold one batch of direct-get replies into `latest`; the sequence to go on from, or None at the end."""
    last_seq = 0
    while True:
        try:
            message = await replies.next_msg(timeout=REPLY_TIMEOUT_S)
        except nats.errors.TimeoutError:
            raise ScanFailed("the bucket's stream stopped answering a scan") from None
        headers = message.headers or {}
        status = headers.get("Status")
        if status == "404":  # nothing (more) matches
            return None
        if status == "204":  # end of this batch
            return last_seq + 1 if int(headers.get("Nats-Num-Pending", "0")) > 0 and last_seq else None
        if status is not None:
            raise ScanFailed(f"the bucket's stream refused a scan: {status} {headers.get('Description', '')}")
        seq = int(headers["Nats-Sequence"])
        last_seq = max(last_seq, seq)
        key = headers["Nats-Subject"][len(prefix):]
        deleted = KV_OPERATION in headers or MARKER_REASON in headers
        if key not in latest or latest[key][0] < seq:
            latest[key] = (seq, None if deleted else message.data)
