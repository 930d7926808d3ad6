"""The key-value metadata at the head of a GGUF file (vocabulary, chat template), read in one pass with `struct`
(a few tenths of a second): gguf's GGUFReader maps each token into a numpy view, ~6 s per validator start."""

import struct
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
"""GGUF value types with a fixed size, as struct formats."""
STRING, ARRAY = 8, 9
Value = int | float | bool | str | list["Value"]


class GGUFFormatError(ValueError):
    """Not a GGUF file this reader understands."""


class _Head:
    def __init__(self, file: BinaryIO) -> None:
        self.file = file

    def read(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            raise GGUFFormatError("the file ends inside its metadata")
        return data

    def string(self) -> str:
        (size,) = struct.unpack("<Q", self.read(8))
        return self.read(size).decode("utf-8")

    def value(self, kind: int) -> Value:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item_kind, count = struct.unpack("<IQ", self.read(12))
            if item_kind in SCALARS:
                fmt = SCALARS[item_kind]
                values: list[Value] = list(struct.unpack(f"<{count}{fmt[1]}", self.read(count * struct.calcsize(fmt))))
                return values
            return [self.value(item_kind) for _ in range(count)]
        if kind not in SCALARS:
            raise GGUFFormatError(f"unknown GGUF value type {kind}")
        scalar: Value = struct.unpack(SCALARS[kind], self.read(struct.calcsize(SCALARS[kind])))[0]
        return scalar


def read_metadata(path: Path) -> dict[str, Value]:
    """Every key-value pair of the file's metadata (GGUF v2 and v3), in file order."""
    with path.open("rb", buffering=1 << 20) as file:
        head = _Head(file)
        if head.read(4) != MAGIC:
            raise GGUFFormatError(f"{path.name} is not a GGUF file")
        (version,) = struct.unpack("<I", head.read(4))
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} is not supported")
        _tensors, pairs = struct.unpack("<QQ", head.read(16))
        metadata: dict[str, Value] = {}
        for _ in range(pairs):
            key = head.string()
            (kind,) = struct.unpack("<I", head.read(4))
            metadata[key] = head.value(kind)
        return metadata
