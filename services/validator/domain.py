"""Validating a whole file: per-line rules plus the file-level ones (duplicates, one model, size)."""

from dataclasses import dataclass, field

from contracts.catalogue import Catalogue
from services.validator.rules import LineIssue, check_line


@dataclass(frozen=True)
class Limits:
    max_lines: int = 50_000
    max_line_bytes: int = 1024 * 1024


@dataclass
class FileValidation:
    """Feed lines in order; it returns each line's issues and keeps what the verdict needs."""

    endpoint: str
    catalogue: Catalogue
    limits: Limits = field(default_factory=Limits)
    total_lines: int = 0
    error_count: int = 0
    counts_by_code: dict[str, int] = field(default_factory=dict)
    model_id: str | None = None
    model_line: int | None = None
    first_line_of: dict[str, int] = field(default_factory=dict)

    def feed(self, line_no: int, raw: bytes) -> list[LineIssue]:
        if not raw.strip():
            return []
        self.total_lines += 1
        if self.total_lines > self.limits.max_lines:
            return self._count([LineIssue("too_many_tasks", f"The file has more than {self.limits.max_lines}"
                                          " requests; split it into several batches.")])
        issues, parsed = check_line(raw, self.endpoint, self.catalogue, self.limits.max_line_bytes)
        if parsed is not None:
            first = self.first_line_of.setdefault(parsed.custom_id, line_no)
            if first != line_no:
                issues.append(LineIssue("duplicate_custom_id", f"custom_id {parsed.custom_id!r} was already "
                                        f"used on line {first}; each custom_id must be unique.", "custom_id"))
            if parsed.model_id is not None:
                issues.extend(self._pin_model(line_no, parsed.model_id))
        return self._count(issues)

    def finish(self) -> list[LineIssue]:
        """File-level issues known only at the end."""
        if self.total_lines == 0:
            return self._count([LineIssue("empty_file", "The file has no requests: add one JSON request "
                                          "per line.")])
        return []

    @property
    def passed(self) -> bool:
        return self.error_count == 0 and self.model_id is not None

    def _pin_model(self, line_no: int, model_id: str) -> list[LineIssue]:
        if self.model_id is None:
            self.model_id, self.model_line = model_id, line_no
            return []
        if model_id != self.model_id:
            return [LineIssue("model_mismatch", f"This line uses {model_id} but line {self.model_line} uses "
                              f"{self.model_id}; a batch runs one model.", "body.model")]
        return []

    def _count(self, issues: list[LineIssue]) -> list[LineIssue]:
        for issue in issues:
            self.error_count += 1
            self.counts_by_code[issue.code] = self.counts_by_code.get(issue.code, 0) + 1
        return issues
