"""Small helpers for the families that measure through torch."""

from __future__ import annotations


from ccbridge import gputimer


def gpu_time_ms(torch, fn, reps: int, inner: int = 1) -> list[float]:
    """Per-call device time (ms) of fn, `inner` calls per sample, by the run's GPU timer (gputimer: CUDA events,
    or %globaltimer stamps where CC makes events unreliable)."""
    return gputimer.time_ms(torch, fn, reps, inner)
