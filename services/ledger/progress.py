"""Runs of progress facts, a busy stream's most frequent fact: a batch's run of them within a fold group merges into
one aggregate event per shard, with the same result as applying each (counts are cumulative per shard and never
lowered; each chunk's tokens count once), whatever the group boundaries were."""

from operator import attrgetter
from typing import NamedTuple
from uuid import UUID

from services.ledger.decoding import ProgressFact
from services.ledger.domainmodel import Batch


class Progress(NamedTuple):
    """A batch's progress as one fact states it, or a run of them merged: the latest sequence and attempt, the
    highest counts, the tokens of the chunks not counted before and their keys."""

    batch: Batch
    sequence: int
    attempt: int
    completed: int
    failed: int
    shard: int
    usage: tuple[int, int, int] = (0, 0, 0)
    chunks: tuple[str, ...] = ()


class ProgressRuns:
    """Per batch and shard, the run of progress facts not applied yet, merged into one."""

    def __init__(self) -> None:
        self._runs: dict[UUID, dict[int, Progress]] = {}

    def add(self, batch: Batch, sequence: int, fact: ProgressFact) -> None:
        """Merge a fact the batch would apply into its shard's run (counts are cumulative per shard)."""
        shards = self._runs.get(batch.id)
        if shards is None:
            shards = self._runs[batch.id] = {}
        attempt, completed, failed, shard = fact.attempt, fact.completed, fact.failed, fact.shard
        usage: tuple[int, int, int] = (0, 0, 0)
        chunks: tuple[str, ...] = ()
        earlier = shards.get(shard)
        if earlier is not None:  # (comparisons, not max(): this runs for nearly every fact)
            if earlier.completed > completed:
                completed = earlier.completed
            if earlier.failed > failed:
                failed = earlier.failed
            usage, chunks = earlier.usage, earlier.chunks
        tokens = fact.usage
        if tokens is not None and fact.chunk_key not in chunks and not batch.counted_chunk(fact.chunk_key):
            usage = (usage[0] + tokens[0], usage[1] + tokens[1], usage[2] + tokens[2])
            chunks = (*chunks, fact.chunk_key)
        shards[shard] = Progress(batch, sequence, attempt, completed, failed, shard, usage, chunks)

    def take(self, ident: UUID | None = None) -> list[Progress]:
        """Take one batch's runs (due before its next other fact), or every batch's (at a group's end), in order."""
        if ident is None:
            due = [each for shards in self._runs.values() for each in shards.values()]
            self._runs.clear()
        else:
            due = list(self._runs.pop(ident, {}).values())
        return sorted(due, key=attrgetter("sequence"))
