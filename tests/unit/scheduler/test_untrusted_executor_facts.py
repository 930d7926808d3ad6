"""What an executor states is checked against what it was assigned: counts within its lines, tokens within what those
lines can use, nothing negative; and an account is never debited past a batch's reservation (issue 27, point 4)."""

from decimal import Decimal

from contracts.api.batch import InputTokensDetails, OutputTokensDetails
from contracts.billing import ModelPrice
from contracts.events.batch import AttemptFailed, BatchCompleted, BatchProgressed, BatchUsage, ShardFinished
from contracts.subjects import result_chunk_key
from services.ledger.accounts import Account
from services.scheduler.book import Book
from services.scheduler.entitlements import may_state
from tests.unit.scheduler.test_object_broker import assigned, created, fleet

CONTEXT = 2048


def context_length(model: str) -> int | None:
    return CONTEXT


def progress(completed: int, failed: int = 0, chunk: int = 0, input_tokens: int = 0,
             output_tokens: int = 0) -> BatchProgressed:
    return BatchProgressed(aggregate_id="b1", attempt=1, chunk=chunk, chunk_key=result_chunk_key("b1", 1, chunk),
                           completed=completed, failed=failed,
                           usage=BatchUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                                            total_tokens=input_tokens + output_tokens))


def test_progress_within_the_units_lines_and_their_tokens_is_stored() -> None:
    assert may_state(fleet(), "alpha", progress(4, 1, input_tokens=5 * 100, output_tokens=5 * 50),
                     context_length) is None


def test_progress_counting_more_lines_than_the_unit_has_is_refused() -> None:
    refusal = may_state(fleet(), "alpha", progress(11), context_length)  # b1 has 10 lines
    assert refusal is not None and "has 10" in refusal


def test_negative_counts_or_tokens_are_refused() -> None:
    assert may_state(fleet(), "alpha", progress(5, -3), context_length) is not None
    assert may_state(fleet(), "alpha", progress(1, input_tokens=-5), context_length) is not None


def test_tokens_that_do_not_add_up_are_refused_whatever_the_model() -> None:
    """A total that is not prompt plus completion, reasoning past the completion, cached past the prompt, or more
    than a 16M-token context per line (a batch's sums an orjson writer could not write), even for a model the
    catalogue does not bound (no context length known)."""
    fine = progress(1, input_tokens=10, output_tokens=5)
    assert may_state(fleet(), "alpha", fine, context_length) is None
    for usage in (fine.usage.model_copy(update={"total_tokens": 2**70}),  # type: ignore[union-attr]
                  fine.usage.model_copy(update={"total_tokens": 16}),  # type: ignore[union-attr]
                  fine.usage.model_copy(update={  # type: ignore[union-attr]
                      "output_tokens_details": OutputTokensDetails(reasoning_tokens=6)}),
                  fine.usage.model_copy(update={  # type: ignore[union-attr]
                      "input_tokens_details": InputTokensDetails(cached_tokens=2**70)})):
        assert may_state(fleet(), "alpha", fine.model_copy(update={"usage": usage})) is not None
    huge = progress(1, input_tokens=2**60, output_tokens=2**60)
    assert may_state(fleet(), "alpha", huge) is not None


def test_tokens_no_line_could_use_are_refused() -> None:
    assert may_state(fleet(), "alpha", progress(1, input_tokens=CONTEXT + 1), context_length) is not None
    assert may_state(fleet(), "alpha", progress(1, output_tokens=10**12), context_length) is not None


def test_a_batchs_end_counting_more_lines_than_it_has_is_refused() -> None:
    end = BatchCompleted(aggregate_id="b1", output_file_id=None, error_file_id=None, completed=10**6, failed=0,
                         usage=BatchUsage())
    assert may_state(fleet(), "alpha", end, context_length) is not None


PRICE = ModelPrice(input_per_mtok_usd=Decimal(1), output_per_mtok_usd=Decimal(1), batch_minimum_usd=Decimal("0.001"))


def billed_account(held_micros: int) -> Account:
    account = Account(account_id="org", sequence=0)
    account.grant(1, 100_000_000, at=0)
    account.reserve(2, "b1", held_micros, PRICE, "m", "/v1/chat/completions", at=0)
    return account


def test_a_debit_never_passes_the_batchs_reservation() -> None:
    account = billed_account(held_micros=5_000)
    account.debit(3, "b1", "chunk-0", (10**12, 0, 10**12), at=0)
    assert account.debited_micros == 5_000 and account.balance_micros == 100_000_000 - 5_000
    account.settle(4, "b1", ran=True, at=0)
    assert account.debited_micros == 5_000 and account.reserved_micros == 0


def test_a_settle_charges_the_committed_chunks_not_a_total_the_end_states() -> None:
    account = billed_account(held_micros=1_000_000)
    account.debit(3, "b1", "chunk-0", (1_000, 0, 1_000), at=0)  # 2,000 tokens at $1 per million: 2,000 micro-USD
    charged = account.debited_micros
    account.settle(4, "b1", ran=True, at=0)
    assert account.debited_micros == max(charged, PRICE.minimum_micros)
    assert account.balance_micros == 100_000_000 - account.debited_micros


def test_a_fenced_attempts_executor_cannot_state_the_batchs_end_even_without_a_fence() -> None:
    book = fleet()
    end = BatchCompleted(aggregate_id="b1", output_file_id=None, error_file_id=None, completed=10, failed=0,
                         usage=BatchUsage())
    assert may_state(book, "alpha", end, context_length) is None
    book.apply(AttemptFailed(aggregate_id="b1", attempt=1, executor_id="alpha", code="executor_lost", reason="x"))
    assert may_state(book, "alpha", end, context_length) is not None


def test_a_progress_fact_stated_again_is_a_repeat_not_a_refusal() -> None:
    book = fleet()
    first = progress(2, input_tokens=200, output_tokens=100)
    assert may_state(book, "alpha", first, context_length) is None
    book.apply(first)
    assert may_state(book, "alpha", first, context_length) is None, "a retried submission of a stored fact"
    next_chunk = progress(2, chunk=1, input_tokens=200, output_tokens=100)
    assert may_state(book, "alpha", next_chunk, context_length) is not None, "a new chunk adding no lines"


def test_a_chunk_stated_again_with_other_counts_or_tokens_is_refused_so_a_unit_is_never_inflated() -> None:
    book = fleet()
    first = progress(2, input_tokens=200, output_tokens=100)
    book.apply(first)
    inflated = progress(10**15, failed=-5, input_tokens=10**15, output_tokens=10**15)
    assert may_state(book, "alpha", inflated, context_length) is not None
    assert may_state(book, "alpha", progress(2, input_tokens=201, output_tokens=100), context_length) is not None
    book.apply(inflated)  # were one in the log (an older desk's), the book keeps what the chunk stated first
    assert may_state(book, "alpha", first, context_length) is None
    assert book.plans["b1"].unit_done == {0: 2}


def split_batch() -> Book:
    """b1 in two units of 5 lines: unit 0 on alpha (attempt 1), unit 1 on bravo (attempt 2)."""
    book = Book(admitted={"alpha", "bravo"})
    created(book, "b1", "file-in1")
    assigned(book, "b1", "alpha", 1, shard=0, shards=2)
    assigned(book, "b1", "bravo", 2, shard=1, shards=2)
    return book


def test_an_attempts_progress_or_end_naming_another_unit_is_refused() -> None:
    book = split_batch()
    other_unit = progress(5).model_copy(update={"shard": 1})
    assert may_state(book, "alpha", other_unit, context_length) is not None
    assert may_state(book, "alpha", progress(5), context_length) is None
    far_unit = ShardFinished(aggregate_id="b1", executor_id="alpha", attempt=1, shard=10**6)
    assert may_state(book, "alpha", far_unit, context_length) is not None
    own_unit = ShardFinished(aggregate_id="b1", executor_id="alpha", attempt=1, shard=0)
    assert may_state(book, "alpha", own_unit, context_length) is None
    book.apply(far_unit)  # were one in the log, it ends the attempt's own unit, not one that does not exist
    assert set(book.plans["b1"].shards) == {0, 1} and book.plans["b1"].shards[0].finished


def test_progress_of_a_chunk_past_the_units_lines_is_refused_so_progress_facts_are_bounded() -> None:
    """Each chunk commits at least one line (the object broker signs no other): a chunk number at or past the unit's
    lines, or negative, would let a holder append zero-line progress facts to the log without end."""
    assert may_state(fleet(), "alpha", progress(0, chunk=9), context_length) is None  # b1 has 10 lines
    for chunk in (10, 10**30):
        refusal = may_state(fleet(), "alpha", progress(0, chunk=chunk), context_length)
        assert refusal is not None and "no chunk" in refusal
    assert may_state(fleet(), "alpha", progress(0, chunk=-1), context_length) is not None
