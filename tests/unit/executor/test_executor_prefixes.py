"""Prefix-aware running of a unit's lines: which lines share a long prompt prefix, the order that runs each prefix's
lines one after another on a slot (lanes, interleaved), and the slot a line should start on."""


from services.executor.prefixes import HEAD_CHARS, SlotState, choose_start, order_lines, prefix_key

CHAT = "/v1/chat/completions"
SYSTEM = "You answer in one word. " * 40  # about 1,000 characters


def chat(question: str, system: str | None = SYSTEM, **fields: object) -> dict[str, object]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"model": "m", "messages": messages, **fields}


def test_lines_sharing_a_long_system_prompt_share_a_key_whatever_they_ask() -> None:
    assert prefix_key(CHAT, chat("Name a colour.")) == prefix_key(CHAT, chat("Name a fruit.", max_tokens=4))
    assert prefix_key(CHAT, chat("Name a colour.")) is not None


def test_another_system_prompt_tools_or_few_shot_turns_make_another_key() -> None:
    base = prefix_key(CHAT, chat("Q"))
    assert prefix_key(CHAT, chat("Q", system=SYSTEM + "Be kind.")) != base
    assert prefix_key(CHAT, chat("Q", tools=[{"type": "function", "function": {"name": "f"}}])) != base
    few_shot = chat("Q")
    few_shot["messages"] = [*few_shot["messages"][:1], {"role": "user", "content": "A?"},  # type: ignore[index]
                            {"role": "assistant", "content": "B"}, {"role": "user", "content": "Q"}]
    assert prefix_key(CHAT, few_shot) not in (None, base)


def test_a_short_prompt_has_no_key_worth_grouping_for() -> None:
    assert prefix_key(CHAT, chat("Name a colour.", system="Be brief.")) is None
    assert prefix_key(CHAT, chat("Name a colour.", system=None)) is None


def test_long_single_prompts_that_begin_alike_share_a_key() -> None:
    head = "Read the report below and list its risks. " * 30
    assert len(head) > HEAD_CHARS
    one, two = chat(head + "Report: A", system=None), chat(head + "Report: B", system=None)
    assert prefix_key(CHAT, one) == prefix_key(CHAT, two) is not None
    assert prefix_key("/v1/completions", {"prompt": head + "x"}) == prefix_key("/v1/completions", {"prompt": head})
    assert prefix_key("/v1/completions", {"prompt": "Once upon a time"}) is None


def test_the_responses_instructions_are_its_system_prompt() -> None:
    one = {"model": "m", "instructions": SYSTEM, "input": "Name a colour."}
    two = {"model": "m", "instructions": SYSTEM, "input": [{"role": "user", "content": "Name a fruit."}]}
    assert prefix_key("/v1/responses", one) == prefix_key("/v1/responses", two) is not None
    assert prefix_key("/v1/responses", {"model": "m", "input": 5}) is None


def test_a_prompt_cache_key_is_the_key_and_an_owner_never_shares_one_with_another() -> None:
    tagged = chat("Q", system="short", prompt_cache_key="faq-v2")
    assert prefix_key(CHAT, tagged) == prefix_key(CHAT, {**tagged, "messages": []}) is not None
    assert prefix_key(CHAT, chat("Q"), scope="alice") != prefix_key(CHAT, chat("Q"), scope="bob")
    assert prefix_key("/v1/embeddings", {"input": SYSTEM * 3}) is None


def started(keys: list[str | None], slots: int, warm: tuple[str, ...] = ()) -> list[str | None]:
    return [keys[index] for index in order_lines(keys, slots, warm).order]


def test_each_prefix_runs_in_one_lane_when_prefixes_outnumber_slots_one_slot_per_lane_at_a_time() -> None:
    keys: list[str | None] = [f"p{i % 16}" for i in range(64)]  # 16 prefixes interleaved, 4 lines each
    planned = order_lines(keys, 8)
    assert sorted(planned.order) == list(range(64))
    assert planned.lanes == {f"p{k}": 1 for k in range(16)}
    # Eight lanes at a time, round-robin: a slot's next line is the next of the lane it ran.
    first_wave = [f"p{k}" for k in range(8)]
    assert started(keys, 8)[:32] == first_wave * 4
    assert started(keys, 8)[32:] == [f"p{k}" for k in range(8, 16)] * 4


def test_a_prefix_with_many_lines_gets_the_spare_slots_as_lanes_of_its_own() -> None:
    keys: list[str | None] = [*["big"] * 60, *["small"] * 4]
    planned = order_lines(keys, 8)
    assert planned.lanes == {"big": 7, "small": 1}
    assert started(keys, 8)[:8] == ["big"] * 7 + ["small"]
    assert order_lines(["only"] * 20, 8).lanes == {"only": 8}
    assert order_lines(["only"] * 3, 8).lanes == {"only": 3}


def test_the_order_is_stable_and_prefixes_a_slot_holds_go_first() -> None:
    keys: list[str | None] = ["a", None, "b", "a", None, "b"]
    order = order_lines(keys, 2).order
    assert [i for i in order if keys[i] == "a"] == [0, 3] and [i for i in order if keys[i] == "b"] == [2, 5]
    assert started(keys, 2, warm=("b",))[:1] == ["b"]
    assert order_lines([], 4).order == []
    assert order_lines([None, None, None], 2).order == [0, 1, 2]  # no keys: file order


def slot(index: int, resident: str | None, busy: bool = False, last_used: int = 0) -> SlotState:
    return SlotState(index, resident, busy, last_used)


def test_a_free_slot_holding_one_of_the_units_prefixes_starts_that_prefix_whatever_comes_first() -> None:
    slots = [slot(0, "a", busy=True), slot(1, "b"), slot(2, None)]
    assert choose_start(["a", "b"], slots, {"a": 1, "b": 1}) == (1, "b")


def test_a_unit_waits_for_its_busy_slot_rather_than_take_one_another_prefix_still_needs() -> None:
    slots = [slot(0, "a", busy=True), slot(1, "b")]
    assert choose_start(["a"], slots, {"a": 1, "b": 1}) is None
    assert choose_start(["a"], slots, {"a": 1, "b": 1}, patient=False) == (1, "a")  # below its share: it may not


def test_a_prefix_needing_more_lanes_spreads_onto_spare_slots() -> None:
    slots = [slot(0, "a", busy=True), slot(1, None), slot(2, "old", last_used=5)]
    assert choose_start(["a"], slots, {"a": 3}) == (1, "a")  # an empty slot before one holding a prefix done with
    assert choose_start(["a"], [slot(0, "a", busy=True), slot(2, "old")], {"a": 3}) == (2, "a")
    assert choose_start(["a"], [slot(0, "a", busy=True), slot(1, None)], {"a": 1}) is None  # its one lane: it waits


def test_a_new_prefix_takes_a_spare_slot_and_otherwise_waits_while_the_unit_has_a_busy_one() -> None:
    slots = [slot(0, "a", busy=True), slot(1, "b"), slot(2, "done")]
    assert choose_start(["a", "new"], slots, {"a": 1, "b": 1, "new": 1}) == (2, "new")
    assert choose_start(["a", "new"], slots[:2], {"a": 1, "b": 1, "new": 1}) is None


def test_a_unit_with_nothing_held_never_waits_and_evicts_what_costs_least() -> None:
    slots = [slot(0, "a", last_used=1), slot(1, "b", last_used=2), slot(2, "c", busy=True)]
    assert choose_start(["new"], slots, {"a": 1, "b": 1, "new": 1}) == (0, "new")  # least recently used
    assert choose_start(["new"], slots, {"a": 2, "b": 1, "new": 1}) == (1, "new")  # a needs more than it holds
    assert choose_start([None], slots, {"a": 1, "b": 1}) == (0, None)
    assert choose_start(["unplanned"], [slot(0, "a", busy=True), slot(1, "b")], {"b": 1}) == (1, "unplanned")
    assert choose_start(["a"], [slot(0, "a", busy=True)], {"a": 1}) is None  # nothing free
    assert choose_start([], slots, {}) is None
