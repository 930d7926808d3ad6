"""Brokers on a host that stands in for the network (127.0.0.2: not this host's, by `nats/tls.py`'s rule): a real
nats-server with the stack's authorization that requires TLS as `sheshnag up --listen` runs it, and an impostor
that records what a client sends it before it would be authenticated."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from infra.embedded import free_port, launch, nats_command, stop_process, wait_for_port
from infra.nats_auth import NatsAuth
from infra.nats_config import client_tls, core_url
from tests.certificates import write_tls_files

NETWORK_HOST = "127.0.0.2"
"""A loopback address other than 127.0.0.1: reachable here, and treated as another host by every client."""
IMPOSTOR_INFO = b'INFO {"server_id":"impostor","version":"2.15.1","auth_required":true,"max_payload":1048576}\r\n'
"""What a broker without TLS says first: it asks for credentials and not for TLS."""


@dataclass(frozen=True)
class TlsBroker:
    url: str
    """`tls://127.0.0.2:port`, without credentials (an executor's)."""
    core_url: str
    """The services' URL, the core user's password in it."""
    ca: Path


@contextlib.contextmanager
def tls_nats(data_dir: Path, host: str = NETWORK_HOST) -> Iterator[TlsBroker]:
    """A JetStream broker on `host` with the stack's accounts, TLS required, its certificate from a throwaway CA."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tls = write_tls_files(data_dir, (host,))
    auth = NatsAuth.load_or_create(data_dir)
    port = free_port()
    config = auth.write_server_config(data_dir, client_tls(str(tls.cert), str(tls.key)))
    process = launch(nats_command(data_dir, port, config, host), data_dir / "nats.log")
    try:
        wait_for_port(port, process, 15.0, "nats-server", host)
        url = f"tls://{host}:{port}"
        yield TlsBroker(url, core_url(auth, url), tls.ca)
    finally:
        stop_process(process)


@dataclass
class Impostor:
    """A plain TCP server that answers like a broker that does not speak TLS, and keeps every byte it is sent."""

    port: int
    received: bytearray = field(default_factory=bytearray)
    connections: int = 0

    @property
    def url(self) -> str:
        return f"{NETWORK_HOST}:{self.port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(IMPOSTOR_INFO)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            while chunk := await reader.read(65536):
                self.received += chunk
        writer.close()


@contextlib.asynccontextmanager
async def impostor_broker() -> AsyncIterator[Impostor]:
    impostor = Impostor(free_port())
    server = await asyncio.start_server(impostor.serve, NETWORK_HOST, impostor.port)
    try:
        yield impostor
    finally:
        server.close()
