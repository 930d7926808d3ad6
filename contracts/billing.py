"""Money and prices: catalogue prices per million tokens, amounts in whole micro-dollars, a file's worst case.

Amounts are integers of micro-USD (1 USD = 1,000,000) everywhere a fact or an aggregate holds one, so a replay adds
up to exactly the same balance; prices are decimals (USD per 1M tokens), and a token count times such a price is
an amount of micro-USD, rounded up to a whole one.
"""

from decimal import ROUND_CEILING, Decimal, InvalidOperation

from pydantic import BaseModel, ConfigDict, Field

MICROS_PER_USD = 1_000_000
TEMPLATE_TOKENS_PER_LINE = 64
"""Tokens a chat template may add to a line's own (role markers, BOS/EOS): the worst case counts them."""


class ModelPrice(BaseModel):
    """What one catalogue model's tokens cost, in USD per 1M tokens, and the least a batch that ran costs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_mtok_usd: Decimal = Field(ge=0)
    output_per_mtok_usd: Decimal = Field(ge=0)
    cached_input_per_mtok_usd: Decimal | None = Field(default=None, ge=0)
    """Prompt tokens the engine had cached; omitted: the input price."""
    batch_minimum_usd: Decimal = Field(default=Decimal(0), ge=0)
    """The least a batch costs once any of its lines ran (a batch that never ran costs nothing)."""

    def cost_micros(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> int:
        """The price of these tokens, in micro-USD (rounded up)."""
        cached = min(max(cached_tokens, 0), input_tokens)
        cached_price = self.input_per_mtok_usd if self.cached_input_per_mtok_usd is None \
            else self.cached_input_per_mtok_usd
        exact = ((input_tokens - cached) * self.input_per_mtok_usd + cached * cached_price
                 + output_tokens * self.output_per_mtok_usd)
        return int(exact.to_integral_value(rounding=ROUND_CEILING))

    @property
    def minimum_micros(self) -> int:
        return usd_to_micros(self.batch_minimum_usd)


def usd_to_micros(amount: Decimal) -> int:
    return int((amount * MICROS_PER_USD).to_integral_value(rounding=ROUND_CEILING))


def parse_usd(text: object) -> int | None:
    """An amount of USD as a person writes it (`"3"`, `"0.25"`, `2.5`) → micro-USD; None when it is not one."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        return None
    try:
        amount = Decimal(str(text).strip())
    except InvalidOperation:
        return None
    if not amount.is_finite() or abs(amount) > Decimal(10) ** 12:
        return None
    return int((amount * MICROS_PER_USD).to_integral_value(rounding=ROUND_CEILING))


def micros_to_usd(micros: int) -> str:
    """`1234567` → `"1.234567"`: the decimal string every API answer shows money as."""
    sign = "-" if micros < 0 else ""
    whole, part = divmod(abs(micros), MICROS_PER_USD)
    return f"{sign}{whole}.{part:06d}"


class FileDemand(BaseModel):
    """What an uploaded batch file can ask of a model at most, summed over its lines as the upload streamed by:
    the bound a reservation is made on before validation has counted a token."""

    model_config = ConfigDict(frozen=True)

    lines: int = 0
    """Lines that parse as JSON objects (the others never run, so cost nothing)."""
    prompt_bytes: int = 0
    """Bytes of those lines: a byte-level tokenizer makes at most one token of each."""
    samples: int = 0
    """Samples asked for over those lines (each line's `n`, 1 without one, times the prompts of a completions line:
    each prompt is answered apart)."""
    output_tokens: int = 0
    """Sum of `max_tokens` (or `max_completion_tokens`, `max_output_tokens`) times `n` over lines that set one."""
    open_samples: int = 0
    """Samples of lines that set no output limit: each may run to the model's context."""
    model: str | None = None
    """The first model a line names."""

    def bounds(self, context_length: int, embeddings: bool = False) -> tuple[int, int]:
        """(input tokens, output tokens) the file can use at most on a model with this context."""
        input_tokens = self.prompt_bytes + TEMPLATE_TOKENS_PER_LINE * self.lines
        # No sample outruns the context, whatever its max_tokens says.
        output_tokens = min(self.output_tokens + self.open_samples * context_length, self.samples * context_length)
        return input_tokens, 0 if embeddings else output_tokens


def worst_case_micros(price: ModelPrice, input_tokens: int, output_tokens: int) -> int:
    """What a batch of these many tokens can cost at most: every prompt token uncached, the batch minimum."""
    return max(price.cost_micros(input_tokens, output_tokens), price.minimum_micros)
