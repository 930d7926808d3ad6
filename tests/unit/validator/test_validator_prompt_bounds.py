"""The validator's cheaper ways to the same verdicts: a chat prompt's size settled in one pass over its messages
(`chat_over`; `plain_chat_over` bounding a spliced prompt from its parts' weights), a plain line's model found in a
table, and the file's rules passing a clean line with a few look-ups (`FileValidation.refused`)."""

import dataclasses
import random
import string

import jinja2.sandbox
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from contracts.api.request_line import MAX_NESTING_DEPTH
from services.validator.adapters import tokenizer as tokenizer_module
from services.validator.adapters.chat_template import template_constants
from services.validator.adapters.tokenizer import ModelTokenizer
from services.validator.domain import FileValidation, Limits
from services.validator.file_check import WINDOW_LINES
from services.validator.line_checks import check_lines
from services.validator.plain_lines import plain_models
from tests.unit.validator.test_validator_fast_paths import CATALOGUE, STRICT, TOKENIZERS, WORDS, corpus, tokenizer

JSON_TEXT = st.lists(st.sampled_from(WORDS) | st.text(st.sampled_from(string.printable), max_size=8)
                     | st.sampled_from(["\x04", "\x13", "\U00040000", "\x00", "\x7f", "\u00a0"]),
                     max_size=300).map(" ".join)
"""Contents a line can hold: words, ASCII, non-ASCII, and bytes the vocabulary lacks (`\\u0004`, plane 4)."""
ROLES = st.sampled_from(["system", "user", "assistant", "tool"])


def settled_the_long_way(model: ModelTokenizer, messages: list[dict[str, object]], room: int) -> str | None:
    """What `context_need` did before `chat_over`: the bound, then the rendered prompt's `fits`."""
    if model.chat_bound(messages) <= room:
        return None
    rendered = model.render_chat(messages)
    return None if model.fits(rendered, room) else rendered


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.tuples(ROLES, JSON_TEXT), min_size=1, max_size=3), st.integers(-40, 40))
def test_a_chat_settled_in_one_pass_gets_the_answer_of_bound_render_and_fits(
        turns: list[tuple[str, str]], near: int) -> None:
    model = tokenizer()
    messages: list[dict[str, object]] = [{"role": role, "content": content} for role, content in turns]
    exact = model.count_text(model.render_chat(messages))
    roles, contents = tuple(role for role, _ in turns), [content for _, content in turns]
    assert model.pair_bound is not None
    bound = model.pair_bound(model.render_chat(messages).encode())
    for room in (exact + near, exact // 2, model.chat_bound(messages) + near, bound + near, bound - 1, bound):
        expected = settled_the_long_way(model, messages, room)
        assert model.chat_over(messages, room) == expected
        assert model.plain_chat_over(roles, contents, room) == expected


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.tuples(ROLES, JSON_TEXT), min_size=1, max_size=3), st.integers(0, 3))
def test_a_spliced_prompts_weights_are_its_skeletons_and_its_contents(turns: list[tuple[str, str]],
                                                                       repeat: int) -> None:
    """`plain_chat_over` bounds a prompt without splicing it: from the skeleton's weights and those of the contents
    joined, which must be the spliced prompt's own, however long; a byte the vocabulary lacks is found either way."""
    model = tokenizer()
    bound = model.pair_bound
    assert bound is not None
    roles, contents = tuple(role for role, _ in turns), [content * (repeat * 9 + 1) for _, content in turns]
    joined = "".join(contents)
    skeleton = model._skeleton_of(roles, joined)
    assume(skeleton is not None)
    assert skeleton is not None
    prompt, data = skeleton.splice(contents).encode(), joined.encode()
    assert len(prompt) == skeleton.size + len(data)
    spoilt = bound.spoilt(data)
    assert bound.spoilt(prompt) == (None if spoilt is None else skeleton.spoilt + spoilt)
    assert (spoilt is None) is (not model._encodable(joined))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.fixed_dictionaries({"role": ROLES}, optional={"content": st.sampled_from(WORDS) | st.none(),
                                                               "name": st.just("n")}), min_size=1, max_size=3),
       st.integers(0, 60))
def test_any_chat_settled_in_one_pass_gets_the_answer_of_bound_render_and_fits(
        messages: list[dict[str, object]], room: int) -> None:
    model = tokenizer()
    assert model.chat_over(messages, room) == settled_the_long_way(model, messages, room)


@pytest.mark.parametrize("odd", ["\u0004", "\u0013", "\U00040000"])
def test_a_plain_prompt_holding_a_byte_the_vocabulary_lacks_is_left_to_be_counted(odd: str) -> None:
    model = tokenizer()
    assert model.pair_bound is not None and set(odd.encode()) & set(model.missing_bytes)
    contents = ["Be brief.", "word " * 600 + odd]
    messages: list[dict[str, object]] = [{"role": "system", "content": contents[0]},
                                         {"role": "user", "content": contents[1]}]
    rendered = model.render_chat(messages)
    room = len(rendered.encode()) - 1
    assert model.pair_bound(rendered.replace(odd, "").encode()) < room, "without it, the bound would settle it"
    assert model.plain_chat_over(("system", "user"), contents, room) == rendered
    assert model.plain_chat_over(("system", "user"), contents, room + 1) is None, "no more bytes than room: it fits"


def test_a_constant_the_template_only_compares_with_a_role_is_not_looked_for_in_contents() -> None:
    parsed = jinja2.sandbox.ImmutableSandboxedEnvironment().parse(
        "{% for m in messages %}{% if m['role'] == 'system' %}S{% endif %}{% if 'tool' != m.role %}{{ m['content'] }}"
        "{% endif %}{% if 'magic' in m['content'] %}!{% endif %}{{ m['content'] | replace('swap', 'x') }}{% endfor %}")
    assert template_constants(parsed) == ("magic", "swap")
    model = tokenizer()
    assert "system" not in model.template_constants, "SmolLM2's template compares 'system' with the first role only"
    messages: list[dict[str, object]] = [{"role": "user", "content": "the system prompt"}]
    skeleton = model._skeleton_of(("user",), "the system prompt")
    assert skeleton is not None
    assert skeleton.splice(["the system prompt"]) == model._render(messages, ["the system prompt"], None)


def test_a_plain_line_never_nests_past_the_limit() -> None:
    assert MAX_NESTING_DEPTH >= 4, "a plain line (line, body, messages, message) is looked at before the depth"


def test_a_plain_lines_model_is_the_one_the_catalogue_resolves() -> None:
    for catalogue in (CATALOGUE, STRICT, CATALOGUE.restricted_to(["smollm2-135m-embed"])):
        table = plain_models(catalogue)
        names = {name for model in catalogue.models for name in (model.id, *model.aliases)} | {"gpt-4o"}
        for name in names:
            model = catalogue.resolve(name)
            if name in table:
                assert table[name] is model
            else:
                assert model is None or model.strict_sampling or "/v1/chat/completions" not in model.endpoints


def file_state(validation: FileValidation) -> tuple[object, ...]:
    return (validation.first_line_of, validation.counts_by_code, validation.error_count, validation.rejected_lines,
            validation.model_id, validation.model_line, validation.embedding_inputs, validation.file_issues)


def test_a_files_rules_find_the_same_refused_lines_and_state_by_either_way() -> None:
    for limits, catalogue in ((Limits(), CATALOGUE), (Limits(max_lines=500), CATALOGUE),
                              (Limits(inherit_line_model=True), CATALOGUE), (Limits(), STRICT)):
        lines = corpus(3 * WINDOW_LINES + 17)
        lines += [orjson.dumps({**orjson.loads(line), "custom_id": "late"}) for line in random.Random(5).sample(
            [line for line in lines if line.startswith(b'{"custom_id"')], 3)]
        applied = FileValidation("/v1/chat/completions", catalogue, limits, TOKENIZERS)
        refused = FileValidation("/v1/chat/completions", catalogue, limits, TOKENIZERS)
        numbered = list(enumerate(lines, start=1))
        for start in range(0, len(numbered), WINDOW_LINES):
            window = numbered[start:start + WINDOW_LINES]
            plan_a, plan_r = applied.plan(window), refused.plan(window)
            verdicts = check_lines(plan_a.to_check, plan_a.spec, catalogue, TOKENIZERS)
            expected = [result for result in applied.apply(plan_a, verdicts) if result.issues]
            assert refused.refused(plan_r, verdicts) == expected
        assert file_state(refused) == file_state(applied)


def test_lines_ordering_roles_a_new_way_each_leave_the_tokenizer_remembering_a_bounded_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's lines can order their messages' roles a new way each; the tokenizer outlives every batch."""
    monkeypatch.setattr(tokenizer_module, "ROLE_SEQUENCES_KEPT", 8)
    model = dataclasses.replace(tokenizer(), overhead_cache={}, skeletons={})
    orders = [tuple(random.Random(n).choices(["system", "user", "assistant"], k=6)) for n in range(60)]
    for roles in orders:
        messages: list[dict[str, object]] = [{"role": role, "content": "hi"} for role in roles]
        assert model.chat_over(messages, 10_000) is None
        assert model.plain_chat_over(roles, ["hi"] * len(roles), 5) == model.chat_over(messages, 5)
    assert len(model.skeletons) <= 8 and len(model.overhead_cache) <= 8
