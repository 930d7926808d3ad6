"""A line's schema patterns may not repeat to millions of copies in all: llama.cpp writes `x{0,1999}` as 1,999 copies
of `x` on the one thread every slot waits on (124 such patterns of 16 quantifiers, each within the per-pattern bounds,
stalled every slot of the engine 6.7 s per line)."""

from services.validator.engine_cost_rules import MAX_PATTERN_REPEATS, engine_cost_issues, pattern_repeats


def body(patterns: int, pattern: str) -> dict[str, object]:
    objects = {f"o{j}": {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": pattern}
                                                          for i in range(patterns // 2)}} for j in range(2)}
    return {"model": "m", "messages": [], "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": objects}}}}


def test_patterns_repeating_to_millions_of_copies_are_refused_and_a_modest_one_is_not() -> None:
    heavy = body(124, "^" + "[a-z]{0,1999}" * 16 + "$")
    issues = list(engine_cost_issues(heavy, "/v1/chat/completions"))
    assert [issue.code for issue in issues] == ["invalid_body"], issues
    assert "repeat" in issues[0].message
    assert list(engine_cost_issues(body(124, "^[a-z]{0,9}[0-9]{2,4}$"), "/v1/chat/completions")) == []
    assert list(engine_cost_issues(body(2, "^[a-z]{0,1999}$"), "/v1/chat/completions")) == []


def test_only_counted_quantifiers_outside_classes_and_escapes_count() -> None:
    assert pattern_repeats("a{3}b{2,}c{0,1999}") == 3 + 2 + 1999
    assert pattern_repeats(r"\{5}[{7}]a{5") == 0
    assert pattern_repeats("a*b+c?") == 0
    assert MAX_PATTERN_REPEATS >= 16 * 1999  # one pattern at every per-pattern bound still passes
