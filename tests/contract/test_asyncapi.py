"""The AsyncAPI event catalogue: generated from the declared routers, and every channel's payload is exactly the
JSON schema of the contract its subject filter names."""

import subprocess
import sys
import typing
from typing import Any

import orjson
from pydantic import BaseModel

from contracts.events.batch import BatchCreated
from contracts.events.registry import AnyEvent
from contracts.subjects import BATCH_CREATED, EVENTS_STREAM, VALIDATOR_DURABLE, WEBHOOKS_DURABLE
from services.asyncapi import DOCUMENT, ROUTERS, event_catalogue, rendered
from services.gateway.views.asyncapi import _document
from services.gateway.webhooks.domain import SENT_FACTS
from services.runtime.nats.delivery import ServiceRouter, fact_filter
from services.validator.handlers import CREATED

REF = "#/components/schemas/"


def contracts_by_filter() -> dict[str, type[BaseModel]]:
    """Every subject filter a channel may name → the contract it carries: each fact's type, each declared answer's
    request, each durable's command."""
    members = typing.get_args(typing.get_args(AnyEvent)[0])
    found: dict[str, type[BaseModel]] = {fact_filter(member): member for member in members}
    for make_router in ROUTERS:
        router = make_router()
        if isinstance(router, ServiceRouter):
            found |= {answer.subject: answer.request for answer in router.answered}
            found |= {declared.durable.subject: declared.durable.contract for declared in router.declared.values()}
    return found


def channels() -> list[tuple[str, str, dict[str, Any]]]:
    """(channel, subject filter, payload schema) of every channel in the document."""
    document = event_catalogue()
    found = []
    for name, channel in document["channels"].items():
        for message in channel["messages"].values():
            message_name = message["$ref"].removeprefix("#/components/messages/")
            payload = document["components"]["messages"][message_name]["payload"]
            found.append((name, channel["bindings"]["nats"]["subject"], payload))
    return found


def actions_on_subjects() -> set[tuple[str, str]]:
    """(send or receive, subject filter) of every operation in the document."""
    document = event_catalogue()
    return {(op["action"], document["channels"][op["channel"]["$ref"].split("/")[-1]]["bindings"]["nats"]["subject"])
            for op in document["operations"].values()}


def resolved(schema: Any, components: dict[str, Any]) -> Any:
    """`schema` with every `$ref` to a component replaced by the component itself."""
    if isinstance(schema, dict):
        if set(schema) == {"$ref"}:
            return resolved(components[schema["$ref"].removeprefix(REF)], components)
        return {key: resolved(value, components) for key, value in schema.items()}
    if isinstance(schema, list):
        return [resolved(item, components) for item in schema]
    return schema


def contract_schema(model: type[BaseModel]) -> Any:
    schema = model.model_json_schema(ref_template=REF + "{model}")
    return resolved({k: v for k, v in schema.items() if k != "$defs"}, schema.get("$defs", {}))


def test_every_channel_carries_exactly_its_contracts_json_schema() -> None:
    components = event_catalogue()["components"]["schemas"]
    contracts = contracts_by_filter()
    for name, subject, payload in channels():
        assert subject in contracts, f"{name}: {subject} is no contract's subject"
        assert resolved(payload, components) == contract_schema(contracts[subject]), name


def test_the_validator_consumes_created_batches_on_its_durable_and_emits_its_verdicts() -> None:
    operations = actions_on_subjects()
    assert ("receive", BATCH_CREATED) in operations
    assert {("send", "evt.batch.*.validated"), ("send", "evt.batch.*.validation_failed"),
            ("send", "evt.batch.*.line_rejected"), ("send", "evt.file.*.stored")} <= operations
    assert (CREATED.stream, CREATED.name, CREATED.subject) == (EVENTS_STREAM, VALIDATOR_DURABLE, BATCH_CREATED)


def test_the_scheduler_folds_the_book_answers_executors_and_states_assignments() -> None:
    operations = actions_on_subjects()
    assert {("receive", "svc.register.{connected_as}"), ("receive", "svc.facts.{executor_id}"),
            ("receive", "svc.log.{executor_id}"), ("receive", "svc.objects.{executor_id}")} <= operations
    assert {("receive", "evt.batch.*.validated"), ("send", "evt.batch.*.assigned")} <= operations
    assert "scheduler.fold:evt.batch.*.validated" in event_catalogue()["channels"]


def test_a_subscriptions_filter_is_its_contracts_subject_pattern() -> None:
    assert fact_filter(BatchCreated) == BATCH_CREATED == CREATED.subject and CREATED.contract is BatchCreated


def test_the_gateway_serves_the_generated_document() -> None:
    assert orjson.loads(_document()) == orjson.loads(orjson.dumps(event_catalogue()))
    assert event_catalogue()["asyncapi"] == "3.0.0"


def test_the_checked_in_document_is_what_the_routers_generate_now() -> None:
    assert DOCUMENT.read_text() == rendered(), "the event catalogue changed: run `python -m services.asyncapi`"


def test_the_gateway_imports_no_worker() -> None:
    workers = ("services.asyncapi", "services.validator", "services.scheduler", "services.executor", "services.ledger")
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, services.gateway.app; print(*sorted(sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert [name for name in imported if name.startswith(workers)] == []


def test_each_executor_takes_its_own_commands_and_states_its_attempts_facts() -> None:
    operations = actions_on_subjects()
    assert {("receive", "cmd.executor.{executor_id}.run"), ("receive", "cmd.executor.{executor_id}.finalize"),
            ("send", "evt.batch.*.progressed"), ("send", "evt.batch.*.completed")} <= operations


def test_the_ledger_folds_every_fact_of_a_batch_life() -> None:
    channels = event_catalogue()["channels"]
    assert {"ledger.fold:evt.batch.*.created", "ledger.fold:evt.batch.*.progressed",
            "ledger.fold:evt.batch.*.completed", "ledger.fold:evt.file.*.stored"} <= set(channels)


def test_the_gateways_take_each_fact_a_webhook_is_sent_for_on_their_shared_intake() -> None:
    operations, channels = actions_on_subjects(), event_catalogue()["channels"]
    assert {("receive", fact_filter(fact)) for fact in SENT_FACTS} <= operations
    assert {f"{WEBHOOKS_DURABLE}:{fact_filter(fact)}" for fact in SENT_FACTS} <= set(channels)
