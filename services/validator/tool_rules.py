"""Tools: a line may offer tools, or ask for a tool call, only to a model that answers with `tool_calls` (its
catalogue entry says `supports_tools` and its chat template reads `tools`); anything else is refused with
`tools_unavailable`, never run as plain text. No tools (`tools: []`, tool_choice "none" or "auto") is neutral."""

import functools
from collections.abc import Iterator

from contracts import engines
from contracts.api.error_codes import TOOLS_UNAVAILABLE
from contracts.catalogue import CatalogueModel
from contracts.engines import honoured_parameters, is_neutral
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.issues import LineIssue

TOOL_PARAMETERS = ("tools", "tool_choice")
"""What this rule decides, for every engine (the parameter rule leaves them to it)."""
TOOL_ENDPOINTS = frozenset({"/v1/chat/completions"})
"""Where tool calls come back: the Responses endpoint runs as a chat without tools and answers text only."""
NO_TOOLS = 'an empty tools list and tool_choice "none" or "auto" are accepted'
known_parameters = functools.cache(engines.known_parameters)
"""`contracts.engines.known_parameters`, each endpoint's built once (every line asks)."""


def tool_issues(body: dict[str, object], endpoint: str, model: CatalogueModel,
                tokenizers: TokenizerCache | None) -> Iterator[LineIssue]:
    if not set(TOOL_PARAMETERS) <= known_parameters(endpoint):
        return  # an endpoint without tools (completions, embeddings): the parameter rule refuses them as unknown
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        yield LineIssue("invalid_body", "tools must be a list of tool definitions.", "body.tools")
        return
    param = next((f"body.{name}" for name in TOOL_PARAMETERS if not is_neutral(name, body.get(name))), None)
    if param is None:
        return
    reason = _why_not(endpoint, model, tokenizers)
    if reason is not None:
        yield LineIssue(TOOLS_UNAVAILABLE, f"{reason}, so the line would come back as plain text without tool_calls. "
                        f"Remove body.tools and tool_choice ({NO_TOOLS}), or pick a model whose GET /v1/models entry "
                        "has supports_tools true.", param)


def _why_not(endpoint: str, model: CatalogueModel, tokenizers: TokenizerCache | None) -> str | None:
    if endpoint not in TOOL_ENDPOINTS:
        return f"Tools run on {', '.join(sorted(TOOL_ENDPOINTS))} only: {endpoint} here answers with text"
    if "tools" not in honoured_parameters(model.engine, model.engine_version):
        return f"{model.id} runs on {model.engine}, which returns no tool calls"
    if not model.supports_tools:
        return f"{model.id} cannot call tools (its chat template does not read them)"
    tokenizer = tokenizers.get(model) if tokenizers is not None else None
    if tokenizer is not None and "tools" not in tokenizer.template_variables:
        return f"{model.id}'s chat template never reads `tools`, though its catalogue entry says supports_tools"
    return None
