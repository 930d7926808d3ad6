"""What the scheduler should do now, given its book of batches and the live fleet: a pure function. A batch is cut
into units (`unit_layout`), each leased to one executor as an attempt; every tick fills the executors' free places
(`parallel_attempts` each) round-robin, each from the batch the fair queue names."""

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.events.batch import ShardLayout
from contracts.events.executor import ExecutorAdvert
from contracts.lifecycle import EndReason
from services.scheduler.actions import (
    QUEUED,
    Action,
    Assign,
    DeclareLost,
    FenceAttempt,
    Finalize,
    Policy,
    StopRevoked,
    Wait,
)
from services.scheduler.book import CONTROL_PLANE, BatchPlan, Book
from services.scheduler.domain import HEARTBEAT_FRESH_MS, free_bytes
from services.scheduler.fair_share import FairQueue, QueuedBatch, is_urgent
from services.scheduler.fleet_view import FleetView, Lane
from services.scheduler.placement import PLACEMENT_WITHDRAWN

MAX_ATTEMPTS = 3
"""Failed attempts of one unit that committed nothing, before the batch fails."""
CANCEL_GRACE_MS = 30_000
"""How long a running attempt gets to wind down a cancel itself before it is fenced and finalized for it."""
DEFAULT_POLICY = Policy()
def decide(book: Book, adverts: list[ExecutorAdvert], catalogue: Catalogue, now_ms: int,
           policy: Policy = DEFAULT_POLICY, rates: Mapping[str, float] | None = None,
           listening_since_ms: int = 0) -> list[Action]:
    """Every act due now: losses declared, leases fenced, batches ended, and free executor places filled with units
    in fair-share order. `rates`: the fleet's measured lines per second per model (for urgency near a deadline).
    `listening_since_ms`: since when executors' adverts could reach the bucket (the term's start: they are written
    through a scheduler); nobody is lost before an advert's lifetime has passed since, so an outage of every
    scheduler longer than an advert lasts fences no executor's work."""
    heard = book.last_heard(adverts)
    newly_listening = now_ms - listening_since_ms <= HEARTBEAT_FRESH_MS
    alive = {executor_id for executor_id, last_seen in heard.items()
             if newly_listening or now_ms - last_seen <= HEARTBEAT_FRESH_MS}
    # Work goes only to admitted executors alive by the very measure that fences their attempts (one declared lost
    # gets none until it heartbeats again); lost by `last_heard` (one scan of the bucket may miss an advert).
    live = {advert.executor_id: advert for advert in adverts
            if advert.executor_id in book.admitted and advert.executor_id in alive}
    actions: list[Action] = [DeclareLost(executor_id, last_seen) for executor_id, last_seen in heard.items()
                             if executor_id not in alive]
    fleet = FleetView(live, catalogue, now_ms, book.placements)
    wanting: list[tuple[BatchPlan, CatalogueModel]] = []
    for plan in book.open.values():
        upkeep, model = _upkeep(plan, book, fleet, alive, now_ms, policy)
        actions += upkeep
        if model is not None:
            wanting.append((plan, model))
    return actions + _hand_out(wanting, book, fleet, now_ms, policy, rates or {})


def _upkeep(plan: BatchPlan, book: Book, fleet: FleetView, alive: set[str], now_ms: int,
            policy: Policy) -> tuple[list[Action], CatalogueModel | None]:
    """What one open batch needs now, and its model when it has units to hand out."""
    if plan.cancel_requested_at_ms is not None:  # an accepted cancel ends `cancelled`, even past the window
        return _end_early(plan, fleet, alive, now_ms, "cancelled", "batch_cancelled", "The batch was cancelled."), None
    if plan.terms.owner_key_id in book.revoked_keys and not plan.finalizing:  # the cancel ends it as any cancel does
        return [StopRevoked(plan)], None
    if now_ms >= plan.expires_at_ms:
        return _end_early(plan, fleet, alive, now_ms, "expired", "batch_expired", "The completion window ended."), None
    actions = _fences(plan, book, fleet, alive) if plan.running_units else []
    if plan.phase != "validated" or plan.model is None or plan.held:
        return actions, None
    if plan.all_finished:
        # Several units finished: one finalizer assembles the files (a single unit finalizes itself).
        return (actions if plan.running else [*actions, *_finalize(plan, fleet, alive, "completed")]), None
    for unit in plan.retry_units:
        if plan.shard(unit).strikes >= MAX_ATTEMPTS:
            tried = ", ".join(sorted(plan.shard(unit).tried_executors))
            # Failed at run time: the other units stop, then a finalizer delivers every committed line.
            return [*actions, *_end_early(plan, fleet, alive, now_ms, "failed", "attempts_exhausted",
                                          f"{MAX_ATTEMPTS} attempts failed without committing a line; the "
                                          f"executors tried were {tried}.")], None
    # A batch refused now still accounts for every line: what ran is delivered, the rest go to the error file.
    model = fleet.model(plan.model)
    if model is None:
        return [*actions, *_end_early(plan, fleet, alive, now_ms, "failed", "model_unavailable",
                                      f"Model {plan.model} is no longer in the catalogue.")], None
    if plan.layout is None and plan.queued_before + plan.total_lines > policy.max_queued_lines:
        return [*actions, *_end_early(
            plan, fleet, alive, now_ms, "failed", "enqueued_request_limit_exceeded",
            f"This batch's {plan.total_lines} lines would bring your queued lines past the limit of "
            f"{policy.max_queued_lines}; wait for running batches to finish, or split the file.")], None
    return actions, (model if plan.pending_count() > 0 else None)


def _fences(plan: BatchPlan, book: Book, fleet: FleetView, alive: set[str]) -> list[Action]:
    """Running attempts whose lease ends: executor lost or restarted; then those the batch may no longer run on."""
    dead: list[Action] = []
    misplaced: list[Action] = []
    for _, run in plan.running_shards():
        executor_id = run.executor_id
        assert executor_id is not None
        if executor_id not in alive:
            dead.append(FenceAttempt(plan, run.attempt, executor_id, "executor_lost",
                                     f"Executor {executor_id} stopped sending heartbeats."))
        elif book.incarnations.get(executor_id, 0) > run.running_since_ms:
            dead.append(FenceAttempt(plan, run.attempt, executor_id, "executor_restarted",
                                     f"Executor {executor_id} restarted while running attempt {run.attempt}."))
        elif not fleet.allows(executor_id, plan):
            misplaced.append(FenceAttempt(plan, run.attempt, executor_id, PLACEMENT_WITHDRAWN,
                                          f"Executor {executor_id}'s provider may no longer run this batch."))
    return dead + misplaced


@dataclass
class _Units:
    """One batch's units to hand out this tick, in order: retries first, then fresh ones."""

    plan: BatchPlan
    layout: ShardLayout
    retries: list[int]
    fresh: Iterator[int]
    attempt: int

    def next_unit(self) -> int | None:
        return self.retries.pop(0) if self.retries else next(self.fresh, None)

    def assign(self, executor_id: str, unit: int) -> Assign:
        self.attempt += 1
        return Assign(self.plan, executor_id, self.attempt, unit, self.layout)


def _hand_out(wanting: list[tuple[BatchPlan, CatalogueModel]], book: Book, fleet: FleetView, now_ms: int,
              policy: Policy, rates: Mapping[str, float]) -> list[Action]:
    """Fill every live executor's free places: first units whose last attempt failed (elsewhere when possible), then
    round-robin over the executors, each unit from the batch the fair queue names for the models it can take."""
    if not wanting:
        return []
    running = [plan for plan in book.open.values() if plan.running_units]
    load = Counter(run.executor_id for plan in running for _, run in plan.running_shards())
    places = {executor_id: advert.parallel_attempts - load[executor_id]
              for executor_id, advert in fleet.live.items() if advert.parallel_attempts > load[executor_id]}
    if not places and not any(load[e] < a.parallel_attempts + a.guest_attempts for e, a in fleet.live.items()):
        return _waits(wanting, fleet)
    lanes = {plan.batch_id: fleet.lane(plan, model) for plan, model in wanting}
    by_key = {lane.key: lane for lane in lanes.values()}
    serves = _servable(by_key.values(), fleet, places)
    units: dict[str, _Units] = {}
    actions: list[Action] = []
    queued: list[QueuedBatch] = []
    for plan, model in _contenders(wanting, lanes, fleet, load, rates, now_ms):
        layout = plan.layout or fleet.layout(plan.total_lines, model, policy)
        plan_units = units[plan.batch_id] = _Units(plan, layout, [], iter(range(plan.touched + 1, layout.shards)),
                                                   plan.attempt)
        retried = 0
        for unit in sorted(plan.retry_units):
            executor_id = _retry_on(plan, unit, lanes[plan.batch_id].key, serves, places)
            if executor_id is None:
                plan_units.retries.append(unit)
                continue
            actions.append(plan_units.assign(executor_id, unit))
            places[executor_id] -= 1
            retried += plan.unit_lines(unit)
        pending, in_flight = plan.pending_lines() - retried, plan.in_flight_lines() + retried
        queued.append(QueuedBatch(plan.batch_id, plan.owner, plan.organization_id, lanes[plan.batch_id].key,
                                  plan.validated_order, plan.expires_at_ms, pending, pending + in_flight, in_flight,
                                  unit_lines=layout.span or plan.total_lines))
    queued += [QueuedBatch(plan.batch_id, plan.owner, plan.organization_id, plan.model or "", plan.validated_order,
                           plan.expires_at_ms, 0, in_flight, in_flight)
               for plan in running if plan.batch_id not in units
               for in_flight in (plan.in_flight_lines(),)]  # they hand out nothing, but count in their owners' share
    # The queue keys batches by lane (a model, narrowed by placement where it must be); rates are the model's.
    lane_rates = {key: rates[lane.model.id] for key, lane in by_key.items() if lane.model.id in rates}
    queue = FairQueue(queued, policy.weights, {**rates, **lane_rates}, now_ms)
    turn = sorted((e for e in places if places[e] > 0 and serves[e]),
                  key=lambda e: (load[e] / fleet.live[e].parallel_attempts, free_bytes(fleet.live[e]), e))
    while turn:
        next_turn = []
        for executor_id in turn:
            taken = queue.take(serves[executor_id], policy.unit_max_lines)
            if taken is None:
                continue  # nothing left for the models it serves
            batch, _ = taken
            plan_units = units[batch.batch_id]
            next_unit = plan_units.next_unit()
            if next_unit is None:
                batch.pending_lines = 0  # the estimate ran ahead of the units left
                next_turn.append(executor_id)
                continue
            actions.append(plan_units.assign(executor_id, next_unit))
            places[executor_id] -= 1
            if places[executor_id] > 0:
                next_turn.append(executor_id)
        turn = next_turn
    actions += _guests(queue, units, fleet, load, actions, policy, by_key)
    given = {action.plan.batch_id for action in actions if isinstance(action, Assign)}
    return actions + _waits([(plan, model) for plan, model in wanting if plan.batch_id not in given], fleet)


def _contenders(wanting: list[tuple[BatchPlan, CatalogueModel]], lanes: Mapping[str, Lane], fleet: FleetView,
                load: Counter[str | None], rates: Mapping[str, float], now_ms: int,
                ) -> list[tuple[BatchPlan, CatalogueModel]]:
    """The batches a unit may come from this tick (in `wanting`'s order): a tick hands out at most `budget` units,
    each from the head of an owner's queue of one lane (FIFO), so only the first batches of each queue can be
    reached, besides urgent ones and units to retry. A batch whose lines ran out under the queue's estimate is passed
    over once it gave a unit, so twice the budget is enough. The others still count in their owners' shares as the
    batches running. A tick's cost then grows with owners and places, not with every batch queued behind them."""
    budget = sum(max(advert.parallel_attempts + advert.guest_attempts - load[executor_id], 0)
                 for executor_id, advert in fleet.live.items())
    reach = 2 * budget + 1
    queues: dict[tuple[str, str], list[BatchPlan]] = {}
    for plan, _ in wanting:
        queues.setdefault((lanes[plan.batch_id].key, plan.owner), []).append(plan)
    if all(len(queue) <= reach for queue in queues.values()):
        return wanting
    passed: set[str] = set()
    for queue in queues.values():
        if len(queue) > reach:
            queue.sort(key=lambda plan: plan.validated_order)
            rate = rates.get(lanes[queue[0].batch_id].model.id, 0.0)
            passed.update(plan.batch_id for plan in queue[reach:] if not plan.retry_units and not is_urgent(
                plan.pending_lines() + plan.in_flight_lines(), plan.expires_at_ms, rate, now_ms))
    return [(plan, model) for plan, model in wanting if plan.batch_id not in passed]


def _retry_on(plan: BatchPlan, unit: int, lane: str, serves: dict[str, set[str]], places: dict[str, int]) -> str | None:
    """Where a failed unit runs again: an executor that has not tried it if one is free (the one that failed it may be
    why), the one with the most free places first."""
    free = [executor_id for executor_id, left in places.items() if left > 0 and lane in serves[executor_id]]
    tried = plan.shard(unit).tried_executors
    fresh = [executor_id for executor_id in free if executor_id not in tried]
    return max(fresh or free, key=lambda e: (places[e], e), default=None)


def _guests(queue: FairQueue, units: dict[str, "_Units"], fleet: FleetView, load: Counter[str | None],
            given: list[Action], policy: Policy, lanes: dict[str, Lane]) -> list[Action]:
    """Units for users with nothing in flight, in the guest places of executors whose own are all taken: a
    newcomer's small batch starts at the next free engine slot, not after the units in hand."""
    held = load + Counter(action.executor_id for action in given if isinstance(action, Assign))
    guests = {executor_id: advert.parallel_attempts + advert.guest_attempts - held[executor_id]
              for executor_id, advert in fleet.live.items()
              if held[executor_id] < advert.parallel_attempts + advert.guest_attempts}
    serves = _servable(lanes.values(), fleet, guests)
    actions: list[Action] = []
    for executor_id in sorted(guests, key=lambda e: (-guests[e], e)):
        while guests[executor_id] > 0:
            taken = queue.take(serves[executor_id], policy.unit_max_lines, newcomers_only=True)
            if taken is None:
                break
            next_unit = units[taken[0].batch_id].next_unit()
            if next_unit is None:
                taken[0].pending_lines = 0
                continue
            actions.append(units[taken[0].batch_id].assign(executor_id, next_unit))
            guests[executor_id] -= 1
    return actions


def _servable(lanes: Iterable[Lane], fleet: FleetView, places: dict[str, int]) -> dict[str, set[str]]:
    """Executor id → the queued lanes (whose placement allows it) it may take a unit of now: of models it has
    loaded, or, when no allowed executor with that model loaded has a free place, that it can load."""
    serves: dict[str, set[str]] = {executor_id: set() for executor_id in places}
    for lane in lanes:
        model = lane.model
        able = [advert for advert in fleet.able(model)
                if advert.executor_id in places and fleet.allows(advert.executor_id, lane.plan)]
        warm = [advert for advert in able if model.id in advert.loaded_models]
        for advert in warm or able:
            serves[advert.executor_id].add(lane.key)
    return serves


def _waits(unserved: list[tuple[BatchPlan, CatalogueModel]], fleet: FleetView) -> list[Action]:
    """Why a batch that got nothing and runs nothing waits, said once. One only waiting for a busy executor is told
    its place by the standings; here only when that replaces a reason that no longer holds."""
    actions: list[Action] = []
    for plan, model in unserved:
        if plan.running:
            continue
        reason, stated = fleet.why_waiting(plan, model), plan.waiting_reason
        if reason != stated and not (reason.startswith(QUEUED) and (stated is None or stated.startswith(QUEUED))):
            actions.append(Wait(plan, reason))
    return actions


def _end_early(plan: BatchPlan, fleet: FleetView, alive: set[str], now_ms: int,
               reason: Literal["cancelled", "expired", "failed"], code: str, message: str) -> list[Action]:
    """Fence what runs (a cancel first gets a grace period to wind down itself), then finalize once."""
    grace = (reason == "cancelled" and plan.cancel_requested_at_ms is not None
             and now_ms - plan.cancel_requested_at_ms < CANCEL_GRACE_MS)
    live = fleet.live_for(plan) if grace else {}
    runs = [(run.attempt, run.executor_id) for _, run in plan.running_shards() if run.executor_id is not None]
    actions: list[Action] = [FenceAttempt(plan, attempt, executor_id, code, message)
                             for attempt, executor_id in runs if executor_id not in live]
    if len(actions) < len(runs) or plan.phase == "validating":
        # A running attempt stops and finalizes the cancel itself (or, sharded, reports its shard stopped);
        # before the verdict the file is not known to be readable.
        return actions
    failure = (code, message) if reason == "failed" else (None, None)
    return [*actions, *_finalize(plan, fleet, alive, reason, *failure)]


def _finalize(plan: BatchPlan, fleet: FleetView, alive: set[str], reason: EndReason,
              failure_code: str | None = None, failure_message: str | None = None) -> list[Action]:
    """Finalize once (`choose_finalizer`); again once the executor chosen is no longer heard from (it may have died
    with the command), or the control plane's finalize failed (it forgets it chose itself)."""
    if plan.finalizer == CONTROL_PLANE or (plan.finalizer is not None and plan.finalizer in alive):
        return []
    return [Finalize(plan, choose_finalizer(plan, fleet.live_for(plan)), reason, failure_code, failure_message)]


def choose_finalizer(plan: BatchPlan, live: dict[str, ExecutorAdvert]) -> str | None:
    """The live executor holding the latest attempt of every unit of the batch (it ran all of it). None otherwise
    (never ran, ran on several executors, or its executor is gone): the control plane finalizes it, so no executor
    ends a batch it did not run, nor writes lines another executor ran."""
    if plan.layout is None:
        return None
    holders = {plan.assignees.get(run.attempt) if run.attempt not in run.failed_attempts else None
               for run in plan.shards.values()}
    if len(holders) != 1 or len(plan.shards) < plan.layout.shards:
        return None
    (holder,) = holders
    return holder if holder is not None and holder in live else None
