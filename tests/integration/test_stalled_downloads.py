"""A download whose client stops reading (its receive window closed, so the gateway's writes wait and its buffers
fill) is cut off after `client_idle_timeout_s`, and the gateway then holds nothing of it: not its download slot, not
its connection to the object store, not its socket with the unsent part of the file (a closed window would keep a
gracefully closed socket, and its buffers, for as long as the client wished)."""

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest

from services.gateway.http.transfer_slots import DOWNLOAD_SLOTS
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_support import Gateway, running_gateway

IDLE_S = 1.0
STALLED = 4


@pytest.fixture(scope="module")
async def gateway(connection: ConnectionSettings) -> AsyncIterator[Gateway]:
    async with running_gateway(connection, client_idle_timeout_s=IDLE_S) as running:
        yield running


def large_jsonl(mib: int) -> bytes:
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "smollm2", "messages": [{"role": "user", "content": "y" * 1000}]}}).encode()
    return b"\n".join([line] * (mib * 1024 * 1024 // (len(line) + 1))) + b"\n"


async def stalled_download(gateway: Gateway, key: dict[str, str], file_id: str) -> asyncio.StreamWriter:
    """A client that asks for the file's content, then reads nothing more (a small receive buffer, never emptied)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (gateway.client.server.host, gateway.client.server.port))
    _, writer = await asyncio.open_connection(sock=sock, limit=1024)
    writer.write(f"GET /v1/files/{file_id}/content HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: {key['Authorization']}\r\n\r\n".encode())
    await writer.drain()
    reading: asyncio.ReadTransport = writer.transport  # type: ignore[assignment]  # a socket's: both ways
    reading.pause_reading()
    return writer


async def test_a_download_whose_client_reads_nothing_is_cut_off_and_its_socket_released(gateway: Gateway) -> None:
    key = await gateway.new_key()
    uploaded = await gateway.upload(key, large_jsonl(8))
    assert uploaded.status == 200, await uploaded.text()
    file_id = (await uploaded.json())["id"]
    app, runner = gateway.client.app, gateway.client.server.runner
    assert app is not None and runner is not None and runner.server is not None
    server = runner.server
    held_before = len(server.connections)

    writers = [await stalled_download(gateway, key, file_id) for _ in range(STALLED)]
    try:
        for _ in range(50):
            if app[DOWNLOAD_SLOTS].in_use == STALLED:
                break
            await asyncio.sleep(0.1)
        assert app[DOWNLOAD_SLOTS].in_use == STALLED, "the downloads did not start"
        for _ in range(int(20 * IDLE_S) + 100):
            if app[DOWNLOAD_SLOTS].in_use == 0 and len(server.connections) <= held_before:
                break
            await asyncio.sleep(0.1)
        assert app[DOWNLOAD_SLOTS].in_use == 0
        held = [handler.transport.get_write_buffer_size() for handler in server.connections
                if handler.transport is not None]
        assert len(server.connections) <= held_before, f"stalled downloads still held, with {held} bytes unsent"
    finally:
        for writer in writers:
            writer.transport.abort()
