"""Who gets the next unit of work: an urgent batch (one that at its model's measured rate would miss its window)
first, earliest deadline first; else fair share of the lines in flight between organisations, then their users (by
weight), FIFO within a user. Built once per tick; a `take` counts its unit at once and costs O(log owners) per model
served (lazily refreshed heaps): a tick with a thousand executors and ten thousand queued batches stays in ms."""

import bisect
import heapq
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

URGENCY_SAFETY = 2.0
"""A batch is urgent once twice its estimated remaining run time no longer fits before its deadline."""
NO_RATE = 1e-9
SOLO = "user:"
"""The organisation of a user who has none."""
Entry = tuple[float, int, str]
"""A heap entry: (lines in flight per weight, the head batch's validated order, user or organisation)."""


@dataclass
class QueuedBatch:
    """A batch with lines still to hand out, as the queue needs it."""

    batch_id: str
    user: str
    organization: str | None
    model: str
    validated_order: int
    """Its place among validated batches (1 = first): FIFO within an owner."""
    expires_at_ms: int
    pending_lines: int
    """Lines neither committed nor in flight."""
    remaining_lines: int
    """Lines not committed (pending and in flight)."""
    in_flight_lines: int = 0
    unit_lines: int = 0
    """The size of the batch's units (its layout's span); 0: whatever the taker asks for."""

    @property
    def org(self) -> str:
        return self.organization if self.organization is not None else SOLO + self.user


def is_urgent(remaining_lines: int, expires_at_ms: int, rate: float, now_ms: int) -> bool:
    """Whether a batch would miss its window at its model's measured `rate` (lines per second; none: never)."""
    if rate <= NO_RATE:
        return False
    return now_ms + remaining_lines / rate * 1000 * URGENCY_SAFETY >= expires_at_ms


@dataclass(frozen=True)
class Weights:
    """Relative shares (default 1 each): an owner of weight 2 gets twice the lines in flight of one of weight 1."""

    users: Mapping[str, float] = field(default_factory=dict)
    organizations: Mapping[str, float] = field(default_factory=dict)

    def of_user(self, user: str) -> float:
        return max(self.users.get(user, 1.0), NO_RATE)

    def of_org(self, org: str) -> float:
        """A user without an organisation is one of its own, of the user's weight."""
        if org.startswith(SOLO):
            return self.of_user(org.removeprefix(SOLO))
        return max(self.organizations.get(org, 1.0), NO_RATE)


class FairQueue:
    def __init__(self, batches: Iterable[QueuedBatch], weights: Weights = Weights(),
                 rates: Mapping[str, float] | None = None, now_ms: int = 0) -> None:
        """`rates`: lines per second the fleet runs each model at (measured); a model with none is never urgent."""
        self.weights = weights
        self.rates = rates or {}
        self.now_ms = now_ms
        self._user_in_flight: dict[str, int] = {}
        self._org_in_flight: dict[str, int] = {}
        self._queues: dict[tuple[str, str], _UserQueue] = {}
        """(model, user) → the user's batches of that model, FIFO."""
        self._users: dict[tuple[str, str], list[Entry]] = {}
        """(model, organisation) → a heap of its users' entries."""
        self._orgs: dict[str, list[Entry]] = {}
        """Model → a heap of organisations' entries (their users' earliest head order); an entry whose key grew
        since it was pushed is pushed again when it comes up."""
        self._urgent: dict[str, list[QueuedBatch]] = {}
        """Model → urgent batches, earliest deadline first."""
        members: dict[tuple[str, str], set[str]] = {}
        for batch in batches:
            self._user_in_flight[batch.user] = self._user_in_flight.get(batch.user, 0) + batch.in_flight_lines
            self._org_in_flight[batch.org] = self._org_in_flight.get(batch.org, 0) + batch.in_flight_lines
            if batch.pending_lines <= 0:
                continue
            if self._is_urgent(batch):
                self._urgent.setdefault(batch.model, []).append(batch)
            self._queues.setdefault((batch.model, batch.user), _UserQueue()).batches.append(batch)
            members.setdefault((batch.model, batch.org), set()).add(batch.user)
        for queue in self._queues.values():
            queue.batches.sort(key=lambda b: b.validated_order)
        for (model, org), users in members.items():
            heap = self._users[(model, org)] = [self._user_entry(model, user) for user in users]
            heapq.heapify(heap)
            self._orgs.setdefault(model, []).append(self._org_entry(model, org))
        for heap in self._orgs.values():
            heapq.heapify(heap)
        for urgent in self._urgent.values():
            urgent.sort(key=lambda b: (b.expires_at_ms, b.validated_order), reverse=True)

    def _is_urgent(self, batch: QueuedBatch) -> bool:
        return is_urgent(batch.remaining_lines, batch.expires_at_ms, self.rates.get(batch.model, 0.0), self.now_ms)

    def take(self, models: Collection[str], max_lines: int,
             newcomers_only: bool = False) -> tuple[QueuedBatch, int] | None:
        """The batch the next unit for an executor serving `models` comes from and the unit's size (at most
        `max_lines`, and the batch's `unit_lines` if set), counted in flight; None when nothing is left for those
        models. `newcomers_only`: only for a user with nothing in flight (a guest place), else None."""
        chosen = self._next_fair(models) if newcomers_only else self._next_urgent(models) or self._next_fair(models)
        if chosen is None or (newcomers_only and self._user_in_flight.get(chosen.user, 0) > 0):
            return None
        lines = min(max_lines, chosen.unit_lines or max_lines, chosen.pending_lines)
        chosen.pending_lines -= lines
        chosen.in_flight_lines += lines
        self._user_in_flight[chosen.user] = self._user_in_flight.get(chosen.user, 0) + lines
        self._org_in_flight[chosen.org] = self._org_in_flight.get(chosen.org, 0) + lines
        # The chosen owner's keys grew: its entries are refreshed (other models' when they come up).
        if (users := self._users.get((chosen.model, chosen.org))) is not None:
            self._fresh_top_user(chosen.model, users)
        return chosen, lines

    def _next_urgent(self, models: Collection[str]) -> QueuedBatch | None:
        best: QueuedBatch | None = None
        for model in models:
            urgent = self._urgent.get(model)
            while urgent and urgent[-1].pending_lines <= 0:
                urgent.pop()
            if urgent and (best is None or (urgent[-1].expires_at_ms, urgent[-1].validated_order)
                           < (best.expires_at_ms, best.validated_order)):
                best = urgent[-1]
        return best

    def _next_fair(self, models: Collection[str]) -> QueuedBatch | None:
        best: Entry | None = None
        best_model = ""
        for model in models:
            top = self._top_org(model)
            if top is not None and (best is None or top[:2] < best[:2]):
                best, best_model = top, model
        if best is None:
            return None
        user = self._users[(best_model, best[2])][0][2]
        return self._queues[(best_model, user)].head()

    def _top_org(self, model: str) -> Entry | None:
        """The model's organisation furthest below its share that has lines to hand out (its heap entry fresh)."""
        heap = self._orgs.get(model)
        while heap:
            entry = heap[0]
            users = self._users[(model, entry[2])]
            if not self._fresh_top_user(model, users):
                heapq.heappop(heap)  # nothing left there for this model
                continue
            fresh = self._org_entry(model, entry[2])
            if fresh[:2] == entry[:2]:
                return entry
            heapq.heapreplace(heap, fresh)
        return None

    def _fresh_top_user(self, model: str, users: list[Entry]) -> bool:
        """Bring the organisation's best user with lines to hand out to the top of its heap; False: none has."""
        while users:
            entry = users[0]
            if self._queues[(model, entry[2])].head() is None:
                heapq.heappop(users)
                continue
            fresh = self._user_entry(model, entry[2])
            if fresh[:2] == entry[:2]:
                return True
            heapq.heapreplace(users, fresh)
        return False

    def _user_entry(self, model: str, user: str) -> Entry:
        head = self._queues[(model, user)].head()
        return (self._user_in_flight.get(user, 0) / self.weights.of_user(user),
                head.validated_order if head is not None else 0, user)

    def _org_entry(self, model: str, org: str) -> Entry:
        users = self._users[(model, org)]
        first = min((head.validated_order for _, _, user in users
                     if (head := self._queues[(model, user)].head()) is not None), default=0)
        return self._org_in_flight.get(org, 0) / self.weights.of_org(org), first, org


@dataclass
class _UserQueue:
    batches: list[QueuedBatch] = field(default_factory=list)
    """By validated order; `at` is the next with lines to hand out."""
    at: int = 0

    def head(self) -> QueuedBatch | None:
        while self.at < len(self.batches) and self.batches[self.at].pending_lines <= 0:
            self.at += 1
        return self.batches[self.at] if self.at < len(self.batches) else None


@dataclass(frozen=True)
class Standing:
    """Where a batch stands among its model's batches, in the order the fair queue will finish them."""

    position: int
    """1 = the next of its model to finish."""
    eta_s: float | None
    """Seconds until it finishes at the model's measured rate; None without a measured rate."""


def standings(batches: Iterable[QueuedBatch], rates: Mapping[str, float],
              weights: Weights = Weights()) -> dict[str, Standing]:
    """Each batch's place and finish time if the fleet keeps its measured rate per model and shares it fairly: each
    owner with lines left runs at the rate times its share of the active weight (processor sharing). In virtual time
    an owner of weight w finishes its first c lines at c / w; real time integrates the active weight over the rate."""
    by_model: dict[str, list[QueuedBatch]] = {}
    for batch in batches:
        if batch.remaining_lines > 0:
            by_model.setdefault(batch.model, []).append(batch)
    found: dict[str, Standing] = {}
    for model, queued in by_model.items():
        found |= _model_standings(queued, rates.get(model, 0.0), weights)
    return found


def _model_standings(queued: list[QueuedBatch], rate: float, weights: Weights) -> dict[str, Standing]:
    users_per_org: dict[str, set[str]] = {}
    for batch in queued:
        users_per_org.setdefault(batch.org, set()).add(batch.user)
    # An organisation's share, split between its users by their weights.
    weight = {batch.user: weights.of_org(batch.org) * weights.of_user(batch.user)
              / sum(weights.of_user(user) for user in users_per_org[batch.org]) for batch in queued}
    finish_virtual: dict[str, float] = {}
    owner_end: dict[str, float] = {}
    done: dict[str, int] = {}
    for batch in sorted(queued, key=lambda b: b.validated_order):
        done[batch.user] = done.get(batch.user, 0) + batch.remaining_lines
        finish_virtual[batch.batch_id] = done[batch.user] / weight[batch.user]
        owner_end[batch.user] = finish_virtual[batch.batch_id]
    # Between two owners' ends the active weight is constant: segments of (virtual start, real start, weight).
    segments: list[tuple[float, float, float]] = []
    elapsed, last_virtual, active = 0.0, 0.0, sum(weight.values())
    for user, end in sorted(owner_end.items(), key=lambda item: item[1]):
        segments.append((last_virtual, elapsed, active))
        elapsed += (end - last_virtual) * active
        last_virtual, active = end, active - weight[user]
    starts = [segment[0] for segment in segments]

    def real_time(virtual: float) -> float:
        """Lines run by every owner together by the time this virtual time is reached (÷ rate: seconds)."""
        virtual_start, real_start, running = segments[max(bisect.bisect_left(starts, virtual) - 1, 0)]
        return real_start + (virtual - virtual_start) * running

    order = sorted(queued, key=lambda b: (finish_virtual[b.batch_id], b.validated_order))
    return {batch.batch_id: Standing(place, real_time(finish_virtual[batch.batch_id]) / rate if rate > NO_RATE
                                     else None)
            for place, batch in enumerate(order, start=1)}
