"""Who gets the next unit of work: fair share between owners, FIFO within an owner, urgency near a deadline.

A pure queue over the batches that have lines to hand out. Owners are two levels deep: organisations, then their
users (a user without an organisation is an organisation of one). The next unit for an executor goes, among the
batches of the models it serves:
1. to an **urgent** batch first — one that, at the rate the fleet runs its model, would not finish inside its
   completion window unless served now — earliest deadline first;
2. else to the organisation furthest below its fair share — the fewest lines in flight per unit of weight —, within
   it to the user furthest below theirs, and within the user to the batch validated first.
Usage is the lines each owner has in flight now (leased and not yet committed), so shares follow the capacity in
use at every moment: an owner alone gets all of it, two owners half each, whatever they queued. Each `take` counts
the unit it hands out at once, so the decisions of one tick stay fair among themselves.

Built once per tick from the book (O(batches)); a `take` costs O(organisations + users of the chosen one), never a
scan of every batch, so a tick with a thousand executors and ten thousand queued batches stays in milliseconds.
"""

import bisect
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

URGENCY_SAFETY = 2.0
"""A batch is urgent once twice its estimated remaining run time no longer fits before its deadline."""
NO_RATE = 1e-9
SOLO = "user:"
"""The organisation of a user who has none."""


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
    """Lines neither committed nor in flight: what units can still be made of."""
    remaining_lines: int
    """Lines not committed (pending and in flight): what must still run before the deadline."""
    in_flight_lines: int = 0

    @property
    def org(self) -> str:
        return self.organization if self.organization is not None else SOLO + self.user


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


@dataclass
class _User:
    batches: list[QueuedBatch]
    """By validated order; the head is the next with pending lines."""
    in_flight: int = 0


@dataclass
class _Organization:
    users: dict[str, _User] = field(default_factory=dict)
    in_flight: int = 0


class FairQueue:
    def __init__(self, batches: Iterable[QueuedBatch], weights: Weights = Weights(),
                 rates: Mapping[str, float] | None = None, now_ms: int = 0) -> None:
        """`rates`: lines per second the fleet runs each model at (measured); a model with none is never urgent."""
        self.weights = weights
        self.rates = rates or {}
        self.now_ms = now_ms
        self._orgs: dict[str, dict[str, _Organization]] = {}
        """Model → organisation → its users' queues of that model's batches."""
        self._user_in_flight: dict[str, int] = {}
        self._org_in_flight: dict[str, int] = {}
        self._urgent: dict[str, list[QueuedBatch]] = {}
        """Model → urgent batches, earliest deadline first."""
        for batch in batches:
            self._user_in_flight[batch.user] = self._user_in_flight.get(batch.user, 0) + batch.in_flight_lines
            self._org_in_flight[batch.org] = self._org_in_flight.get(batch.org, 0) + batch.in_flight_lines
            if batch.pending_lines <= 0:
                continue
            if self._is_urgent(batch):
                self._urgent.setdefault(batch.model, []).append(batch)
            organization = self._orgs.setdefault(batch.model, {}).setdefault(batch.org, _Organization())
            organization.users.setdefault(batch.user, _User([])).batches.append(batch)
        for organizations in self._orgs.values():
            for organization in organizations.values():
                for user in organization.users.values():
                    user.batches.sort(key=lambda b: b.validated_order)
        for urgent in self._urgent.values():
            urgent.sort(key=lambda b: (b.expires_at_ms, b.validated_order))

    def _is_urgent(self, batch: QueuedBatch) -> bool:
        rate = self.rates.get(batch.model, 0.0)
        if rate <= NO_RATE:
            return False
        needed_ms = batch.remaining_lines / rate * 1000 * URGENCY_SAFETY
        return self.now_ms + needed_ms >= batch.expires_at_ms

    def take(self, models: Collection[str], max_lines: int) -> tuple[QueuedBatch, int] | None:
        """The batch the next unit (of at most `max_lines` lines) comes from, for an executor serving `models`, and
        the unit's size; None when none of those models has lines to hand out. The unit is counted in flight."""
        chosen = self._next_urgent(models) or self._next_fair(models)
        if chosen is None:
            return None
        lines = min(max_lines, chosen.pending_lines)
        chosen.pending_lines -= lines
        chosen.in_flight_lines += lines
        self._user_in_flight[chosen.user] = self._user_in_flight.get(chosen.user, 0) + lines
        self._org_in_flight[chosen.org] = self._org_in_flight.get(chosen.org, 0) + lines
        return chosen, lines

    def _next_urgent(self, models: Collection[str]) -> QueuedBatch | None:
        best: QueuedBatch | None = None
        for model in models:
            urgent = self._urgent.get(model)
            while urgent and urgent[0].pending_lines <= 0:
                urgent.pop(0)
            if urgent and (best is None or (urgent[0].expires_at_ms, urgent[0].validated_order)
                           < (best.expires_at_ms, best.validated_order)):
                best = urgent[0]
        return best

    def _next_fair(self, models: Collection[str]) -> QueuedBatch | None:
        candidates: dict[str, list[_Organization]] = {}
        for model in models:
            for org_id, organization in self._orgs.get(model, {}).items():
                candidates.setdefault(org_id, []).append(organization)
        ranked_orgs = sorted(candidates, key=lambda org: (self._org_in_flight.get(org, 0) / self.weights.of_org(org),
                                                          self._first_order(candidates[org])))
        for org_id in ranked_orgs:
            chosen = self._next_in_org(candidates[org_id])
            if chosen is not None:
                return chosen
            for model in models:  # nothing left there for these models
                organizations = self._orgs.get(model, {})
                if organizations.get(org_id) is not None and not _has_pending(organizations[org_id]):
                    del organizations[org_id]
        return None

    def _next_in_org(self, organizations: list[_Organization]) -> QueuedBatch | None:
        heads: dict[str, QueuedBatch] = {}
        for organization in organizations:
            for user_id, user in organization.users.items():
                head = _head(user)
                if head is not None and (user_id not in heads or head.validated_order < heads[user_id].validated_order):
                    heads[user_id] = head
        if not heads:
            return None
        user_id = min(heads, key=lambda u: (self._user_in_flight.get(u, 0) / self.weights.of_user(u),
                                            heads[u].validated_order))
        return heads[user_id]

    @staticmethod
    def _first_order(organizations: list[_Organization]) -> int:
        orders = [head.validated_order for organization in organizations for user in organization.users.values()
                  if (head := _head(user)) is not None]
        return min(orders, default=0)


def _head(user: _User) -> QueuedBatch | None:
    """The user's first batch with lines to hand out; batches with none are dropped from the front."""
    while user.batches and user.batches[0].pending_lines <= 0:
        user.batches.pop(0)
    return user.batches[0] if user.batches else None


def _has_pending(organization: _Organization) -> bool:
    return any(_head(user) is not None for user in organization.users.values())


@dataclass(frozen=True)
class Standing:
    """Where a batch stands among its model's batches, in the order the fair queue will finish them."""

    position: int
    """1 = the next of its model to finish."""
    eta_s: float | None
    """Seconds until it finishes at the model's measured rate; None without a measured rate."""


def standings(batches: Iterable[QueuedBatch], rates: Mapping[str, float],
              weights: Weights = Weights()) -> dict[str, Standing]:
    """Each batch's place and finish time if the fleet keeps its measured rate per model and shares it fairly.

    The fair queue is processor sharing between owners: at any moment every owner with lines left runs at the
    model's rate times its weight over the weights of the owners still running. In virtual time an owner of weight
    w finishes its first c lines at c / w; real time is the integral of the active weight over the rate."""
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
