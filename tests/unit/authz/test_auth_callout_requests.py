"""The auth callout believes only requests nats-server made for it: sealed to its xkey, signed by the server they
name, for its issuer, fresh. Requests are built here as `server/auth_callout.go` builds them."""

import os
import time
import typing
from dataclasses import dataclass
from types import SimpleNamespace

import nkeys
import pytest
from nats.aio.msg import Msg

from services.authz import nkey_jwt
from services.authz.callout import ExecutorAuthority
from services.authz.keyring import CalloutKeys
from services.authz.request import SERVER_XKEY_HEADER, ForgedRequest, opened
from services.authz.xkey import VERSION, CurveKey, SealError

KEYS = CalloutKeys(nkey_jwt.new_account_seed())


def server_seed() -> str:
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_SERVER)).decode()


@dataclass
class Server:
    """A nats-server's two keys: its nkey signs requests (its public key is its id), its curve key seals them."""

    seed: str
    curve: CurveKey

    @classmethod
    def new(cls) -> "Server":
        return cls(server_seed(), CurveKey.derived(os.urandom(32), b"server"))

    @property
    def id(self) -> str:
        return nkey_jwt.public_key(self.seed)

    def claims(self, **changes: object) -> dict[str, typing.Any]:
        claims: dict[str, typing.Any] = {
            "sub": KEYS.issuer, "aud": "nats-authorization-request", "exp": int(time.time()) + 2,
            "nats": {"server_id": {"name": self.id, "host": "127.0.0.1", "id": self.id,
                                   "xkey": self.curve.public_key},
                     "user_nkey": "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4",
                     "client_info": {"host": "127.0.0.1", "id": 17, "kind": "Client", "type": "nats"},
                     "connect_opts": {"user": "alpha", "pass": "wk-secret", "protocol": 1},
                     "type": "authorization_request", "version": 2}}
        claims.update(changes)
        return claims

    def request(self, token: str, sealed_by: CurveKey | None = None) -> tuple[bytes, dict[str, str]]:
        curve = sealed_by or self.curve
        return curve.seal(token.encode(), KEYS.curve.public_key), {SERVER_XKEY_HEADER: curve.public_key}


def test_a_request_the_server_sealed_and_signed_is_opened_with_who_connects_and_where() -> None:
    server = Server.new()
    request = opened(*server.request(nkey_jwt.encode(server.claims(), server.seed)), KEYS)
    assert (request.server_id, request.server_xkey, request.client_id) == (server.id, server.curve.public_key, 17)
    assert (request.user, request.password) == ("alpha", "wk-secret")
    assert "wk-secret" not in repr(request)


def test_an_unsealed_request_is_not_believed() -> None:
    server = Server.new()
    with pytest.raises(ForgedRequest, match="unsealed"):
        opened(nkey_jwt.encode(server.claims(), server.seed).encode(), {}, KEYS)


def test_a_request_signed_by_a_key_other_than_the_server_it_names_is_not_believed() -> None:
    server, impostor = Server.new(), Server.new()
    with pytest.raises(ForgedRequest, match="other than the server it names"):
        opened(*server.request(nkey_jwt.encode(server.claims(), impostor.seed)), KEYS)


def test_a_request_signed_by_an_account_rather_than_a_server_is_not_believed() -> None:
    server = Server.new()
    with pytest.raises(ForgedRequest, match="not signed by its issuer"):
        opened(*server.request(nkey_jwt.encode(server.claims(), nkey_jwt.new_account_seed())), KEYS)


def test_a_request_whose_claims_were_changed_after_signing_is_not_believed() -> None:
    server = Server.new()
    header, _, signature = nkey_jwt.encode(server.claims(), server.seed).split(".")
    other_claims = nkey_jwt.encode(server.claims(exp=int(time.time()) + 3600), server.seed).split(".")[1]
    with pytest.raises(ForgedRequest, match="not signed by its issuer"):
        opened(*server.request(f"{header}.{other_claims}.{signature}"), KEYS)


def test_a_request_sealed_with_a_curve_key_the_server_did_not_sign_is_not_believed() -> None:
    server = Server.new()
    with pytest.raises(ForgedRequest, match="sealed with a key other"):
        opened(*server.request(nkey_jwt.encode(server.claims(), server.seed), CurveKey.derived(b"x", b"y")), KEYS)


@pytest.mark.parametrize(("change", "problem"), [
    ({"sub": nkey_jwt.public_key(nkey_jwt.new_account_seed())}, "another issuer"),
    ({"aud": "$G"}, "not an authorization request"),
    ({"exp": int(time.time()) - 3600}, "expired"),
])
def test_a_request_for_another_issuer_of_another_kind_or_stale_is_not_believed(
        change: dict[str, object], problem: str) -> None:
    server = Server.new()
    with pytest.raises(ForgedRequest, match=problem):
        opened(*server.request(nkey_jwt.encode(server.claims(**change), server.seed)), KEYS)


def test_a_request_sealed_to_another_responder_is_not_opened() -> None:
    server = Server.new()
    sealed = server.curve.seal(nkey_jwt.encode(server.claims(), server.seed).encode(),
                               CurveKey.derived(b"other", b"responder").public_key)
    with pytest.raises(ForgedRequest, match="not sealed for this key"):
        opened(sealed, {SERVER_XKEY_HEADER: server.curve.public_key}, KEYS)


def test_a_sealed_message_is_xkv1_nonce_and_box_and_opens_only_between_its_two_keys() -> None:
    sender, recipient, stranger = (CurveKey.derived(os.urandom(32), b"test") for _ in range(3))
    sealed = sender.seal(b"the worker key", recipient.public_key)
    assert sealed.startswith(VERSION) and len(sealed) == len(VERSION) + 24 + 16 + len(b"the worker key")
    assert recipient.open(sealed, sender.public_key) == b"the worker key"
    assert sender.public_key.startswith("X") and len(sender.public_key) == 56
    with pytest.raises(SealError):
        stranger.open(sealed, sender.public_key)
    with pytest.raises(SealError):
        recipient.open(sealed[:-1] + bytes([sealed[-1] ^ 1]), sender.public_key)


def test_the_callout_keys_come_from_the_issuer_seed_alone() -> None:
    again = CalloutKeys(KEYS.issuer_seed)
    assert again.curve.public_key == KEYS.curve.public_key and again.system_password == KEYS.system_password
    assert CalloutKeys(nkey_jwt.new_account_seed()).curve.public_key != KEYS.curve.public_key
    assert KEYS.system_url("nats://core:pw@10.0.0.5:4222") == f"nats://system:{KEYS.system_password}@10.0.0.5:4222"


async def test_a_forged_request_gets_no_answer_at_all() -> None:
    """Not even a refusal: an answer would tell a forger whether a worker key is live, unthrottled."""
    answers: list[bytes] = []

    async def respond(data: bytes) -> None:
        answers.append(data)

    server, impostor = Server.new(), Server.new()
    data, headers = server.request(nkey_jwt.encode(server.claims(), impostor.seed))
    message = typing.cast(Msg, SimpleNamespace(subject="$SYS.REQ.USER.AUTH", data=data, headers=headers,
                                               respond=respond))
    authority = ExecutorAuthority(bus=typing.cast(typing.Any, None), read_model=typing.cast(typing.Any, None),
                                  keys=KEYS)
    await authority.on_request(message)
    assert answers == []


def test_an_executors_admission_bounds_its_messages_to_its_largest_request_not_the_servers_megabyte() -> None:
    """Every request an executor makes is parsed whole on the leading scheduler, one at a time: its connection may
    publish no more than a full fact submission (the server closes one that does), not nats-server's 1 MiB."""
    from contracts.fact_desk import FACTS_PER_SUBMISSION, MAX_STATED_FACT_CHARS, FactSubmission
    from contracts.permissions import EXECUTOR_MAX_PAYLOAD

    authority = ExecutorAuthority(typing.cast(typing.Any, None), typing.cast(typing.Any, None), KEYS)
    user = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
    claims = nkey_jwt.decode(authority.user_jwt(user, "alpha"))
    assert 0 < claims["nats"]["payload"] == EXECUTOR_MAX_PAYLOAD < 512 * 1024
    widest = "\U0001f600" * MAX_STATED_FACT_CHARS  # 4 bytes of UTF-8 each
    largest = FactSubmission(event=widest, then=[widest] * (FACTS_PER_SUBMISSION - 1)).model_dump_json().encode()
    assert len(largest) <= EXECUTOR_MAX_PAYLOAD
