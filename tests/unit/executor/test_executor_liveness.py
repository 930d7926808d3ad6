"""The executor stays in the fleet: its first advert waits out a broker that cannot write, it renews its broker
admission before it expires, and after a silence longer than its advert lives (a pause) it registers again before
it heartbeats on."""

import asyncio
import time
from types import SimpleNamespace

import nats.errors
import pytest

import services.executor.adapters.advert as advert_module
from contracts.commands import AdmissionTerms
from contracts.events.executor import ExecutorAdvert
from services.executor.adapters.admission import expires_in, renew_in
from services.executor.adapters.advert import OwnAdvert
from services.executor.heartbeat import SILENCE_MS, heartbeat
from services.runtime.nats.client import ReadmittingClient

START = 2_000_000_000_000


@pytest.mark.parametrize(("expires_in_s", "renew_after_s"), [(3600.0, 3540.0), (4.0, 3.0), (0.0, 0.0)])
def test_an_admission_is_renewed_a_quarter_of_its_life_before_it_expires_but_at_most_a_minute_before(
        expires_in_s: float, renew_after_s: float) -> None:
    assert renew_in(expires_in_s) == renew_after_s


@pytest.mark.parametrize(("ttl_s", "connected_s_ago", "left_s"), [
    (60.0, 20.0, 40.0), (60.0, 90.0, 0.0), (None, 20.0, None), (60.0, None, None)])
async def test_an_admission_has_its_lifetime_left_less_the_time_since_the_connection_last_connected(
        ttl_s: float | None, connected_s_ago: float | None, left_s: float | None) -> None:
    """The lifetime a scheduler says (the executor may not ask the server: `services/authz/relay.py`)."""
    client = ReadmittingClient()
    client.connected_at = None if connected_s_ago is None else time.monotonic() - connected_s_ago
    asked: list[str] = []

    async def request(subject: str, payload: bytes, **options: float) -> SimpleNamespace:
        asked.append(subject)
        return SimpleNamespace(data=AdmissionTerms(ttl_s=ttl_s).model_dump_json().encode())

    client.request = request  # type: ignore[method-assign,assignment]
    left = await expires_in(client, "alpha")
    assert asked == ["svc.admission.alpha"]
    assert left == left_s if left_s is None or left_s == 0.0 else left == pytest.approx(left_s, abs=1.0)


class RecordingFleet:
    """Takes each advert, saying what the leader says then: registered (True/False/None), or no scheduler at all."""

    def __init__(self, log: list[str], said: dict[int, bool | type[Exception] | None] | None = None) -> None:
        self.log = log
        self.said = said or {}

    async def advertise(self, advert: ExecutorAdvert) -> bool | None:
        said = self.said.get(advert.heartbeat_at - START, True)
        if isinstance(said, type):
            self.log.append(f"unheard@{advert.heartbeat_at - START}")
            raise said
        self.log.append(f"beat@{advert.heartbeat_at - START}")
        return said


def advert_at(heartbeat_at: int) -> ExecutorAdvert:
    return ExecutorAdvert(executor_id="e1", engine="llamacpp", engine_version="1", models=[], loaded_models=[],
                          devices=[], slots=1, heartbeat_at=heartbeat_at)


async def beats(times_ms: list[int], answers: list[bool],
                said: dict[int, bool | type[Exception] | None] | None = None) -> list[str]:
    """What the heartbeat does when its clock reads `times_ms` in turn; each rejoin gets the next answer; `said`: what
    the leader answers the advert of a moment (registered by default)."""
    log: list[str] = []
    stop = asyncio.Event()
    clock = iter(times_ms)
    replies = iter(answers)

    def advert_now() -> ExecutorAdvert:
        at = next(clock, None)
        if at is None:
            stop.set()
            return advert_at(START)
        return advert_at(START + at)

    async def rejoin(advert: ExecutorAdvert) -> bool:
        answered = next(replies)
        log.append(f"rejoin@{advert.heartbeat_at - START}:{'ok' if answered else 'no answer'}")
        return answered

    await heartbeat(RecordingFleet(log, said), advert_now, 0, stop, rejoin)
    return log[:-1]  # the last beat ran while stopping


async def test_regular_heartbeats_never_register_again() -> None:
    assert await beats([0, 3_000, 6_000, 9_000], []) == ["beat@0", "beat@3000", "beat@6000", "beat@9000"]


async def test_after_a_silence_longer_than_an_advert_lives_the_executor_registers_again_before_beating() -> None:
    after = SILENCE_MS + 3_001
    assert await beats([0, 3_000, after, after + 3_000], [True]) == [
        "beat@0", "beat@3000", f"rejoin@{after}:ok", f"beat@{after}", f"beat@{after + 3_000}"]


async def test_no_heartbeat_is_sent_until_a_scheduler_answers_the_new_registration() -> None:
    after = SILENCE_MS + 1
    assert await beats([0, after, after + 3_000, after + 6_000], [False, True]) == [
        "beat@0", f"rejoin@{after}:no answer", f"rejoin@{after + 3_000}:ok", f"beat@{after + 3_000}",
        f"beat@{after + 6_000}"]


class StuckBroker:
    """A JetStream context whose publishes time out `stuck_for` times (a broker that cannot write), then are taken."""

    def __init__(self, stuck_for: int, error: type[Exception] = nats.errors.TimeoutError) -> None:
        self.stuck_for = stuck_for
        self.error = error
        self.taken: list[bytes] = []

    async def publish(self, subject: str, payload: bytes = b"", **_: object) -> None:
        if self.stuck_for > 0:
            self.stuck_for -= 1
            raise self.error
        self.taken.append(payload)


async def test_the_first_advert_waits_for_a_scheduler_to_take_it_however_long_none_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An admitted executor's advert is written through a scheduler: one started before any scheduler (or while all
    restart) waits, and does not crash once the bucket's own wait has passed."""
    monkeypatch.setattr(advert_module, "FIRST_ADVERT_RETRY_S", 0.0)
    monkeypatch.setattr(advert_module, "BUCKET_WAIT_S", 0.0)
    broker = StuckBroker(stuck_for=3, error=nats.errors.NoRespondersError)
    own = OwnAdvert(broker, "e1")  # type: ignore[arg-type]

    taken = await own.advertise_first(lambda: advert_at(START), asyncio.Event())

    assert taken is not None and len(broker.taken) == 1


async def test_the_first_advert_waits_out_a_broker_that_cannot_write_and_is_made_afresh_for_each_try(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advert_module, "FIRST_ADVERT_RETRY_S", 0.0)
    broker = StuckBroker(stuck_for=3)
    made = iter(range(10))
    own = OwnAdvert(broker, "e1")  # type: ignore[arg-type]

    taken = await own.advertise_first(lambda: advert_at(START + next(made)), asyncio.Event())

    assert taken is not None and taken.heartbeat_at == START + 3
    assert [ExecutorAdvert.model_validate_json(p).heartbeat_at for p in broker.taken] == [START + 3]


async def test_an_executor_stopped_before_its_first_advert_was_taken_advertises_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advert_module, "FIRST_ADVERT_RETRY_S", 0.01)
    broker = StuckBroker(stuck_for=1_000_000)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, stop.set)

    assert await OwnAdvert(broker, "e1").advertise_first(lambda: advert_at(START), stop) is None  # type: ignore[arg-type]
    assert broker.taken == []


async def test_while_no_scheduler_runs_its_silence_is_no_reason_to_register_again() -> None:
    """Its adverts are written through a scheduler: with none at all, none can take it for lost, and a new epoch
    would fence the work in hand (every scheduler restarting, longer than an advert lives)."""
    outage = list(range(3_000, SILENCE_MS + 20_000, 3_000))
    back = outage[-1] + 3_000
    assert await beats([0, *outage, back], [], dict.fromkeys(outage, nats.errors.NoRespondersError)) == [
        "beat@0", *(f"unheard@{at}" for at in outage), f"beat@{back}"]


async def test_an_executor_the_leader_counts_lost_registers_again_before_beating_on() -> None:
    """A partition: a leader on the other side took it for lost while its adverts found no scheduler."""
    assert await beats([0, 3_000, 6_000, 9_000], [True], {3_000: False}) == [
        "beat@0", "beat@3000", "rejoin@6000:ok", "beat@6000", "beat@9000"]


async def test_a_leader_still_reading_the_log_is_no_reason_to_register_again() -> None:
    assert await beats([0, 3_000, 6_000], [], {3_000: None}) == ["beat@0", "beat@3000", "beat@6000"]
