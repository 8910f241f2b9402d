"""Small-copy serialization: 32-byte D2H per-copy time with 1..16 streams in one context."""

from __future__ import annotations

from ccbridge.bindings import core
from ccbridge.probe.registry import test
from ccbridge.results import Row

STREAMS = (1, 2, 4, 8, 16)
BYTES = 32


@test("smallcopy.d2h32", "32-byte D2H per-copy time, 1 to 16 streams in one context", needs=("gpu",))
def d2h32(ctx):
    rounds = ctx.pick(400, 150)
    rows = []
    with core.Session(ctx.device, "pinned", BYTES, nstreams=max(STREAMS)) as s:
        for k in STREAMS:
            ctx.step(f"{k} streams")
            s.copy("d2h", BYTES, k * 20, nstreams=k, sync_every=k)  # warm
            _, per_round = s.copy("d2h", BYTES, k * rounds, nstreams=k, sync_every=k)
            # One round issues one copy on each of k streams and waits for all.
            row = Row.of("smallcopy.d2h32", "per_copy_time", "us", [x / 1e3 / k for x in per_round], streams=k)
            row.extra["headline"] = k in (1, max(STREAMS))
            rows.append(row)
    return rows
