"""Validating a whole file: per-line rules plus the file-level ones (duplicates, one model, size limits)."""

from dataclasses import dataclass, field

from contracts.catalogue import Catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.body_rules import context_issue
from services.validator.issues import LineIssue
from services.validator.rules import LineVerdict, check_line
from services.validator.strict_sampling import OneSampling


@dataclass(frozen=True)
class Limits:
    max_lines: int = 50_000
    max_embedding_inputs: int = 50_000
    max_line_bytes: int = 1024 * 1024
    inherit_line_model: bool = False
    """A line without `body.model` runs on the model an earlier line named (Reliquary's files). Off, OpenAI's
    rule: each line names its model, unless the batch names one for all (`metadata.model`, or the upload's)."""


@dataclass(frozen=True)
class LineResult:
    line: int
    custom_id: str | None
    issues: list[LineIssue]


@dataclass
class FileValidation:
    """Feed lines in order; it returns each line's issues and keeps what the verdict needs."""

    endpoint: str
    catalogue: Catalogue
    limits: Limits = field(default_factory=Limits)
    tokenizers: TokenizerCache | None = None
    total_lines: int = 0
    rejected_lines: int = 0
    error_count: int = 0
    counts_by_code: dict[str, int] = field(default_factory=dict)
    model_id: str | None = None
    model_line: int | None = None
    embedding_inputs: int = 0
    first_line_of: dict[str, int] = field(default_factory=dict)
    limit_line: int | None = None
    """The first line past `max_lines`: it is refused with `too_many_tasks`, the lines after it are not read."""
    embedding_limit_line: int | None = None
    """The line whose embedding inputs went past `max_embedding_inputs`: the one refused for it."""
    file_issues: dict[str, LineIssue] = field(default_factory=dict)
    """The file-level errors found, one per code (`empty_file`, `too_many_tasks`): each is reported once, and
    fails the batch even with allow_partial."""
    default_model: str | None = None
    """The model the batch names for lines that name none (`BatchCreated.default_model`); every line runs on it."""
    revision: str | None = None
    """The model revision the batch pins (`metadata.revision`): the catalogue must serve the model at it."""
    sampling: OneSampling = field(default_factory=OneSampling)
    """A strict-sampling model's file samples one way (the first usable line's)."""

    def __post_init__(self) -> None:
        pinned = self.catalogue.resolve(self.default_model) if self.default_model is not None else None
        if pinned is not None:
            self.model_id, self.model_line = pinned.id, 0

    def _line_model(self) -> str | None:
        """What a line without body.model runs on: the batch's model, else (if inherited) the first one named."""
        if self.default_model is not None:
            return self.default_model
        return self.model_id if self.limits.inherit_line_model else None

    def feed(self, line_no: int, raw: bytes) -> list[LineIssue]:
        return self.check(line_no, raw).issues

    def check(self, line_no: int, raw: bytes) -> LineResult:
        return self.check_window([(line_no, raw)])[0]

    def check_window(self, lines: list[tuple[int, bytes]]) -> list[LineResult]:
        """Check consecutive lines: each on its own, then the prompts that need it counted in one batch,
        then the file-level rules in line order."""
        verdicts: list[tuple[int, LineVerdict | None]] = []
        line_model = self._line_model()
        for line_no, raw in lines:
            if not raw.strip():
                verdicts.append((line_no, None))
                continue
            self.total_lines += 1
            if self.total_lines > self.limits.max_lines:
                # One error for the file, at its first line past the limit; the rest are counted, never checked.
                if self.limit_line is None:
                    self.limit_line = line_no
                    issue = LineIssue("too_many_tasks", f"The file has more than {self.limits.max_lines} "
                                      f"requests; split it into several batches (lines from {line_no} on were not "
                                      "checked).")
                    verdicts.append((line_no, LineVerdict([self._file_issue(issue)])))
                else:
                    verdicts.append((line_no, None))
                continue
            verdict = check_line(raw, self.endpoint, self.catalogue, self.limits.max_line_bytes, self.tokenizers,
                                 line_model)
            if line_model is None and self.limits.inherit_line_model and verdict.model is not None:
                line_model = verdict.model.id  # named in this window, pinned once its file rules run
            verdicts.append((line_no, verdict))
        counted = self._count_prompts([v for _, v in verdicts if v is not None and v.context is not None])
        return [self._file_rules(line_no, verdict, counted) for line_no, verdict in verdicts]

    def _count_prompts(self, verdicts: list[LineVerdict]) -> dict[int, LineIssue | None]:
        """Exact token counts for the prompts the cheap bound could not clear, keyed by id(verdict)."""
        if not verdicts or self.tokenizers is None:
            return {}
        issues: dict[int, LineIssue | None] = {}
        by_model: dict[str, list[LineVerdict]] = {}
        for verdict in verdicts:
            assert verdict.context is not None
            by_model.setdefault(verdict.context.model.id, []).append(verdict)
        for group in by_model.values():
            need0 = group[0].context
            assert need0 is not None
            tokenizer = self.tokenizers.get(need0.model)
            if tokenizer is None:
                continue
            texts = [text for v in group for text in v.context.prompts]  # type: ignore[union-attr]
            counts = iter(tokenizer.count_many(texts))
            for verdict in group:
                assert verdict.context is not None
                longest = max(next(counts) for _ in verdict.context.prompts)
                issues[id(verdict)] = context_issue(verdict.context, longest)
        return issues

    def _file_rules(self, line_no: int, verdict: LineVerdict | None,
                    context_issues: dict[int, LineIssue | None]) -> LineResult:
        if verdict is None:
            return LineResult(line_no, None, [])
        issues = list(verdict.issues)
        model = verdict.model
        if (context := context_issues.get(id(verdict))) is not None:
            issues.append(context)
            model = None
        if verdict.custom_id is not None:
            first = self.first_line_of.setdefault(verdict.custom_id, line_no)
            if first != line_no:
                issues.append(LineIssue("duplicate_custom_id", f"custom_id {verdict.custom_id!r} was already used "
                                        f"on line {first}; each custom_id must be unique.", "custom_id"))
        if model is not None and not issues:
            issues += self._pin_model(line_no, model.id)
        if verdict.sampling is not None and not issues:
            mixed = self.sampling.check(line_no, verdict.sampling)
            if mixed is not None:
                issues.append(self._file_issue(mixed))
        if verdict.embedding_inputs:
            self.embedding_inputs += verdict.embedding_inputs
            if self.embedding_inputs > self.limits.max_embedding_inputs and self.embedding_limit_line is None:
                self.embedding_limit_line = line_no
                issues.append(self._file_issue(LineIssue(
                    "too_many_tasks", f"The file asks for more than {self.limits.max_embedding_inputs} embedding "
                    f"inputs in all (line {line_no} goes past it); split it into several batches.", "body.input")))
        return self._count(LineResult(line_no, verdict.custom_id, issues))

    def finish(self) -> list[LineIssue]:
        """File-level issues known only at the end."""
        if self.total_lines == 0:
            return [self._final_issue(LineIssue("empty_file", "The file has no requests: add one JSON request per "
                                                "line."))]
        model = self.catalogue.resolve(self.model_id) if self.model_id is not None else None
        if self.revision is not None and model is not None and model.served_revision != self.revision:
            served = f"at revision {model.served_revision}" if model.served_revision else "without a pinnable revision"
            return [self._final_issue(LineIssue(
                "revision_unavailable", f"metadata.revision pins {model.id} at {self.revision!r}, but it is served "
                f"{served} here; pin that one or leave metadata.revision out.", "metadata.revision"))]
        return []

    def _final_issue(self, issue: LineIssue) -> LineIssue:
        """A file-level issue found at the end: it fails the batch."""
        self.error_count += 1
        self.counts_by_code[issue.code] = self.counts_by_code.get(issue.code, 0) + 1
        return self._file_issue(issue)

    @property
    def passed(self) -> bool:
        return self.error_count == 0 and self.model_id is not None

    @property
    def runnable_lines(self) -> int:
        return self.total_lines - self.rejected_lines

    @property
    def partial_run_possible(self) -> bool:
        """With allow_partial the valid lines may run: there are some, of one model, and the file is acceptable."""
        return self.model_id is not None and self.runnable_lines > 0 and not self.file_issues

    def unchecked(self, line_no: int) -> bool:
        """A line past `max_lines`, which validation never read."""
        return self.limit_line is not None and line_no > self.limit_line

    def failure_reason(self) -> str:
        """Why the file fails, for a person: its file-level errors, then how many lines were refused."""
        parts = [issue.message for issue in self.file_issues.values()]
        if self.error_count > len(self.file_issues):  # some lines broke line rules too
            counted = f"{self.rejected_lines} of {self.total_lines} input lines failed validation"
            if self.error_count != self.rejected_lines:
                counted += f" ({self.error_count} errors)"
            parts.append(counted + ".")
        return " ".join(parts)

    def _file_issue(self, issue: LineIssue) -> LineIssue:
        self.file_issues.setdefault(issue.code, issue)
        return issue

    def _pin_model(self, line_no: int, model_id: str) -> list[LineIssue]:
        if self.model_id is None:
            self.model_id, self.model_line = model_id, line_no
            return []
        if model_id != self.model_id:
            pinned_by = "the batch's model is" if self.model_line == 0 else f"line {self.model_line} uses"
            return [LineIssue("model_mismatch", f"This line uses {model_id} but {pinned_by} {self.model_id}; a "
                              "batch runs one model.", "body.model")]
        return []

    def _count(self, result: LineResult) -> LineResult:
        if result.issues:
            self.rejected_lines += 1
        for issue in result.issues:
            self.error_count += 1
            self.counts_by_code[issue.code] = self.counts_by_code.get(issue.code, 0) + 1
        return result
