"""Who may run whose batch: an unapproved provider runs only its own organisation's batches, an approval widens
that, `own_organization` narrows a batch to its organisation's providers; the scheduler assigns, and the object
broker signs, accordingly."""

import pytest

from contracts.api.batch import Placement
from contracts.events.batch import BatchAssigned, BatchValidated
from contracts.events.envelope import Event
from contracts.events.executor import ExecutorRegistered
from contracts.events.key import UserCreated
from contracts.events.provider import ProviderApprovalWithdrawn, ProviderApproved, ProviderRegistered
from contracts.objects import ObjectRequest
from services.scheduler.book import Book
from services.scheduler.decisions import Assign, FenceAttempt, Wait, decide
from services.scheduler.objects import authorize
from services.scheduler.placement import PLACEMENT_WITHDRAWN, PLATFORMS_OWN, Runner, may_run
from tests.factories import batch_created
from tests.unit.scheduler.test_scheduler_decisions import CATALOGUE, NOW, advert

UNAPPROVED_ACME = Runner(organization="acme", scope="acme")
APPROVED_ACME = Runner(organization="acme", scope="acme", approved_platform_wide=True)
ACME_APPROVED_BY_GLOBEX = Runner(organization="acme", scope="acme", approved_for=frozenset({"globex"}))


@pytest.mark.parametrize(("runner", "placement", "organization", "allowed"), [
    (UNAPPROVED_ACME, "approved_providers", "acme", True),
    (UNAPPROVED_ACME, "approved_providers", "globex", False),
    (UNAPPROVED_ACME, "own_organization", "acme", True),
    (APPROVED_ACME, "approved_providers", "globex", True),
    (APPROVED_ACME, "own_organization", "globex", False),
    (ACME_APPROVED_BY_GLOBEX, "approved_providers", "globex", True),
    (ACME_APPROVED_BY_GLOBEX, "approved_providers", "initech", False),
    (ACME_APPROVED_BY_GLOBEX, "own_organization", "globex", False),
    (PLATFORMS_OWN, "approved_providers", "globex", True),
    (PLATFORMS_OWN, "own_organization", "globex", False),
])
def test_the_placement_rule(runner: Runner, placement: Placement, organization: str, allowed: bool) -> None:
    assert may_run(runner, placement, organization, organization) is allowed


def registered(executor_id: str, provider_id: str | None) -> ExecutorRegistered:
    return ExecutorRegistered(aggregate_id=executor_id, advert=advert(executor_id), started_at=NOW,
                              worker_key_id=f"key_{executor_id}", provider_id=provider_id, occurred_at=NOW)


def fleet_book(*facts: Event) -> Book:
    """Users of acme and globex (and one of the default organisation); acme's provider runs executor `acme-1`, the
    default organisation's `dflt-1`; `ops-1` is the platform's own; then `facts`."""
    book = Book()
    for fact in (UserCreated(aggregate_id="u_acme", organization_id="acme"),
                 UserCreated(aggregate_id="u_globex", organization_id="globex"), UserCreated(aggregate_id="u_dflt"),
                 ProviderRegistered(aggregate_id="prov_acme", display_name="a", owner_key_id="k1",
                                    owner_user_id="u_acme"),
                 ProviderRegistered(aggregate_id="prov_dflt", display_name="d", owner_key_id="k2",
                                    owner_user_id="u_dflt"),
                 registered("acme-1", "prov_acme"), registered("dflt-1", "prov_dflt"), registered("ops-1", None),
                 *facts):
        book.apply(fact)  # type: ignore[arg-type]
    return book


def batch(book: Book, batch_id: str, organization: str | None, placement: Placement = "approved_providers") -> None:
    book.apply(batch_created(batch_id, "k", "files/f", created_at=0, expires_at=NOW // 1000 + 3600,
                             organization_id=organization, owner_user_id=f"u_{organization or 'dflt'}",
                             placement=placement))
    book.apply(BatchValidated(aggregate_id=batch_id, total_lines=3, model="m"))


def placed(book: Book, *executors: str) -> dict[str, str]:
    """Batch id → the executor each batch was assigned to in one tick."""
    actions = decide(book, [advert(e) for e in executors], CATALOGUE, NOW)
    return {a.plan.batch_id: a.executor_id for a in actions if isinstance(a, Assign)}


def waiting(book: Book, *executors: str) -> dict[str, str]:
    actions = decide(book, [advert(e) for e in executors], CATALOGUE, NOW)
    return {a.plan.batch_id: a.reason for a in actions if isinstance(a, Wait)}


def test_an_unapproved_providers_executor_gets_its_own_organisations_batch_and_no_other() -> None:
    book = fleet_book()
    batch(book, "b_acme", "acme")
    batch(book, "b_globex", "globex")
    assert placed(book, "acme-1") == {"b_acme": "acme-1"}
    assert "No approved provider" in waiting(book, "acme-1")["b_globex"]


def test_the_default_organisations_provider_serves_only_the_default_organisation_unapproved() -> None:
    book = fleet_book()
    batch(book, "b_dflt", None)
    batch(book, "b_globex", "globex")
    assert placed(book, "dflt-1") == {"b_dflt": "dflt-1"}


def test_in_the_default_organisation_an_unapproved_provider_serves_only_its_owners_batches() -> None:
    book = fleet_book(UserCreated(aggregate_id="u_other"))  # another user made without an organisation
    book.apply(batch_created("b_other", "k9", "files/f", created_at=0, expires_at=NOW // 1000 + 3600,
                             owner_user_id="u_other"))
    book.apply(BatchValidated(aggregate_id="b_other", total_lines=3, model="m"))
    assert placed(book, "dflt-1") == {}, "the default organisation is everyone without one: no circle of trust"
    assert placed(book, "dflt-1", "ops-1") == {"b_other": "ops-1"}


def test_a_platform_approval_lets_it_serve_everyone_until_withdrawn() -> None:
    approved = ProviderApproved(aggregate_id="prov_acme", approved_by_key_id="admin", occurred_at=NOW)
    book = fleet_book(approved)
    batch(book, "b_globex", "globex")
    assert placed(book, "acme-1") == {"b_globex": "acme-1"}
    book.apply(ProviderApprovalWithdrawn(aggregate_id="prov_acme", withdrawn_by_key_id="admin", occurred_at=NOW + 1))
    assert placed(book, "acme-1") == {}


def test_an_organisations_approval_covers_that_organisations_batches_only() -> None:
    book = fleet_book(ProviderApproved(aggregate_id="prov_acme", organization_id="globex", approved_by_key_id="g",
                                       occurred_at=NOW))
    batch(book, "b_globex", "globex")
    batch(book, "b_initech", "initech")
    assert placed(book, "acme-1") == {"b_globex": "acme-1"}


def test_own_organization_batches_never_go_to_another_organisations_approved_provider_nor_the_platforms() -> None:
    book = fleet_book(ProviderApproved(aggregate_id="prov_dflt", approved_by_key_id="admin", occurred_at=NOW))
    batch(book, "b_acme", "acme", "own_organization")
    assert placed(book, "dflt-1", "ops-1") == {}
    assert "own_organization" in waiting(book, "dflt-1", "ops-1")["b_acme"]
    assert placed(book, "dflt-1", "ops-1", "acme-1") == {"b_acme": "acme-1"}


def test_the_platforms_own_executors_serve_every_batch_that_allows_approved_providers() -> None:
    book = fleet_book()
    batch(book, "b_globex", "globex")
    assert placed(book, "acme-1", "ops-1") == {"b_globex": "ops-1"}


def test_an_attempt_whose_provider_lost_its_approval_is_fenced_and_then_refused_its_objects() -> None:
    book = fleet_book(ProviderApproved(aggregate_id="prov_acme", approved_by_key_id="admin", occurred_at=NOW))
    batch(book, "b_globex", "globex")
    book.apply(BatchAssigned(aggregate_id="b_globex", executor_id="acme-1", attempt=1, lease_token="t",
                             occurred_at=NOW))
    read_input = ObjectRequest(operation="get", batch_id="b_globex", key="files/f")
    assert authorize(book, "acme-1", read_input) is None
    book.apply(ProviderApprovalWithdrawn(aggregate_id="prov_acme", withdrawn_by_key_id="admin", occurred_at=NOW + 1))
    fences = [a for a in decide(book, [advert("acme-1")], CATALOGUE, NOW) if isinstance(a, FenceAttempt)]
    assert [(f.executor_id, f.code) for f in fences] == [("acme-1", PLACEMENT_WITHDRAWN)]
    refusal = authorize(book, "acme-1", read_input)
    assert refusal is not None and "placement" in refusal


def test_the_object_broker_refuses_an_unapproved_provider_another_organisations_batch_it_somehow_holds() -> None:
    book = fleet_book()
    batch(book, "b_globex", "globex")
    book.apply(BatchAssigned(aggregate_id="b_globex", executor_id="acme-1", attempt=1, lease_token="t",
                             occurred_at=NOW))
    assert authorize(book, "acme-1", ObjectRequest(operation="get", batch_id="b_globex", key="files/f")) is not None
