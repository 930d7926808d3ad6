"""The invariant every terminal batch keeps, as the executor tests check it on the files a batch ended with."""

from collections import Counter

import orjson


class InvariantBroken(AssertionError):
    """A terminal batch whose files do not account for every input line exactly once."""


def check_invariant(total: int, completed: int, failed: int, output: bytes, errors: bytes) -> None:
    """completed + failed = total = output lines + error lines, each line's id once across both files (custom_ids
    may repeat: allow_partial runs the first line of a repeated custom_id and refuses the others)."""
    ids = [orjson.loads(raw)["id"] for raw in [*output.splitlines(), *errors.splitlines()] if raw.strip()]
    output_lines = sum(1 for raw in output.splitlines() if raw.strip())
    problems = []
    if completed + failed != total:
        problems.append(f"completed {completed} + failed {failed} != total {total}")
    if len(ids) != total:
        problems.append(f"{len(ids)} file lines for {total} input lines")
    if output_lines != completed:
        problems.append(f"{output_lines} output lines but {completed} completed")
    duplicates = sorted(ident for ident, seen in Counter(ids).items() if seen > 1)
    if duplicates:
        problems.append(f"ids more than once: {duplicates[:5]}")
    if problems:
        raise InvariantBroken("; ".join(problems))
