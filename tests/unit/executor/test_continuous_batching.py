"""How a line's sampling becomes a request of transformers' continuous batching: greedy as top_k 1, top_k 0 as every
token, and only what the library's per-request processors carry (a seed or a repetition penalty stays out)."""

from types import SimpleNamespace

from services.executor.adapters.engines import continuous_batching as batching


def test_greedy_is_top_k_one_at_temperature_one() -> None:
    assert batching.sampling_kwargs(True, 0.0, 1.0, 0, 49152) == {"temperature": 1.0, "top_k": 1, "top_p": 1.0}


def test_a_sampled_line_keeps_its_own_settings_and_top_k_zero_means_every_token() -> None:
    assert batching.sampling_kwargs(False, 0.7, 0.9, 0, 49152) == {"temperature": 0.7, "top_k": 49152, "top_p": 0.9}
    assert batching.sampling_kwargs(False, 1.0, 1.0, 40, 49152)["top_k"] == 40


def test_a_seed_or_a_repetition_penalty_runs_in_micro_batches() -> None:
    assert batching.eligible(None, 1.0)
    assert not batching.eligible(7, 1.0)
    assert not batching.eligible(None, 1.2)


def test_a_transformers_without_per_request_sampling_is_not_used() -> None:
    assert not batching.available(SimpleNamespace())
    assert not batching.available(SimpleNamespace(ContinuousBatchingConfig=object))


def test_an_eager_only_model_keeps_micro_batches() -> None:
    """The manager turns a model's attention paged; an eager one's would then break the micro-batches beside it."""
    import dataclasses

    @dataclasses.dataclass
    class Config:
        per_request_processors: bool = False

    library = SimpleNamespace(ContinuousBatchingConfig=Config)
    assert batching.available(library, SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa")))
    assert not batching.available(library, SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager")))
