"""The hash chain over the EVENTS stream: the ledger's checkpointed links against a recomputed log."""

from services.ledger.chain import DIGEST_CHARS, Fact, Link, first_break, link, link_run


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


def test_events_deleted_up_to_the_checkpoint_are_missing_not_a_log_that_ends() -> None:
    log = log_of(10)
    later = Fact(12, "evt.batch.b0.progressed", b'{"n": 12}')  # one the ledger has not folded yet
    checked, found = first_break(links_for(log), [*log[:8], later])
    assert found is not None and (checked, found.sequence) == (8, 9) and "missing" in found.reason


def test_an_event_moved_to_another_subject_breaks_the_chain() -> None:
    log = log_of(4)
    moved = [*log[:3], Fact(4, "evt.batch.other.progressed", log[3].data)]
    found = first_break(links_for(log), moved)[1]
    assert found is not None and found.sequence == 4


def test_a_run_linked_at_once_is_the_chain_linked_fact_by_fact() -> None:
    log = log_of(10)
    [whole] = links_for(log, per_link=10)
    digests, head = link_run("", log)
    assert (digests, head) == (whole.digests, whole.head)
    assert first_break([Link(1, digests, head)], log) == (10, None)
