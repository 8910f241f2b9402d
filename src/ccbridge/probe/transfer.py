"""Transfer: H2D and D2H latency and sustained bandwidth over sizes and memory kinds.

Under an emulating profile the bandwidth of sizes from SUSTAINED_BYTES on is also
taken with emulation paused, alternating sample by sample in the same process
(the `bandwidth_emulation_paused` rows), as the framework loops do: calibrate's
never-faster check compares each emulated copy with its own process's native
one: one native process's pageable H2D at 16 MiB read 6.95 GB/s where others
read 12-14 on lent H100s (bench/RESULTS.md, 2026-11-23, run N).
"""

from __future__ import annotations

from ccbridge.emulate.interposer import emulating
from ccbridge.probe.framework import alternating, paired_rows
from ccbridge.probe.registry import test
from ccbridge.probe.sessions import close_all, open_all
from ccbridge.results import Row
from ccbridge.stats import plan_iters, settle_after, settled
from ccbridge.ui import human_bytes

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SUSTAINED_BYTES = 16 * MiB  # sizes from here on are bandwidth-bound: calibrate compares them with native
SIZES_FULL = [4 * KiB * 4**k for k in range(10)]  # 4 KiB .. 1 GiB
SIZES_QUICK = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB]
MEMS = ("pinned", "pageable")


@test("transfer.sweep", "H2D/D2H latency and bandwidth, pinned and pageable, 4 KiB to 1 GiB", needs=("gpu",))
def sweep(ctx):
    sizes = ctx.pick(SIZES_FULL, SIZES_QUICK)
    reps = ctx.pick(5, 3)
    rows = []
    twinned = emulating()
    # Both sessions open side by side before anything is measured (each allocates and fills its buffers: seconds
    # at 1 GiB), and each stays idle while the other's copies run.
    ctx.step(f"allocating {human_bytes(max(sizes))} {' and '.join(MEMS)}")
    sessions = open_all(ctx.device, [(mem, max(sizes), False) for mem in MEMS])
    try:
        for mem, s in zip(MEMS, sessions):
            for direction in ("h2d", "d2h"):
                for size in sizes:
                    ctx.step(f"{direction} {mem} {human_bytes(size)}")
                    rows += _case(ctx, s, direction, mem, size, reps, twinned, size == max(sizes))
    finally:
        close_all(sessions)
    return rows


def _case(ctx, s, direction: str, mem: str, size: int, reps: int, twinned: bool, headline: bool) -> list[Row]:
    """One direction, memory kind and size: its latency, bandwidth (and paused twin) and in-call rows."""
    # The pilot's second copy is the latency samples' first: timed alone, as each of theirs, and after a copy of
    # the same size, as theirs are (one 1 GiB pageable H2D copy less: 0.17 s on one H200).
    pilot, warm = s.copy(direction, size, 2, sync_every=1)
    t_one = pilot.seconds / 2
    n_lat = plan_iters(t_one, ctx.pick(0.05, 0.03), 3, 200)
    lat = warm[1:] + s.copy(direction, size, n_lat - 1, sync_every=1)[1]
    p = dict(dir=direction, mem=mem, bytes=size)
    rows = [Row.of("transfer.sweep", "latency", "us", [x / 1e3 for x in lat], **p)]
    k = plan_iters(t_one, ctx.pick(0.03, 0.015), 2, 1000)

    def timed():
        return s.copy(direction, size, k)[0]

    if twinned and size >= SUSTAINED_BYTES:  # each after one untimed copy in its state
        outs, off = alternating(timed, lambda: s.copy(direction, size, 1), reps)
    else:  # stops once the samples agree (stats.settled)
        outs, off = settled(timed, settle_after(reps), reps, lambda o: o.bytes / (o.end_ns - o.start_ns)), None
    got = paired_rows("transfer.sweep", "bandwidth", "GB/s", (outs, off), lambda o: o.bytes / (o.end_ns - o.start_ns),
                      **p)
    got[0].extra["headline"] = headline
    rows += got
    rows.append(Row.of("transfer.sweep", "in_call_fraction", "fraction",
                       [o.incall_ns / (o.end_ns - o.start_ns) for o in outs], **p))
    return rows
