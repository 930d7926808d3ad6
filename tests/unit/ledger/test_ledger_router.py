"""The ledger's table: it declares one fold of the log, of exactly the facts its rules fold, and no durable."""

from contracts.events.batch import BatchCreated, BatchProgressed, ValidationProgressed
from contracts.subjects import LEDGER_NAME
from services.ledger.handlers import ledger_router
from services.ledger.rules import _batch_facts, _facts


def test_the_ledger_declares_its_fold_of_every_fact_its_rules_fold() -> None:
    router = ledger_router()
    [follower] = router.followers
    assert follower.name == LEDGER_NAME and follower.description
    assert set(follower.contracts) == {*_facts.types(), *_batch_facts.types()}
    assert {BatchCreated, BatchProgressed} <= set(follower.contracts)
    assert ValidationProgressed not in follower.contracts
    assert not router.declared  # the fold runs on the ordered reader, not on a faststream subscriber


def test_each_call_makes_a_fresh_router() -> None:
    assert ledger_router() is not ledger_router()
