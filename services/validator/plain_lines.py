"""The common well-formed chat line (the four fields, a usable custom_id, a chat model, string messages, the usual
sampling parameters in range), recognised by a few plain checks: it breaks no rule, so its verdict is its model and
prompt size; any doubt goes through every rule (`rules.check_line`). test_validator_fast_paths holds both equal."""

import functools
from collections.abc import Mapping

from contracts.api.request_line import MAX_CUSTOM_ID_LENGTH, REQUIRED_LINE_FIELDS
from contracts.catalogue import Catalogue, CatalogueModel
from contracts.engines import honoured_parameters
from contracts.events.executor import EngineName
from services.validator.adapters.tokenizer import PLAIN_MESSAGE, TokenizerCache
from services.validator.body_rules import CHAT_ROLES, RANGES, ContextNeed, wanted_tokens

CHAT = "/v1/chat/completions"
LINE_FIELDS = frozenset(REQUIRED_LINE_FIELDS)
PLAIN_BODY = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed"})
"""What a plain body may hold (each with a plain value: see `_plain_values`)."""


PlainModels = Mapping[str, CatalogueModel]
"""Each name (id or alias) of a model serving chat in batches, without strict sampling, on an engine honouring it."""


def plain_models(catalogue: Catalogue) -> PlainModels:
    named: dict[str, CatalogueModel] = {}
    for model in catalogue.models:  # the first model a name names, as `resolve` finds it
        for name in (model.id, *model.aliases):
            named.setdefault(name, model)
    return {name: model for name, model in named.items() if model.batchable and CHAT in model.endpoints
            and not model.strict_sampling and _honours_plain_body(model.engine, model.engine_version)}


class PlainChat:
    """The plain-line check of one catalogue and its tokenizers, made once for many lines."""

    def __init__(self, catalogue: Catalogue, tokenizers: TokenizerCache | None) -> None:
        self.models, self.tokenizers = plain_models(catalogue), tokenizers

    def check(self, line: object) -> tuple[str, CatalogueModel, ContextNeed | None] | None:
        """(custom_id, model, what of its prompt must still be counted) of a plain chat line; None: check it fully."""
        if type(line) is not dict or line.keys() != LINE_FIELDS or line["method"] != "POST" or line["url"] != CHAT:
            return None
        custom_id, body = line["custom_id"], line["body"]
        if type(custom_id) is not str or not 0 < len(custom_id) <= MAX_CUSTOM_ID_LENGTH \
                or type(body) is not dict or not body.keys() <= PLAIN_BODY:
            return None
        name, messages = body.get("model"), body.get("messages")
        model = self.models.get(name) if type(name) is str else None
        if model is None or type(messages) is not list or not messages or not _plain_values(body):
            return None
        roles: list[str] = []
        contents: list[str] = []
        for message in messages:
            if type(message) is not dict or message.keys() != PLAIN_MESSAGE:
                return None
            role, content = message["role"], message["content"]
            if type(role) is not str or role not in CHAT_ROLES or type(content) is not str:
                return None
            roles.append(role)
            contents.append(content)
        tokenizer = self.tokenizers.get(model) if self.tokenizers is not None else None
        if tokenizer is None:
            return custom_id, model, None
        # What `context_need` finds of a chat body without chat_template_kwargs, its messages all objects.
        wanted = wanted_tokens(body)
        rendered = tokenizer.plain_chat_over(tuple(roles), contents, model.context_length - wanted)
        return custom_id, model, None if rendered is None else ContextNeed(model, (rendered,), wanted, "body.messages")


def _plain_values(body: dict[str, object]) -> bool:
    """The sampling parameters a body names are in OpenAI's ranges (a null one is left to the full rules)."""
    for name in ("max_tokens", "max_completion_tokens"):
        if name in body:
            value = body[name]
            if type(value) is not int or value < 1:
                return False
    if "seed" in body and type(body["seed"]) is not int:
        return False
    for name in ("temperature", "top_p"):
        if name in body:
            value, (low, high) = body[name], RANGES[name]
            if type(value) not in (int, float) or not low <= value <= high:  # type: ignore[operator]
                return False
    return True


@functools.cache
def _honours_plain_body(engine: EngineName, engine_version: str | None) -> bool:
    """The engine honours every parameter a plain body may name (so none is unsupported or unavailable)."""
    return PLAIN_BODY <= honoured_parameters(engine, engine_version)
