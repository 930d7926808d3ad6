"""What `sheshnag batch` prints about a batch's errors: `GET /v1/batches/{id}/errors` as the dashboard shows it, each
kind of error with its count, first line numbers, field, an example message and the fix."""

from contracts.api.error_codes import BatchErrorSummary, FailureStage

STAGES: dict[FailureStage, str] = {"refused": "refused by validation", "ran": "ran and failed",
                                   "not_run": "never ran"}


def render_errors(summary: BatchErrorSummary) -> str:
    """Lines of text ending in a newline; empty when the batch has no errors to show."""
    out: list[str] = []
    if summary.groups:
        kinds = len(summary.groups)
        out.append(f"{summary.total} problem{'s' if summary.total != 1 else ''} found, of {kinds} "
                   f"kind{'s' if kinds != 1 else ''}:")
        for group in summary.groups:
            lines = ", ".join(str(line) for line in group.lines)
            more = ", …" if lines and group.count > len(group.lines) else ""
            where = f"line{'s' if len(group.lines) != 1 else ''} {lines}{more}" if lines else "the whole file"
            field = f", field {group.param}" if group.param else ""
            out.append(f"  {group.title} ({group.code}) x {group.count}: {where}{field}")
            if group.example_message and group.example_message != group.title:
                out.append(f"    {group.example_message}")
            out.append(f"    Fix: {group.fix}")
    if summary.failed_lines:
        by_code = ", ".join(f"{group.code} x {group.count} ({STAGES[group.stage]})"
                            for group in summary.failed_by_code)
        out.append(f"{summary.failed_lines} failed line{'s' if summary.failed_lines != 1 else ''} in the error file"
                   + (f": {by_code}" if by_code else ""))
    return "".join(line + "\n" for line in out)
