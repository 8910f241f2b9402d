"""Device time of GPU work through torch's CUDA events, for the probe families and the benches that time
through torch (torch is passed in: importing this module loads nothing)."""

from __future__ import annotations


def event_time_ms(torch, fn, reps: int, inner: int = 1) -> list[float]:
    """Per-call device time (ms) of fn, timed with CUDA events, `inner` calls per sample."""
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / inner)
    return samples
