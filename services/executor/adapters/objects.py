"""What the executor does with objects: the port that direct S3 access and brokered access both fill."""

from collections.abc import AsyncIterator
from typing import Protocol


class ObjectAccess(Protocol):
    def iter_chunks(self, key: str) -> AsyncIterator[bytes]:
        """The object's bytes in bounded chunks, as they arrive."""

    def iter_lines(self, key: str) -> AsyncIterator[bytes]: ...

    async def get_bytes(self, key: str) -> bytes: ...

    async def put_bytes(self, key: str, data: bytes, content_type: str = "application/jsonl") -> None: ...

    async def list_keys(self, prefix: str) -> list[str]: ...

