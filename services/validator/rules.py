"""Rules for one line of a batch input file: each problem found is a LineIssue with a code and a fix."""

from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from contracts.api.request_line import MAX_CUSTOM_ID_LENGTH, REQUIRED_LINE_FIELDS
from contracts.catalogue import Catalogue


@dataclass(frozen=True)
class LineIssue:
    code: str
    message: str
    param: str | None = None


@dataclass(frozen=True)
class ParsedLine:
    """The parts of a good line that file-level rules need."""

    custom_id: str
    model_id: str | None


ENDPOINT_BODY_FIELD = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/responses": "input",
}


def check_line(
    raw: bytes, endpoint: str, catalogue: Catalogue, max_line_bytes: int
) -> tuple[list[LineIssue], ParsedLine | None]:
    """All issues of one non-blank line on its own, and what file-level rules need from it."""
    if len(raw) > max_line_bytes:
        return [LineIssue("invalid_json_line", f"The line is {len(raw)} bytes; the limit is {max_line_bytes}. "
                          "Shorten the request or split it.")], None
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return [LineIssue("invalid_json", f"The line is not valid JSON ({error}). Each line must be one "
                          "complete JSON object; check for trailing commas, unescaped quotes or a "
                          "request split across lines.")], None
    if not isinstance(line, dict):
        return [LineIssue("not_an_object", "Each line must be a JSON object with custom_id, method, url "
                          "and body.")], None
    issues = list(_structure_issues(line, endpoint))
    custom_id = line.get("custom_id")
    body = line.get("body")
    model_id = None
    if isinstance(body, dict):
        body_issues, model_id = _body_issues(body, endpoint, catalogue)
        issues.extend(body_issues)
    parsed = ParsedLine(custom_id, model_id) if isinstance(custom_id, str) and custom_id else None
    return issues, parsed


def _structure_issues(line: dict[str, object], endpoint: str) -> Iterator[LineIssue]:
    for field in REQUIRED_LINE_FIELDS:
        if field not in line:
            yield LineIssue("missing_field", f"The line has no `{field}`. Every line needs custom_id, "
                            "method, url and body.", field)
    unknown = sorted(set(line) - set(REQUIRED_LINE_FIELDS))
    if unknown:
        yield LineIssue("unknown_fields", f"Unknown top-level field(s) {', '.join(unknown)}: request "
                        "parameters belong inside `body`.", unknown[0])
    custom_id = line.get("custom_id")
    if "custom_id" in line and (not isinstance(custom_id, str) or not custom_id):
        yield LineIssue("invalid_custom_id", "custom_id must be a non-empty string.", "custom_id")
    elif isinstance(custom_id, str) and len(custom_id) > MAX_CUSTOM_ID_LENGTH:
        yield LineIssue("invalid_custom_id", f"custom_id is {len(custom_id)} characters; the limit is "
                        f"{MAX_CUSTOM_ID_LENGTH}.", "custom_id")
    if "method" in line and line["method"] != "POST":
        yield LineIssue("invalid_method", f"method must be \"POST\", not {line['method']!r}.", "method")
    url = line.get("url")
    if "url" in line and url != endpoint:
        yield LineIssue("url_mismatch", f"url is {url!r} but the batch endpoint is {endpoint!r}; every "
                        "line must use the batch's endpoint.", "url")
    if "body" in line and not isinstance(line["body"], dict):
        yield LineIssue("invalid_body", "body must be a JSON object: the request for the endpoint.", "body")


def _body_issues(
    body: dict[str, object], endpoint: str, catalogue: Catalogue
) -> tuple[list[LineIssue], str | None]:
    issues: list[LineIssue] = []
    model_id = None
    model_name = body.get("model")
    if model_name is None:
        issues.append(LineIssue("missing_model", "body.model is required: name a model from GET /v1/models.",
                                "body.model"))
    elif not isinstance(model_name, str) or (model := catalogue.resolve(model_name)) is None:
        known = ", ".join(m.id for m in catalogue.models)
        issues.append(LineIssue("unsupported_model", f"Model {model_name!r} is not served here. Available: "
                                f"{known}.", "body.model"))
    elif not model.batchable:
        issues.append(LineIssue("model_not_batchable", f"Model {model.id} cannot run in batches.",
                                "body.model"))
    elif endpoint not in model.endpoints:
        issues.append(LineIssue("unsupported_endpoint", f"Model {model.id} does not serve {endpoint}; it "
                                f"serves {', '.join(model.endpoints)}.", "body.model"))
    else:
        model_id = model.id
    if body.get("stream") not in (None, False):
        issues.append(LineIssue("stream_not_supported", "Batch requests cannot stream: remove "
                                "body.stream or set it to false.", "body.stream"))
    field = ENDPOINT_BODY_FIELD.get(endpoint)
    if field is not None:
        issues.extend(_shape_issues(body, field))
    return issues, model_id


def _shape_issues(body: dict[str, object], field: str) -> Iterator[LineIssue]:
    value = body.get(field)
    if value is None:
        yield LineIssue("invalid_body", f"body.{field} is required for this endpoint.", f"body.{field}")
    elif field == "messages" and (not isinstance(value, list) or not value
                                  or not all(isinstance(m, dict) and "role" in m for m in value)):
        yield LineIssue("invalid_body", "body.messages must be a non-empty list of {role, content} objects.",
                        "body.messages")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        yield LineIssue("invalid_body", "max_tokens must be a positive integer.", "body.max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, int | float) or not 0 <= temperature <= 2):
        yield LineIssue("invalid_body", "temperature must be a number from 0 to 2.", "body.temperature")
