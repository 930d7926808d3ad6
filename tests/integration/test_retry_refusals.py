"""Retries refused with a 409, never a 500: one racing a DELETE of the batch's input or error file (the object leaves
the store between the retry's read of the file's record and its read of the object) answers as for a file deleted
before; one asked again with other parameters names the earlier retry, not an `Idempotency-Key` the client never sent
(the retry's own derived key once leaked into the message and `param`)."""

from services.gateway.context import DEPS
from tests.integration.gateway_support import Gateway
from tests.integration.test_storage_quota import cancelled_batch, gateways

__all__ = ["gateways"]


async def _remove_object(gateway: Gateway, file_id: str) -> None:
    """What a concurrent DELETE does to the file's bytes, before the ledger folds its `deleted` fact."""
    deps = gateway.client.app[DEPS]
    record = await deps.read_model.get_file(file_id)
    assert record is not None and not record.deleted
    await deps.store.remove(record.object_key)


async def test_a_retry_whose_input_object_is_gone_answers_409_input_file_deleted(
        gateways: list[Gateway]) -> None:
    key = await gateways[0].new_key()
    batch = await cancelled_batch(gateways[0], key)
    await _remove_object(gateways[0], str(batch["input_file_id"]))

    answer = await gateways[0].client.post(f"/v1/batches/{batch['id']}/retry", headers=key, json={})

    assert answer.status == 409, await answer.text()
    assert (await answer.json())["error"]["code"] == "input_file_deleted"


async def test_a_retry_whose_error_file_object_is_gone_answers_409_nothing_to_retry(
        gateways: list[Gateway]) -> None:
    key = await gateways[0].new_key()
    batch = await cancelled_batch(gateways[0], key)
    await _remove_object(gateways[0], str(batch["error_file_id"]))

    answer = await gateways[0].client.post(f"/v1/batches/{batch['id']}/retry", headers=key, json={})

    assert answer.status == 409, await answer.text()
    assert (await answer.json())["error"]["code"] == "nothing_to_retry"


async def test_a_second_retry_with_other_parameters_names_the_first_retry(gateways: list[Gateway]) -> None:
    key = await gateways[0].new_key()
    batch = await cancelled_batch(gateways[0], key)
    first = await gateways[0].client.post(f"/v1/batches/{batch['id']}/retry", headers=key, json={})
    assert first.status == 200, await first.text()
    again = await gateways[0].client.post(f"/v1/batches/{batch['id']}/retry", headers=key, json={})
    assert again.status == 200 and (await again.json())["id"] == (await first.json())["id"]

    other = await gateways[0].client.post(f"/v1/batches/{batch['id']}/retry", headers=key,
                                          json={"completion_window": "48h"})

    assert other.status == 409, await other.text()
    error = (await other.json())["error"]
    assert error["code"] == "already_retried" and error["param"] is None
    assert (await first.json())["id"] in error["message"] and "Idempotency-Key" not in error["message"]
