"""Executor settings (`SHESHNAG_EXECUTOR_*`)."""

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from contracts.catalogue import Catalogue, CatalogueModel
from contracts.commands import MAX_ACK_WAIT_S, MAX_RUN_DELIVERIES, MIN_ACK_WAIT_S
from contracts.events.executor import EngineName
from services.runtime.process.settings import ServiceSettings


class ExecutorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="SHESHNAG_EXECUTOR_", extra="ignore")

    executor_id: str = "local-0"
    """This executor's id: one subject token, unique in the fleet (with a worker key: its NATS user)."""
    worker_key: str = ""
    """The worker key (`wk-…`) an operator or provider created; without one the scheduler assigns nothing."""
    engine: EngineName = "llamacpp"
    """The inference engine: `llamacpp` (CPU, the embedded default), `tensorrt_llm` (NVIDIA GPUs), `transformers`
    (PyTorch, GPU or CPU), or `simulated` (answers at once, computes nothing: bench/control_plane.py only)."""
    models: list[str] = Field(default_factory=list)
    """Catalogue ids (or aliases) to serve; empty means every catalogue model of `engine`."""
    preload_models: list[str] | None = None
    """Catalogue ids loaded at start; None means the first served model. Others load on first use."""
    memory_budget_mb: int | None = None
    """Advertise at most this much memory (a share of a shared host or GPU); None: the device's own."""
    n_threads: int = 2
    """CPU threads the engine uses for prompt processing and generation."""
    chunk_lines: int = 256
    """Finished lines per committed result chunk (and per progress event) at most; a slower engine commits smaller
    chunks every `chunk_max_wait_s`. Each chunk costs an object write and a fact; a lost attempt runs its
    uncommitted chunk again (at most this many lines, or `chunk_max_wait_s` of work)."""
    chunk_max_wait_s: float = 2.0
    """A chunk is committed with fewer lines once its first finished this long ago, whether or not another line
    finished since: `request_counts` and `usage` move within this long of any line finishing."""
    line_attempts: int = 3
    """Tries of one line when the engine answers 5xx (transient); a 4xx answer is final at once."""
    line_retry_delay_s: float = 0.5
    """Backoff before a line's second try, doubled before each further one."""
    parallel_attempts: int = Field(default=8, ge=1)
    """Attempts (of different batches, or shards of one) it runs at once, all through one pool of each engine's
    slots shared fairly between batch owners; advertised, and the scheduler assigns it no more."""
    heartbeat_s: float = 3.0
    """How often the executor says it is alive, with its models and free memory."""
    ack_wait_s: float = Field(default=30.0, ge=MIN_ACK_WAIT_S, le=MAX_ACK_WAIT_S)
    """How long a command may go unacknowledged before the broker delivers it again."""
    max_deliver: int = Field(default=5, ge=1, le=MAX_RUN_DELIVERIES)
    """Deliveries of one run command before the batch is failed."""
    stop_grace_s: float = 5.0
    """How long a stopping executor lets the attempts in hand commit (together) before abandoning them to a
    redelivery."""
    model_cache_dir: str = ""
    """Where model weights fetched from the object store or Hugging Face are kept (verified by their SHA-256);
    empty: `$XDG_CACHE_HOME/sheshnag/models`."""
    join_retry_s: float = Field(default=1.0, gt=0)
    """After a refusal to join (NATS refused the worker key, the broker's certificate is not trusted, the scheduler
    refused the registration) the executor says why and tries again this long after; the wait doubles with each
    refusal in a row, up to `join_retry_max_s`."""
    join_retry_max_s: float = Field(default=60.0, gt=0)
    """The longest wait between two tries to join."""
    max_refusals: int = Field(default=0, ge=0)
    """Give up after this many refusals in a row and exit with status 78 (scripts; 1: try once); 0: keep trying,
    backing off."""
    object_broker_wait_s: float = 60.0
    """How long to wait for the leading scheduler's answer while none can answer (a leader change): for the facts an
    executor under authorization (a worker key) sends through the scheduler's fact desk, and, without S3 credentials
    (`SHESHNAG_S3_ACCESS_KEY` unset), for the presigned URLs its objects are reached through."""

    def served_models(self, catalogue: Catalogue) -> list[CatalogueModel]:
        if not self.models:
            served = [model for model in catalogue.models if model.engine == self.engine]
            if not served:
                raise ValueError(f"the catalogue has no {self.engine} model to serve: add one (its engine "
                                 f"{self.engine!r}, an artifact it can read) or run another engine")
            return served
        served = []
        for name in self.models:
            model = catalogue.resolve(name)
            if model is None or model.engine != self.engine:
                raise ValueError(f"model {name!r} is not a {self.engine} model of the catalogue")
            served.append(model)
        return served
