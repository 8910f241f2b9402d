"""Transfer: H2D and D2H latency and sustained bandwidth over sizes and memory kinds.

Under an emulating profile the bandwidth of sizes from SUSTAINED_BYTES on is also
taken with emulation paused, alternating sample by sample in the same process
(the `bandwidth_emulation_paused` rows), as the framework loops do: calibrate's
never-faster check compares each emulated copy with its own process's native
one: one native process's pageable H2D at 16 MiB read 6.95 GB/s where others
read 12-14 on lent H100s (bench/RESULTS.md, 2026-11-23, run N).
"""

from __future__ import annotations

from ccbridge.bindings import core
from ccbridge.emulate.interposer import emulating
from ccbridge.probe.framework import alternating, paired_rows
from ccbridge.probe.registry import test
from ccbridge.results import Row
from ccbridge.stats import plan_iters, settled
from ccbridge.ui import human_bytes

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SUSTAINED_BYTES = 16 * MiB  # sizes from here on are bandwidth-bound: calibrate compares them with native
SIZES_FULL = [4 * KiB * 4**k for k in range(10)]  # 4 KiB .. 1 GiB
SIZES_QUICK = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB]


@test("transfer.sweep", "H2D/D2H latency and bandwidth, pinned and pageable, 4 KiB to 1 GiB", needs=("gpu",))
def sweep(ctx):
    sizes = ctx.pick(SIZES_FULL, SIZES_QUICK)
    reps = ctx.pick(5, 3)
    rows = []
    twinned = emulating()
    for mem in ("pinned", "pageable"):
        ctx.step(f"allocating {human_bytes(max(sizes))} {mem}")
        with core.Session(ctx.device, mem, max(sizes)) as s:
            for direction in ("h2d", "d2h"):
                for size in sizes:
                    ctx.step(f"{direction} {mem} {human_bytes(size)}")
                    pilot, _ = s.copy(direction, size, 2, sync_every=1)
                    t_one = pilot.seconds / 2
                    n_lat = plan_iters(t_one, ctx.pick(0.05, 0.03), 3, 200)
                    _, lat = s.copy(direction, size, n_lat, sync_every=1)
                    p = dict(dir=direction, mem=mem, bytes=size)
                    rows.append(Row.of("transfer.sweep", "latency", "us", [x / 1e3 for x in lat], **p))
                    k = plan_iters(t_one, ctx.pick(0.03, 0.015), 2, 1000)

                    def timed():
                        return s.copy(direction, size, k)[0]

                    if twinned and size >= SUSTAINED_BYTES:  # each after one untimed copy in its state
                        outs, off = alternating(timed, lambda: s.copy(direction, size, 1), reps)
                    else:
                        outs, off = settled(timed, min(3, reps), reps, lambda o: o.bytes / (o.end_ns - o.start_ns)), None
                    got = paired_rows("transfer.sweep", "bandwidth", "GB/s", (outs, off),
                                      lambda o: o.bytes / (o.end_ns - o.start_ns), **p)
                    got[0].extra["headline"] = size == max(sizes)
                    rows += got
                    rows.append(Row.of("transfer.sweep", "in_call_fraction", "fraction",
                                       [o.incall_ns / (o.end_ns - o.start_ns) for o in outs], **p))
    return rows
