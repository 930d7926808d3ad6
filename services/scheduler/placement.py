"""Who may run whose batch (`may_run`, by which the scheduler assigns and the object broker signs): executors'
providers, their organisations (their owners') and approvals, folded from the log. An operator's executor (no
provider) is the platform's own: it runs every batch allowing approved providers, none limited to an organisation's
own. The default organisation is no circle of trust: there an unapproved provider runs only its owner's batches, and
`own_organization` means the owner's own providers (`trust_scope`)."""

from dataclasses import dataclass, field

from contracts.api.batch import Placement
from contracts.api.organization import DEFAULT_ORGANIZATION_ID
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorRegistered
from contracts.events.key import KeyCreated, UserCreated
from contracts.events.provider import ProviderApprovalWithdrawn, ProviderApproved, ProviderRegistered
from contracts.ids import owner_id
from services.runtime.nats.foldrules import FoldRules
from services.scheduler.plans import BatchPlan

PLACEMENT_FACTS: tuple[type[Event], ...] = (UserCreated, KeyCreated, ProviderRegistered, ProviderApproved,
                                            ProviderApprovalWithdrawn, ExecutorRegistered)
"""The facts the placement view folds (executor registrations are the fleet's too)."""
PLACEMENT_WITHDRAWN = "placement_withdrawn"
"""An attempt fenced because its executor may no longer run the batch: it says nothing of the lines, so is forgiven."""
_rules = FoldRules[None]()


def organization_key(organization_id: str | None) -> str:
    """An organisation's public id: facts say None for the default one."""
    return organization_id or DEFAULT_ORGANIZATION_ID


def trust_scope(organization_id: str | None, owner: str) -> str:
    """Whose providers a batch of `owner` trusts unapproved: its organisation's; in the default one, its owner's."""
    organization = organization_key(organization_id)
    return f"{organization}/{owner}" if organization == DEFAULT_ORGANIZATION_ID else organization


@dataclass(frozen=True)
class Runner:
    """Whose executor it is, as placement judges it."""

    organization: str | None
    """The provider's organisation (public id); None: the platform's own executor (no provider)."""
    scope: str | None = None
    """The provider's `trust_scope`: the batches it runs unapproved; None: the platform's own executor."""
    approved_platform_wide: bool = False
    approved_for: frozenset[str] = frozenset()
    """Organisations whose administrators approved the provider for their batches."""


PLATFORMS_OWN = Runner(organization=None, approved_platform_wide=True)
UNKNOWN_PROVIDER = Runner(organization="", approved_platform_wide=False)
"""A provider the log has not named (yet): it runs nothing."""


def may_run(runner: Runner, placement: Placement, organization: str, scope: str) -> bool:
    """Whether an executor of `runner` may run a batch of `organization` and `trust_scope` `scope` with `placement`."""
    if placement == "own_organization":
        return runner.scope is not None and runner.scope == scope
    return runner.approved_platform_wide or organization in runner.approved_for or (
        runner.scope is not None and runner.scope == scope)


def why_not_placed(placement: Placement, model: str) -> str:
    """A batch's waiting reason when executors serve its model but none it may run on."""
    if placement == "own_organization":
        return (f"No executor of your organisation's own providers serves {model} (the batch's placement is "
                "own_organization).")
    return (f"No approved provider's executor serves {model}; only unapproved providers of other organisations "
            "do.")


@dataclass
class _Provider:
    owner_user_id: str | None
    owner_key_id: str
    approved_platform_wide: bool = False
    approved_for: set[str] = field(default_factory=set)


@dataclass
class Placements:
    """The log's say on placement: users' organisations, providers' owners and approvals, executors' providers."""

    users: dict[str, str] = field(default_factory=dict)
    """User id → organisation (public id)."""
    providers: dict[str, _Provider] = field(default_factory=dict)
    executors: dict[str, str | None] = field(default_factory=dict)
    """Executor id → the provider of the worker key it last registered with (None: an operator's or admin's)."""
    key_providers: dict[str, str] = field(default_factory=dict)
    """Worker key id → its provider (for registrations stated before they named it)."""

    def provider_of(self, event: ExecutorRegistered) -> str | None:
        """The provider of the registering worker key: as the fact names it, else as the key's creation did."""
        return event.provider_id or (self.key_providers.get(event.worker_key_id) if event.worker_key_id else None)

    def apply(self, event: Event) -> None:
        rule = _rules.rule_for(type(event))
        if rule is not None:
            rule(self, event)

    def runner(self, executor_id: str) -> Runner:
        """Whose the executor is; one never registered is taken for the platform's own (it gets no work anyway)."""
        provider_id = self.executors.get(executor_id)
        if provider_id is None:
            return PLATFORMS_OWN
        provider = self.providers.get(provider_id)
        if provider is None:
            return UNKNOWN_PROVIDER
        owner = provider.owner_user_id
        organization = organization_key(self.users.get(owner) if owner is not None else None)
        return Runner(organization=organization,
                      scope=trust_scope(organization, owner_id(owner, provider.owner_key_id)),
                      approved_platform_wide=provider.approved_platform_wide,
                      approved_for=frozenset(provider.approved_for))

    def allows(self, executor_id: str, plan: BatchPlan) -> bool:
        """Whether the batch's placement lets `executor_id` run it (or read its objects)."""
        return may_run(self.runner(executor_id), plan.placement, organization_key(plan.organization_id),
                       trust_scope(plan.organization_id, plan.owner))

    @_rules.on(UserCreated)
    def _user(self, event: UserCreated) -> None:
        self.users.setdefault(event.aggregate_id, organization_key(event.organization_id))

    @_rules.on(ProviderRegistered)
    def _provider(self, event: ProviderRegistered) -> None:
        self.providers.setdefault(event.aggregate_id, _Provider(event.owner_user_id, event.owner_key_id))

    @_rules.on(ProviderApproved, ProviderApprovalWithdrawn)
    def _approval(self, event: ProviderApproved | ProviderApprovalWithdrawn) -> None:
        provider = self.providers.get(event.aggregate_id)
        if provider is None:
            return
        approved = isinstance(event, ProviderApproved)
        if event.organization_id is None:
            provider.approved_platform_wide = approved
        elif approved:
            provider.approved_for.add(event.organization_id)
        else:
            provider.approved_for.discard(event.organization_id)

    @_rules.on(KeyCreated)
    def _key(self, event: KeyCreated) -> None:
        if event.role == "worker" and event.provider_id is not None:
            self.key_providers.setdefault(event.public_id, event.provider_id)

    @_rules.on(ExecutorRegistered)
    def _executor(self, event: ExecutorRegistered) -> None:
        if event.worker_key_id is not None:
            self.executors[event.aggregate_id] = self.provider_of(event)
