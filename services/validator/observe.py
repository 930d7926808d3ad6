"""The validator's metrics: lines checked, by verdict (its spans come from the bus's handler span)."""

from services.runtime.process import metrics


def count_lines(total: int, runnable: int) -> None:
    metrics.VALIDATED_LINES.labels("valid").inc(runnable)
    metrics.VALIDATED_LINES.labels("rejected").inc(total - runnable)
