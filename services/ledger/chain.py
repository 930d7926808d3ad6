"""The EVENTS stream's hash chain: each event's bytes chained to the one before, so edits and gaps show."""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from hashlib import sha256

from services.runtime.follower import Fact

__all__ = ["DIGEST_CHARS", "Fact", "Link", "contiguous_runs", "first_break", "link", "link_run"]

DIGEST_CHARS = 16
"""Hex characters of each event's chained hash kept per event; the full head is kept per link."""


def link(previous: str, fact: Fact) -> str:
    """The chain's hash after `fact`, given the hash after the event before it ("" at the start)."""
    body = b"%s\n%d\n%s\n" % (previous.encode(), fact.sequence, fact.subject.encode())
    return sha256(body + fact.data).hexdigest()


def link_run(previous: str, run: list[Fact]) -> tuple[list[str], str]:
    """`link` over consecutive facts: each one's digest, and the chain's hash after the last of them."""
    digests = []
    head = previous
    for fact in run:
        body = b"%s\n%d\n%s\n" % (head.encode(), fact.sequence, fact.subject.encode())
        head = sha256(body + fact.data).hexdigest()
        digests.append(head[:DIGEST_CHARS])
    return digests, head


def contiguous_runs(facts: Iterable[Fact]) -> Iterator[list[Fact]]:
    """Facts split where a sequence is missing, so each link covers consecutive sequences."""
    run: list[Fact] = []
    for fact in facts:
        if run and fact.sequence != run[-1].sequence + 1:
            yield run
            run = []
        run.append(fact)
    if run:
        yield run


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


def first_break(links: Iterable[Link], log: Iterable[Fact]) -> tuple[int, Break | None]:
    """Recompute the chain over `log` and compare it with the checkpointed links.

    Returns how many events were checked and the first sequence where the log differs, if any.
    """
    expected: dict[int, str] = {}
    heads: dict[int, str] = {}
    for checkpoint in links:
        for offset, digest in enumerate(checkpoint.digests):
            expected[checkpoint.first_sequence + offset] = digest
        heads[checkpoint.first_sequence + len(checkpoint.digests) - 1] = checkpoint.head
    if not expected:
        return 0, None
    last = max(expected)
    head, checked, seen = "", 0, 0
    for fact in log:
        if fact.sequence > last:
            break
        while seen + 1 < fact.sequence:  # sequences the log no longer has
            seen += 1
            if seen in expected:
                return checked, Break(seen, "the event is missing from the log")
        seen = fact.sequence
        if fact.sequence not in expected:
            return checked, Break(fact.sequence, "the event was never folded by the ledger")
        head = link(head, fact)
        if head[:DIGEST_CHARS] != expected[fact.sequence] or heads.get(fact.sequence, head) != head:
            return checked, Break(fact.sequence, "the event's bytes differ from what the ledger chained")
        checked += 1
    if seen < last:
        return checked, Break(seen + 1, "the log ends before the ledger's checkpoint")
    return checked, None
