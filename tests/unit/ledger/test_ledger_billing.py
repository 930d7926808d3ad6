"""The ledger bills: grants, a batch's reservation, debits as its chunks commit (each once), the refund at its end."""

from decimal import Decimal

from contracts.api.batch import BatchUsage, InputTokensDetails
from contracts.billing import FileDemand, ModelPrice, micros_to_usd, parse_usd, worst_case_micros
from contracts.events.account import CreditsGranted, CreditsReleased, CreditsReserved
from contracts.events.batch import (
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchProgressed,
    BatchStarted,
    BatchValidated,
    BatchValidationFailed,
)
from contracts.events.envelope import Event
from contracts.readmodel import AccountRecord
from services.ledger.accounts import Account
from services.ledger.application import Ledger, persistence_env
from services.ledger.folded import aggregate_id
from services.ledger.projection import account_record, batch_record
from tests.factories import batch_created

ORG = "acme"
BATCH = "batch_bill1"
PRICE = ModelPrice(input_per_mtok_usd=Decimal("2"), cached_input_per_mtok_usd=Decimal("1"),
                   output_per_mtok_usd=Decimal("10"), batch_minimum_usd=Decimal("0.01"))
ENDPOINT = "/v1/chat/completions"


class Stream:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger, self.seq, self.log = ledger, 0, list[tuple[int, Event]]()

    def fold(self, *facts: Event) -> None:
        numbered = []
        for fact in facts:
            self.seq += 1
            numbered.append((self.seq, fact))
        self.log.extend(numbered)
        self.ledger.fold(numbered)

    def account(self, ledger: Ledger | None = None) -> AccountRecord:
        found: object = (ledger or self.ledger).repository.get(aggregate_id("account", ORG))
        assert isinstance(found, Account)
        return account_record(found)


def usage(prompt: int, output: int, cached: int = 0) -> BatchUsage:
    return BatchUsage(input_tokens=prompt, output_tokens=output, total_tokens=prompt + output,
                      input_tokens_details=InputTokensDetails(cached_tokens=cached))


def grant(usd: str, grant_id: str = "g1") -> CreditsGranted:
    amount = parse_usd(usd)
    assert amount is not None
    return CreditsGranted(aggregate_id=ORG, grant_id=grant_id, amount_micros=amount)


def reserved(amount_micros: int, batch_id: str = BATCH) -> CreditsReserved:
    return CreditsReserved(aggregate_id=ORG, batch_id=batch_id, amount_micros=amount_micros, price=PRICE,
                           model="smollm2", endpoint=ENDPOINT)


def created(batch_id: str = BATCH) -> BatchCreated:
    return batch_created(batch_id, "key_a", "files/file-in", created_at=0, expires_at=86400, billing_account=ORG)


def running(batch_id: str = BATCH) -> list[Event]:
    return [BatchValidated(aggregate_id=batch_id, total_lines=4, model="smollm2"),
            BatchStarted(aggregate_id=batch_id, executor_id="exec-1", attempt=1, engine="llamacpp",
                         engine_version="1")]


def chunk(number: int, done: int, tokens: BatchUsage, batch_id: str = BATCH) -> BatchProgressed:
    return BatchProgressed(aggregate_id=batch_id, attempt=1, chunk=number, chunk_key=f"results/{batch_id}/1/{number}",
                           completed=done, failed=0, usage=tokens)


def test_money_is_whole_micro_dollars_and_a_price_rounds_up() -> None:
    assert parse_usd("3") == 3_000_000 and parse_usd("0.25") == 250_000 and parse_usd("x") is None
    assert parse_usd(True) is None and parse_usd("nan") is None
    assert micros_to_usd(1_234_567) == "1.234567" and micros_to_usd(-5) == "-0.000005"
    # 1M input tokens at 2 USD: 2,000,000 micro-USD; 1 output token at 10 USD per 1M: 10 micro-USD exactly.
    assert PRICE.cost_micros(1_000_000, 0) == 2_000_000 and PRICE.cost_micros(0, 1) == 10
    assert PRICE.cost_micros(1, 0) == 2 and PRICE.cost_micros(3, 0, cached_tokens=2) == 4
    assert ModelPrice(input_per_mtok_usd=Decimal("0.15"), output_per_mtok_usd=Decimal(0)).cost_micros(1, 0) == 1


def test_the_worst_case_of_a_file_counts_every_byte_as_a_token_and_open_lines_at_the_context() -> None:
    demand = FileDemand(lines=2, prompt_bytes=300, samples=3, output_tokens=128, open_samples=1)
    assert demand.bounds(context_length=8192) == (300 + 2 * 64, 128 + 8192)
    assert demand.bounds(context_length=8192, embeddings=True)[1] == 0
    assert worst_case_micros(PRICE, 0, 0) == PRICE.minimum_micros == 10_000


def test_a_billed_batch_is_debited_as_chunks_commit_and_refunded_the_rest_at_its_end(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(grant("5"), reserved(2_000_000), created(), *running())
    assert (stream.account().balance_micros, stream.account().reserved_micros) == (5_000_000, 2_000_000)
    assert stream.account().available_micros == 3_000_000

    stream.fold(chunk(0, 2, usage(1000, 2000)))  # 1000 * 2 + 2000 * 10 micro-USD
    account = stream.account()
    assert account.balance_micros == 5_000_000 - 22_000 and account.reserved_micros == 2_000_000 - 22_000
    assert account.last_event is not None and account.last_event.type == "debit"
    assert account.last_event.endpoint == "/v1/chat/completions:batch" and account.last_event.amount_micros == 22_000

    stream.fold(chunk(1, 4, usage(1000, 1000, cached=1000)),
                BatchCompleted(aggregate_id=BATCH, output_file_id="o", error_file_id=None, completed=4, failed=0,
                               usage=usage(2000, 3000, cached=1000)))
    account = stream.account()
    charged = 22_000 + 1000 * 1 + 1000 * 10
    assert account.balance_micros == 5_000_000 - charged and account.reserved_micros == 0
    assert account.last_event is not None and account.last_event.type == "refund"
    assert account.last_event.amount_micros == 2_000_000 - charged and account.open_batches == 0


def test_a_chunk_announced_twice_is_debited_once_and_a_refold_changes_nothing(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(grant("5"), reserved(2_000_000), created(), *running(), chunk(0, 2, usage(1000, 2000)))
    once = stream.account()
    stream.fold(chunk(0, 2, usage(1000, 2000)))  # the same chunk again, past the broker's dedup window
    assert stream.account().balance_micros == once.balance_micros
    stream.ledger.fold(stream.log)  # every fact redelivered (a restart before the checkpoint)
    assert stream.account().balance_micros == once.balance_micros


def test_a_replay_of_the_log_into_a_new_store_gives_the_same_account(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(grant("5"), reserved(2_000_000), created(), *running(), chunk(0, 2, usage(1000, 2000)),
                chunk(1, 4, usage(10, 20)),
                BatchCompleted(aggregate_id=BATCH, output_file_id="o", error_file_id=None, completed=4, failed=0,
                               usage=usage(1010, 2020)), grant("1", "g2"))
    scratch = Ledger(persistence_env(None))
    try:
        for fact in stream.log:  # one fact per group, unlike the live fold
            scratch.fold([fact])
        assert stream.account(scratch) == stream.account()
    finally:
        scratch.close()


def test_a_batch_that_never_ran_is_released_in_full_and_one_that_ran_costs_at_least_the_minimum(
        ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(grant("1"), reserved(500_000), created(),
                BatchValidationFailed(aggregate_id=BATCH, total_lines=4, error_count=4))
    assert (stream.account().balance_micros, stream.account().reserved_micros) == (1_000_000, 0)

    other = "batch_bill2"
    stream.fold(reserved(500_000, other), created(other), *running(other), chunk(0, 1, usage(5, 1), other),
                BatchCancelRequested(aggregate_id=other, requested_by_key_id="key_a"),
                BatchCancelled(aggregate_id=other, output_file_id="o", error_file_id="e", completed=1, failed=3,
                               usage=usage(5, 1)))
    account = stream.account()
    assert account.balance_micros == 1_000_000 - PRICE.minimum_micros and account.reserved_micros == 0


def test_a_reservation_whose_batch_was_never_created_can_be_released(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(grant("1"), reserved(400_000), CreditsReleased(aggregate_id=ORG, batch_id=BATCH))
    account = stream.account()
    assert (account.balance_micros, account.reserved_micros) == (1_000_000, 0)
    assert account.last_event is not None and account.last_event.type == "release"
    assert account.credit_sequence == stream.seq


def test_an_unbilled_batchs_usage_moves_no_account(ledger: Ledger) -> None:
    stream = Stream(ledger)
    unbilled = created().model_copy(update={"billing_account": None})
    stream.fold(grant("1"), unbilled, *running(), chunk(0, 2, usage(1000, 2000)))
    assert stream.account().balance_micros == 1_000_000


def test_a_batchs_usage_advances_as_its_chunks_commit_each_chunk_once_and_its_end_states_the_final(
        ledger: Ledger) -> None:
    stream = Stream(ledger)
    unbilled = created().model_copy(update={"billing_account": None})
    stream.fold(unbilled, *running())
    assert batch_record(stream.ledger.batch(BATCH)).batch.usage is None  # type: ignore[arg-type]
    stream.fold(chunk(0, 2, usage(100, 20, cached=40)), chunk(1, 3, usage(50, 10)))
    shown = batch_record(stream.ledger.batch(BATCH)).batch.usage  # type: ignore[arg-type]
    assert shown is not None and (shown.input_tokens, shown.output_tokens, shown.total_tokens) == (150, 30, 180)
    assert shown.input_tokens_details.cached_tokens == 40
    stream.fold(chunk(1, 3, usage(50, 10)))  # chunk 1 again, past the broker's dedup window
    assert batch_record(stream.ledger.batch(BATCH)).batch.usage.output_tokens == 30  # type: ignore[arg-type,union-attr]
    stream.fold(BatchCompleted(aggregate_id=BATCH, output_file_id="o", error_file_id=None, completed=4, failed=0,
                               usage=usage(200, 41)))
    final = batch_record(stream.ledger.batch(BATCH)).batch.usage  # type: ignore[arg-type]
    assert final is not None and (final.input_tokens, final.output_tokens) == (200, 41)


def test_an_ended_batch_keeps_no_chunk_keys_and_a_chunk_announced_after_its_end_debits_nothing(ledger: Ledger) -> None:
    stream = Stream(ledger)
    stream.fold(grant("5"), reserved(2_000_000), created(), *running(), chunk(0, 2, usage(1000, 2000)),
                BatchCompleted(aggregate_id=BATCH, output_file_id="o", error_file_id=None, completed=2, failed=0,
                               usage=usage(1000, 2000)))
    ended = stream.account()
    batch = ledger.batch(BATCH)
    assert batch is not None and not getattr(batch, "usage_chunks", []) and batch.usage is not None
    stream.fold(chunk(0, 2, usage(1000, 2000)), chunk(1, 3, usage(5, 5)))  # late, past the broker's dedup window
    after = ledger.batch(BATCH)
    assert stream.account() == ended and after is not None and after.usage == batch.usage
