"""The validator holds up to `INTAKE` created batches leased while they wait for their owner's turn, so a validator
killed N times spends N deliveries of every one of them. The server must never drop one at a delivery limit: a batch
whose last delivery was lost to a crash would have no handler left to fail it, and would stay `validating` for good
(seen: with ack_wait 3 s and max_deliver 3, three SIGKILLs left all 8 held batches of two tenants validating)."""

from services.validator.handlers import CREATED


def test_the_server_redelivers_created_batches_without_limit() -> None:
    assert CREATED.consumer_config().max_deliver == -1


def test_a_check_that_keeps_failing_is_still_given_up() -> None:
    assert CREATED.policy.max_deliver > 0  # `_Delivery._failed` gives up on this delivery and fails the batch
