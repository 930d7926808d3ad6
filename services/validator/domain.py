"""Validating a whole file: per-line rules plus the file-level ones (duplicates, one model, size limits)."""

from dataclasses import dataclass, field

from contracts.api.request_line import MAX_LINE_BYTES
from contracts.catalogue import Catalogue
from services.validator.adapters.tokenizer import TokenizerCache
from services.validator.issues import LineIssue
from services.validator.line_checks import WindowSpec, check_lines
from services.validator.rules import LineVerdict
from services.validator.strict_sampling import OneSampling


@dataclass(frozen=True)
class Limits:
    max_lines: int = 50_000
    max_embedding_inputs: int = 50_000
    max_line_bytes: int = MAX_LINE_BYTES
    inherit_line_model: bool = False
    """A line without `body.model` runs on the model an earlier line named (Reliquary's files; off: OpenAI's rule)."""


@dataclass(frozen=True)
class LineResult:
    line: int
    custom_id: str | None
    issues: list[LineIssue]


@dataclass(frozen=True)
class Window:
    """Consecutive lines as the file's bookkeeping admitted them."""

    numbers: list[int]
    to_check: list[bytes | None]
    """Each line's bytes to check on its own; None: blank, past the line limit, or decided already."""
    decided: dict[int, LineVerdict]
    """Verdicts the bookkeeping gave itself (the first line past the limit)."""
    spec: WindowSpec


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
    """The first line past `max_lines`: refused with `too_many_tasks`; the lines after it are not read."""
    embedding_limit_line: int | None = None
    """The line whose embedding inputs went past `max_embedding_inputs` (refused for it)."""
    lines_seen: int = 0
    """The last line planned (blank ones and those past `max_lines` too)."""
    blank_lines: list[int] = field(default_factory=list)
    """The blank lines planned (no requests, no line in the error file)."""
    file_issues: dict[str, LineIssue] = field(default_factory=dict)
    """File-level errors, one per code: each is reported once, and fails the batch even with allow_partial."""
    default_model: str | None = None
    """The model the batch names for every line (`BatchCreated.default_model`)."""
    revision: str | None = None
    """The model revision the batch pins (`metadata.revision`), which the catalogue must serve."""
    sampling: OneSampling = field(default_factory=OneSampling)
    """A strict-sampling model's file samples one way."""
    allowed_models: tuple[str, ...] | None = None
    """The owner's model access (`catalogue` is restricted to it already; a worker process restricts its own)."""

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
        """Check consecutive lines here: each on its own, then the file-level rules in line order."""
        window = self.plan(lines)
        return self.apply(window, check_lines(window.to_check, window.spec, self.catalogue, self.tokenizers))

    @property
    def awaits_line_model(self) -> bool:
        """Lines without a model take the first one a line names, and none has yet: windows go in order until then."""
        return self.limits.inherit_line_model and self._line_model() is None

    def plan(self, lines: list[tuple[int, bytes]]) -> "Window":
        """The file's bookkeeping of a window: lines counted, those past `max_lines` decided, the others to check."""
        numbers = [line_no for line_no, _ in lines]
        raws = [raw for _, raw in lines]
        decided: dict[int, LineVerdict] = {}
        self.lines_seen = numbers[-1] if numbers else self.lines_seen
        to_check: list[bytes | None]
        if all(map(bytes.strip, raws)) and self.total_lines + len(raws) <= self.limits.max_lines:
            to_check, self.total_lines = list(raws), self.total_lines + len(raws)  # requests all, as nearly always
        else:
            to_check = [self._admitted(line_no, raw, decided) for line_no, raw in lines]
        spec = WindowSpec(self.endpoint, self.allowed_models, self.limits.max_line_bytes, self._line_model(),
                          self.limits.inherit_line_model)
        return Window(numbers, to_check, decided, spec)

    def _admitted(self, line_no: int, raw: bytes, decided: dict[int, LineVerdict]) -> bytes | None:
        """`raw` to check, counted; None for a blank line or one past `max_lines` (the first refused in `decided`)."""
        if not raw.strip():
            self.blank_lines.append(line_no)
            return None
        self.total_lines += 1
        if self.total_lines <= self.limits.max_lines:
            return raw
        if self.limit_line is None:
            self.limit_line = line_no
            issue = LineIssue("too_many_tasks", f"The file has more than {self.limits.max_lines} requests; split it "
                              f"into several batches (lines from {line_no} on were not checked).")
            decided[line_no] = LineVerdict([self._file_issue(issue)])
        return None

    def apply(self, window: "Window", verdicts: list[LineVerdict | None]) -> list[LineResult]:
        """The file-level rules over a window's checked lines, in line order."""
        return [self._file_rules(line_no, window.decided.get(line_no, verdict))
                for line_no, verdict in zip(window.numbers, verdicts, strict=True)]

    def refused(self, window: "Window", verdicts: list[LineVerdict | None]) -> list[LineResult]:
        """`apply`'s results with issues: a line that plainly passes (no issue, a new custom_id, the file's model,
        nothing to count) is passed by a few look-ups."""
        found: list[LineResult] = []
        first_line_of, decided = self.first_line_of, window.decided
        for line_no, verdict in zip(window.numbers, verdicts, strict=True):
            if decided:
                verdict = decided.get(line_no, verdict)
            if verdict is None:
                continue
            if not verdict.issues and verdict.sampling is None and not verdict.embedding_inputs \
                    and verdict.custom_id is not None and verdict.model is not None \
                    and verdict.model.id == self.model_id and verdict.custom_id not in first_line_of:
                first_line_of[verdict.custom_id] = line_no
                continue
            result = self._file_rules(line_no, verdict)
            if result.issues:
                found.append(result)
        return found

    def _file_rules(self, line_no: int, verdict: LineVerdict | None) -> LineResult:
        if verdict is None:
            return LineResult(line_no, None, [])
        issues = list(verdict.issues)
        model = verdict.model
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
        """With allow_partial the valid lines may run: some, of one model, in an acceptable file."""
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
