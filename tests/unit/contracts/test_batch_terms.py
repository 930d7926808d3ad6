"""A batch's terms said once: facts and commands of version 1 (each term a field of its own) still decode to the
same terms, and a command goes to an executor in the shape its protocol takes."""

import json

import pytest
from pydantic import BaseModel, ValidationError

from contracts.api.batch import Endpoint
from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.batch import BatchCreated, BatchValidated, ShardLayout
from contracts.events.executor import ExecutorAdvert
from contracts.events.registry import decode_event
from contracts.terms import TERM_FIELDS, BatchTerms

TERMS = BatchTerms(owner_key_id="key_owner", endpoint="/v1/chat/completions", input_object_key="files/file-in",
                   created_at=1_700_000_000, expires_at=1_700_086_400, output_expires_after_s=3600)

# As the code before nested terms wrote them (recorded from it).
CREATED_V1 = (
    b'{"event_id":"batch_abc:created","type":"batch.created","version":1,"occurred_at":1700000000123,'
    b'"aggregate_id":"batch_abc","correlation_id":"batch_abc","causation_id":null,"owner_key_id":"key_owner",'
    b'"input_file_id":"file-in","input_object_key":"files/file-in","endpoint":"/v1/chat/completions",'
    b'"completion_window":"24h","metadata":{"team":"nlp"},"created_at":1700000000,"expires_at":1700086400,'
    b'"allow_partial":true,"hold":false,"allowed_models":null,"output_expires_after_s":3600,"owner_user_id":"u_1",'
    b'"organization_id":null,"default_model":null,"billing_account":null,"placement":"approved_providers"}')
VALIDATED_V1 = (
    b'{"event_id":"batch_abc:validated","type":"batch.validated","version":1,"occurred_at":1700000001000,'
    b'"aggregate_id":"batch_abc","correlation_id":"batch_abc","causation_id":null,"total_lines":40,'
    b'"model":"smollm2","owner_key_id":"key_owner","endpoint":"/v1/chat/completions",'
    b'"input_object_key":"files/file-in","rejected_lines":2,"rejections_object_key":"rejections/batch_abc.jsonl",'
    b'"error_count":3,"counts_by_code":{"invalid_json":3}}')
RUN_V1 = (
    b'{"batch_id":"batch_abc","executor_id":"gpu-1","attempt":3,"lease_token":"lease_x","owner_key_id":"key_owner",'
    b'"model":"smollm2","endpoint":"/v1/chat/completions","input_object_key":"files/file-in","total_lines":40,'
    b'"rejections_object_key":"rejections/batch_abc.jsonl","shard":1,"layout":{"shards":2,"span":20},'
    b'"output_expires_after_s":3600,"created_at":1700000000,"expires_at":1700086400}')
FINALIZE_V1 = (
    b'{"batch_id":"batch_abc","executor_id":"gpu-1","reason":"cancelled","owner_key_id":"key_owner",'
    b'"input_object_key":"files/file-in","endpoint":"/v1/chat/completions","unrun_code":"authorization_revoked",'
    b'"output_expires_after_s":3600,"created_at":1700000000,"failure_code":null,"failure_message":null}')


def created() -> BatchCreated:
    return BatchCreated(aggregate_id="batch_abc", occurred_at=1_700_000_000_123, terms=TERMS, input_file_id="file-in",
                        completion_window="24h", metadata={"team": "nlp"}, allow_partial=True, owner_user_id="u_1")


def run() -> RunBatch:
    return RunBatch(batch_id="batch_abc", executor_id="gpu-1", attempt=3, lease_token="lease_x", terms=TERMS,
                    model="smollm2", total_lines=40, rejections_object_key="rejections/batch_abc.jsonl", shard=1,
                    layout=ShardLayout(shards=2, span=20))


def finalize() -> FinalizeBatch:
    return FinalizeBatch(batch_id="batch_abc", executor_id="gpu-1", reason="cancelled", terms=TERMS,
                         unrun_code="authorization_revoked")


def test_a_version_1_created_fact_decodes_to_the_terms_and_identity_of_a_version_2_one() -> None:
    old, new = decode_event(CREATED_V1), decode_event(created().model_dump_json().encode())
    assert isinstance(old, BatchCreated) and isinstance(new, BatchCreated)
    assert (old.version, new.version) == (1, 2)
    assert old.terms == new.terms == TERMS
    assert old.model_dump(exclude={"version", "event_id"}) == new.model_dump(exclude={"version", "event_id"})
    assert (old.event_id, new.event_id) == ("batch_abc:created", "batch:batch_abc:created")  # each as published


def test_a_version_1_validated_fact_decodes_to_what_validation_found_and_leaves_the_terms_to_created() -> None:
    old = decode_event(VALIDATED_V1)
    new = BatchValidated(aggregate_id="batch_abc", occurred_at=1_700_000_001_000, total_lines=40, model="smollm2",
                         rejected_lines=2, rejections_object_key="rejections/batch_abc.jsonl", error_count=3,
                         counts_by_code={"invalid_json": 3})
    assert isinstance(old, BatchValidated) and old.version == 1
    assert old.model_dump(exclude={"version", "event_id"}) == decode_event(new.model_dump_json().encode()).model_dump(
        exclude={"version", "event_id"})
    assert "owner_key_id" not in json.loads(new.model_dump_json())


def test_a_created_fact_without_its_expiry_is_refused_as_before() -> None:
    flat = json.loads(CREATED_V1)
    del flat["expires_at"]
    with pytest.raises(ValidationError):
        decode_event(json.dumps(flat).encode())


@pytest.mark.parametrize(("command", "flat"), [(run, RUN_V1), (finalize, FINALIZE_V1)])
def test_protocol_1_gets_the_command_byte_for_byte_as_before(command: type, flat: bytes) -> None:
    assert command().wire(1) == flat


@pytest.mark.parametrize(("command", "flat"), [(run, RUN_V1), (finalize, FINALIZE_V1)])
def test_a_new_executor_takes_a_command_flat_or_nested(command: type, flat: bytes) -> None:
    sent = command()
    contract = type(sent)
    nested = sent.wire(2)
    assert json.loads(nested)["terms"]["owner_key_id"] == "key_owner" and "owner_key_id" not in json.loads(nested)
    assert contract.model_validate_json(nested) == sent
    old_flat = contract.model_validate_json(flat)
    assert old_flat.terms == TERMS.model_copy(update={"expires_at": None} if contract is FinalizeBatch else {})
    assert old_flat.msg_id == sent.msg_id


class RunBatchV1(BaseModel):
    """The run command as an executor from before nested terms decodes it."""

    batch_id: str
    executor_id: str
    attempt: int
    lease_token: str
    owner_key_id: str
    model: str
    endpoint: Endpoint
    input_object_key: str
    total_lines: int
    rejections_object_key: str | None = None
    shard: int = 0
    layout: ShardLayout = ShardLayout()
    output_expires_after_s: int | None = None
    created_at: int = 0
    expires_at: int | None = None


def test_an_old_executor_refuses_a_nested_command_and_takes_the_flat_one() -> None:
    with pytest.raises(ValidationError):
        RunBatchV1.model_validate_json(run().wire(2))
    old = RunBatchV1.model_validate_json(run().wire(1))
    assert old.model_dump(exclude=set(TERM_FIELDS)) == run().model_dump(exclude={"terms"})
    assert BatchTerms.model_validate(old.model_dump()) == TERMS


def test_an_executor_that_says_nothing_speaks_protocol_1_and_a_made_up_protocol_is_refused() -> None:
    advert = {"executor_id": "gpu-1", "engine": "llamacpp", "engine_version": "1", "models": [],
              "loaded_models": [], "devices": [], "slots": 1, "heartbeat_at": 0}
    assert ExecutorAdvert.model_validate(advert).protocol == 1
    with pytest.raises(ValidationError):
        ExecutorAdvert.model_validate({**advert, "protocol": 10**9})
