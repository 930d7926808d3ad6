"""How the ledger's stored events and snapshots are written as JSON: eventsourcing's transcoder, except that a plain
dict that has a `_type_` key of its own (a tenant's batch metadata, a code an executor chose) is written escaped, as
a `plain_dict`, and so reads back as the same dict. eventsourcing reads any two-key `{"_type_", "_data_"}` dict as a
custom type: unescaped, such a dict made the batch unreadable from the store (an unknown type raised; `decimal_str`
or `datetime_iso` came back as a Decimal or a datetime), and every later fact of it stopped the ledger."""

import threading
from typing import Any

from eventsourcing.persistence import JSONTranscoder, Transcoding

TYPE_KEY = b'"_type_"'


class _Escaped:
    """A plain dict to be written escaped (not a dict: json would write a dict subclass as a dict)."""

    __slots__ = ("items",)

    def __init__(self, items: dict[str, Any]) -> None:
        self.items = items


class PlainDict(Transcoding):
    type = _Escaped
    name = "plain_dict"

    def encode(self, obj: _Escaped) -> list[list[Any]]:
        return [[key, value] for key, value in obj.items.items()]

    def decode(self, data: list[list[Any]]) -> dict[str, Any]:
        return {key: value for key, value in data}


def escaped(obj: Any) -> Any:
    """`obj` with every plain dict that holds a `_type_` key (at any depth) wrapped to be written escaped."""
    if type(obj) is dict:
        inner = {key: escaped(value) for key, value in obj.items()}
        return _Escaped(inner) if "_type_" in inner else inner
    if type(obj) is list or type(obj) is tuple:
        return [escaped(value) for value in obj]
    return obj


class LedgerTranscoder(JSONTranscoder):
    """Written as eventsourcing writes it while every `"_type_"` in the text is one of its own custom types (one
    count, no walk of the object); otherwise written again with the plain dicts that hold one escaped."""

    def __init__(self) -> None:
        super().__init__()
        self._written = threading.local()
        self.register(PlainDict())

    def _encode_obj(self, o: Any) -> dict[str, Any]:
        self._written.custom = getattr(self._written, "custom", 0) + 1
        return super()._encode_obj(o)

    def encode(self, obj: Any) -> bytes:
        self._written.custom = 0
        data = super().encode(obj)
        if data.count(TYPE_KEY) == self._written.custom:
            return data
        return super().encode(escaped(obj))
