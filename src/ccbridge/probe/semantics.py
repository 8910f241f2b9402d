"""Semantics: does a non_blocking copy return before queued GPU work drains?"""

from __future__ import annotations

from ccbridge import gputimer
from ccbridge.bindings import core
from ccbridge.probe.registry import test
from ccbridge.results import Row
from ccbridge.stats import percentile, settle_after, settled

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


def _fraction(out) -> float:
    """How much of the queued work the copy call waited for (inf: the work was over before the call)."""
    return out.call_ns / out.remaining_ns if out.remaining_ns > 0 else float("inf")


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
            # The third repetition only where the first two disagree by more than 2% of the queued work
            # (stats.settled against the whole: a third could move the median by at most 1% of it).
            outs = settled(lambda: sessions[mem].semantics(direction, RELATIONS[rel], COPY_BYTES, spin_ns),
                           settle_after(reps), reps, value=_fraction, scale=1.0)
            fracs = [_fraction(o) for o in outs]
            if any(f == float("inf") for f in fracs):
                raise RuntimeError("the busy kernel finished before the copy was issued; host too slow to test")
            row = Row.of("semantics.nonblocking", "return_fraction", "fraction", fracs,
                         dir=direction, mem=mem, stream=rel)
            row.extra.update(verdict=verdict(row.median), busy_ms=spin_ns / 1e6,
                             call_us=percentile(sorted(o.call_ns / 1e3 for o in outs), 50))
            rows.append(row)
    finally:
        sessions["pinned"].close()
        sessions["pageable"].close()
    return rows


@test("semantics.cc_answers", "what the driver answers about pinned memory, and events against %globaltimer",
      needs=("gpu", "torch"))
def cc_answers(ctx):
    """The evidence for what CC machines are reported to do (NVIDIA/TensorRT PR #4740, vLLM PRs #50671/#57404):
    pinned memory's type as a program reads it (driver and torch.is_pinned), whether a device view of pinned
    memory sees a later host write, and how far CUDA events and %globaltimer stamps disagree on one interval."""
    import torch  # deferred: torch, needed only on a GPU

    ctx.step("pinned memory: its type and a device view")
    with core.Session(ctx.device, "pinned", 1 << 20) as s:
        mtype, managed, live = s.pinned_answers()
    torch.cuda.set_device(ctx.device)
    pinned = torch.empty(1 << 12, dtype=torch.uint8, pin_memory=True).is_pinned()
    rows = [Row.of("semantics.cc_answers", "pinned_memory_type", "code", [mtype]),
            Row.of("semantics.cc_answers", "pinned_is_managed", "bool", [int(managed)]),
            Row.of("semantics.cc_answers", "torch_is_pinned", "bool", [int(pinned)]),
            Row.of("semantics.cc_answers", "pinned_view_live", "bool", [int(live)])]
    rows[0].extra["what"] = "cuPointerGetAttribute(MEMORY_TYPE) of cuMemHostAlloc memory: 1 host, 2 device (managed)"
    ctx.step("one interval timed by CUDA events and by %globaltimer stamps")
    reps, cycles = ctx.pick(20, 8), 2_000_000  # ~1 ms of spinning on a ~2 GHz GPU
    stream = torch.cuda.current_stream()
    own = gputimer.stamp_cost_ns(torch, torch.cuda.current_device())
    ev, gt = [], []
    buf = torch.zeros(2, dtype=torch.int64, device="cuda")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        core.stamp(stream.cuda_stream, buf.data_ptr())
        torch.cuda._sleep(cycles)
        core.stamp(stream.cuda_stream, buf.data_ptr() + 8)
        b.record(stream)
        b.synchronize()
        t = buf.cpu().tolist()
        ev.append(a.elapsed_time(b) * 1e6 - own)  # the events hold both stamps, the stamps' interval one less
        gt.append(float(t[1] - t[0]))
    diff = [abs(e - g) / e * 100 for e, g in zip(ev, gt) if e > 0]
    rows += [Row.of("semantics.cc_answers", "timers_disagree", "%", diff),
             Row.of("semantics.cc_answers", "stamp_cost", "ns", [own])]
    rows[-2].extra["what"] = ("|events - globaltimer| / events on one ~1 ms interval (the events bracket the two "
                              "stamps, so one stamp's own cost is taken off the events' side); under CC events are "
                              "reported unreliable")
    return rows
