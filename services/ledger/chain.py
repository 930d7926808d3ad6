"""The EVENTS stream's hash chain: each event's bytes chained to the one before, so edits and gaps show."""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from hashlib import sha256
from itertools import groupby

from services.runtime.nats.follower import Fact

__all__ = ["DIGEST_CHARS", "ChainCheck", "Fact", "Link", "contiguous_runs", "first_break", "link", "link_run"]

DIGEST_CHARS = 16
"""Hex characters of each event's chained hash kept per event; the full head is kept per link."""


def link(previous: str, fact: Fact) -> str:
    """The chain's hash after `fact`, given the hash after the event before it ("" at the start)."""
    body = b"%s\n%d\n%s\n" % (previous.encode(), fact.sequence, fact.subject.encode())
    return sha256(body + fact.data).hexdigest()


def link_run(previous: str, run: list[Fact]) -> tuple[list[str], str]:
    """`link` over consecutive facts: each one's digest, and the chain's hash after the last of them."""
    digests, head = [], previous
    for fact in run:
        head = link(head, fact)
        digests.append(head[:DIGEST_CHARS])
    return digests, head


def contiguous_runs(facts: Iterable[Fact]) -> Iterator[list[Fact]]:
    """Facts split where a sequence is missing, so each link covers consecutive sequences (within a run, a fact's
    sequence less its position is the same)."""
    for _, run in groupby(enumerate(facts), key=lambda pair: pair[1].sequence - pair[0]):
        yield [fact for _, fact in run]


@dataclass(frozen=True)
class Link:
    """What the ledger checkpointed for a run of consecutive sequences."""

    first_sequence: int
    digests: list[str]
    head: str


@dataclass(frozen=True)
class Break:
    sequence: int
    reason: str


class ChainCheck:
    """Recompute the chain over a log fed fact by fact, and compare it with the checkpointed links. Facts before the
    first linked sequence (an archived history the store was seeded past) are chained, not compared: the archive's
    own hashes vouch for them."""

    def __init__(self, links: Iterable[Link]) -> None:
        self.expected: dict[int, str] = {}
        self.heads: dict[int, str] = {}
        for checkpoint in links:
            for offset, digest in enumerate(checkpoint.digests):
                self.expected[checkpoint.first_sequence + offset] = digest
            self.heads[checkpoint.first_sequence + len(checkpoint.digests) - 1] = checkpoint.head
        self.first = min(self.expected, default=0)
        self.last = max(self.expected, default=0)
        self.head, self.checked, self.seen = "", 0, 0
        self.found: Break | None = None

    @property
    def done(self) -> bool:
        return self.found is not None or self.seen >= self.last

    def feed(self, fact: Fact) -> None:
        if self.done:
            return
        if fact.sequence < self.first:
            self.head, self.seen = link(self.head, fact), fact.sequence
            return
        while self.seen + 1 < min(fact.sequence, self.last + 1):  # sequences the log no longer has
            self.seen += 1
            if self.seen in self.expected:
                self.found = Break(self.seen, "the event is missing from the log")
                return
        if fact.sequence > self.last:  # past the checkpoint: the gap up to it held nothing the ledger chained
            return
        self.seen = fact.sequence
        if fact.sequence not in self.expected:
            self.found = Break(fact.sequence, "the event was never folded by the ledger")
            return
        self.head = link(self.head, fact)
        if (self.head[:DIGEST_CHARS] != self.expected[fact.sequence]
                or self.heads.get(fact.sequence, self.head) != self.head):
            self.found = Break(fact.sequence, "the event's bytes differ from what the ledger chained")
            return
        self.checked += 1

    def result(self) -> tuple[int, Break | None]:
        """How many events were checked and the first sequence where the log differs, if any."""
        if self.found is None and self.seen < self.last:
            return self.checked, Break(self.seen + 1, "the log ends before the ledger's checkpoint")
        return self.checked, self.found


def first_break(links: Iterable[Link], log: Iterable[Fact]) -> tuple[int, Break | None]:
    """`ChainCheck` over a whole log: how many events were checked and the first break, if any."""
    check = ChainCheck(links)
    for fact in log:
        if check.done:
            break
        check.feed(fact)
    return check.result()
