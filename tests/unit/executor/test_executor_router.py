"""The executor's table of subscriptions: one router per executor id, whose durables are the ones its NATS
credentials let it create, pull from and ack, each taking its command typed, with a poison handler beside it."""

import inspect
import typing

import pytest

from contracts.commands import FinalizeBatch, RunBatch
from contracts.events.executor import GUEST_ATTEMPTS
from contracts.permissions import executor_permissions
from contracts.subjects import (
    WORK_STREAM,
    executor_acks,
    executor_durable,
    executor_finalize_durable,
    executor_pulls,
    finalize_command,
    run_command,
)
from services.executor import handlers
from services.executor.durables import FINALIZE_DELIVERIES, RUN_SPARE
from services.executor.handlers import executor_router


def test_each_executor_consumes_its_run_and_finalize_durables_on_its_own_subjects() -> None:
    router = executor_router("gpu-7", ack_wait_s=12.0, max_deliver=3)
    durables = {declared.durable.name: declared.durable for declared in router.declared.values()}
    assert set(durables) == {executor_durable("gpu-7"), executor_finalize_durable("gpu-7")}
    run, finalize = durables[executor_durable("gpu-7")], durables[executor_finalize_durable("gpu-7")]
    assert (run.stream, run.subject, run.contract) == (WORK_STREAM, run_command("gpu-7"), RunBatch)
    assert (finalize.stream, finalize.subject, finalize.contract) == (WORK_STREAM, finalize_command("gpu-7"),
                                                                      FinalizeBatch)
    assert (run.policy.ack_wait_s, run.policy.max_deliver, run.policy.max_ack_pending) == (
        12.0, 3, 2 * (1 + GUEST_ATTEMPTS) + RUN_SPARE)
    assert (finalize.policy.ack_wait_s, finalize.policy.max_deliver) == (12.0, FINALIZE_DELIVERIES)


def test_an_executor_running_attempts_at_once_handles_every_run_command_it_has_out_at_once() -> None:
    """Its run durable gives it the attempts it runs together and spare places (for commands a crashed predecessor
    held), and a worker for each: a command fetched never waits unattended while its ack wait runs."""
    router = executor_router("gpu-7", ack_wait_s=30.0, max_deliver=5, parallel_attempts=8)
    run = router.declared[executor_durable("gpu-7")].durable
    assert run.policy.max_ack_pending == run.consumer_config().max_ack_pending == 2 * (8 + GUEST_ATTEMPTS) + RUN_SPARE
    workers = {getattr(subscriber, "max_workers", 1) for subscriber in router.subscribers
               if getattr(getattr(subscriber, "config", None), "durable_name", None) == run.name}
    assert workers == {2 * (8 + GUEST_ATTEMPTS) + RUN_SPARE}


@pytest.mark.parametrize("executor_id", ["alpha", "gpu-7", "a_b"])
def test_the_executors_credentials_allow_exactly_what_its_durables_need(executor_id: str) -> None:
    publish = set(executor_permissions(executor_id).publish)
    for declared in executor_router(executor_id, 30.0, 5).declared.values():
        durable = declared.durable
        config = durable.consumer_config()
        assert (config.name, config.durable_name, config.filter_subject) == (durable.name, durable.name,
                                                                            durable.subject)
        # Pull and ack through a scheduler's relay; never made nor looked up (the scheduler makes them at
        # registration; the broker binds), and nothing asked of JetStream itself.
        assert f"{executor_pulls(executor_id)}.CONSUMER.MSG.NEXT.{WORK_STREAM}.{durable.name}" in publish
        assert executor_acks(executor_id) in publish
        assert not any(subject.startswith("$") for subject in publish)


def test_handlers_are_the_executors_own_methods_taking_their_command_typed_and_every_durable_has_a_poison_handler(
        ) -> None:
    router = executor_router("alpha", 30.0, 5)
    assert {name: declared.on_poison for name, declared in router.declared.items()} == {
        executor_durable("alpha"): handlers.Executor.fail_the_attempt,
        executor_finalize_durable("alpha"): handlers.Executor.fail_the_batch}
    for handler, contract in ((handlers.Executor.run, RunBatch), (handlers.Executor.finalize, FinalizeBatch)):
        command = list(inspect.signature(handler).parameters.values())[1]  # after self
        assert typing.get_type_hints(handler)[command.name] is contract
