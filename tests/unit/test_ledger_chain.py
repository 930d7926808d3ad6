"""The hash chain over the EVENTS stream: the ledger's checkpointed links against a recomputed log."""

from services.ledger.chain import DIGEST_CHARS, Fact, Link, first_break, link


def log_of(count: int) -> list[Fact]:
    return [Fact(n, f"evt.batch.b{n % 3}.progressed", b'{"n": %d}' % n) for n in range(1, count + 1)]


def links_for(log: list[Fact], per_link: int = 4) -> list[Link]:
    links, head = [], ""
    for start in range(0, len(log), per_link):
        digests = []
        for fact in log[start:start + per_link]:
            head = link(head, fact)
            digests.append(head[:DIGEST_CHARS])
        links.append(Link(log[start].sequence, digests, head))
    return links


def test_an_untouched_log_verifies_every_event() -> None:
    log = log_of(10)
    assert first_break(links_for(log), log) == (10, None)


def test_an_edited_event_breaks_the_chain_at_its_sequence() -> None:
    log = log_of(10)
    tampered = [Fact(f.sequence, f.subject, b'{"n": 99}') if f.sequence == 6 else f for f in log]
    checked, found = first_break(links_for(log), tampered)
    assert found is not None and (checked, found.sequence) == (5, 6)


def test_a_deleted_event_breaks_the_chain_at_its_sequence() -> None:
    log = log_of(10)
    checked, found = first_break(links_for(log), [f for f in log if f.sequence != 3])
    assert found is not None and (checked, found.sequence) == (2, 3) and "missing" in found.reason


def test_a_truncated_log_breaks_where_it_ends() -> None:
    log = log_of(10)
    checked, found = first_break(links_for(log), log[:8])
    assert found is not None and (checked, found.sequence) == (8, 9)


def test_an_event_moved_to_another_subject_breaks_the_chain() -> None:
    log = log_of(4)
    moved = [*log[:3], Fact(4, "evt.batch.other.progressed", log[3].data)]
    found = first_break(links_for(log), moved)[1]
    assert found is not None and found.sequence == 4
