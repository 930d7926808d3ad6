"""Attack: present wrong keys from one address until the limiter trips, to lock out the tenants behind it (one
proxy) or to keep guessing. Right keys must keep working; guesses must be refused."""

import secrets

import httpx2

from contracts.ids import new_api_key
from tests.security.conftest import ADMIN_KEY, RunningStack

GUESSES = 200
DEFAULT_LIMIT = 100


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_two_hundred_wrong_keys_from_one_address_lock_out_no_right_key_and_are_refused(
        secure_stack: RunningStack) -> None:
    with httpx2.Client(base_url=secure_stack.base_url, timeout=30) as http:
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
