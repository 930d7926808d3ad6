"""A prompt's size bounded from its bytes (`PairBound`): never below the tokenizer's exact count, whatever the text,
and a file's verdicts are the same with the bound and without it."""

import dataclasses
import itertools
import random
import string

import orjson
import regex
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from contracts.catalogue import CatalogueModel
from services.validator.adapters.pair_bound import PairBound
from services.validator.adapters.tokenizer import GPT2_SPLIT, ModelTokenizer, PromptTokenizer, TokenizerCache
from services.validator.domain import FileValidation, LineResult
from services.validator.file_check import WINDOW_LINES
from tests.unit.validator.test_validator_fast_paths import CATALOGUE, TOKENIZERS, WORDS, corpus, tokenizer


def bound_of(model: ModelTokenizer) -> PairBound:
    assert model.pair_bound is not None, "SmolLM2's vocabulary has letter pairs to bound with"
    return model.pair_bound


def assert_bounded(text: str) -> None:
    model = tokenizer()
    assert bound_of(model)(text.encode()) >= model.count_text(text), text


def encodable(text: str) -> str:
    assume(tokenizer()._encodable(text))  # a text the encoder cannot take is counted as its size, never bounded
    return text


PAIRED = "abcdeilmnoprstuyfh"
"""The letters the bound links (SmolLM2's leaders and followers), and two of either kind only."""
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>"]
PIECES = st.sampled_from([*WORDS, *SPECIALS, "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'", "''", "n't", "O'Neil",
                          " ", "  ", "   ", "\n", "\n\n", " \n ", "\t", "\r\n", "\u00a0", "\u2003", "\u3000",
                          ".", ",", "!?", "...", "--", "()", "{}", "[]", "\"", "#", "@", "$", "%", "&", "*", "_", "`",
                          "0", "7", "42", "3.14", "1e9", "-5", "2026-12-05", "١٢٣", "Ⅻ",
                          "🙂", "👩‍👩‍👧", "🇫🇷", "é", "ß", "Ω", "ж", "東京", "한국어", "ع", "ह", "\u0301", "\ufeff"])
"""Words, contractions, special tokens, whitespace runs, punctuation, numbers, and characters of 1 to 4 UTF-8 bytes."""
SOUP = st.text(st.sampled_from(PAIRED + PAIRED.upper() + " '"), max_size=600)
"""Letters the bound links, run together as BPE splits them worst: its tightest texts."""
ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
          deadline=None)
@given(st.lists(PIECES | SOUP | ANY_TEXT | st.text(string.printable, max_size=40), max_size=60).map("".join))
def test_a_texts_pair_bound_is_never_below_its_token_count(text: str) -> None:
    assert_bounded(encodable(text))


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(SOUP)
def test_letters_run_together_are_never_counted_above_their_bound(text: str) -> None:
    assert_bounded(text)


def test_every_text_of_up_to_four_linked_letters_spaces_and_apostrophes_is_within_its_bound() -> None:
    for size in range(1, 5):
        for letters in itertools.product(PAIRED + " '", repeat=size):
            assert_bounded("".join(letters))


def test_the_bound_is_reached_where_bpe_leaves_one_pair_between_two_single_letters() -> None:
    model = tokenizer()
    assert [len(model.encoding.decode_single_token_bytes(t)) for t in model.encoding.encode("aabb")] == [1, 2, 1]
    assert bound_of(model)(b"aabb") == 3, "4 bytes, 3 links: a third of the links is all a bound may save"


def links(model: ModelTokenizer, text: str) -> int:
    """Positions whose byte follows a leader and is a follower, in one piece of GPT-2's split or one special token."""
    bound = bound_of(model)
    found = 0
    for segment in regex.split(f"({'|'.join(map(regex.escape, model.encoding.special_tokens_set))})", text):
        for piece in regex.findall(GPT2_SPLIT, segment) if segment not in model.encoding.special_tokens_set \
                else [segment]:
            data = piece.encode()
            found += sum(a in bound.leaders and b in bound.followers for a, b in itertools.pairwise(data))
    return found


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
          deadline=None)
@given(st.lists(PIECES | SOUP | st.text(string.printable, max_size=40), max_size=40).map("".join))
def test_each_step_of_the_bounds_proof_holds_of_the_text_as_tiktoken_splits_it(text: str) -> None:
    model, data = tokenizer(), encodable(text).encode()
    found, weight = links(model, text), sum(data.translate(bound_of(model).weights))
    assert found >= len(data) - 1 - weight, "every position but those a spoiling byte or a contraction takes"
    assert found <= 3 * (len(data) - model.count_text(text)), "a token of k >= 2 bytes takes at most k + 1 links"


TEXT_PART = st.builds(lambda text: {"type": "text", "text": text}, st.lists(PIECES, max_size=30).map("".join))
MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
     "content": st.lists(PIECES, max_size=40).map("".join) | st.lists(TEXT_PART, min_size=1, max_size=5)}),
    min_size=1, max_size=6)
TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.text(string.ascii_letters + "_", min_size=1, max_size=12), "description": st.lists(
        PIECES, max_size=10).map("".join)})}), max_size=3)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(MESSAGES, TOOLS)
def test_a_rendered_chat_of_many_messages_parts_and_tools_is_never_counted_above_its_bound(
        messages: list[dict[str, object]], tools: list[dict[str, object]]) -> None:
    assert_bounded(encodable(tokenizer().render_chat(messages, {"tools": tools} if tools else None)))


def test_a_bench_shaped_prompt_is_settled_by_its_bound_far_below_its_size() -> None:
    rng = random.Random(2)
    model = tokenizer()
    text = model.render_chat([{"role": "system", "content": "You are a careful assistant who answers briefly."},
                              {"role": "user", "content": "Summarise this note: " + " ".join(
                                  rng.choice(WORDS[:9]) for _ in range(300))}])
    room = 2048 - 128
    assert len(text.encode()) > room >= bound_of(model)(text.encode()) >= model.count_text(text)


def test_no_linked_letter_is_the_edge_of_a_special_token() -> None:
    model = tokenizer()
    ranks = {bytes([x, y]): 0 for x in range(256) for y in range(256)}
    bound = PairBound.of(ranks, ["<|im_start|>", "a>", "<y", "b c"])
    assert bound is not None and bound.followers and bound.leaders
    assert not {ord("a"), ord("b")} & bound.followers and not {ord("y"), ord("c")} & bound.leaders
    assert bound(b"b" * 30) == 30, "a text of letters that are never linked is bounded by its size"
    assert PairBound.of({}, []) is None
    assert bound_of(model).weights[ord("'")] == 3, "an apostrophe may end a contraction's piece before a letter"


# -- the same verdicts with the bound and without it -----------------------------------------------------------------

class Unbounded(TokenizerCache):
    """The model's tokenizer without its bound: every prompt over its room in bytes has its head counted."""

    @staticmethod
    def _build(model: CatalogueModel) -> PromptTokenizer | None:
        built = TokenizerCache._build(model)
        if isinstance(built, ModelTokenizer):
            return dataclasses.replace(built, pair_bound=None, overhead_cache={}, skeletons={})
        return built


def near_the_context(count: int) -> list[bytes]:
    """Chat and completion lines whose prompts are just under, at and over the context, in English and not."""
    rng = random.Random(count)
    lines: list[bytes] = []
    for n in range(count):
        words = rng.choice([WORDS[:9], WORDS, list(PAIRED), ["naïve", "東京", "🙂", "don't", "it's"]])
        text = " ".join(rng.choice(words) for _ in range(rng.randint(200, 2300)))
        body: dict[str, object] = {"model": "smollm2", "max_tokens": rng.choice([1, 128, 512, 1500]),
                                   "messages": [{"role": "user", "content": text}]}
        if n % 3 == 0:
            body["messages"] = [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": [{"type": "text", "text": text}]}]
        lines.append(orjson.dumps({"custom_id": f"near-{n}", "method": "POST", "url": "/v1/chat/completions",
                                   "body": body}))
    return lines


def every_result(lines: list[bytes], tokenizers: TokenizerCache) -> tuple[list[LineResult], tuple[object, ...]]:
    validation = FileValidation("/v1/chat/completions", CATALOGUE, tokenizers=tokenizers)
    numbered = list(enumerate(lines, start=1))
    results = [result for start in range(0, len(numbered), WINDOW_LINES)
               for result in validation.check_window(numbered[start:start + WINDOW_LINES])]
    return results, (validation.passed, validation.error_count, validation.counts_by_code, validation.model_id,
                     validation.finish())


def test_a_files_verdicts_and_every_line_error_are_the_same_with_the_bound_and_without_it() -> None:
    lines = near_the_context(300) + corpus(WINDOW_LINES + 30)
    random.Random(4).shuffle(lines)
    bounded, unbounded = every_result(lines, TOKENIZERS), every_result(lines, Unbounded())
    assert bounded == unbounded
    codes = bounded[1][2]
    assert isinstance(codes, dict) and codes.get("context_too_long", 0) > 20, "prompts over the context are in it"
    assert sum(not result.issues for result in bounded[0]) > 100, "and prompts that fit"
