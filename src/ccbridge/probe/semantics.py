"""Semantics: does a non_blocking copy return before queued GPU work drains?"""

from __future__ import annotations

from ccbridge.bindings import core
from ccbridge.probe.registry import test
from ccbridge.results import Row

RELATIONS = {"same": core.SAME_STREAM, "idle": core.IDLE_STREAM, "event-wait": core.EVENT_WAIT}
COPY_BYTES = 4 << 20
ASYNC_BELOW, BLOCKS_ABOVE = 0.2, 0.8


def verdict(fraction: float) -> str:
    """Classify how much of the queued work an async copy call waited for."""
    if fraction < ASYNC_BELOW:
        return "async"
    if fraction > BLOCKS_ABOVE:
        return "blocks"
    return "partial"


def cases():
    for direction in ("h2d", "d2h"):
        for mem in ("pinned", "pageable"):
            for rel in RELATIONS:
                yield direction, mem, rel
    yield "d2d", "device", "same"  # control: device-local work never blocks the host


@test("semantics.nonblocking", "async copy call vs a busy stream: async, blocks or partial", needs=("gpu",))
def nonblocking(ctx):
    spin_ns = ctx.pick(50e6, 20e6)
    reps = 3
    sessions = {m: core.Session(ctx.device, m, COPY_BYTES, nstreams=2) for m in ("pinned", "pageable")}
    sessions["device"] = sessions["pinned"]
    rows = []
    try:
        for direction, mem, rel in cases():
            ctx.step(f"{direction} {mem} {rel}-stream")
            outs = [sessions[mem].semantics(direction, RELATIONS[rel], COPY_BYTES, spin_ns) for _ in range(reps)]
            fracs = [o.call_ns / o.remaining_ns if o.remaining_ns > 0 else float("inf") for o in outs]
            if any(f == float("inf") for f in fracs):
                raise RuntimeError("the busy kernel finished before the copy was issued; host too slow to test")
            row = Row.of("semantics.nonblocking", "return_fraction", "fraction", fracs,
                         dir=direction, mem=mem, stream=rel)
            row.extra.update(verdict=verdict(row.median), busy_ms=spin_ns / 1e6,
                             call_us=sorted(o.call_ns / 1e3 for o in outs)[len(outs) // 2])
            rows.append(row)
    finally:
        sessions["pinned"].close()
        sessions["pageable"].close()
    return rows
