"""Upload slots shared fairly, against a real gateway, ledger, NATS and SeaweedFS: hundreds of stalled uploads of one
key (and of no key, or a bad one, from one address) never delay another key's upload, a body sent too slowly is cut
with a 408 in OpenAI's shape, and every slot comes back once the attackers are gone."""

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson

from services.gateway.http.transfer_slots import UPLOAD_SLOTS, UPLOADS_IN_FLIGHT
from services.runtime.process.settings import ConnectionSettings
from tests.integration.gateway_pair import client_from, key_of_role, own_address, url_of
from tests.integration.gateway_support import Gateway, jsonl, running_gateway

ATTACKERS = 200
GOOD_UPLOADS = 8
MIN_RATE_WINDOW_S = 1.0
SETTINGS = {"upload_slots": 16, "upload_slots_per_owner": 4, "upload_min_bytes_per_s": 1024,
            "upload_min_rate_window_s": MIN_RATE_WINDOW_S, "uploads_per_address": 2 * ATTACKERS,
            "control_call_burst": 4 * ATTACKERS}
"""Every attacking upload reaches the slots (no control-call or address limit turns it away first)."""


@dataclass
class Answer:
    status: int
    body: bytes


async def stalled_upload(gateway: Gateway, address: str, authorization: str | None, trickle_s: float | None,
                         ) -> Answer:
    """An upload from `address` that declares 1 MB, sends the start of its file, then sends one byte every
    `trickle_s` (or nothing); the answer, or status 0 when the connection ends without one."""
    server = gateway.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port, local_addr=(address, 0))
    boundary = "stall"
    head = (f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {1024 * 1024}\r\n" + (f"Authorization: {authorization}\r\n" if authorization else "")
            + "\r\n").encode()
    start = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n"
             "Content-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n"
             "Content-Type: application/octet-stream\r\n\r\n").encode() + jsonl("stalled")[:200]

    async def trickle(every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            writer.write(b"x")
            await writer.drain()

    trickling = asyncio.create_task(trickle(trickle_s)) if trickle_s else None
    try:
        writer.write(head + start)
        await writer.drain()
        headers = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length = next(int(h.split(":")[1]) for h in headers if h.lower().startswith("content-length:"))
        return Answer(int(headers[0].split()[1]), await reader.readexactly(length))
    except (ConnectionError, asyncio.IncompleteReadError):
        return Answer(0, b"")
    finally:
        if trickling is not None:
            trickling.cancel()
        writer.close()


async def upload(http: aiohttp.ClientSession, gateway: Gateway, key: dict[str, str], content: bytes) -> int:
    form = aiohttp.FormData({"purpose": "batch"})
    form.add_field("file", content, filename="good.jsonl", content_type="application/octet-stream")
    async with http.post(url_of(gateway, "/v1/files"), headers=key, data=form) as answer:
        return answer.status


async def test_stalled_uploads_of_one_key_and_of_bad_keys_never_delay_another_keys_upload(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, **SETTINGS) as gateway:
        attacker, victim = await key_of_role(gateway), await key_of_role(gateway)
        keyed, unkeyed, good = own_address(), own_address(), own_address()
        attacks = [asyncio.create_task(stalled_upload(gateway, keyed, attacker["Authorization"],
                                                      0.3 if n % 2 else None)) for n in range(ATTACKERS)]
        attacks += [asyncio.create_task(stalled_upload(gateway, unkeyed, None if n % 2 else "Bearer gk-wrong",
                                                       0.3 if n % 4 < 2 else None)) for n in range(ATTACKERS)]
        await asyncio.sleep(0.5)  # every attacker is connected, and as many as may hold a slot do

        took: list[float] = []
        slots = gateway.client.app[UPLOAD_SLOTS]
        async with client_from(good) as http:
            for n in range(GOOD_UPLOADS):
                # What keeps another key's upload from waiting: no owner holds more than its share of the slots,
                # however many of its uploads wait (the time each took is printed, not asserted: a loaded machine's
                # clock is not the property).
                assert max(slots.held.values(), default=0) <= SETTINGS["upload_slots_per_owner"], dict(slots.held)
                assert slots.in_use < SETTINGS["upload_slots"]
                started = time.monotonic()
                status = await upload(http, gateway, victim, jsonl(f"good-{n}"))
                took.append(time.monotonic() - started)
                assert status == 200
                await asyncio.sleep(0.25)
        print(f"good uploads under attack took {[round(t, 2) for t in took]} s")

        cut = [a.result() for a in attacks[:ATTACKERS] if a.done() and a.result().status == 408]
        assert cut, "no stalled upload was cut for its rate"
        error = orjson.loads(cut[0].body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "request_timeout"
        for attack in attacks:
            attack.cancel()
        await asyncio.gather(*attacks, return_exceptions=True)

        in_flight = gateway.client.app[UPLOADS_IN_FLIGHT]
        for _ in range(100):  # the handlers still reading a body find their client gone
            if not (slots.in_use or slots.waiting() or in_flight.counts):
                break
            await asyncio.sleep(0.1)
        assert (slots.in_use, slots.waiting(), dict(slots.held), dict(in_flight.counts)) == (0, 0, {}, {})
        async with client_from(good) as http:
            assert await upload(http, gateway, victim, jsonl("after")) == 200


async def test_uploads_of_one_address_past_its_cap_get_429_before_their_key_is_looked_at(
        connection: ConnectionSettings) -> None:
    async with running_gateway(connection, uploads_per_address=3, client_idle_timeout_s=3.0) as gateway:
        key = await key_of_role(gateway)
        crowded, other = own_address(), own_address()
        stalled = [asyncio.create_task(stalled_upload(gateway, crowded, key["Authorization"], None))
                   for _ in range(3)]
        await asyncio.sleep(0.5)

        refused = await stalled_upload(gateway, crowded, "Bearer gk-wrong", None)
        async with client_from(other) as http:
            assert await upload(http, gateway, key, jsonl("elsewhere")) == 200

        assert refused.status == 429
        assert orjson.loads(refused.body)["error"]["code"] == "too_many_uploads"
        assert [a.status for a in await asyncio.gather(*stalled)] == [408] * 3
        assert gateway.client.app[UPLOADS_IN_FLIGHT].counts == {}
