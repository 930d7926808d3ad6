"""Reading a GGUF file's metadata (the vocabulary and chat template the validator counts tokens with) without its
tensors: every value type, the real SmolLM2 file, and files that are not GGUF."""

import struct
from pathlib import Path

import pytest

from services.runtime.storage.catalogue import load_catalogue, resolve_artifact
from services.validator.adapters.gguf_metadata import GGUFFormatError, read_metadata


def gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_file(path: Path, pairs: list[tuple[str, int, bytes]], version: int = 3) -> Path:
    body = b"".join(gguf_string(key) + struct.pack("<I", kind) + value for key, kind, value in pairs)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, len(pairs)) + body + b"\x00" * 64)
    return path


def test_every_value_type_reads_back_as_written(tmp_path: Path) -> None:
    strings = [gguf_string(s) for s in ("a", "Ġb", "<|im_end|>")]
    path = gguf_file(tmp_path / "m.gguf", [
        ("general.name", 8, gguf_string("tiny")),
        ("count", 4, struct.pack("<I", 7)),
        ("signed", 11, struct.pack("<q", -3)),
        ("ratio", 6, struct.pack("<f", 0.5)),
        ("flag", 7, struct.pack("<?", True)),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + b"".join(strings)),
        ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 1, 3)),
        ("nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 0, 2) + b"\x01\x02"),
    ])
    assert read_metadata(path) == {"general.name": "tiny", "count": 7, "signed": -3, "ratio": 0.5, "flag": True,
                                   "tokenizer.ggml.tokens": ["a", "Ġb", "<|im_end|>"],
                                   "tokenizer.ggml.token_type": [1, 1, 3], "nested": [[1, 2]]}


def test_the_packaged_model_has_its_whole_vocabulary_and_chat_template() -> None:
    model = load_catalogue(None).resolve("smollm2-135m-instruct-q4_1")
    assert model is not None
    metadata = read_metadata(resolve_artifact(model.artifact))
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    assert isinstance(tokens, list) and isinstance(types, list) and len(tokens) == len(types) == 49152
    assert metadata["tokenizer.ggml.pre"] == "smollm" and "<|im_start|>" in tokens
    assert "messages" in str(metadata["tokenizer.chat_template"])


@pytest.mark.parametrize(("content", "problem"), [
    (b"not a model at all", "not a GGUF file"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("cut"), "ends inside"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("odd") + struct.pack("<I", 99), "type 99"),
])
def test_a_file_that_is_not_readable_gguf_is_refused_with_why(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFFormatError, match=problem):
        read_metadata(path)
