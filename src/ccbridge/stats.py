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


def ratio_range(num: tuple[float, float], den: tuple[float, float]) -> tuple[float, float]:
    """The plausible range of a ratio of two measured quantities from each one's (p10, p90): lowest over highest to
    highest over lowest; NaN where den's range reaches 0. It holds 1 where the two ranges overlap: then the two
    differ by no more than their own run-to-run noise, and no ratio of their medians says anything."""
    if den[0] <= 0 or den[1] <= 0:
        return float("nan"), float("nan")
    return num[0] / den[1], num[1] / den[0]


def apart(num: tuple[float, float], den: tuple[float, float]) -> bool:
    """Whether two quantities' (p10, p90) ranges do not overlap (ratio_range excludes 1): a real difference."""
    lo, hi = ratio_range(num, den)
    return lo > 1 or hi < 1  # False for NaN: no range, no claim


def plan_iters(pilot_s: float, budget_s: float, lo: int, hi: int) -> int:
    """How many repetitions of a pilot-timed operation fit in a time budget."""
    if pilot_s <= 0:
        return hi
    return max(lo, min(hi, int(budget_s / pilot_s)))


SETTLED_SPREAD = 0.02  # samples whose (max - min) is within 2% of their median: where a stop leaves it


def settle_after(max_reps: int) -> int:
    """Samples taken before settled() judges them, of max_reps allowed: more than half (2 of 3, 3 of 5). Once more
    than half the allowed samples agree, the median of every allowed sample must fall within their range, whatever
    the others would have been; two of five could both be outliers of the median that five would give."""
    return max_reps // 2 + 1


def settled(sample: Callable[[], T], lo: int, hi: int, value: Callable[[T], float | tuple[float, ...]] = float,
            spread: float = SETTLED_SPREAD, scale: float | None = None) -> list[T]:
    """Samples of sample(): lo of them (settle_after(hi) for a stop that holds), then one more at a time, up to hi,
    while their values' spread (max - min) is over `spread` of their median (of `scale` where given: values near 0,
    such as fractions of a whole, are judged against the whole). Where value gives several figures of one sample
    (a round that makes two rows), each figure is judged so, and the samples stop only once every one agrees.
    Bandwidth samples of a DMA engine often agree to 0.5% from the start, so a probe stops there instead of
    repeating what it already knows; noisy ones still get every repetition.

    Why that is enough: with more than half of the hi allowed samples taken (lo = settle_after(hi)), the median of
    all hi samples lies within the range of those taken, whatever the rest would be (more than half of them at or
    above its low end, more than half at or below its high end). So a stop leaves the median within `spread` of
    where every repetition would put it; within spread/2 where two of three stop it (their midpoint, and the
    third's median clamped to their range)."""
    def agree(xs: list[float]) -> bool:
        xs = sorted(xs)
        ref = percentile(xs, 50) if scale is None else scale
        return ref > 0 and (xs[-1] - xs[0]) <= spread * ref

    out = [sample() for _ in range(lo)]
    while len(out) < hi:
        figures = [value(s) for s in out]
        columns = zip(*figures) if isinstance(figures[0], tuple) else [figures]
        if all(agree(list(col)) for col in columns):
            break
        out.append(sample())
    return out
