"""Every validation error code with a short title and the fix a person should make: the teaching half."""

from types import MappingProxyType
from typing import Final, Literal

from pydantic import BaseModel, Field


class ErrorCodeHelp(BaseModel):
    title: str
    fix: str


def _h(title: str, fix: str) -> ErrorCodeHelp:
    return ErrorCodeHelp(title=title, fix=fix)


TOOLS_UNAVAILABLE: Final = "tools_unavailable"
"""The code of a line that offers tools (or asks for a tool call) a model cannot call: Reliquary's code."""

ERROR_CODE_HELP: Final = MappingProxyType({
    "invalid_json": _h("Line is not valid JSON", "Write each request as one complete JSON object on one line; "
                       "look for trailing commas, single quotes, unescaped quotes or a request split over lines."),
    "invalid_json_line": _h("Line too long", "Keep each line under the size limit: shorten the prompt or split "
                            "the request."),
    "nesting_too_deep": _h("JSON nested too deeply", "Keep arrays and objects nested at most 64 levels deep in one "
                           "line; flatten the deepest field (often a JSON schema or an unused field)."),
    "not_an_object": _h("Line is not a JSON object", "Each line must be an object: "
                        '{"custom_id": …, "method": "POST", "url": …, "body": {…}}.'),
    "missing_field": _h("Required field missing", "Give every line custom_id, method, url and body."),
    "unknown_fields": _h("Unknown top-level field", "Only custom_id, method, url and body belong at the top "
                         "level; move request parameters into body."),
    "invalid_custom_id": _h("Bad custom_id", "Use a non-empty string of at most 512 characters."),
    "duplicate_custom_id": _h("custom_id used twice", "Make every custom_id unique within the file; the message "
                              "names the line that used it first."),
    "invalid_method": _h("Method is not POST", 'Set "method": "POST" on every line.'),
    "url_mismatch": _h("URL differs from the batch endpoint", "Set every line's url to the endpoint the batch "
                       "was created with."),
    "unsupported_endpoint": _h("Endpoint not supported", "Use /v1/chat/completions, /v1/completions, "
                               "/v1/embeddings or /v1/responses, with a model that serves it."),
    "missing_model": _h("No model named", "Set body.model to a model from GET /v1/models."),
    "unsupported_model": _h("Model not available", "Use a model id or alias from GET /v1/models."),
    "model_not_batchable": _h("Model cannot run in batches", "Pick a batchable model from GET /v1/models."),
    "unsupported_template_kwarg": _h("Template option the model cannot read", "Remove the chat_template_kwargs "
                                     "entry the model's chat template does not read (the message lists the ones it "
                                     "does), or one the engine sets itself."),
    "mixed_sampling": _h("Lines sample differently", "This model runs one sampling per file: give every line the "
                         "same temperature, top_p, top_k, min_p, max_tokens, seed and n, or split the file."),
    "greedy_unavailable": _h("Greedy decoding not offered", "This model samples only: set a temperature above 0."),
    "revision_unavailable": _h("Model revision not served", "Pin the revision GET /v1/models shows for the model in "
                               "metadata.revision, or leave metadata.revision out."),
    "invalid_max_tokens": _h("max_tokens out of range", "Set max_tokens (or max_completion_tokens) within the range "
                             "the message gives."),
    "max_tokens_conflict": _h("max_tokens and max_completion_tokens differ", "Set one of them, or both to the same "
                              "value."),
    "model_mismatch": _h("Lines use different models", "Use one model for the whole file (aliases count as their "
                         "model); split the file per model."),
    "stream_not_supported": _h("Streaming requested", "Remove body.stream or set it to false."),
    "invalid_body": _h("Request body is not valid",
                       "Fix the field named in param: its type or range is wrong for this endpoint. This includes "
                       "what a line may ask the engine to compute beyond its tokens: `top_logprobs` and `n_probs` "
                       "0 to 20, a completion's `logprobs` 0 to 5 (OpenAI's limits), and each JSON schema "
                       "(`response_format`, `text.format`, each tool's `parameters`) of at most 32 KB, 128 "
                       "properties per object, and in all of a line's schemas at most 500 enum values (OpenAI: "
                       "1,000) and 1,000 properties (OpenAI: 5,000), with patterns of at most 256 characters and "
                       "16 quantifiers that repeat no group (`(…)*`, `(…)+`, `(…){n}`; `(…)?` is fine; so "
                       "`^([\\w-]+\\.)+[a-z]{2,}$` is refused, `^[\\w.-]+\\.[a-z]{2,}$` is not), whose counted "
                       "repeats (`{n}`, `{m,}`, `{m,n}`: their bounds) sum to at most 32,000 in a line: the engine "
                       "compiles a schema into a grammar every slot waits on."),
    "multimodal_unavailable": _h("Images, audio or files not supported by this model's engine",
                                 "Send text content parts only, or pick a model whose engine reads that input."),
    TOOLS_UNAVAILABLE: _h("Tools offered to a model that cannot call them", "Remove body.tools and tool_choice (an "
                          'empty tools list and tool_choice "none" or "auto" are accepted), or use a model whose '
                          "GET /v1/models entry has supports_tools true, on /v1/chat/completions."),
    "unsupported_parameter": _h("Unknown parameter", "Check the parameter's spelling, or remove it."),
    "context_too_long": _h("Prompt plus max_tokens exceeds the context", "Shorten the prompt or lower max_tokens "
                           "so both fit the model's context."),
    "empty_file": _h("File has no requests", "Add one JSON request per line."),
    "too_many_tasks": _h("File too large for one batch", "Split the file into batches of at most 50,000 requests "
                         "(and 50,000 embedding inputs)."),
})

INSUFFICIENT_STORAGE: Final = "insufficient_storage"
"""507: a volume the stack writes to is under its free-space reserve, or full; new uploads and batches wait."""
BROKER_UNAVAILABLE: Final = "broker_unavailable"
"""503: the broker is not taking writes for the moment (restarting, or re-enabling its store)."""


class RequestRefusalHelp(BaseModel):
    status: int
    title: str
    fix: str


REQUEST_REFUSAL_HELP: Final = MappingProxyType({
    INSUFFICIENT_STORAGE: RequestRefusalHelp(
        status=507, title="Out of storage space", fix="Retry after the Retry-After seconds; nothing of the request "
        "was kept. Reads, downloads, cancels and running batches go on. Operators: free space on the volume the "
        "message names (`sheshnag status` shows each volume's free space and reserve)."),
    BROKER_UNAVAILABLE: RequestRefusalHelp(
        status=503, title="Broker not taking writes", fix="Retry shortly (Retry-After); nothing of the request was "
        "kept. A broker that stopped writing on a full disk is restarted once space returns."),
})
"""Codes of whole requests refused for the stack's storage (not a line's), as the API answers them."""

UNAVAILABLE_SUFFIX = "_unavailable"


def help_for(code: str) -> ErrorCodeHelp:
    """The help for a code; `<param>_unavailable` codes share one text."""
    if code in ERROR_CODE_HELP:
        return ERROR_CODE_HELP[code]
    if code.endswith(UNAVAILABLE_SUFFIX):
        param = code.removesuffix(UNAVAILABLE_SUFFIX)
        return _h(f"{param} not supported by this model's engine",
                  f"Remove {param} or set it to its default; this engine cannot honour it.")
    return _h(code.replace("_", " ").capitalize(), "See the message for what to change.")


class ErrorGroup(BaseModel):
    code: str
    count: int
    """How many errors of this code the whole file has."""
    lines: list[int]
    """The first few line numbers with this error."""
    param: str | None
    example_message: str
    title: str
    fix: str


FailureStage = Literal["refused", "ran", "not_run"]
"""Why a line is in the error file: validation refused it, it ran and failed, or it never ran (the batch was
cancelled, expired, failed or ran out of credit first)."""


class FailedLineGroup(BaseModel):
    code: str
    stage: FailureStage
    count: int
    title: str


class BatchErrorSummary(BaseModel):
    """`GET /v1/batches/{id}/errors`: what a dashboard shows to fix a file in one pass."""

    object: str = "batch.errors"
    batch_id: str
    total: int
    groups: list[ErrorGroup]
    failed_lines: int | None = None
    """Once the batch has ended: the lines of its error file, which is `request_counts.failed` (None before)."""
    failed_by_code: list[FailedLineGroup] = Field(default_factory=list)
    """Those lines by code and why, largest first; the counts add up to `failed_lines`."""
