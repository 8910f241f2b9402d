"""Framework: the bridge as a PyTorch program meets it: eager launches, synchronizes, readbacks, copies.

The published launch figures were measured through the framework (Tinfoil: an
`x.add_(1)` loop, pipelined and with a synchronize after each launch), and the
published 32-byte D2H with a loop of small copies, so `ccbridge calibrate`
checks the emulator against these rows as well as against the C probe's
driver-level ones. Row names (test, metric, params) are fixed: calibrate reads
them by name.

Under an emulating profile every loop here also runs with emulation paused,
alternating sample by sample in the same process (the `*_emulation_paused`
rows): the bridge's cost on the launch and 32-byte D2H loops is a few us, and
two processes of one loop differ by more than that on a shared host (an
H100's native d2h32 loop read 27.1 and 43.0 us in two processes); a 256 MiB
pageable copy_ read 6.6 and 7.7 GB/s in two native processes.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from ccbridge.emulate.interposer import emulating, emulation_paused
from ccbridge.probe.registry import test
from ccbridge.results import Row
from ccbridge.stats import plan_iters, settle_after, settled

MiB = 1 << 20
LAUNCH = "framework.launch"
# mode -> what follows each x.add_(1); "pipelined" only synchronizes once, after the loop
LAUNCH_MODES = ("pipelined", "launch+synchronize", "launch+stream_synchronize", "launch+item")
D2H32 = "framework.d2h32"
# (streams, sync): "none" is a serving loop's readback (no synchronize between
# copies); "each" synchronizes after every copy, as the published harness did
D2H32_CASES = ((1, "none"), (16, "none"), (1, "each"))
T = TypeVar("T")
PAUSED = "_emulation_paused"  # metric suffix of a loop's twin row: the same process, emulation paused
PAIR_WARM = 5  # untimed iterations before each paired sample, in its state
COPY = "framework.copy"
COPY_BYTES = (16 * MiB, 256 * MiB)


def per_iteration_us(body: Callable[[], object], finish: Callable[[], object], n: int, reps: int) -> list[float]:
    """Wall time per iteration (us) of n calls of body and one finish (the closing synchronize), reps samples."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            body()
        finish()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return samples


def alternating(sample: Callable[[], T], warm: Callable[[], object], reps: int) -> tuple[list[T], list[T]]:
    """reps samples with emulation on and reps with it paused, which of the two goes first alternating, each
    after warm() in its state: (on, paused)."""
    on, off = [], []
    for i in range(reps):
        for paused in ((False, True) if i % 2 == 0 else (True, False)):
            with emulation_paused() if paused else contextlib.nullcontext():
                warm()
                (off if paused else on).append(sample())
    return on, off


def paired_us(body: Callable[[], object], finish: Callable[[], object], n: int, reps: int,
              warm: int = PAIR_WARM, settle: bool = False) -> tuple[list[float], list[float] | None]:
    """per_iteration_us; under an emulating interposer also the same loop with emulation paused, sample by
    sample (alternating, each after `warm` untimed iterations in its state): (samples, paused samples or None
    where nothing emulates). settle: natively, reps at most, stopping once the samples agree (stats.settled);
    for bandwidth, not for latencies whose medians must ride out a preempted sample."""
    if not emulating():
        if settle:
            return settled(lambda: per_iteration_us(body, finish, n, 1)[0], settle_after(reps), reps), None
        return per_iteration_us(body, finish, n, reps), None
    return alternating(lambda: per_iteration_us(body, finish, n, 1)[0],
                       lambda: per_iteration_us(body, finish, warm, 1), reps)


def paired_rows(test_id: str, metric: str, unit: str, samples: tuple[list, list | None],
                per: Callable[[object], float] = lambda us: us, **params) -> list[Row]:
    """The row of paired samples (paired_us's, alternating's), each through `per` (a sample -> the row's
    unit; paired_us's are us per iteration), and its twin with emulation paused where there is one."""
    on, off = samples
    row = Row.of(test_id, metric, unit, [per(x) for x in on], **params)
    if off is None:
        return [row]
    twin = Row.of(test_id, metric + PAUSED, unit, [per(x) for x in off], **params)
    twin.extra["note"] = "the same loop in the same process with emulation paused, alternating with the row's samples"
    return [row, twin]


def launch_bodies(torch, x, stream) -> dict[str, Callable[[], object]]:
    """One iteration of each launch mode on the small tensor x."""
    def add():
        x.add_(1)

    def add_sync():
        x.add_(1)
        torch.cuda.synchronize()

    def add_stream_sync():
        x.add_(1)
        stream.synchronize()

    def add_item():
        x.add_(1)
        return x.item()

    return dict(zip(LAUNCH_MODES, (add, add_sync, add_stream_sync, add_item)))


def _device(torch, ctx):
    dev = torch.device("cuda", ctx.device)
    torch.cuda.set_device(dev)
    return dev


@test(LAUNCH, "eager op launch through torch: pipelined, + torch.cuda.synchronize(), + stream.synchronize(), + .item()",
      needs=("gpu", "torch"))
def launches(ctx):
    import torch  # deferred: torch, which the registry must not need to list the tests

    dev = _device(torch, ctx)
    x = torch.zeros(1, device=dev)  # Tinfoil's small tensor: the launch, not the kernel, is timed
    reps = ctx.pick(9, 7)  # quick still under a second emulated; medians of 7 ride out a preempted sample
    counts = {"pipelined": ctx.pick(2000, 1000)}
    rows, done = [], 0
    for mode, body in launch_bodies(torch, x, torch.cuda.current_stream(dev)).items():
        ctx.step(mode)
        n = counts.get(mode, ctx.pick(500, 300))
        per_iteration_us(body, torch.cuda.synchronize, 20, 1)  # warm: kernel load, caches
        samples = paired_us(body, torch.cuda.synchronize, n, reps)
        done += 20 + (n * reps if samples[1] is None else 2 * reps * (n + PAIR_WARM))  # paired: both states, each warmed
        got = paired_rows(LAUNCH, "time_per_op", "us", samples, mode=mode)
        got[0].extra["headline"] = mode in ("pipelined", "launch+synchronize")
        rows += got
    if x.item() != done:  # every launch ran, in order (float32 counts exactly far beyond this)
        raise RuntimeError(f"x.add_(1) ran {x.item():.0f} times, expected {done}")
    return rows


@test(D2H32, "32-byte non_blocking D2H through torch: no synchronize between copies (1 and 16 streams), "
             "and a synchronize after each (1 stream)", needs=("gpu", "torch"))
def small_d2h(ctx):
    import torch  # deferred: torch, which the registry must not need to list the tests

    dev = _device(torch, ctx)
    src = torch.arange(8, dtype=torch.float32, device=dev)  # 32 bytes
    torch.cuda.synchronize()
    reps, n = ctx.pick(9, 7), ctx.pick(1000, 300)
    rows = []
    for k, sync in D2H32_CASES:
        ctx.step(f"{k} streams, sync {sync}")
        streams = itertools.cycle([torch.cuda.Stream(device=dev) for _ in range(k)])
        last = []

        def readback():
            with torch.cuda.stream(next(streams)):
                last[:] = [src.to("cpu", non_blocking=True)]  # a pinned output: the copy is asynchronous natively
            if sync == "each":
                torch.cuda.synchronize()

        per_iteration_us(readback, torch.cuda.synchronize, 20, 1)  # warm: the pinned host allocator's cache
        samples = paired_us(readback, torch.cuda.synchronize, n, reps)
        if not torch.equal(last[0], src.cpu()):
            raise RuntimeError("a 32-byte D2H copy is not byte-exact")
        got = paired_rows(D2H32, "per_copy_time", "us", samples, streams=k, sync=sync)
        got[0].extra["headline"] = (k, sync) == (1, "none")
        rows += got
    return rows


@test(COPY, "H2D/D2H through torch copy_, pinned and pageable, 16 MiB and 256 MiB: GB/s", needs=("gpu", "torch"))
def copies(ctx):
    import torch  # deferred: torch, which the registry must not need to list the tests

    dev = _device(torch, ctx)
    reps, size = ctx.pick(5, 3), max(COPY_BYTES)
    rows = []
    device_buf = torch.empty(size, dtype=torch.uint8, device=dev)
    block = torch.randint(0, 256, (MiB,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def host_pair(mem: str):
        """The mem kind's source, every MiB different so that a misplaced chunk is caught (uint8 wraps), and the
        buffer its readbacks land in."""
        torch.cuda.set_device(dev)  # this thread's device: where pinned memory is registered
        host = torch.empty(size, dtype=torch.uint8, pin_memory=mem == "pinned")
        host.view(-1, MiB).copy_(block + torch.arange(size // MiB, dtype=torch.uint8)[:, None])
        return host, torch.empty(size, dtype=torch.uint8, pin_memory=mem == "pinned")

    # Both kinds' buffers are made side by side before the first copy (torch lets the interpreter's lock go
    # while it allocates and fills), each idle while the other's copies run.
    ctx.step(f"allocating {size // MiB} MiB pinned and pageable")
    with ThreadPoolExecutor(2, thread_name_prefix="ccbridge-alloc") as pool:
        pairs = {mem: pool.submit(host_pair, mem) for mem in ("pinned", "pageable")}
    for mem in ("pinned", "pageable"):
        ctx.step(f"{mem}: H2D -> D2H round trip")
        host, back = pairs.pop(mem).result()  # popped: freed after its copies
        device_buf.copy_(host, non_blocking=True)
        back.copy_(device_buf, non_blocking=True)
        torch.cuda.synchronize()
        if not torch.equal(back, host):
            raise RuntimeError(f"{mem} H2D -> D2H round trip through torch is not byte-exact")
        for direction in ("h2d", "d2h"):
            for nbytes in COPY_BYTES:
                ctx.step(f"{direction} {mem} {nbytes // MiB} MiB")
                dst, src = (device_buf[:nbytes], host[:nbytes]) if direction == "h2d" else (back[:nbytes], device_buf[:nbytes])

                def one():
                    dst.copy_(src, non_blocking=True)

                pilot = per_iteration_us(one, torch.cuda.synchronize, 1, 1)[0] * 1e-6
                k = plan_iters(pilot, ctx.pick(0.1, 0.03), 2, 200)
                samples = paired_us(one, torch.cuda.synchronize, k, reps, warm=1, settle=True)
                got = paired_rows(COPY, "bandwidth", "GB/s", samples,
                                  lambda us: nbytes / (us * 1e-6) / 1e9, dir=direction, mem=mem, bytes=nbytes)
                got[0].extra["headline"] = nbytes == size
                rows += got
        del host, back
    return rows
