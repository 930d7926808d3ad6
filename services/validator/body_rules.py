"""Rules for a line's `body`: the model, the request's shape, sampling ranges, engine parameters, context."""

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from contracts.api.request_line import MAX_SAMPLES
from contracts.catalogue import Catalogue, CatalogueModel
from contracts.engines import (
    CONTENT_PART_MODALITY,
    RESPONSE_INCLUDES,
    first_release_honouring,
    honoured_parameters,
    is_neutral,
    served_modalities,
)
from contracts.events.executor import EngineName
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.engine_cost_rules import COSTED, engine_cost_issues
from services.validator.issues import LineIssue
from services.validator.strict_sampling import SamplingKey, is_integer, is_number, sampling_key, strict_issues
from services.validator.tool_rules import TOOL_PARAMETERS, known_parameters, tool_issues

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_EMBEDDING_INPUTS_PER_LINE = 2048
MAX_STOP_SEQUENCES = 4
ENGINE_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
"""What the engine itself gives the chat template: not the line's to set through chat_template_kwargs."""
TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True)
class BodyVerdict:
    issues: list[LineIssue]
    model: CatalogueModel | None
    """The catalogue model the line resolved to (None when it did not)."""
    embedding_inputs: int = 0
    context: "ContextNeed | None" = None
    """Set when the prompt's size must still be counted exactly."""
    sampling: SamplingKey | None = None
    """For a model with strict sampling: how the line samples (every line of a file must sample the same way)."""


def check_body(body: dict[str, object], endpoint: str, catalogue: Catalogue,
               tokenizers: TokenizerCache | None, line_model: str | None = None,
               count_context: bool = True) -> BodyVerdict:
    """`count_context`: the prompt's size matters (False: the line is refused already, whatever it is)."""
    issues, model = _model_issues(body, endpoint, catalogue, line_model)
    if body.get("stream") not in (None, False):
        issues.append(LineIssue("stream_not_supported", "Batch requests cannot stream: remove body.stream or set "
                                "it to false.", "body.stream"))
    shape = list(_SHAPES[endpoint](body)) if endpoint in _SHAPES else []
    issues += shape
    strict = model is not None and model.strict_sampling
    if not RANGED.isdisjoint(body):
        issues += _range_issues(body, temperature_checked=strict)
    if not COSTED.isdisjoint(body):
        issues += engine_cost_issues(body, endpoint)
    need = None
    if strict:
        issues += strict_issues(body)
    if model is not None:
        issues += _parameter_issues(body, endpoint, model)
        if not TOOLS.isdisjoint(body):  # a body naming no tools asks for none
            issues += tool_issues(body, endpoint, model, tokenizers)
        issues += _modality_issues(body, endpoint, model)
        if "chat_template_kwargs" in body:
            issues += _template_kwarg_issues(body, endpoint, model, tokenizers)
        prompt = body.get("prompt")
        if endpoint == "/v1/completions" and is_token_ids(prompt):
            assert isinstance(prompt, list)
            issues += _token_id_issues(prompt, body, model, tokenizers)
        elif not shape and tokenizers is not None and count_context and not issues:
            # A refused line's prompt is never counted: its verdict drops what counting would find.
            need = context_need(body, endpoint, model, tokenizers)
    return BodyVerdict(issues, model if not issues else None, _embedding_inputs(body, endpoint), need,
                       sampling_key(body) if strict else None)


def _model_issues(body: dict[str, object], endpoint: str, catalogue: Catalogue,
                  line_model: str | None) -> tuple[list[LineIssue], CatalogueModel | None]:
    name = body.get("model", line_model)
    if name is None:
        return [LineIssue("missing_model", "body.model is required: name a model from GET /v1/models (or name "
                          "one for every line: metadata.model on the batch, or the x-litellm-model header of the "
                          "upload).", "body.model")], None
    model = catalogue.resolve(name) if isinstance(name, str) else None
    if model is None:
        known = ", ".join(m.id for m in catalogue.models)
        named = "" if "model" in body else " (the batch's model, named for lines without body.model)"
        return [LineIssue("unsupported_model", f"Model {name!r}{named} is not served here or not open to your "
                          f"key. Available to you: {known or 'none'}.", "body.model")], None
    if not model.batchable:
        return [LineIssue("model_not_batchable", f"Model {model.id} cannot run in batches; pick another from "
                          "GET /v1/models.", "body.model")], None
    if endpoint not in model.endpoints:
        return [LineIssue("unsupported_endpoint", f"Model {model.id} does not serve {endpoint}; it serves "
                          f"{', '.join(model.endpoints)}.", "body.model")], None
    return [], model


def _chat_shape(body: dict[str, object]) -> Iterator[LineIssue]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        yield LineIssue("invalid_body", "body.messages must be a non-empty list of {role, content} objects.",
                        "body.messages")
        return
    for index, message in enumerate(messages):
        yield from _message_issues(index, message)


def _message_issues(index: int, message: object) -> Iterator[LineIssue]:
    role = message.get("role") if isinstance(message, dict) else None
    if not isinstance(message, dict) or not isinstance(role, str) or role not in CHAT_ROLES:
        # (a list or an object is no role either)
        yield LineIssue("invalid_body", f"body.messages[{index}] needs a role, one of "
                        f"{', '.join(sorted(CHAT_ROLES))}.", f"body.messages[{index}].role")
    elif isinstance(content := message.get("content"), list):
        yield from _part_issues(content, f"body.messages[{index}].content")
    elif not isinstance(content, str) and not (role == "assistant" and content is None):
        yield LineIssue("invalid_body", f"body.messages[{index}].content must be a string or a list of "
                        "content parts.", f"body.messages[{index}].content")


def _completion_shape(body: dict[str, object]) -> Iterator[LineIssue]:
    prompt = body.get("prompt")
    if not _is_text_or_texts(prompt) and not is_token_ids(prompt):
        yield LineIssue("invalid_body", "body.prompt must be a non-empty string, a list of strings, or a list "
                        "of token ids (non-negative integers).", "body.prompt")


def _embedding_shape(body: dict[str, object]) -> Iterator[LineIssue]:
    value = body.get("input")
    if not _is_text_or_texts(value):
        yield LineIssue("invalid_body", "body.input must be a non-empty string or list of non-empty strings.",
                        "body.input")
    elif isinstance(value, list) and len(value) > MAX_EMBEDDING_INPUTS_PER_LINE:
        yield LineIssue("invalid_body", f"body.input has {len(value)} items; at most "
                        f"{MAX_EMBEDDING_INPUTS_PER_LINE} per request.", "body.input")


def _response_shape(body: dict[str, object]) -> Iterator[LineIssue]:
    value = body.get("input")
    if not (isinstance(value, str) and value) and not (isinstance(value, list) and value):
        yield LineIssue("invalid_body", "body.input must be a non-empty string or list of input items.", "body.input")
    include = body.get("include")
    if include is not None and not (isinstance(include, list) and all(
            isinstance(item, str) and item in RESPONSE_INCLUDES for item in include)):
        yield LineIssue("invalid_body", "body.include must be a list of: " + ", ".join(sorted(RESPONSE_INCLUDES))
                        + ".", "body.include")


_SHAPES: dict[str, Callable[[dict[str, object]], Iterator[LineIssue]]] = {
    "/v1/chat/completions": _chat_shape, "/v1/completions": _completion_shape, "/v1/embeddings": _embedding_shape,
    "/v1/responses": _response_shape}
"""Each endpoint's rules of the request body's own shape (its messages, prompt or input)."""


def _part_issues(content: list[object], param: str) -> Iterator[LineIssue]:
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str) or kind not in CONTENT_PART_MODALITY:
            yield LineIssue("invalid_body", f"{param}[{index}] must be a content part object whose type is one of "
                            f"{', '.join(sorted(CONTENT_PART_MODALITY))}.", f"{param}[{index}].type")
        elif CONTENT_PART_MODALITY[kind] == "text" and not isinstance(part.get("text"), str):
            yield LineIssue("invalid_body", f"{param}[{index}] is a {kind} part: give it a string `text`.",
                            f"{param}[{index}].text")


def _content_parts(body: dict[str, object], endpoint: str) -> Iterator[tuple[str, dict[str, object]]]:
    """(param, part) of every content part a chat or Responses request carries."""
    field = {"/v1/chat/completions": "messages", "/v1/responses": "input"}.get(endpoint)
    items = body.get(field) if field else None
    for index, item in enumerate(items if isinstance(items, list) else []):
        content = item.get("content") if isinstance(item, dict) else None
        for part_index, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict):
                yield f"body.{field}[{index}].content[{part_index}]", part


def _modality_issues(body: dict[str, object], endpoint: str, model: CatalogueModel) -> Iterator[LineIssue]:
    """Images, audio and files only for an engine that declares it reads them."""
    served = served_modalities(model.engine)
    for param, part in _content_parts(body, endpoint):
        kind = part.get("type")
        modality = CONTENT_PART_MODALITY.get(kind) if isinstance(kind, str) else None
        if modality is not None and modality not in served:
            yield LineIssue("multimodal_unavailable", f"{model.id} runs on {model.engine}, which reads "
                            f"{', '.join(sorted(served))} only: remove the {kind} part or send it as text.",
                            f"{param}.type")


def is_token_ids(value: object) -> bool:
    """A prompt given as token ids: a non-empty list of non-negative integers."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def _is_text_or_texts(value: object) -> bool:
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


RANGES = {"temperature": (0, 2), "top_p": (0, 1), "presence_penalty": (-2, 2), "frequency_penalty": (-2, 2)}
"""OpenAI's ranges of the sampling parameters."""
POSITIVE = (*TOKEN_LIMIT_FIELDS, "n")
RANGED = frozenset({*RANGES, *POSITIVE, "seed", "stop"})
"""What `_range_issues` reads: a body naming none of these has none."""
TOOLS = frozenset(TOOL_PARAMETERS)


def _range_issues(body: dict[str, object], temperature_checked: bool = False) -> Iterator[LineIssue]:
    """OpenAI's ranges (`temperature_checked`: a strict model's own range applies to temperature instead)."""
    for name, (low, high) in RANGES.items():
        if temperature_checked and name == "temperature":
            continue
        value = body.get(name)
        if value is not None and not (is_number(value) and low <= value <= high):
            yield LineIssue("invalid_body", f"{name} must be a number from {low} to {high}.", f"body.{name}")
    for name in POSITIVE:
        value = body.get(name)
        if value is not None and (not is_integer(value) or value < 1):
            yield LineIssue("invalid_body", f"{name} must be a positive integer.", f"body.{name}")
    n = body.get("n")
    if is_integer(n) and n > MAX_SAMPLES:
        yield LineIssue("invalid_body", f"n asks for {n} samples; a line takes 1 to {MAX_SAMPLES}.", "body.n")
    seed = body.get("seed")
    if seed is not None and not is_integer(seed):
        yield LineIssue("invalid_body", "seed must be an integer.", "body.seed")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and len(stop) <= MAX_STOP_SEQUENCES and all(isinstance(s, str) for s in stop)):
        yield LineIssue("invalid_body", f"stop must be a string or a list of at most {MAX_STOP_SEQUENCES} strings.",
                        "body.stop")


def _parameter_issues(body: dict[str, object], endpoint: str, model: CatalogueModel) -> Iterator[LineIssue]:
    known = known_parameters(endpoint)
    honoured = _honoured_besides_tools(model.engine, model.engine_version)
    for name, value in body.items():
        if name in honoured or (is_neutral(name, value) and name in known) or (
                name in TOOL_PARAMETERS and name in known):
            continue
        since = first_release_honouring(model.engine, name)
        if name not in known and since is None:
            yield LineIssue("unsupported_parameter", f"Unknown parameter body.{name} for {endpoint}; check its "
                            "spelling or remove it.", f"body.{name}")
        elif not is_neutral(name, value):
            release = (f" (it does from release {since} on, and {model.id}'s catalogue entry does not pin "
                       "engine_version at or above it)" if since is not None else "")
            yield LineIssue(f"{name}_unavailable", f"{model.id} runs on {model.engine}, which cannot honour "
                            f"body.{name}={value!r}{release}; remove it or use its default.", f"body.{name}")


@functools.cache
def _honoured_besides_tools(engine: EngineName, engine_version: str | None) -> frozenset[str]:
    # Tools are the tool rule's where the endpoint takes them; elsewhere they are unknown, whatever the engine reads.
    return honoured_parameters(engine, engine_version) - TOOLS


def _token_id_issues(ids: list[int], body: dict[str, object], model: CatalogueModel,
                     tokenizers: TokenizerCache | None) -> Iterator[LineIssue]:
    """A prompt of token ids: each in the model's vocabulary, and (counted as given) within its context."""
    tokenizer = tokenizers.get(model) if tokenizers is not None else None
    vocabulary = tokenizer.encoding.n_vocab if tokenizer is not None else None
    outside = next((i for i, v in enumerate(ids) if v >= vocabulary), None) if vocabulary is not None else None
    if outside is not None:
        yield LineIssue("invalid_body", f"Token id {ids[outside]} is outside {model.id}'s vocabulary of {vocabulary} "
                        "tokens.", f"body.prompt[{outside}]")
        return
    issue = context_issue(ContextNeed(model, (), wanted_tokens(body), "body.prompt"), len(ids))
    if issue is not None:
        yield issue


def _template_kwarg_issues(body: dict[str, object], endpoint: str, model: CatalogueModel,
                           tokenizers: TokenizerCache | None) -> Iterator[LineIssue]:
    """`chat_template_kwargs`: an object of variables the model's own chat template reads. One it never reads is
    refused (`unsupported_template_kwarg`) unless it is false or null, which asks the template for nothing (so
    `{"enable_thinking": false}` runs on a model that never thinks); what the engine sets itself is refused."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None or endpoint != "/v1/chat/completions" or "chat_template_kwargs" not in honoured_parameters(
            model.engine, model.engine_version):
        return
    if not isinstance(kwargs, dict):
        yield LineIssue("invalid_body", "chat_template_kwargs must be an object of template variables.",
                        "body.chat_template_kwargs")
        return
    tokenizer = tokenizers.get(model) if tokenizers is not None else None
    read = tokenizer.template_variables if tokenizer is not None else None
    for name, value in kwargs.items():
        param = f"body.chat_template_kwargs.{name}"
        if name in ENGINE_TEMPLATE_VARIABLES:
            yield LineIssue("unsupported_template_kwarg", f"{name} is set by the engine for every request; it "
                            "cannot be given in chat_template_kwargs.", param)
        elif read is not None and name not in read and value not in (None, False):
            variables = ", ".join(sorted(read - ENGINE_TEMPLATE_VARIABLES)) or "none besides the messages"
            yield LineIssue("unsupported_template_kwarg", f"{model.id}'s chat template does not read {name}, so "
                            f"it would have no effect; the variables it reads: {variables}.", param)


def _dicts(value: object) -> list[dict[str, object]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


@dataclass(frozen=True)
class ContextNeed:
    """A prompt the cheap bound could not clear: it is counted exactly, batched with others."""

    model: CatalogueModel
    prompts: tuple[str, ...]
    """The texts the engine tokenizes; the longest must fit."""
    wanted: int
    param: str | None


def _chat_messages(body: dict[str, object], endpoint: str) -> list[dict[str, object]]:
    if endpoint == "/v1/chat/completions":
        return _dicts(body["messages"])
    value = body["input"]
    user: dict[str, object] = {"role": "user", "content": value}
    messages = [user] if isinstance(value, str) else _dicts(value)
    if isinstance(body.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    return messages


def context_need(body: dict[str, object], endpoint: str, model: CatalogueModel,
                 tokenizers: TokenizerCache) -> ContextNeed | None:
    """None when the prompt provably fits; otherwise what to count exactly."""
    tokenizer = tokenizers.get(model)
    if tokenizer is None:
        return None
    wanted = wanted_tokens(body)
    room = model.context_length - wanted
    if endpoint in ("/v1/chat/completions", "/v1/responses"):
        kwargs = body.get("chat_template_kwargs")
        rendered = tokenizer.chat_over(_chat_messages(body, endpoint), room,
                                       kwargs if isinstance(kwargs, dict) else None)
        if rendered is None:
            return None
        return ContextNeed(model, (rendered,), wanted, "body.messages" if endpoint == "/v1/chat/completions"
                           else "body.input")
    field = "prompt" if endpoint == "/v1/completions" else "input"
    value = body[field]
    texts = tuple(str(text) for text in (value if isinstance(value, list) else [value]))
    if max(len(text.encode()) for text in texts) <= room or all(tokenizer.fits(text, room) for text in texts):
        return None
    return ContextNeed(model, texts, wanted, f"body.{field}")


def wanted_tokens(body: dict[str, object]) -> int:
    """Tokens the request asks to generate: its first token limit that is an integer, else none."""
    for name in TOKEN_LIMIT_FIELDS:
        value = body.get(name)
        if isinstance(value, int):
            return value
    return 0


def context_issue(need: ContextNeed, prompt_tokens: int) -> LineIssue | None:
    budget = prompt_tokens + need.wanted
    if budget <= need.model.context_length:
        return None
    return LineIssue("context_too_long", f"The prompt is {prompt_tokens} tokens and asks for {need.wanted} more: "
                     f"{budget} exceeds {need.model.id}'s context of {need.model.context_length}. Shorten the "
                     "prompt or lower max_tokens.", need.param)


def _embedding_inputs(body: dict[str, object], endpoint: str) -> int:
    if endpoint != "/v1/embeddings":
        return 0
    value = body.get("input")
    return len(value) if isinstance(value, list) else 1
