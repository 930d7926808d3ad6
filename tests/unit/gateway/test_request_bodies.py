"""Request bodies are parsed by their contract models: each refused field gets the OpenAI error code and `param` its
contract declares, whether the request came over HTTP (JSON) or from the CLI (arguments)."""

import orjson
import pytest
from pydantic import BaseModel

from contracts.api.batch_request import BatchCreateRequest
from contracts.api.organization import CreateOrganization, CreateUser
from contracts.api.webhook import UpdateWebhook
from services.gateway.usecases.refusals import ApiError, parse_body, parse_fields
from services.gateway.usecases.retry import RetryRequest

GOOD = {"input_file_id": "file-abc", "endpoint": "/v1/chat/completions", "completion_window": "24h"}


def refusal(raw: bytes) -> tuple[int, str | None, str | None]:
    with pytest.raises(ApiError) as refused:
        parse_body(BatchCreateRequest, raw)
    return refused.value.status, refused.value.body.code, refused.value.body.param


@pytest.mark.parametrize(("changed", "code", "param"), [
    ({"input_file_id": None}, "missing_required_parameter", "input_file_id"),
    ({"input_file_id": ""}, "missing_required_parameter", "input_file_id"),
    ({"input_file_id": 7}, "missing_required_parameter", "input_file_id"),
    ({"endpoint": "/v1/moderations"}, "unsupported_endpoint", "endpoint"),
    ({"endpoint": None}, "unsupported_endpoint", "endpoint"),
    ({"completion_window": "\uff12\uff14h"}, "invalid_completion_window", "completion_window"),
    ({"completion_window": 24}, "invalid_completion_window", "completion_window"),
    ({"completion_window": "1" * 5000 + "h"}, "invalid_completion_window", "completion_window"),
    ({"metadata": {"a": 1}}, "invalid_metadata", "metadata"),
    ({"metadata": {f"k{n}": "v" for n in range(17)}}, "invalid_metadata", "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "invalid_metadata", "metadata"),
    ({"metadata": "a=b"}, "invalid_metadata", "metadata"),
    ({"allow_partial": "true"}, "invalid_allow_partial", "allow_partial"),
    ({"allow_partial": 1}, "invalid_allow_partial", "allow_partial"),
    ({"hold": None}, "invalid_hold", "hold"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": 60}}, "invalid_output_expires_after",
     "output_expires_after"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": 3600.0}}, "invalid_output_expires_after",
     "output_expires_after"),
    ({"output_expires_after": {"anchor": "last_active_at", "seconds": 3600}}, "invalid_output_expires_after",
     "output_expires_after"),
    ({"temperature": 0.5}, "unknown_parameter", "temperature"),
])
def test_a_refused_batch_field_gets_the_code_and_param_its_contract_declares(changed: dict[str, object], code: str,
                                                                             param: str) -> None:
    assert refusal(orjson.dumps({**GOOD, **changed})) == (400, code, param)


def test_a_missing_field_is_refused_as_its_own_bad_value_would_be() -> None:
    assert refusal(orjson.dumps({"input_file_id": "file-abc"})) == (400, "unsupported_endpoint", "endpoint")
    assert refusal(b"{}") == (400, "missing_required_parameter", "input_file_id")


def test_an_unknown_parameter_is_named_before_anything_else_that_is_wrong() -> None:
    assert refusal(orjson.dumps({"endpoint": "nope", "zzz": 1})) == (400, "unknown_parameter", "zzz")


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"a string"', b"\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_invalid_json(raw: bytes) -> None:
    assert refusal(raw) == (400, "invalid_json", None)


def test_a_valid_body_keeps_every_extension() -> None:
    body = parse_body(BatchCreateRequest, orjson.dumps({
        **GOOD, "metadata": {"a": "b"}, "output_expires_after": {"anchor": "created_at", "seconds": 3600},
        "allow_partial": True, "hold": True}))
    assert (body.metadata, body.allow_partial, body.hold) == ({"a": "b"}, True, True)
    assert body.output_expires_after is not None and body.output_expires_after.seconds == 3600


def test_completion_windows_in_minutes_and_seconds_pass_the_model_for_deployments_that_allow_them() -> None:
    assert parse_body(BatchCreateRequest, orjson.dumps({**GOOD, "completion_window": "90s"})).completion_window \
        == "90s"


def test_an_admin_body_refuses_a_bad_id_the_same_way_over_http_and_from_the_cli() -> None:
    with pytest.raises(ApiError) as over_http:
        parse_body(CreateUser, b'{"id": "a.b"}')
    with pytest.raises(ApiError) as from_cli:
        parse_fields(CreateUser, {"id": "a.b", "name": ""})
    assert over_http.value.body == from_cli.value.body
    assert (over_http.value.body.code, over_http.value.body.param) == ("invalid_id", "id")
    assert "'a.b'" in over_http.value.body.message


def test_an_empty_admin_body_is_an_empty_object() -> None:
    assert parse_body(CreateOrganization, b"") == CreateOrganization()


@pytest.mark.parametrize(("model", "field"), [(UpdateWebhook, "enabled"), (RetryRequest, "allow_partial")])
@pytest.mark.parametrize("value", [0, 1, "true", "yes", "off"])
def test_a_boolean_field_takes_a_json_boolean_only(model: type[BaseModel], field: str, value: object) -> None:
    with pytest.raises(ApiError) as refused:
        parse_body(model, orjson.dumps({field: value}))
    assert refused.value.status == 400 and refused.value.body.param == field
    assert getattr(parse_body(model, orjson.dumps({field: True})), field) is True


def test_output_expires_after_refuses_a_parameter_it_does_not_know() -> None:
    body = {**GOOD, "output_expires_after": {"anchor": "created_at", "seconds": 4000, "x": 1}}
    assert refusal(orjson.dumps(body)) == (400, "invalid_output_expires_after", "output_expires_after")
