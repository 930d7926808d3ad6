"""Where a batch stands, told to its owner: the fleet's measured rate per model (`RateMeter`) and the `status_reason`
texts. Pure. The texts are coarse on purpose (exact place only near the front, ETA in buckets) and restated only when
`should_republish` says so: 10,000 queued batches must not each get a new fact whenever one of them finishes."""

import math

WINDOW_MS = 60_000
"""The rate is what the fleet ran in the last minute."""
BUCKETS = 12
"""The window is kept as this many buckets per model (5 s each): memory stays bounded whatever the fact rate."""
REPUBLISH_EVERY_MS = 10_000
"""A batch's standing changes its text at most this often."""
ETA_ONLY_EVERY_MS = 30_000
"""A change of the ETA alone waits longer: a rate near a bucket's edge would flip it back and forth."""
FAR_PLACE_EVERY_MS = 30_000
"""A far-back place ("about 300th") waits as long: under a burst it moves a step every few s; its ETA says more."""
QUEUED_KIND = "Queued"
EXACT_PLACES = 10
"""Places up to this are told exactly; beyond, to one significant digit ("about 40th")."""


class RateMeter:
    """Lines per second the fleet runs each model at, over a sliding window of fixed buckets (O(models * buckets)),
    from progress facts; one older than the window before the newest seen (replayed at start-up) adds nothing."""

    bucket_ms = WINDOW_MS // BUCKETS

    def __init__(self) -> None:
        self._lines: dict[str, dict[int, int]] = {}
        """Model → bucket index (at_ms // bucket_ms) → lines made durable in it."""
        self._newest: int | None = None
        """The newest bucket index seen: what is older than the window before it can never count again."""

    def note(self, model: str, at_ms: int, lines: int) -> None:
        """`lines` more lines of `model` were committed at `at_ms` (a progress fact's time and its new lines)."""
        if lines <= 0:
            return
        index = at_ms // self.bucket_ms
        if self._newest is None or index > self._newest:
            self._newest = index
            self._prune(index - BUCKETS + 1)
        elif index < self._newest - BUCKETS + 1:
            return
        buckets = self._lines.setdefault(model, {})
        buckets[index] = buckets.get(index, 0) + lines

    def rates(self, now_ms: int) -> dict[str, float]:
        """Lines per second per model over the window before `now_ms` (a model with none is absent), measured since
        the model's first bucket in it when that is younger (a model started 10 s ago: over those 10 s)."""
        # `now_ms` only grows: what is before this window never counts again, and what is left is the window's.
        self._prune(now_ms // self.bucket_ms - BUCKETS + 1)
        return {model: sum(buckets.values()) * 1000
                / min(max(now_ms - min(buckets) * self.bucket_ms, self.bucket_ms), WINDOW_MS)
                for model, buckets in self._lines.items()}

    def _prune(self, before: int) -> None:
        """Forget the buckets before `before` (the window's first kept), and the models left with none."""
        self._lines = {model: kept for model, buckets in self._lines.items()
                       if (kept := {index: lines for index, lines in buckets.items() if index >= before})}


def ordinal(n: int) -> str:
    """1st 2nd 3rd 4th … 11th 12th 13th … 21st 22nd … 101st 111th."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


def place_phrase(position: int) -> str:
    """"3rd" up to `EXACT_PLACES`; beyond, one significant digit: "about 40th", "about 300th"."""
    position = max(position, 1)
    if position <= EXACT_PLACES:
        return ordinal(position)
    magnitude = 10 ** (len(str(position)) - 1)
    return f"about {ordinal(int(position / magnitude + 0.5) * magnitude)}"


def eta_phrase(eta_s: float | None) -> str | None:
    """"under a minute", "about N min" (1-10, then 15/20/30/45), "about N h", "about N days"; None: no estimate."""
    if eta_s is None or not math.isfinite(eta_s) or eta_s < 0:
        return None
    minutes = eta_s / 60
    if minutes < 1:
        return "under a minute"
    if minutes < 10.5:
        return f"about {int(minutes + 0.5)} min"
    for edge, bucket in ((12.5, 10), (17.5, 15), (25, 20), (37.5, 30), (52.5, 45)):
        if minutes < edge:
            return f"about {bucket} min"
    hours = int(minutes / 60 + 0.5)
    if hours <= 48:
        return f"about {hours} h"
    return f"about {int(hours / 24 + 0.5)} days"


def queued_reason(position: int, model: str, eta_s: float | None) -> str:
    """A waiting batch's standing: "Queued: 3rd for smollm2-135m-instruct-q4_1, about 4 min." (`position` 1 = the
    next of its model to finish, `eta_s` seconds until it finishes, as `fair_share.standings` gives them)."""
    eta = eta_phrase(eta_s)
    return f"{QUEUED_KIND}: {place_phrase(position)} for {model}" + (f", {eta}." if eta else ".")


def running_reason(done: int, total: int, eta_s: float | None, executors: int) -> str:
    """A running batch's standing: "Running on 2 executors: 40 % done, about 3 min left." (`done` lines
    committed of `total`, `eta_s` seconds until the last is, `executors` running its lines now; 0: "Running:")."""
    where = "" if executors <= 0 else f" on {executors} executor{'s' if executors != 1 else ''}"
    percent = 0 if total <= 0 else min(int(100 * max(done, 0) / total), 99 if done < total else 100)
    eta = eta_phrase(eta_s)
    return f"Running{where}: {percent} % done" + (f", {eta} left." if eta else ".")


def _parts(reason: str) -> tuple[str, str, str] | None:
    """A text of this module as (kind, where it stands, ETA); None for any other reason. The ETA follows the
    first ", " (model ids hold none, and "1,000th" has no space)."""
    kind = reason.split(":", 1)[0].split(" ", 1)[0]
    if kind not in ("Queued", "Running") or ":" not in reason:
        return None
    standing, _, eta = reason.partition(", ")
    return kind, standing.removesuffix("."), eta


def should_republish(old_reason: str | None, new_reason: str, last_at_ms: int | None, now_ms: int) -> bool:
    """Whether to state `new_reason` for a batch whose last stated reason was `old_reason` at `last_at_ms`: never
    the same text twice; at once when the kind changes (or for the first standing); else a new place or progress
    after `REPUBLISH_EVERY_MS` (far back: `FAR_PLACE_EVERY_MS`), a new ETA alone after `ETA_ONLY_EVERY_MS`."""
    if new_reason == old_reason:
        return False
    if old_reason is None or last_at_ms is None:
        return True
    old, new = _parts(old_reason), _parts(new_reason)
    if old is None or new is None or old[0] != new[0]:
        return True
    elapsed = now_ms - last_at_ms
    if old[1] != new[1]:
        far_back = new[1].startswith(f"{QUEUED_KIND}: about ")  # a place beyond `EXACT_PLACES`
        return elapsed >= (FAR_PLACE_EVERY_MS if far_back else REPUBLISH_EVERY_MS)
    return elapsed >= ETA_ONLY_EVERY_MS
