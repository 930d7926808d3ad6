"""An object request names keys no longer than S3 allows: a longer one (a model object's key is any admitted
executor's to ask for) was signed into an answer past the broker's max payload, never sent."""

import json

import pytest
from pydantic import ValidationError

from contracts.objects import AHEAD, MAX_KEY_CHARS, ObjectRequest


def request(key: str, ahead: int = 0) -> dict[str, object]:
    return {"operation": "get", "batch_id": "b1", "key": key,
            "ahead": [{"operation": "get", "key": key} for _ in range(ahead)]}


@pytest.mark.parametrize("where", ["key", "ahead", "start_after"])
def test_a_key_past_s3s_limit_is_a_malformed_request(where: str) -> None:
    long = "models/" + "é" * MAX_KEY_CHARS
    body = request("models/m", 1)
    if where == "key":
        body["key"] = long
    elif where == "ahead":
        body["ahead"] = [{"operation": "get", "key": long}]
    else:
        body["start_after"] = long
    with pytest.raises(ValidationError):
        ObjectRequest.model_validate_json(json.dumps(body))


def test_the_longest_request_signs_within_the_brokers_payload() -> None:
    """Every key at the limit, in the character that percent-encodes longest: 17 URLs well under 1 MiB."""
    key = "é" * MAX_KEY_CHARS
    asked = ObjectRequest.model_validate(request(key, AHEAD))
    encoded = sum(len(wanted.key.encode()) * 3 for wanted in asked.ahead) + len(asked.key.encode()) * 3
    assert encoded < 256 * 1024
