"""Transfer: H2D and D2H latency and sustained bandwidth over sizes and memory kinds."""

from __future__ import annotations

from ccbridge import native
from ccbridge.probe.registry import test
from ccbridge.results import Row
from ccbridge.stats import plan_iters

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SIZES_FULL = [4 * KiB * 4**k for k in range(10)]  # 4 KiB .. 1 GiB
SIZES_QUICK = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB]


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


@test("transfer.sweep", "H2D/D2H latency and bandwidth, pinned and pageable, 4 KiB to 1 GiB", needs=("gpu",))
def sweep(ctx):
    sizes = ctx.pick(SIZES_FULL, SIZES_QUICK)
    reps = ctx.pick(5, 3)
    rows = []
    for mem in ("pinned", "pageable"):
        ctx.step(f"allocating {human_bytes(max(sizes))} {mem}")
        with native.Session(ctx.device, mem, max(sizes)) as s:
            for direction in ("h2d", "d2h"):
                for size in sizes:
                    ctx.step(f"{direction} {mem} {human_bytes(size)}")
                    pilot, _ = s.copy(direction, size, 2, sync_every=1)
                    t_one = pilot.seconds / 2
                    n_lat = plan_iters(t_one, ctx.pick(0.08, 0.03), 5, 200)
                    _, lat = s.copy(direction, size, n_lat, sync_every=1)
                    p = dict(dir=direction, mem=mem, bytes=size)
                    rows.append(Row.of("transfer.sweep", "latency", "us", [x / 1e3 for x in lat], **p))
                    k = plan_iters(t_one, ctx.pick(0.03, 0.015), 2, 1000)
                    bw, frac = [], []
                    for _ in range(reps):
                        out, _ = s.copy(direction, size, k)
                        bw.append(out.bytes / (out.end_ns - out.start_ns))
                        frac.append(out.incall_ns / (out.end_ns - out.start_ns))
                    row = Row.of("transfer.sweep", "bandwidth", "GB/s", bw, **p)
                    row.extra["headline"] = size == max(sizes)
                    rows.append(row)
                    rows.append(Row.of("transfer.sweep", "in_call_fraction", "fraction", frac, **p))
    return rows
