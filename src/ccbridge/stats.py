"""Order statistics for repeated measurements: median and the p10-p90 spread."""

from __future__ import annotations

import math
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of already-sorted data."""
    if not sorted_xs:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    pos = (len(sorted_xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> dict:
    """median, p10, p90, min, max and n of the samples (NaN is refused)."""
    xs = sorted(float(x) for x in samples)
    if any(math.isnan(x) for x in xs):
        raise ValueError("NaN among samples")
    return {
        "median": percentile(xs, 50),
        "p10": percentile(xs, 10),
        "p90": percentile(xs, 90),
        "min": xs[0],
        "max": xs[-1],
        "n": len(xs),
    }


def plan_iters(pilot_s: float, budget_s: float, lo: int, hi: int) -> int:
    """How many repetitions of a pilot-timed operation fit in a time budget."""
    if pilot_s <= 0:
        return hi
    return max(lo, min(hi, int(budget_s / pilot_s)))


SETTLED_SPREAD = 0.02  # samples whose (max - min) is within 2% of their median put it within +-1%: enough
SETTLE_AFTER = 2  # samples taken before any judging: two within the spread bound the median as well as three do


def settled(sample: Callable[[], T], lo: int, hi: int, value: Callable[[T], float] = float,
            spread: float = SETTLED_SPREAD, scale: float | None = None) -> list[T]:
    """Samples of sample(): lo of them, then one more at a time, up to hi, while their values' spread (max - min)
    is over `spread` of their median (of `scale` where given: values near 0, such as fractions of a whole, are
    judged against the whole). Bandwidth samples of a DMA engine often agree to 0.5% from the start, so a probe
    stops there instead of repeating what it already knows; noisy ones still get every repetition.

    Why that is enough: one more sample, whatever its value, moves the median by at most half the samples'
    spread (two samples a <= b: their median (a + b) / 2 becomes a value between a and b; three: b becomes the
    mean of b and a value between a and c), so a stop leaves the median within +-spread/2 of where another
    repetition would put it. That holds from two samples on (SETTLE_AFTER): a third before judging only guards
    against two samples disturbed alike."""
    out = [sample() for _ in range(lo)]
    while len(out) < hi:
        xs = sorted(value(s) for s in out)
        ref = percentile(xs, 50) if scale is None else scale
        if ref > 0 and (xs[-1] - xs[0]) <= spread * ref:
            break
        out.append(sample())
    return out
