"""The object store's HTTPS on the network: `sheshnag up --listen` runs SeaweedFS wholly on loopback (none of its
inner servers on the network) and this relay on the listen address, which ends TLS with the stack's certificate
and passes the bytes to S3's loopback port unchanged (the Host a presigned URL was signed for included).

`python -m infra.tls_relay HOST PORT TARGET_PORT CERT KEY`; SIGHUP loads the certificate again (certs rotate).
"""

import asyncio
import contextlib
import logging
import sys
from pathlib import Path

from services.runtime.process.runner import configure_logging, run_until_signalled
from services.runtime.process.tls_server import reload_on_hangup, server_context

log = logging.getLogger("sheshnag.tls_relay")

CHUNK = 256 * 1024
HANDSHAKE_TIMEOUT_S = 10.0


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass


async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, target_port: int) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError as error:
        log.warning("the object store did not take a connection: %s", error)
        client_writer.close()
        return
    directions = [asyncio.ensure_future(pipe(client_reader, server_writer)),
                  asyncio.ensure_future(pipe(server_reader, client_writer))]
    try:  # HTTP never half-closes: one side done (or gone), the connection is over
        await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for direction in directions:
            direction.cancel()
        for writer in (server_writer, client_writer):
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


async def serve(host: str, port: int, target_port: int, cert: Path, key: Path, stop: asyncio.Event) -> None:
    context = server_context(cert, key)
    reload_on_hangup(context, cert, key)
    server = await asyncio.start_server(lambda r, w: relay(r, w, target_port), host, port, ssl=context,
                                        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S, limit=CHUNK)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> None:
    host, port, target_port, cert, key = argv
    configure_logging("tls-relay", "INFO")
    run_until_signalled(lambda stop: serve(host, int(port), int(target_port), Path(cert), Path(key), stop))


if __name__ == "__main__":
    main(sys.argv[1:])
