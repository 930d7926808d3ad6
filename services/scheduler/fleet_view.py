"""The live fleet as one scheduler tick sees it: who can take a model, whom a batch's placement allows, and why a
batch waits, each worked out once per tick (per model, or per executor and trust key) however many batches ask."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.events.batch import ShardLayout
from contracts.events.executor import ExecutorAdvert
from services.scheduler.actions import QUEUED, Policy
from services.scheduler.domain import eligible_executors, why_unassignable
from services.scheduler.placement import Placements, trust_scope, why_not_placed
from services.scheduler.plans import BatchPlan

K = TypeVar("K")
V = TypeVar("V")
UNITS_PER_EXECUTOR = 4
"""Units per able executor at least (within the size bounds): each gets some, a latecomer too, and a loss is small."""


def unit_layout(total_lines: int, able_executors: int, policy: Policy) -> ShardLayout:
    """How a batch is cut into units, fixed by its first assignment."""
    if total_lines <= max(policy.unit_min_lines, 1):
        return ShardLayout()
    span = -(-total_lines // (UNITS_PER_EXECUTOR * max(able_executors, 1)))
    span = min(max(span, policy.unit_min_lines, 1), max(policy.unit_max_lines, policy.unit_min_lines, 1))
    return ShardLayout.split(total_lines, -(-total_lines // span))


@dataclass(frozen=True)
class Lane:
    """A model's batches that may run on the same executors (`FleetView.lane`); `plan` is one of them."""

    key: str
    model: CatalogueModel
    plan: BatchPlan


@dataclass
class FleetView:
    """The live fleet as one tick sees it, with what it costs to ask computed once per model."""

    live: dict[str, ExecutorAdvert]
    catalogue: Catalogue
    now_ms: int
    placements: Placements = field(default_factory=Placements)
    _models: dict[str, CatalogueModel | None] = field(default_factory=dict)
    _able: dict[str, list[ExecutorAdvert]] = field(default_factory=dict)
    _layouts: dict[tuple[int, str], ShardLayout] = field(default_factory=dict)
    _selective: dict[str, bool] = field(default_factory=dict)
    _allowed: dict[tuple[str, str, str | None, str], bool] = field(default_factory=dict)
    _live_for: dict[tuple[str, str | None, str], dict[str, ExecutorAdvert]] = field(default_factory=dict)
    _reasons: dict[tuple[str, str, str | None, str], str] = field(default_factory=dict)

    def model(self, name: str) -> CatalogueModel | None:
        return _memo(self._models, name, lambda: self.catalogue.resolve(name))

    def layout(self, total_lines: int, model: CatalogueModel, policy: Policy) -> ShardLayout:
        return _memo(self._layouts, (total_lines, model.id),
                     lambda: unit_layout(total_lines, len(self.able(model)), policy))

    def able(self, model: CatalogueModel) -> list[ExecutorAdvert]:
        return _memo(self._able, model.id, lambda: eligible_executors(model, self.live.values(), self.now_ms))

    def allows(self, executor_id: str, plan: BatchPlan) -> bool:
        """Whether the batch's placement lets the executor run it (once per tick per executor and trust key)."""
        return _memo(self._allowed, (executor_id, plan.placement, plan.organization_id, plan.owner),
                     lambda: self.placements.allows(executor_id, plan))

    def live_for(self, plan: BatchPlan) -> dict[str, ExecutorAdvert]:
        """The live executors the batch may run on (once per tick per trust key)."""
        return _memo(self._live_for, (plan.placement, plan.organization_id, plan.owner),
                     lambda: {executor_id: advert for executor_id, advert in self.live.items()
                              if self.allows(executor_id, plan)})

    def why_waiting(self, plan: BatchPlan, model: CatalogueModel) -> str:
        """Why a batch that got nothing waits (worked out once a tick per model and trust key)."""
        return _memo(self._reasons, (model.id, plan.placement, plan.organization_id, plan.owner),
                     lambda: self._why_waiting(plan, model))

    def _why_waiting(self, plan: BatchPlan, model: CatalogueModel) -> str:
        if any(self.allows(advert.executor_id, plan) for advert in self.able(model)):
            return f"{QUEUED} every executor serving {model.id} is busy with other batches."
        allowed = list(self.live_for(plan).values())
        if any(model.id in advert.models for advert in allowed) or \
                not any(model.id in advert.models for advert in self.live.values()):
            return why_unassignable(model, allowed or list(self.live.values()), self.now_ms)
        return why_not_placed(plan.placement, model.id)

    def lane(self, plan: BatchPlan, model: CatalogueModel) -> Lane:
        """The queue a batch's units wait in: batches of one lane may run on the same executors. One per model
        while every executor able to serve it runs any organisation's batches that allow approved providers."""
        if plan.placement == "approved_providers" and not _memo(self._selective, model.id, lambda: any(
                not self.placements.runner(advert.executor_id).approved_platform_wide for advert in self.able(model))):
            return Lane(model.id, model, plan)
        return Lane(f"{model.id}|{plan.placement}|{trust_scope(plan.organization_id, plan.owner)}", model, plan)


def _memo(cache: dict[K, V], key: K, make: Callable[[], V]) -> V:
    """`cache[key]`, made once (per tick: a view lives for one)."""
    if key not in cache:
        cache[key] = make()
    return cache[key]
