"""Folds as tables of rules: how a rule is found for an event, and which facts each fold has a rule for."""

from typing import get_args

import pytest

from contracts.events.batch import BatchCancelled, BatchCompleted, BatchEnded, BatchEvent, ValidationProgressed
from contracts.events.envelope import Event
from contracts.events.file import FileUsed
from contracts.events.key import KeyRevoked
from contracts.events.registry import AnyEvent
from services.executor.attempts import _rules as attempt_rules
from services.ledger.rules import _batch_facts, _facts
from services.runtime.nats.foldrules import FoldRules
from services.scheduler.book import _fleet_rules, _plan_rules

EVERY_EVENT: tuple[type[Event], ...] = get_args(get_args(AnyEvent)[0])


def test_an_event_is_folded_by_the_rule_registered_for_its_own_type() -> None:
    rules = FoldRules[str]()

    @rules.on(BatchCompleted)
    def completed(event: BatchCompleted) -> str:
        return "completed"

    @rules.on(BatchEnded)
    def ended(event: BatchEnded) -> str:
        return "ended"

    assert rules.rule_for(BatchCompleted) is completed
    assert rules.rule_for(BatchCancelled) is ended  # no rule of its own: its base's


def test_a_type_without_a_rule_is_left_alone() -> None:
    rules = FoldRules[None]()
    rules.on(BatchCompleted)(lambda event: None)
    assert rules.rule_for(ValidationProgressed) is None
    assert ValidationProgressed not in rules


def test_a_second_rule_for_the_same_type_is_refused() -> None:
    rules = FoldRules[None]()
    rules.on(BatchCompleted)(lambda event: None)
    with pytest.raises(ValueError, match="BatchCompleted already has a rule"):
        rules.on(BatchCompleted)(lambda event: None)


def test_the_ledger_folds_every_fact_but_the_informational_ones() -> None:
    informational = {ValidationProgressed, FileUsed}
    unfolded = {t for t in EVERY_EVENT if t not in _facts and t not in _batch_facts}
    assert unfolded == informational


def test_ledger_rules_for_batch_facts_never_create_a_batch() -> None:
    assert all(issubclass(t, BatchEvent) for t in EVERY_EVENT if t in _batch_facts)
    assert not any(t in _facts and t in _batch_facts for t in EVERY_EVENT)


@pytest.mark.parametrize("rules", [_fleet_rules, _plan_rules, attempt_rules], ids=["fleet", "plan", "attempts"])
def test_the_scheduler_and_the_executor_ignore_file_and_key_facts_but_a_revocation(rules: FoldRules[None]) -> None:
    """A revoked key's batches are stopped by the scheduler's book (whatever the revocation's listing saw)."""
    folded = {t for t in EVERY_EVENT if t in rules and t.kind in ("file", "key", "user", "organization")}
    assert folded == ({KeyRevoked} if rules is _fleet_rules else set())
