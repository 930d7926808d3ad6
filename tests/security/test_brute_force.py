"""Attack: present wrong keys from one address until the limiter trips, to lock out the tenants behind it (one
proxy) or to keep guessing. Right keys must keep working; guesses must be refused."""

import secrets
import socket

import httpx2
import pytest

from contracts.ids import new_api_key
from tests.security.conftest import ADMIN_KEY, RunningStack

GUESSES = 200
DEFAULT_LIMIT = 100


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def own_address() -> str:
    """A loopback address of this test's own: the limiter counts per address, and the other attack tests on the
    shared stack present wrong keys from 127.0.0.1 before or after this one."""
    return f"127.{secrets.randbelow(250) + 2}.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def test_two_hundred_wrong_keys_from_one_address_lock_out_no_right_key_and_are_refused(
        secure_stack: RunningStack) -> None:
    with httpx2.Client(base_url=secure_stack.base_url, timeout=30,
                       transport=httpx2.HTTPTransport(local_address=own_address())) as http:
        user_id = f"u-{secrets.token_hex(4)}"
        assert http.post("/organization/users", json={"id": user_id}, headers=bearer(ADMIN_KEY)).status_code == 200
        made = http.post("/organization/keys", json={"user_id": user_id}, headers=bearer(ADMIN_KEY))
        assert made.status_code == 200, made.text
        user = bearer(made.json()["value"])
        guesses = [http.get("/models", headers=bearer(f"gk-{secrets.token_hex(6)}")).status_code
                   for _ in range(GUESSES)]
        assert guesses[:DEFAULT_LIMIT - 1] == [401] * (DEFAULT_LIMIT - 1)
        assert guesses[DEFAULT_LIMIT - 1:] == [429] * (GUESSES - DEFAULT_LIMIT + 1)  # refused, not looked up
        assert http.get("/models", headers=bearer(new_api_key(False))).status_code == 429
        # The admin's chosen (weak) key worked from here before the guessing began; the user's key is generated.
        assert http.get("/models", headers=bearer(ADMIN_KEY)).status_code == 200
        assert http.get("/models", headers=user).status_code == 200
        assert http.get("/files", headers=user).status_code == 200


def raw_request(stack: RunningStack, header: bytes) -> bytes:
    """The status line the gateway answers `GET /v1/models` with, sent with `header` as raw bytes."""
    with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as conn:
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + header + b"\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("header", [b"Authorization: Bearer gk-\xff" + b"a" * 40,
                                    b"Authorization: Bearer \xc3\x28\xa0\xa1" + b"b" * 40,
                                    b"Authorization: Bearer gk-\x01\x02" + b"c" * 40])
def test_a_key_of_bytes_that_are_no_key_is_refused_never_a_500(secure_stack: RunningStack, header: bytes) -> None:
    status = raw_request(secure_stack, header).split(b" ")[1]
    # Control characters are refused by the HTTP parser itself (400); other bytes name no key (401, or 429 once this
    # address's wrong guesses, the other tests' among them, are over the brute-force limit).
    assert status in ((b"400",) if b"\x01" in header else (b"401", b"429"))
