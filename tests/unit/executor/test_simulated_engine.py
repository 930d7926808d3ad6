"""The simulated engine (bench/control_plane.py) answers each line at once in the shape of the endpoint, with usage
derived from the request, and only a catalogue entry naming it uses it."""

from pathlib import Path

from contracts.catalogue import CatalogueModel
from services.executor.adapters.engines import create_engine
from services.executor.settings import ExecutorSettings


def model(tmp_path: Path) -> CatalogueModel:
    weights = tmp_path / "simulated.weights"
    weights.write_bytes(b"x")
    return CatalogueModel(id="sim", engine="simulated", artifact=str(weights), context_length=4096, slots=4,
                          memory_bytes=1, endpoints=["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])


async def test_each_endpoint_is_answered_at_once_with_usage_from_the_request(tmp_path: Path) -> None:
    engine = create_engine("simulated", 1)
    engine.load(model(tmp_path))

    chat = await engine.run("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 40}],
                                                     "max_tokens": 7})
    completion = await engine.run("/v1/completions", {"prompt": "hello"})
    embedding = await engine.run("/v1/embeddings", {"input": "hello"})
    refused = await engine.run("/v1/responses", {"input": "hello"})

    assert chat.ok and chat.body["usage"] == {"prompt_tokens": chat.body["usage"]["prompt_tokens"],  # type: ignore[index]
                                              "completion_tokens": 7,
                                              "total_tokens": chat.body["usage"]["prompt_tokens"] + 7}  # type: ignore[index]
    assert chat.body["choices"][0]["message"]["role"] == "assistant"  # type: ignore[index]
    assert completion.ok and completion.body["usage"]["completion_tokens"] == 16  # type: ignore[index]
    assert embedding.ok and embedding.body["object"] == "list"
    assert refused.status_code == 400 and engine.slots == 4


def test_no_executor_runs_it_unless_told() -> None:
    assert ExecutorSettings.model_fields["engine"].default == "llamacpp"
