"""Property: whatever bytes or JSON a file holds, the validator never crashes and always reaches a verdict."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.catalogue import Catalogue
from services.runtime.storage.catalogue import load_catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.domain import FileValidation

CATALOGUE: Catalogue = load_catalogue(None)
TOKENIZERS = TokenizerCache()
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
FIELDS = st.sampled_from(["custom_id", "method", "url", "body", "model", "messages", "max_tokens", "stream", "n"])
REQUESTISH = st.fixed_dictionaries(
    {"custom_id": st.text(max_size=8) | JSON, "method": st.sampled_from(["POST", "GET"]) | JSON,
     "url": st.sampled_from(["/v1/chat/completions", "/v1/embeddings"]) | JSON,
     "body": st.dictionaries(FIELDS | st.text(max_size=8), JSON | st.sampled_from(["smollm2", 8, True]), max_size=6)},
)


def verdict(lines: list[bytes]) -> tuple[bool, int]:
    validation = FileValidation("/v1/chat/completions", CATALOGUE, tokenizers=TOKENIZERS)
    for number, raw in enumerate(lines, start=1):
        for issue in validation.feed(number, raw):
            assert issue.code and issue.message
    validation.finish()
    return validation.passed, validation.error_count


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=8))
def test_random_bytes_never_crash_and_always_get_a_verdict(lines: list[bytes]) -> None:
    passed, errors = verdict([line.replace(b"\n", b" ") for line in lines])
    assert passed is (errors == 0)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(JSON | REQUESTISH, max_size=6))
def test_random_json_never_crashes_and_a_failed_file_names_its_errors(values: list[object]) -> None:
    passed, errors = verdict([json.dumps(value).encode() for value in values])
    assert passed is (errors == 0)
