"""What a direct read of a replicated stream must reach: the leader's last sequence on its subject. Any replica may
answer a direct get, a lagging one among them; a stream-leader get (`STREAM.MSG.GET`) is coherent with every
acknowledged publish. A single-replica stream needs no floor."""

import time
from weakref import WeakKeyDictionary

import nats.errors
import nats.js.errors

from services.runtime.nats.bus import JetStream

LEADER_TIMEOUT_S = 2.0
"""How long the leader may take to answer. A stream electing a leader answers nobody (its publishes fail too);
reads then fail fast (`ScanFailed`, as for a scan that cannot finish) rather than answer from a replica that may
lag."""
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


_REPLICATED: "WeakKeyDictionary[JetStream, dict[str, tuple[bool, float]]]" = WeakKeyDictionary()
"""Per connection's JetStream context, per stream: whether it has more than one replica, and when that was asked."""


def leader_api(js: JetStream) -> JetStream:
    """`js`'s connection asking JetStream's API (a stream's leader, for a non-direct read) within `LEADER_TIMEOUT_S`."""
    return JetStream(js.nc, timeout=LEADER_TIMEOUT_S)


async def replicated(js: JetStream, stream: str) -> bool:
    """Whether `stream` has more than one replica (as asked at most `REPLICATION_RECHECK_S` ago): any of them may then
    answer a direct get."""
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
