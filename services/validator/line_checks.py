"""Checking a window of lines on their own: every per-line rule, then the prompts the cheap bound could not clear
counted exactly in one batch. Pure (no state of the file), so a window runs in this process or in a worker process,
and its verdicts travel between the two in a small form (`to_wire` / `from_wire`)."""

from dataclasses import dataclass

from contracts.catalogue import Catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.body_rules import context_issue
from services.validator.issues import LineIssue
from services.validator.plain_lines import PlainChat
from services.validator.rules import LineVerdict, check_line
from services.validator.strict_sampling import SamplingKey


@dataclass(frozen=True)
class WindowSpec:
    """What the lines of one file are checked against (the same for every window of it)."""

    endpoint: str
    allowed_models: tuple[str, ...] | None
    """The owner's model access (None: every model): the catalogue is restricted to it."""
    max_line_bytes: int
    line_model: str | None
    """The model of lines that name none, as known when the window was sent."""
    inherit_line_model: bool
    """A line without a model takes the first one a line of the window names (when `line_model` is None)."""


WireVerdict = tuple[tuple[tuple[str, str, str | None], ...], str | None, str | None, int, SamplingKey | None]
"""A verdict as it crosses between processes: (issues, custom_id, model id, embedding inputs, sampling)."""


def check_lines(lines: list[bytes | None], spec: WindowSpec, catalogue: Catalogue,
                tokenizers: TokenizerCache | None) -> list[LineVerdict | None]:
    """Each line's verdict (None for a line not to check), its prompt counted exactly where needed: a prompt over the
    context is one more issue of its line (whose model then pins nothing)."""
    verdicts: list[LineVerdict | None] = []
    line_model = spec.line_model
    plain = PlainChat(catalogue, tokenizers)
    for raw in lines:
        if raw is None:
            verdicts.append(None)
            continue
        verdict = check_line(raw, spec.endpoint, catalogue, spec.max_line_bytes, tokenizers, line_model, plain)
        if line_model is None and spec.inherit_line_model and verdict.model is not None:
            line_model = verdict.model.id
        verdicts.append(verdict)
    return _counted(verdicts, tokenizers)


def _counted(verdicts: list[LineVerdict | None], tokenizers: TokenizerCache | None) -> list[LineVerdict | None]:
    """The verdicts with their prompts counted: a prompt over the context becomes its line's issue."""
    pending = [v for v in verdicts if v is not None and v.context is not None]
    if not pending or tokenizers is None:
        return verdicts
    issues: dict[int, LineIssue | None] = {}
    by_model: dict[str, list[LineVerdict]] = {}
    for verdict in pending:
        assert verdict.context is not None
        by_model.setdefault(verdict.context.model.id, []).append(verdict)
    for group in by_model.values():
        need0 = group[0].context
        assert need0 is not None
        tokenizer = tokenizers.get(need0.model)
        if tokenizer is None:
            continue
        texts = [text for v in group for text in v.context.prompts]  # type: ignore[union-attr]
        counts = iter(tokenizer.count_many(texts))
        for verdict in group:
            assert verdict.context is not None
            longest = max(next(counts) for _ in verdict.context.prompts)
            issues[id(verdict)] = context_issue(verdict.context, longest)
    return [_with_context(v, issues.get(id(v))) if v is not None else None for v in verdicts]


def _with_context(verdict: LineVerdict, issue: LineIssue | None) -> LineVerdict:
    if verdict.context is None:
        return verdict
    if issue is None:
        return LineVerdict(verdict.issues, verdict.custom_id, verdict.model, verdict.embedding_inputs, None,
                           verdict.sampling)
    return LineVerdict([*verdict.issues, issue], verdict.custom_id, None, verdict.embedding_inputs, None,
                       verdict.sampling)


def to_wire(verdict: LineVerdict | None) -> WireVerdict | None:
    if verdict is None:
        return None
    issues = tuple((issue.code, issue.message, issue.param) for issue in verdict.issues)
    return issues, verdict.custom_id, verdict.model.id if verdict.model else None, verdict.embedding_inputs, \
        verdict.sampling


def from_wire(wire: WireVerdict | None, catalogue: Catalogue) -> LineVerdict | None:
    if wire is None:
        return None
    issues, custom_id, model_id, embedding_inputs, sampling = wire
    model = catalogue.resolve(model_id) if model_id is not None else None
    return LineVerdict([LineIssue(*issue) for issue in issues], custom_id, model, embedding_inputs, None, sampling)
