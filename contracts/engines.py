"""What each engine honours, per endpoint: the validator refuses what the pinned model's engine cannot do.

An OpenAI parameter the engine cannot honour is still fine at a neutral value (one that asks nothing of it).
"""

from types import MappingProxyType
from typing import Final, Literal

from packaging.version import InvalidVersion, Version

from contracts.events.executor import EngineName

_CHAT: Final = frozenset({
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
    "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
})
_COMPLETIONS: Final = frozenset({
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
})
_EMBEDDINGS: Final = frozenset({"model", "input", "dimensions", "encoding_format", "user"})
_RESPONSES: Final = frozenset({
    "model", "input", "instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "reasoning",
    "store", "stream", "temperature", "text", "tool_choice", "tools", "top_p", "truncation", "user", "seed",
    "previous_response_id", "include", "background", "service_tier", "top_logprobs", "prompt_cache_key",
    "safety_identifier", "max_tool_calls", "conversation", "prompt",
})

OPENAI_PARAMETERS: Final = MappingProxyType({
    "/v1/chat/completions": _CHAT,
    "/v1/completions": _COMPLETIONS,
    "/v1/embeddings": _EMBEDDINGS,
    "/v1/responses": _RESPONSES,
})
"""Every parameter OpenAI defines per endpoint; anything else is `unsupported_parameter` unless an engine
declares it as its own extension."""

SEED_PARAMETERS: Final = MappingProxyType({
    "/v1/chat/completions": frozenset({"top_k", "min_p", "repetition_penalty", "chat_template_kwargs"}),
    "/v1/completions": frozenset({"top_k", "min_p", "repetition_penalty"}),
})
"""Parameters beyond OpenAI's that the batch services we are compared with document (Reliquary's sampling
extensions): known here, so accepted at a neutral value on any engine, `<param>_unavailable` otherwise."""

RESPONSE_INCLUDES: Final = frozenset({
    "code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
    "message.input_image.image_url", "message.output_text.logprobs", "reasoning.encrypted_content",
    "web_search_call.action.sources", "web_search_call.results"})
"""What a Responses request may name in `include` (OpenAI's `IncludeEnum`)."""
LOGPROBS_INCLUDE: Final = "message.output_text.logprobs"
"""The `include` item that asks for the output text's log probabilities (the one an engine computes)."""

NEUTRAL_VALUES: Final = MappingProxyType({
    # One sample, and nothing returned beside it: no log probabilities, no echoed prompt, no suffix.
    "n": (1,), "best_of": (1,), "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "suffix": ("",),
    # No penalty and no filter (OpenAI's defaults; llama.cpp's top_k 0 and the seeds' -1 both mean no limit).
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "min_p": (0,), "top_k": (0, -1),
    "logit_bias": ({},), "stop": ([],),
    # Plain text out, no reasoning asked of a model that has none.
    "response_format": ({"type": "text"},), "text": ({"format": {"type": "text"}},), "modalities": (["text"],),
    "verbosity": ("medium",), "reasoning_effort": ("none",), "reasoning": ({}, {"effort": "none"}),
    # No tools offered, none asked for: `auto` with no tools calls nothing (Reliquary's neutral tool_choice).
    "tools": ([],), "functions": ([],), "tool_choice": ("none", "auto"), "function_call": ("none", "auto"),
    "parallel_tool_calls": (True, False),
    # How the request is served or kept, never what is computed.
    "service_tier": ("auto", "default"), "store": (False,), "stream": (False,), "background": (False,),
    "truncation": ("disabled",), "include": ([],), "encoding_format": ("float",), "chat_template_kwargs": ({},),
})
"""Values of a parameter that ask nothing of the engine (None always counts as neutral too): one table for every
parameter of OpenAI's API and the seeds' (`SEED_PARAMETERS`) that has such a value."""


def known_parameters(endpoint: str) -> frozenset[str]:
    """The parameters a request to `endpoint` may name at all: OpenAI's and the seeds' extensions."""
    return OPENAI_PARAMETERS.get(endpoint, frozenset()) | SEED_PARAMETERS.get(endpoint, frozenset())


_HARMLESS: Final = frozenset({
    "model", "user", "metadata", "store", "prompt_cache_key", "safety_identifier", "service_tier", "stream",
    "stream_options",
})
"""Parameters that never change what the engine computes, so every engine accepts them."""

ENGINE_PARAMETERS: Final = MappingProxyType({
    "llamacpp": _HARMLESS | frozenset({
        "messages", "prompt", "input", "instructions", "max_tokens", "max_completion_tokens", "max_output_tokens",
        "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
        "top_logprobs", "response_format", "tools", "tool_choice", "text", "encoding_format",
        # A Responses line's `include`: the output text's log probabilities; the other items name what a text model
        # without tools never makes (tool outputs, images, reasoning), so there is nothing for them to include.
        "include",
        # llama.cpp's own sampling extensions, accepted beside OpenAI's.
        "top_k", "min_p", "repeat_penalty", "ignore_eos", "n_probs", "typical_p", "mirostat",
        # `n`: the executor runs a line's samples one by one with derived seeds (services/executor/samples.py);
        # `chat_template_kwargs`: variables the model's own chat template reads (e.g. enable_thinking).
        "n", "chat_template_kwargs",
    }),
    # What the PyTorch backend's sampler (TensorRT-LLM's default) honours in every release we run: temperature,
    # top_p and top_k. What it honours only from a release on is in ENGINE_PARAMETERS_SINCE. `seed` is taken as
    # OpenAI's is, best effort (per-request seeds reached that sampler with #17172).
    "tensorrt_llm": _HARMLESS | frozenset({
        "messages", "prompt", "input", "instructions", "max_tokens", "max_completion_tokens", "max_output_tokens",
        "temperature", "top_p", "seed", "stop", "n", "best_of", "logprobs", "top_logprobs", "top_k", "ignore_eos",
        "chat_template_kwargs",
    }),
    # PyTorch and transformers' generate: sampling as OpenAI's, repetition_penalty, seed (a seeded line runs as
    # its own batch), stop strings, n samples as rows of one batch.
    "transformers": _HARMLESS | frozenset({
        "messages", "prompt", "input", "instructions", "max_tokens", "max_completion_tokens", "max_output_tokens",
        "temperature", "top_p", "top_k", "seed", "stop", "n", "repetition_penalty", "ignore_eos",
        "chat_template_kwargs",
    }),
    # Answers at once with a fixed body (bench/control_plane.py): takes what llama.cpp takes, tools aside, so a
    # benchmark's lines validate as they would for the default model.
    "simulated": _HARMLESS | frozenset({
        "messages", "prompt", "input", "instructions", "max_tokens", "max_completion_tokens", "max_output_tokens",
        "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "top_k", "min_p",
        "ignore_eos", "n", "encoding_format", "chat_template_kwargs",
    }),
})


ENGINE_PARAMETERS_SINCE: Final[MappingProxyType[EngineName, tuple[tuple[str, frozenset[str]], ...]]] = \
    MappingProxyType({
        # TensorRT-LLM's PyTorch sampler ignored the penalties and min_p (accepted by SamplingParams, silently
        # dropped) until pull requests of mid-2026 (#16485, #16590); its sampling guide lists them first in
        # 1.3.0rc24. Before that release they would change nothing, so they are refused unless a model's catalogue
        # entry pins `engine_version` at or above it.
        "tensorrt_llm": (("1.3.0rc24", frozenset({
            "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"})),),
        "llamacpp": (),
        "transformers": (),
        "simulated": (),
    })
"""Parameters an engine honours only from a release on: (first release, parameters), oldest first."""


def release_at_least(release: str, minimum: str) -> bool:
    """Whether an engine release is `minimum` or later (PEP 440 order, so 1.3.0rc24 < 1.3.0); a release that is
    not a version number (an engine not installed) is not."""
    try:
        return Version(release) >= Version(minimum)
    except InvalidVersion:
        return False


def first_release_honouring(engine: EngineName, parameter: str) -> str | None:
    """The release from which `engine` honours `parameter`, where it does only from a release on."""
    return next((first for first, parameters in ENGINE_PARAMETERS_SINCE[engine] if parameter in parameters), None)


def honoured_parameters(engine: EngineName, engine_version: str | None = None) -> frozenset[str]:
    """What `engine` honours at release `engine_version` (None: at every release we run, the least)."""
    honoured = ENGINE_PARAMETERS[engine]
    if engine_version is None:
        return honoured
    for first_release, parameters in ENGINE_PARAMETERS_SINCE[engine]:
        if release_at_least(engine_version, first_release):
            honoured |= parameters
    return honoured


def is_neutral(parameter: str, value: object) -> bool:
    return value is None or any(_same(value, neutral) for neutral in NEUTRAL_VALUES.get(parameter, ()))


def _same(value: object, neutral: object) -> bool:
    """Equal as JSON values: 1.0 is 1, but false is not 0 and true is not 1."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


Modality = Literal["text", "image", "audio", "file"]

CONTENT_PART_MODALITY: Final = MappingProxyType({
    "text": "text", "input_text": "text", "output_text": "text",
    "image_url": "image", "input_image": "image",
    "input_audio": "audio",
    "file": "file", "input_file": "file",
})
"""What each OpenAI content part type (chat and Responses) asks the engine to read."""

ENGINE_MODALITIES: Final[MappingProxyType[EngineName, frozenset[Modality]]] = MappingProxyType({
    # Both load text-only models (llama.cpp without an mmproj refuses image and audio parts).
    "llamacpp": frozenset({"text"}),
    "tensorrt_llm": frozenset({"text"}),
    "transformers": frozenset({"text"}),
    "simulated": frozenset({"text"}),
})
"""The inputs each engine can read; a content part of any other kind is `multimodal_unavailable`."""


def served_modalities(engine: EngineName) -> frozenset[Modality]:
    return ENGINE_MODALITIES[engine]
