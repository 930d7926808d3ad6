"""What every view and use case needs (`Deps`: connections, settings, admission, the key cache), held on the app
under one typed key."""

from dataclasses import dataclass, field

from aiohttp import web

from contracts.catalogue import Catalogue
from services.gateway.adapters.admission import Admission
from services.gateway.adapters.fold_notices import FoldNotices
from services.gateway.adapters.key_cache import KeyCache
from services.gateway.adapters.own_writes import OwnWrites
from services.gateway.adapters.result_chunks import ResultChunks
from services.gateway.adapters.shared_reads import SharedReads
from services.gateway.settings import GatewaySettings
from services.gateway.usecases.accounts import Accounts
from services.runtime.nats.bus import EventBus
from services.runtime.nats.fleet import Fleet
from services.runtime.nats.readmodel import ReadModel
from services.runtime.storage.objectstore import ObjectStore


@dataclass(frozen=True)
class Deps:
    settings: GatewaySettings
    bus: EventBus
    store: ObjectStore
    read_model: ReadModel
    catalogue: Catalogue
    fleet: Fleet
    admission: Admission
    """Takes and releases an owner's places against its limits, atomically across gateways (admission.py)."""
    keys: KeyCache
    """Key records and their users, cached a short while."""
    own_writes: OwnWrites = field(default_factory=OwnWrites)
    folds: FoldNotices = field(default_factory=FoldNotices)
    """How far the read model holds the log: what a read-back of this gateway's own write waits for."""
    shared_reads: SharedReads = field(default_factory=SharedReads)
    """Reads of an owner's index shared by the requests in flight that need them (shared_reads.py)."""
    result_chunks: ResultChunks = field(default_factory=ResultChunks)
    """Result chunks as the results pages show them, the last read kept (result_chunks.py)."""


DEPS = web.AppKey("deps", Deps)


def deps(request: web.Request) -> Deps:
    return request.app[DEPS]


def accounts(request: web.Request) -> Accounts:
    """What the account use cases need, from the gateway's dependencies."""
    d = deps(request)
    return Accounts(d.bus, d.read_model, d.catalogue, d.settings.read_your_writes_s)
