"""Checking a window of lines on their own: every per-line rule, then the prompts the cheap bound could not clear
counted exactly in one batch. Pure (no state of the file), so a window runs in this process or in a worker process,
and its verdicts travel between the two in a small form (`to_wire` / `from_wire`)."""

from dataclasses import dataclass

from contracts.catalogue import Catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.body_rules import ContextNeed, context_issue
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
    """Each line's verdict (None: not to check); a prompt over the context is one more issue of its line."""
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
    """The verdicts with their prompts counted, a model's in one batch."""
    by_model: dict[str, list[tuple[int, LineVerdict, ContextNeed]]] = {}
    for index, verdict in enumerate(verdicts):
        if verdict is not None and verdict.context is not None:
            by_model.setdefault(verdict.context.model.id, []).append((index, verdict, verdict.context))
    if not by_model or tokenizers is None:
        return verdicts
    counted = list(verdicts)
    for needs in by_model.values():
        tokenizer = tokenizers.get(needs[0][2].model)
        texts = [text for *_, need in needs for text in need.prompts]
        counts = iter(tokenizer.count_many(texts) if tokenizer is not None else [])
        for index, v, need in needs:
            issue = context_issue(need, max(next(counts) for _ in need.prompts)) if tokenizer is not None else None
            counted[index] = LineVerdict(v.issues if issue is None else [*v.issues, issue], v.custom_id,
                                         v.model if issue is None else None, v.embedding_inputs, None, v.sampling)
    return counted


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
