"""The `transformers` engine: Hugging Face checkpoints (or a GGUF, dequantized once) on CUDA or the CPU. On a GPU lines
join transformers' continuous batching; the rest (a seed, a repetition penalty, the CPU unless asked) run as
micro-batches on the engine's own thread, lines sampling alike generated together (left-padded)."""

import asyncio
import contextlib
import gc
import hashlib
import importlib
import importlib.metadata
import logging
import queue
import secrets
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from contracts.api.request_line import MAX_SAMPLES
from contracts.catalogue import CatalogueModel
from contracts.events.executor import EngineName
from services.executor.adapters.artifacts import default_cache_dir
from services.executor.adapters.engines import continuous_batching as batching
from services.executor.adapters.engines.base import Engine, EngineReply, EngineUnavailable, error_reply, installed
from services.executor.adapters.engines.generation_rules import (
    PromptTooLong,
    Sampling,
    cut_at_stop,
    max_new_tokens,
    own_tokens,
    sampling_of,
    token_list,
)
from services.executor.adapters.engines.hf_prompts import completion, prompt_text, text_choice
from services.executor.adapters.engines.responses import UnmappableRequest, chat_request

log = logging.getLogger(__name__)

@dataclass
class Job:
    prompt_ids: list[int]
    samples: int
    limit: int
    sampling: Sampling
    stops: list[str]
    ignore_eos: bool
    done: asyncio.Future[list[tuple[list[int], bool]]]
    cancelled: threading.Event = field(default_factory=threading.Event)


class TransformersEngine(Engine):
    name: ClassVar[EngineName] = "transformers"

    def __init__(self, n_threads: int = 2, cache_dir: Path | None = None,
                 continuous_batching: bool | None = None) -> None:
        """`continuous_batching`: None, on CUDA where transformers has it; True: wherever it has it; False: never."""
        self.n_threads = n_threads
        self.continuous_batching = continuous_batching
        self._batches: batching.ContinuousBatches | None = None
        self.cache_dir = cache_dir or default_cache_dir() / "hf-checkpoints"
        self._torch: Any = None
        self._transformers: Any = None
        self._network: Any = None
        self._tokenizer: Any = None
        self.device = "cpu"
        """Where the model runs: "cuda" or "cpu" (chosen at load)."""
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    @property
    def version(self) -> str:
        try:
            versions = [f"{name} {importlib.metadata.version(name)}" for name in ("transformers", "torch")]
        except importlib.metadata.PackageNotFoundError:
            return "not-installed"
        return ", ".join(versions)

    @property
    def release(self) -> str:
        return installed("transformers")

    @property
    def fingerprint(self) -> str:
        """`system_fingerprint`: which engine and versions produced an answer."""
        return "transformers-" + self.version.replace(", ", "-").replace(" ", "-")

    def load(self, model: CatalogueModel) -> None:
        try:
            torch = importlib.import_module("torch")
            transformers = importlib.import_module("transformers")
        except ImportError as error:
            raise EngineUnavailable(f"PyTorch and transformers are not installed here, so {model.id} cannot load: "
                                    "pip install 'sheshnag[transformers]'") from error
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            torch.set_num_threads(max(1, self.n_threads))
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        source = self._checkpoint(Path(model.artifact), transformers, dtype)
        try:
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
            network = transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
        except (OSError, ValueError) as error:
            raise EngineUnavailable(f"transformers could not load {model.id} from {source}: {error}") from error
        self._network = network.to(self.device).eval()
        if self._tokenizer.pad_token_id is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token
        self._tokenizer.padding_side = "left"
        self._torch, self._transformers = torch, transformers
        wanted = self.device == "cuda" if self.continuous_batching is None else self.continuous_batching
        if wanted and batching.available(transformers, self._network):
            self._batches = batching.ContinuousBatches(
                transformers, self._network, model.slots, model.context_length, self._tokenizer.pad_token_id)
        self.model = model
        self._worker = threading.Thread(target=self._serve, name=f"transformers-{model.id}", daemon=True)
        self._worker.start()
        log.info("loaded %s on %s (%s) with %s, %s", model.id, self.device, dtype, self.version,
                 "continuous batching" if self._batches is not None else "micro-batches")

    @property
    def continuous(self) -> bool:
        """Whether lines run through transformers' continuous batching (bench/gpu_smoke.py reports it)."""
        return self._batches is not None

    def in_flight(self) -> int:
        """Lines being generated in the continuous batch (0 once each has ended or been cancelled)."""
        return self._batches.in_flight() if self._batches is not None else 0

    def _checkpoint(self, artifact: Path, transformers: Any, dtype: Any) -> Path:
        """The checkpoint directory to load: the artifact itself, or a GGUF's dequantized copy (made once)."""
        if artifact.is_dir():
            return artifact
        if artifact.suffix.lower() != ".gguf":
            raise EngineUnavailable(f"{artifact} is neither a checkpoint directory nor a GGUF file")
        stat = artifact.stat()
        key = hashlib.sha256(f"{artifact.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        target = self.cache_dir / f"{artifact.stem}-{key}"
        if (target / "config.json").is_file():
            return target
        log.info("converting %s to a checkpoint under %s (once)", artifact.name, target)
        staging = target.with_name(target.name + f".tmp-{secrets.token_hex(4)}")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(artifact.parent), gguf_file=artifact.name)
        network = transformers.AutoModelForCausalLM.from_pretrained(str(artifact.parent), gguf_file=artifact.name,
                                                                    dtype=dtype)
        # The weights are dequantized already; transformers only refuses to save what it still calls GGUF-quantized.
        network.hf_quantizer = None
        if hasattr(network.config, "quantization_config"):
            del network.config.quantization_config
        tokenizer.save_pretrained(str(staging))
        network.save_pretrained(str(staging))
        try:
            staging.rename(target)
        except OSError:  # another process converted it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def unload(self) -> None:
        if self._batches is not None:
            self._batches.stop()
            self._batches = None
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout=60)
        self._worker = None
        self._network = self._tokenizer = self.model = None
        gc.collect()
        if self._torch is not None and self.device == "cuda":
            self._torch.cuda.empty_cache()

    async def run(self, endpoint: str, body: dict[str, object]) -> EngineReply:
        if self._network is None or self.model is None:
            raise EngineUnavailable("no model is loaded")
        if endpoint not in self.model.endpoints or endpoint == "/v1/embeddings":
            return self.not_served(endpoint)
        try:
            request = chat_request(body) if endpoint == "/v1/responses" else dict(body)
            job = self._job(endpoint, request)
        except UnmappableRequest as error:
            return error_reply(400, str(error), "invalid_request")
        except PromptTooLong as error:
            return error_reply(400, str(error), "context_too_long")
        except Exception as error:  # jinja2's TemplateError from the model's own template: the line's fault
            return error_reply(400, f"the chat template refused the messages: {error}", "invalid_request")
        try:
            rows = await self._generate_job(job)
        except RuntimeError as error:  # CUDA out of memory, a kernel error: this line's try failed
            return error_reply(500, f"generation failed: {error}", "engine_error")
        return self.completed(endpoint, self._completion(endpoint, job, rows), body)

    async def _generate_job(self, job: Job) -> list[tuple[list[int], bool]]:
        """Each sample's tokens and whether it ended (EOS), through the continuous batch where the line fits it."""
        sampling = job.sampling
        if (self._batches is not None and self._batches.running
                and batching.eligible(sampling.seed, sampling.repetition_penalty)):
            kwargs = batching.sampling_kwargs(sampling.greedy, sampling.temperature, sampling.top_p, sampling.top_k,
                                              self._batches.vocabulary)
            generated = await self._batches.generate(job.prompt_ids, job.samples, job.limit, kwargs, job.ignore_eos)
            eos = set(token_list(self._network.generation_config.eos_token_id))
            return [own_tokens(tokens, job.limit, eos, job.ignore_eos) for tokens in generated]
        self._jobs.put(job)
        try:
            return await job.done
        except asyncio.CancelledError:
            job.cancelled.set()
            raise

    def _job(self, endpoint: str, request: dict[str, Any]) -> Job:
        assert self.model is not None
        prompt = prompt_text(self._tokenizer, endpoint, request)
        ids = self._tokenizer(prompt, add_special_tokens=endpoint == "/v1/completions")["input_ids"]
        limit = max_new_tokens(request, endpoint, len(ids), self.model.context_length)
        if limit < 1 or len(ids) + limit > self.model.context_length:
            raise PromptTooLong(f"{len(ids)} prompt tokens and {limit} to generate exceed the context of "
                                f"{self.model.context_length} tokens")
        samples = int(request.get("n") or 1)
        if not 1 <= samples <= MAX_SAMPLES:
            raise UnmappableRequest(f"n must be from 1 to {MAX_SAMPLES}")
        stop = request.get("stop")
        stops = [stop] if isinstance(stop, str) else [str(s) for s in stop] if isinstance(stop, list) else []
        return Job(list(ids), samples, limit, sampling_of(request), stops, bool(request.get("ignore_eos")),
                   asyncio.get_running_loop().create_future())

    def _completion(self, endpoint: str, job: Job, rows: list[tuple[list[int], bool]]) -> dict[str, Any]:
        assert self.model is not None
        chat = endpoint != "/v1/completions"
        choices, generated = [], 0
        for index, (tokens, ended) in enumerate(rows):
            text = self._tokenizer.decode(tokens, skip_special_tokens=True)
            text, stopped = cut_at_stop(text, job.stops)
            if stopped:
                tokens = self._tokenizer(text, add_special_tokens=False)["input_ids"]
            generated += len(tokens)
            choices.append(text_choice(index, "stop" if ended or stopped else "length", text, chat))
        return completion(chat, self.model.id, choices, len(job.prompt_ids), generated, 0, self.fingerprint)

    # The engine's own thread from here on.

    def _serve(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < max(1, self.model.slots if self.model else 1):
                try:
                    waiting = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if waiting is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                batch.append(waiting)
            for group in _groups(batch):
                live = [job for job in group if not job.cancelled.is_set()]
                for job in group:
                    if job.cancelled.is_set():
                        job.done.get_loop().call_soon_threadsafe(_settle, job.done, job.done.cancel)
                if live:
                    self._generate(live)

    def _generate(self, jobs: list[Job]) -> None:
        torch = self._torch
        try:
            rows = [job.prompt_ids for job in jobs for _ in range(job.samples)]
            width = max(len(row) for row in rows)
            pad = self._tokenizer.pad_token_id
            input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows], device=self.device)
            mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=self.device)
            sampling = jobs[0].sampling
            settings: dict[str, Any] = {"max_new_tokens": max(job.limit for job in jobs), "pad_token_id": pad,
                                        "do_sample": not sampling.greedy,
                                        "repetition_penalty": sampling.repetition_penalty}
            greedy = sampling.greedy
            settings.update(temperature=None if greedy else sampling.temperature,
                            top_p=None if greedy else sampling.top_p, top_k=None if greedy else sampling.top_k)
            if jobs[0].ignore_eos:  # a group ignores EOS or not as one
                settings["eos_token_id"] = None
            stopping = all_cancelled(self._transformers, jobs)
            batches = self._batches
            with batches.paused() if batches is not None else contextlib.nullcontext(), torch.inference_mode():
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                output = self._network.generate(input_ids=input_ids, attention_mask=mask,
                                                stopping_criteria=stopping, **settings)
            new = iter(output[:, width:].tolist())  # each job's samples, in the order their rows were built
            eos = set(token_list(self._network.generation_config.eos_token_id))
            for job in jobs:
                found = [own_tokens(next(new), job.limit, eos, job.ignore_eos) for _ in range(job.samples)]
                job.done.get_loop().call_soon_threadsafe(_settle, job.done, job.done.set_result, found)
        except Exception as error:
            log.exception("generation failed for %d lines", len(jobs))
            for job in jobs:
                job.done.get_loop().call_soon_threadsafe(_settle, job.done, job.done.set_exception,
                                                         RuntimeError(str(error)))


def all_cancelled(transformers: Any, jobs: list[Job]) -> Any:
    """A stopping criterion ending the batch once every line in it was cancelled."""

    class AllCancelled(transformers.StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            stop = all(job.cancelled.is_set() for job in jobs)
            return input_ids.new_full((input_ids.shape[0],), stop, dtype=bool)

    return transformers.StoppingCriteriaList([AllCancelled()])


def _groups(batch: list[Job]) -> list[list[Job]]:
    """Jobs that sample alike (and seeded ones alone: a seed is the batch's)."""
    groups: dict[object, list[Job]] = {}
    for job in batch:
        key: object = (job.sampling, job.ignore_eos) if job.sampling.seed is None else id(job)
        groups.setdefault(key, []).append(job)
    return list(groups.values())


def _settle(future: "asyncio.Future[Any]", settle: Callable[..., object], *args: object) -> None:
    """`settle(*args)` (the future's own result, exception or cancel), unless the future is done already."""
    if not future.done():
        settle(*args)
