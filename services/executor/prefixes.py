"""Prefix-aware running of a unit's lines, so an engine keeping each slot's last prompt (llama.cpp) serves a shared
prefix from cache: same-prefix lines run one after another on one slot (a lane: started together, each would compute
the prefix), and a free slot starts a line of the prefix it holds. Pure: no I/O, no engine, no clock."""

import hashlib
import json
from collections import Counter, deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from services.executor.adapters.engines.responses import UnmappableRequest, chat_request

MIN_STEM_CHARS = 512
"""A shared stem (tools, system prompt, few-shot turns) shorter than this (~128 tokens) is cheaper than an idle slot."""
HEAD_CHARS = 1024
"""Without a long stem, prompts longer than this sharing their first this many characters share ~256 tokens."""


def prefix_key(endpoint: str, body: Mapping[str, object], scope: str = "") -> str | None:
    """The key of the long prompt prefix the line shares, if any: its `prompt_cache_key`, else a digest of its stem
    (chat: the tools and every message but the last; else a long prompt's start), scoped to the batch owner."""
    explicit = body.get("prompt_cache_key")
    if isinstance(explicit, str) and explicit:
        return _digest(scope, "prompt_cache_key", explicit)
    text = _shared_text(endpoint, body)
    return None if text is None else _digest(scope, endpoint, text)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _shared_text(endpoint: str, body: Mapping[str, object]) -> str | None:
    if endpoint == "/v1/completions":
        prompt = body.get("prompt")
        return prompt[:HEAD_CHARS] if isinstance(prompt, str) and len(prompt) > HEAD_CHARS else None
    if endpoint == "/v1/responses":
        try:
            body = chat_request(dict(body))
        except (UnmappableRequest, AttributeError, TypeError):
            return None
    elif endpoint != "/v1/chat/completions":
        return None  # embeddings: no prompt cache to serve
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    tools = body.get("tools")
    stem = _canonical([tools, messages[:-1]])
    if len(stem) >= MIN_STEM_CHARS:
        return stem
    whole = _canonical([tools, messages])
    return whole[:HEAD_CHARS] if len(whole) > HEAD_CHARS else None


@dataclass(frozen=True)
class UnitOrder:
    """How to start a unit's lines: their indices in starting order, and the slots (lanes) each prefix key gets."""

    order: list[int]
    lanes: dict[str, int]


def order_lines(keys: Sequence[str | None], slots: int, warm: Collection[str] = ()) -> UnitOrder:
    """The order to start lines of prefix `keys` on `slots` slots: stable, `warm` keys first, a keyless line alone."""
    slots = max(slots, 1)
    if all(key is None for key in keys):
        return UnitOrder(list(range(len(keys))), {})  # every line a lane of its own: file order
    groups: dict[str, list[int]] = {}
    singles: list[tuple[int, list[int]]] = []
    for index, key in enumerate(keys):
        if key is None:
            singles.append((index, [index]))
        else:
            groups.setdefault(key, []).append(index)
    lanes = _lane_counts({key: len(members) for key, members in groups.items()}, len(singles), slots)
    lane_lists: list[tuple[tuple[int, int], deque[int]]] = []
    for key, members in groups.items():
        count = lanes[key]
        rank = (0 if key in warm else 1, members[0])  # members[0]: the key's first line
        lane_lists.extend((rank, deque(members[lane::count])) for lane in range(count))
    lane_lists.extend(((1, index), deque(members)) for index, members in singles)
    lane_lists.sort(key=lambda item: item[0])  # stable: a key's lanes stay together
    return UnitOrder(_interleave([lane for _, lane in lane_lists], slots), lanes)


def _lane_counts(sizes: dict[str, int], singles: int, slots: int) -> dict[str, int]:
    """One lane per key; spare slots go, one at a time, to the key with the most lines per lane (D'Hondt)."""
    lanes = dict.fromkeys(sizes, 1)
    spare = slots - len(sizes) - singles
    while spare > 0:
        candidates = [key for key in sizes if sizes[key] > lanes[key]]
        if not candidates:
            break
        widest = max(candidates, key=lambda key: sizes[key] / lanes[key])
        lanes[widest] += 1
        spare -= 1
    return lanes


def _interleave(lanes: list[deque[int]], slots: int) -> list[int]:
    """Round-robin over `slots` lanes at a time; an exhausted lane's place goes to the next lane waiting."""
    queue = deque(lanes)
    active = [queue.popleft() for _ in range(min(slots, len(queue)))]
    order: list[int] = []
    while active:
        following = []
        for lane in active:
            order.append(lane.popleft())
            if lane:
                following.append(lane)
            elif queue:
                following.append(queue.popleft())
        active = following
    return order


@dataclass(eq=False)
class SlotState:
    """One engine slot as the pool keeps it and the choice reads it."""

    index: int
    resident: str | None = None
    """Prefix key of the last line started on it (what its KV cache holds); None: nothing worth keeping."""
    busy: bool = False
    last_used: int = -1
    """When it was last handed out (a counter): the least recently used goes first among equals."""


def choose_start(candidates: Sequence[str | None], slots: Sequence[SlotState], need: Mapping[str, int],
                 patient: bool = True) -> tuple[int, str | None] | None:
    """Which pending prefix (`candidates`, preferred first) to start on which free slot; None: wait. In turn: a free
    slot holding a candidate's prefix; a spare slot for a candidate short of its `need`; wait, while a busy slot holds
    a candidate's prefix and the owner is `patient`; else the free slot whose loss costs least."""
    free = [slot for slot in slots if not slot.busy]
    keys = list(dict.fromkeys(candidates))
    if not free or not keys:
        return None
    holding = Counter(slot.resident for slot in slots)

    def surplus(slot: SlotState) -> float:
        if slot.resident is None:
            return float("inf")
        return holding[slot.resident] - need.get(slot.resident, 0)

    def cheapest(among: list[SlotState]) -> int:
        return max(among, key=lambda slot: (surplus(slot), -slot.last_used)).index

    for key in keys:
        warm = [slot for slot in free if key is not None and slot.resident == key]
        if warm:
            return max(warm, key=lambda slot: slot.last_used).index, key
    spare = [slot for slot in free if surplus(slot) > 0]
    for key in keys:
        if spare and (key is None or holding[key] < need.get(key, len(slots))):
            return cheapest(spare), key
    if patient and any(key is not None and key in need and holding[key] > 0 for key in keys):
        return None
    return cheapest(free), keys[0]
