"""An admitted executor's durables are made by its scheduler when it accepts the registration, never by the executor
(services/scheduler/registration.py, `provide_durables`), on a real broker: made with the registration's policy,
brought to a later one in place (the commands waiting stay), and a durable made otherwise under the id before its
owner registered (a squatter's push consumer) replaced, so its owner can pull its commands."""

import secrets

from nats.js.api import AckPolicy, ConsumerConfig, ReplayPolicy

from contracts.commands import ExecutorRegistration
from contracts.events.executor import DeviceMemory, ExecutorAdvert
from contracts.subjects import WORK_STREAM, executor_durable, executor_finalize_durable, finalize_command, run_command
from services.executor.durables import FINALIZE_DELIVERIES, FINALIZE_PENDING, run_workers
from services.runtime.nats.bus import EventBus
from services.scheduler.registration import provide_durables


def registration(executor_id: str, parallel: int, ack_wait_s: float = 12.0, max_deliver: int = 4,
                 ) -> ExecutorRegistration:
    advert = ExecutorAdvert(executor_id=executor_id, engine="llamacpp", engine_version="1", models=["m"],
                            loaded_models=[], slots=8, heartbeat_at=0, parallel_attempts=parallel,
                            devices=[DeviceMemory(name="cpu", total_bytes=10**9, free_bytes=10**9)])
    return ExecutorRegistration(executor_id=executor_id, worker_key="wk-x", advert=advert, ack_wait_s=ack_wait_s,
                                max_deliver=max_deliver)


async def test_a_registration_makes_both_durables_with_its_policy_and_a_later_one_updates_them_in_place(
        bus: EventBus) -> None:
    executor_id = f"dur-{secrets.token_hex(4)}"
    await provide_durables(bus, executor_id, registration(executor_id, parallel=3))
    runs = await bus.js.consumer_info(WORK_STREAM, executor_durable(executor_id))
    finals = await bus.js.consumer_info(WORK_STREAM, executor_finalize_durable(executor_id))
    assert (runs.config.filter_subject, runs.config.deliver_subject) == (run_command(executor_id), None)
    assert (runs.config.ack_wait, runs.config.max_deliver, runs.config.max_ack_pending) == (12.0, 4, run_workers(3))
    assert (finals.config.filter_subject, finals.config.max_deliver, finals.config.max_ack_pending) == (
        finalize_command(executor_id), FINALIZE_DELIVERIES, FINALIZE_PENDING)

    await bus.js.publish(run_command(executor_id), b"waiting", stream=WORK_STREAM)
    await provide_durables(bus, executor_id, registration(executor_id, parallel=8, ack_wait_s=20.0))
    runs = await bus.js.consumer_info(WORK_STREAM, executor_durable(executor_id))
    assert (runs.config.ack_wait, runs.config.max_ack_pending, runs.num_pending) == (20.0, run_workers(8), 1)


async def test_a_durable_squatted_before_its_owner_registered_is_replaced_and_its_commands_still_reach_the_owner(
        bus: EventBus) -> None:
    executor_id = f"dur-{secrets.token_hex(4)}"
    name = executor_durable(executor_id)
    await bus.js.add_consumer(WORK_STREAM, ConsumerConfig(  # a push consumer: no pull could ever bind to it
        name=name, durable_name=name, filter_subject=run_command(executor_id), ack_policy=AckPolicy.EXPLICIT,
        deliver_subject=f"squat.{executor_id}"))
    await bus.js.publish(run_command(executor_id), b"for the owner", stream=WORK_STREAM)
    await provide_durables(bus, executor_id, registration(executor_id, parallel=1))
    subscription = await bus.js.pull_subscribe_bind(durable=name, stream=WORK_STREAM)
    [message] = await subscription.fetch(1, timeout=5)
    assert message.data == b"for the owner"
    await message.ack_sync()
    await subscription.unsubscribe()


async def test_a_pull_durable_of_its_filter_the_server_will_not_update_is_kept_with_the_commands_it_has_out(
        bus: EventBus) -> None:
    """A rejoin while the executor holds a command: its durable (here one whose replay policy no update changes) is
    not deleted and made again, which would hand the command out a second time at once, its deliveries counted anew."""
    executor_id = f"dur-{secrets.token_hex(4)}"
    name = executor_durable(executor_id)
    await bus.js.add_consumer(WORK_STREAM, ConsumerConfig(
        name=name, durable_name=name, filter_subject=run_command(executor_id), ack_policy=AckPolicy.EXPLICIT,
        replay_policy=ReplayPolicy.ORIGINAL, ack_wait=300))
    subscription = await bus.js.pull_subscribe_bind(durable=name, stream=WORK_STREAM)
    await bus.js.publish(run_command(executor_id), b"in hand", stream=WORK_STREAM)
    [held] = await subscription.fetch(1, timeout=5)
    await provide_durables(bus, executor_id, registration(executor_id, parallel=1))
    info = await bus.js.consumer_info(WORK_STREAM, name)
    assert (info.num_ack_pending, info.num_pending) == (1, 0), "the command in hand was handed out again"
    await held.ack_sync()
    await subscription.unsubscribe()
