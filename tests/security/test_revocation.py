"""Attack: keep using a key after its revoke, while the ledger lags (under load) or stands still (SIGSTOPped).
The key must be refused by the time `DELETE /v1/organization/keys/{id}` returns."""

import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2

from tests.factories import chat_line
from tests.security.conftest import ADMIN_KEY, RunningStack

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def user_key(stack: RunningStack) -> tuple[str, dict[str, str]]:
    """A new user and a key of theirs: (the key's id, its headers)."""
    user_id = f"u-{secrets.token_hex(4)}"
    made = httpx2.post(f"{stack.base_url}/organization/users", json={"id": user_id}, headers=ADMIN, timeout=30)
    assert made.status_code == 200, made.text
    key = httpx2.post(f"{stack.base_url}/organization/keys", json={"user_id": user_id}, headers=ADMIN, timeout=30)
    assert key.status_code == 200, key.text
    return key.json()["id"], {"Authorization": f"Bearer {key.json()['value']}"}


@contextmanager
def paused(stack: RunningStack, service: str) -> Iterator[None]:
    pid = stack.service_pid(service)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_revoked_key_is_refused_the_moment_the_revoke_returns_with_the_ledger_stopped(
        secure_stack: RunningStack) -> None:
    key_id, key = user_key(secure_stack)
    with httpx2.Client(base_url=secure_stack.base_url, timeout=30) as http:
        assert http.get("/files", headers=key).status_code == 200
        with paused(secure_stack, "ledger"):
            assert http.delete(f"/organization/keys/{key_id}", headers=ADMIN).status_code == 200
            for _ in range(20):
                refused = http.get("/files", headers=key)
                assert refused.status_code == 401, refused.text
                assert "revoked" in refused.json()["error"]["message"]
                time.sleep(0.05)


def test_under_load_no_request_sent_after_the_revoke_returned_is_served(secure_stack: RunningStack) -> None:
    key_id, key = user_key(secure_stack)
    answers: list[tuple[float, int]] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx2.Client(base_url=secure_stack.base_url, timeout=30) as http:
            while not stop.is_set():
                sent = time.monotonic()
                answers.append((sent, http.get("/files", headers=key).status_code))

    workers = [threading.Thread(target=hammer) for _ in range(8)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1.0)
        revoked = httpx2.delete(f"{secure_stack.base_url}/organization/keys/{key_id}", headers=ADMIN, timeout=30)
        returned = time.monotonic()
        assert revoked.status_code == 200, revoked.text
        time.sleep(1.0)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    before = [status for sent, status in answers if sent < returned]
    after = [status for sent, status in answers if sent > returned]
    assert before and set(before) <= {200, 401}
    assert 200 in before  # the load was served until the revoke
    assert after and set(after) == {401}


def test_an_event_stream_opened_before_the_revoke_ends_within_seconds_of_it(secure_stack: RunningStack) -> None:
    """A stream admitted before the revoke does not ride on it: it ends with an `authentication_error` frame. The
    batch is made with another key of the same user, so the revoke does not end it (and the stream with it)."""
    key_id, key = user_key(secure_stack)
    user_id = httpx2.get(f"{secure_stack.base_url}/organization/keys", headers=ADMIN, timeout=30).json()
    owner = next(k["user_id"] for k in user_id["data"] if k["id"] == key_id)
    other = httpx2.post(f"{secure_stack.base_url}/organization/keys", json={"user_id": owner}, headers=ADMIN,
                        timeout=30)
    assert other.status_code == 200, other.text
    client = secure_stack.client(other.json()["value"])
    line = chat_line("held-1", "hi")  # valid: the batch validates and waits, held (a refused one would end)
    uploaded = client.files.create(file=("held.jsonl", json.dumps(line).encode()), purpose="batch")
    held = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h", extra_body={"hold": True})  # it never ends by itself
    with httpx2.Client(base_url=secure_stack.base_url, timeout=30) as http, \
            http.stream("GET", f"/batches/{held.id}/events", headers=key) as events:
        assert events.status_code == 200
        lines = events.iter_lines()
        assert next(lines) == ": connected"
        assert http.delete(f"/organization/keys/{key_id}", headers=ADMIN).status_code == 200
        revoked_at = time.monotonic()
        rest = list(lines)  # until the server ends the stream
        ended_after = time.monotonic() - revoked_at
    assert ended_after < 10, f"the stream outlived the revoke by {ended_after:.1f}s"
    assert "event: error" in rest and any("authentication_error" in line for line in rest), rest[-12:]
    again = httpx2.get(f"{secure_stack.base_url}/batches/{held.id}/events", headers=key, timeout=30)
    assert again.status_code == 401, "nor can it be resumed"
    assert client.batches.retrieve(held.id).status in ("validating", "validated"), "the other key's batch goes on"
