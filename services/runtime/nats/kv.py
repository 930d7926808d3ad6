"""KV buckets (open-or-create with direct reads on, every key's latest value, named keys' last values) and reading
streams without consumers: batched direct gets (`next_by_subj`, `batch`) leave nothing on the server and read to the
stream's end, never cut short by a quiet spell. On a replicated stream a lagging replica may answer a direct get, so a
read counts only once it reaches the leader's last sequence on its subject (`leader_floor`: a stream-leader get is
coherent with every acknowledged publish); `read_value` asks the leader itself, and `read_latest` asks it when a
direct get finds nothing."""

import asyncio
import time
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import nats.errors
import nats.js.errors
import orjson
from nats.aio.msg import Msg
from nats.js.client import KV_PRE_TEMPLATE, KV_STREAM_TEMPLATE, JetStreamContext
from nats.js.kv import KV_MARKER_REASON, KV_OP, KeyValue

from contracts.subjects import direct_get
from services.runtime.nats.bus import EventBus, JetStream
from services.runtime.nats.placement import until_placed

SCAN_PAGE = 256
"""Messages asked for per direct get; the server ends each batch with an EOB status saying how many remain."""
PAGE_TIMEOUT_S = 10.0
"""How long one page of replies may take to arrive before the scan fails (instead of answering short)."""
MAX_CHASE = 16
"""A scan whose keys' writes outrun it for this many times the pages it first saw fails rather than chase for ever."""
KV_OPERATION = KV_OP
"""The header a delete or purge marker carries (nats-py's name for it)."""
LAGGING_RETRY_S = 0.05
"""A lagging replica's short answer is asked again after this long, for up to `PAGE_TIMEOUT_S` in all."""
LEADER_TIMEOUT_S = 2.0
"""How long the leader may take to answer: a stream electing one answers nobody, and reads then fail fast
(`ScanFailed`) rather than answer from a replica that may lag."""
REPLICATION_RECHECK_S = 30.0
"""How long a stream's replica count is taken as known: a stream scaled up meanwhile is read as replicated after."""


class ScanFailed(nats.errors.Error):
    """The server refused or broke off a scan: the caller gets an error, never a partial list."""


async def leader_floor(js: JetStream, stream: str, subject: str) -> int:
    """The sequence a direct read of `subject` (a filter) must reach to miss nothing acknowledged before it began;
    0 on a single-replica stream and when `subject` holds nothing."""
    if not await replicated(js, stream):
        return 0
    try:
        return (await leader_api(js).get_last_msg(stream, subject)).seq or 0
    except nats.js.errors.NotFoundError:
        return 0
    except (nats.errors.Error, nats.js.errors.Error) as error:
        raise ScanFailed(f"the leader of {stream} did not answer a read: {error!r}") from error


async def newest_sequence(js: JetStream, stream: str, subject: str) -> int:
    """The sequence of the newest message on `subject` (a filter) in `stream`, as of a read begun now: asked of the
    leader on a replicated stream, else by a direct get; 0 when `subject` holds nothing."""
    if await replicated(js, stream):
        return await leader_floor(js, stream, subject)
    try:
        answer = await js.nc.request(direct_get(stream), orjson.dumps({"last_by_subj": subject}),
                                     timeout=LEADER_TIMEOUT_S)
    except (nats.errors.Error, nats.js.errors.Error) as error:
        raise ScanFailed(f"{stream} did not answer a read: {error!r}") from error
    headers = answer.headers or {}
    if headers.get("Status") == "404":
        return 0
    if "Nats-Sequence" not in headers:
        raise ScanFailed(f"{stream} refused a read (status {headers.get('Status')})")
    return int(headers["Nats-Sequence"])


_REPLICATED: "WeakKeyDictionary[JetStream, dict[str, tuple[bool, float]]]" = WeakKeyDictionary()
"""Per connection's JetStream context, per stream: whether it has more than one replica, and when that was asked."""


def leader_api(js: JetStream) -> JetStream:
    """`js`'s connection asking JetStream's API (a stream's leader, for a non-direct read) within `LEADER_TIMEOUT_S`."""
    return JetStream(js.nc, timeout=LEADER_TIMEOUT_S)


async def replicated(js: JetStream, stream: str) -> bool:
    """Whether `stream` has more than one replica (as asked at most `REPLICATION_RECHECK_S` ago)."""
    known = _REPLICATED.setdefault(js, {})
    now = time.monotonic()
    if stream in known and now - known[stream][1] <= REPLICATION_RECHECK_S:
        return known[stream][0]
    try:
        replicas = (await leader_api(js).stream_info(stream)).config.num_replicas or 1
    except (nats.errors.Error, nats.js.errors.Error) as error:
        if stream not in known:
            raise ScanFailed(f"{stream} did not say how many replicas it has: {error!r}") from error
        return known[stream][0]  # asked again while the stream elects a leader: as it was
    known[stream] = replicas > 1, now
    return replicas > 1


class Bucket(KeyValue):
    """A KV bucket, with what a direct read of it needs kept public: the bus's JetStream context, the bucket's
    stream and its keys' subject prefix (named as nats-py names them: `KV_<bucket>`, `$KV.<bucket>.<key>`)."""

    def __init__(self, js: JetStream, name: str, direct: bool) -> None:
        self.js = js
        self.name = name
        self.stream = KV_STREAM_TEMPLATE.format(bucket=name)
        self.prefix = KV_PRE_TEMPLATE.format(bucket=name)
        self.direct = direct
        super().__init__(name, self.stream, self.prefix, js, direct)


async def open_bucket(bus: EventBus, bucket: str, ttl_s: float | None = None, *, scans: bool = False,
                      max_value_bytes: int | None = None) -> Bucket:
    """The bucket, created (with direct reads) when missing, once JetStream can place it (placement.py). `scans`:
    a bucket made before direct reads is switched to them (core services only). `max_value_bytes`: the server
    refuses a larger value (a bucket made without the bound gets it: core services only)."""
    return await until_placed(f"bucket {bucket}", lambda: _open_bucket(bus, bucket, ttl_s, scans, max_value_bytes))


async def _open_bucket(bus: EventBus, bucket: str, ttl_s: float | None, scans: bool,
                       max_value_bytes: int | None = None) -> Bucket:
    stream = KV_STREAM_TEMPLATE.format(bucket=bucket)
    try:
        info = await bus.js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        try:
            await bus.js.create_key_value(bucket=bucket, history=1, ttl=ttl_s, direct=True, replicas=bus.replicas,
                                          max_value_size=max_value_bytes)
            return Bucket(bus.js, bucket, direct=True)
        except nats.js.errors.BadRequestError:  # another process created it first
            info = await bus.js.stream_info(stream)
    await bus.ensure_replicas(info)  # a no-op at one replica
    if max_value_bytes is not None and info.config.max_msg_size != max_value_bytes:
        info.config.max_msg_size = max_value_bytes
        await bus.js.update_stream(info.config)
    if scans and not info.config.allow_direct:
        await ensure_direct_reads(bus.js, stream)
    return Bucket(bus.js, bucket, direct=scans or bool(info.config.allow_direct))


async def ensure_direct_reads(js: JetStreamContext, stream: str) -> None:
    """Let `read_subject` read the stream (a stream made before direct reads is switched to them; core users only)."""
    info = await js.stream_info(stream)
    if not info.config.allow_direct:
        info.config.allow_direct = True
        await js.update_stream(info.config)


async def latest_values(kv: Bucket, key_filter: str = ">", *, coherent: bool = True) -> list[bytes]:
    """The current value of every live key matching `key_filter` (deleted keys are skipped), in key order."""
    return [value for _, value in await latest_entries(kv, key_filter, coherent=coherent)]


async def latest_entries(bucket: Bucket, key_filter: str = ">", *, coherent: bool = True) -> list[tuple[str, bytes]]:
    """Every live key matching `key_filter` with its current value (a key written during the scan: its newest).
    `coherent=False`: whatever replica answers, even mid-election (where a moment-old value serves: heartbeats)."""
    latest: dict[str, tuple[int, bytes | None]] = {}
    for message in await read_subject(bucket.js, bucket.stream, f"{bucket.prefix}{key_filter}", coherent=coherent):
        key = message.subject[len(bucket.prefix):]
        if key not in latest or latest[key][0] < message.seq:
            latest[key] = (message.seq, message.value)
    return [(key, value) for key, (_, value) in sorted(latest.items()) if value]


async def read_value(bucket: Bucket, key: str) -> bytes | None:
    """The key's value (None: never written, deleted or expired) with every write acknowledged before the call in it:
    on a replicated bucket the stream leader's own get, not a direct one a lagging replica may answer."""
    entry = await read_entry(bucket, key)
    return entry.value if entry is not None else None


async def read_entry(bucket: Bucket, key: str) -> KeyValue.Entry | None:
    """`read_value`'s entry, with its revision (for a compare-and-set); None: never written, deleted or expired."""
    reader: KeyValue = bucket
    if await replicated(bucket.js, bucket.stream):
        reader = KeyValue(bucket.name, bucket.stream, bucket.prefix, leader_api(bucket.js), direct=False)
    try:
        entry = await reader.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    return entry if entry.value else None


async def read_latest(bucket: Bucket, key: str) -> bytes | None:
    """The key's value (None: never written, deleted or expired) by a direct get, which any replica may answer. A
    miss on a replicated bucket is asked again of the stream's leader (`read_value`): a replica lagging by a commit,
    or catching up after a restart, does not hold every acknowledged write yet, and what exists is never reported
    missing. A value it answers may be a revision behind the leader's."""
    try:
        entry = await bucket.get(key)
    except nats.js.errors.KeyNotFoundError:
        entry = None
    if entry is not None and entry.value:
        return entry.value
    return await read_value(bucket, key) if await replicated(bucket.js, bucket.stream) else None


async def erase(bucket: Bucket, key: str, through: int | None = None) -> None:
    """Remove every revision of `key` from the bucket's stream, leaving no delete marker behind (a KV `purge` keeps
    one per key for ever): for records kept only for a while. `through`: only the revisions up to that one (the one
    the caller read), so a newer write made meanwhile stays."""
    await bucket.js.purge_stream(bucket.stream, subject=f"{bucket.prefix}{key}",
                                 seq=None if through is None else through + 1)


@dataclass(frozen=True)
class StoredMessage:
    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes

    @property
    def value(self) -> bytes | None:
        """The data as a KV value: None for a delete, purge or expiry marker (one the server writes: a TTL ran out)."""
        return None if KV_OPERATION in self.headers or KV_MARKER_REASON in self.headers else self.data


async def read_subject(js: JetStream, stream: str, subject: str, *,
                       coherent: bool = True) -> list[StoredMessage]:
    """Every message of `stream` (which must allow direct gets) on `subject`, in stream order, to the stream's end.
    `coherent`: to the leader's last message on `subject` at least (see the module's docstring)."""
    found: list[StoredMessage] = []
    floor = await leader_floor(js, stream, subject) if coherent else 0
    deadline: float | None = None
    start = 1
    pages = 0
    while True:
        pages += 1
        if pages > MAX_CHASE * (1 + len(found) // SCAN_PAGE):
            raise ScanFailed(f"writes to {subject} outran a scan of them")
        page, status, pending = await _direct_batch(js, stream, {
            "seq": start, "next_by_subj": subject, "batch": SCAN_PAGE}, "scan")
        found += page
        if status == "204" and page and pending:
            start = page[-1].seq + 1
            continue
        if status not in ("204", "404"):
            raise ScanFailed(f"the stream refused a scan (status {status})")
        highest = found[-1].seq if found else 0
        if highest >= floor:
            return found
        deadline = deadline or asyncio.get_running_loop().time() + PAGE_TIMEOUT_S
        floor = await _lagging(js, stream, subject, highest, deadline, "scan")
        if highest >= floor:
            return found
        pages -= 1
        start = max(start, highest + 1)


async def read_page(js: JetStream, stream: str, subject: str, after: int, limit: int,
                    max_bytes: int) -> tuple[list[StoredMessage], bool]:
    """Up to `limit` messages (about `max_bytes`) of `stream` on `subject` after `after`, in stream order, by one
    batched direct get (again while a lagging replica answers); and whether more follow."""
    floor = await leader_floor(js, stream, subject)
    deadline = asyncio.get_running_loop().time() + PAGE_TIMEOUT_S
    while True:
        found, status, pending = await _direct_batch(js, stream, {
            "seq": after + 1, "next_by_subj": subject, "batch": limit, "max_bytes": max_bytes}, "read")
        if status not in ("204", "404"):  # 404: nothing after `after`
            raise ScanFailed(f"the stream refused a read (status {status})")
        more = status == "204" and pending > 0
        reached = max(after, found[-1].seq if found else 0)
        if more or reached >= floor:
            return found, more
        floor = await _lagging(js, stream, subject, reached, deadline, "read")
        if reached >= floor:
            return found, more


async def _lagging(js: JetStream, stream: str, subject: str, reached: int, deadline: float, what: str) -> int:
    """The leader's last sequence on `subject` now, for a read that stopped short at `reached` (the message went,
    or a lagging replica answered); after a pause if still short of it (a `ScanFailed` past `deadline`)."""
    floor = await leader_floor(js, stream, subject)
    if reached < floor:
        if asyncio.get_running_loop().time() > deadline:
            raise ScanFailed(f"no replica of {stream} caught up to sequence {floor} for a {what}")
        await asyncio.sleep(LAGGING_RETRY_S)
    return floor


async def _direct_batch(js: JetStream, stream: str, request: dict[str, object],
                        what: str) -> tuple[list[StoredMessage], str, int]:
    """One batched direct get: the messages it answers, the status that ends them, and how many it says follow."""
    nc = js.nc
    found: list[StoredMessage] = []
    end: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()

    async def on_reply(message: Msg) -> None:
        headers = {str(name): value for name, value in (message.headers or {}).items()}
        status = headers.get("Status")
        if status is None:
            found.append(StoredMessage(int(headers["Nats-Sequence"]), headers["Nats-Subject"], headers, message.data))
        elif not end.done():
            end.set_result((status, int(headers.get("Nats-Num-Pending", "0") or 0)))

    replies = await nc.subscribe(nc.new_inbox(), cb=on_reply)
    try:
        await nc.publish(direct_get(stream), orjson.dumps(request), reply=replies.subject)
        try:
            status, pending = await asyncio.wait_for(end, PAGE_TIMEOUT_S)
        except TimeoutError:
            raise ScanFailed(f"the stream stopped answering a {what}") from None
    finally:
        await replies.unsubscribe()
    return found, status, pending


LAST_PER_REQUEST = 256
"""Keys asked for per batched direct get of their last values (the server allows up to 1,024)."""


async def read_last(bucket: Bucket, keys: list[str]) -> dict[str, bytes]:
    """The current value of each of `keys` that has one, by batched direct gets of their last messages
    (`multi_last`): one request per `LAST_PER_REQUEST` keys."""
    chunks = [keys[start:start + LAST_PER_REQUEST] for start in range(0, len(keys), LAST_PER_REQUEST)]
    found: dict[str, bytes] = {}
    for messages in await asyncio.gather(*(_read_last(bucket, chunk) for chunk in chunks)):
        for message in messages:
            if message.value:
                found[message.subject[len(bucket.prefix):]] = message.value
    return found


async def _read_last(bucket: Bucket, keys: list[str]) -> list[StoredMessage]:
    found, status, _ = await _direct_batch(bucket.js, bucket.stream, {
        "multi_last": [f"{bucket.prefix}{key}" for key in keys], "batch": len(keys)}, "read of keys")
    if status not in ("204", "404"):  # 404: none of the keys has a value
        raise ScanFailed(f"the stream refused a read of keys (status {status})")
    return found
