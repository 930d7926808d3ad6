"""Users and keys: how the ledger folds them, and how a key's model access and revocation reach the batch."""


import orjson

from contracts.commands import FinalizeBatch
from contracts.events.batch import BatchCancelRequested, BatchCreated
from contracts.events.key import KeyCreated, KeyRevoked, UserCreated
from contracts.readmodel import UserRecord
from contracts.terms import BatchTerms
from services.executor.attempts import BatchLog
from services.ledger.aggregates import User
from services.ledger.application import Ledger
from services.ledger.projection import api_key_record, user_record
from services.runtime.storage.catalogue import load_catalogue
from services.scheduler.book import Book
from services.validator.domain import FileValidation
from tests.factories import batch_created

KEY = "ef" * 32
T0 = 1_700_000_000
CHAT, EMBED = "smollm2-135m-instruct-q4_1", "smollm2-135m-embed"


def test_a_users_key_is_recorded_with_its_user_and_then_revoked(ledger: Ledger) -> None:
    ledger.fold([
        (1, UserCreated(aggregate_id="alice", display_name="Alice", allowed_models=[CHAT], occurred_at=T0 * 1000)),
        (2, KeyCreated(aggregate_id=KEY[:32], key_sha256=KEY, role="user", label="laptop", user_id="alice",
                       occurred_at=T0 * 1000)),
    ])
    key = ledger.api_key(KEY)
    assert key is not None
    assert api_key_record(key).model_dump() == {"key_id": "key_" + "ef" * 8, "role": "user", "label": "laptop",
                                                "user_id": "alice", "provider_id": None, "revoked": False,
                                                "created_at": T0}
    ledger.fold([(3, KeyRevoked(aggregate_id=KEY[:32], key_sha256=KEY, revoked_by_key_id="key_admin"))])
    key = ledger.api_key(KEY)
    assert key is not None and api_key_record(key).revoked and not key.anomalies


def test_a_user_without_a_model_list_may_use_every_model(ledger: Ledger) -> None:
    (user,) = ledger.fold([(1, UserCreated(aggregate_id="bob", display_name="Bob", occurred_at=T0 * 1000))])
    assert isinstance(user, User)
    assert user_record(user) == UserRecord(user_id="bob", display_name="Bob", allowed_models=None, created_at=T0)


def test_revoking_twice_keeps_the_key_revoked_and_notes_an_anomaly(ledger: Ledger) -> None:
    revoked = KeyRevoked(aggregate_id=KEY[:32], key_sha256=KEY)
    ledger.fold([(1, KeyCreated(aggregate_id=KEY[:32], key_sha256=KEY, role="user", label="k")),
                 (2, revoked), (3, revoked.model_copy(update={"event_id": "again"}))])
    key = ledger.api_key(KEY)
    assert key is not None and key.revoked and [a["fact"] for a in key.anomalies] == ["revoked"]


def test_revoking_an_unknown_key_changes_nothing(ledger: Ledger) -> None:
    assert ledger.fold([(1, KeyRevoked(aggregate_id=KEY[:32], key_sha256=KEY))]) == []


def test_a_key_created_before_users_existed_has_no_user() -> None:
    old = orjson.dumps({"type": "key.created", "aggregate_id": "k", "key_sha256": KEY, "role": "admin",
                        "label": "bootstrap"})
    assert KeyCreated.model_validate_json(old).user_id is None
    assert BatchCreated.model_validate_json(orjson.dumps({
        "type": "batch.created", "aggregate_id": "b", "owner_key_id": "k", "input_file_id": "f",
        "input_object_key": "files/f", "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "created_at": T0, "expires_at": T0 + 1})).allowed_models is None


def line(model: str) -> bytes:
    return orjson.dumps({"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}})


def test_a_model_the_owner_may_not_use_is_an_unsupported_model() -> None:
    catalogue = load_catalogue(None).restricted_to([EMBED])
    issues = FileValidation("/v1/chat/completions", catalogue).feed(1, line("smollm2"))
    assert [(i.code, i.param) for i in issues] == [("unsupported_model", "body.model")]
    assert "smollm2" in issues[0].message and EMBED in issues[0].message


def test_an_alias_of_an_allowed_model_is_allowed() -> None:
    catalogue = load_catalogue(None).restricted_to([CHAT])
    assert FileValidation("/v1/chat/completions", catalogue).feed(1, line("smollm2")) == []
    assert load_catalogue(None).restricted_to(None) == load_catalogue(None)


def cancel(code: str = "batch_cancelled") -> BatchCancelRequested:
    return BatchCancelRequested.model_validate({"aggregate_id": "b1", "requested_by_key_id": "k", "code": code})


def test_a_revocation_cancel_marks_unrun_lines_authorization_revoked_even_after_a_users_cancel() -> None:
    log = BatchLog()
    log.fold(cancel())
    assert log.stop_reason(0) == "cancelled" and log.cancel_code == "batch_cancelled"
    log.fold(cancel("authorization_revoked"))
    assert log.cancel_code == "authorization_revoked"


def test_the_scheduler_finalizes_a_revoked_batch_with_the_revocation_code() -> None:
    book = Book()
    book.apply(batch_created("b1", "k", "files/f", created_at=T0, expires_at=T0 + 86400))
    book.apply(cancel("authorization_revoked"))
    assert book.plans["b1"].cancel_code == "authorization_revoked"
    command = FinalizeBatch(batch_id="b1", executor_id="e1", reason="cancelled",
                            terms=BatchTerms(owner_key_id="k", endpoint="/v1/chat/completions",
                                             input_object_key="files/f"),
                            unrun_code=book.plans["b1"].cancel_code)
    assert command.code == "authorization_revoked"
    assert command.model_copy(update={"unrun_code": None}).code == "batch_cancelled"
