"""Advice from an env stamp (whether CC-aware settings apply at all) and from a probe result (per measured
bridge property: readbacks, input copies, pinning, the launch toll, context pools, small readbacks)."""

from __future__ import annotations

from pathlib import Path

from ccbridge import env as envmod
from ccbridge.advise.core import Add, Advice, Input, adder, one, state
from ccbridge.advise.multicast import no_multicast
from ccbridge.errors import ResultFileError
from ccbridge.probe.transfer import human_bytes
from ccbridge.results import Result

PROBE_TESTS = ("semantics.", "transfer.", "launch.", "framework.", "concurrency.", "smallcopy.", "toll.")
HOLDS = 0.2  # return fraction above which a non_blocking copy held the host (semantics.ASYNC_BELOW)
PINNED_WINS = 1.5  # pinned/pageable bandwidth ratio above which pinning pays
LAUNCH_TOLL_US = 10.0  # pipelined per-kernel launch cost above which graphs are a must
SCALES = 1.3  # aggregate bandwidth gain over one context that a pool must buy


def check(inp: Input) -> None:
    """A probe result advise can read: one of the GPU families it reads ran (a stamp needs nothing more)."""
    res = inp.result
    if res is not None and not any(r.test.startswith(PROBE_TESTS) for r in res.rows):
        what = "of a machine with no usable GPU" if res.no_gpu else "with none of the GPU families advise reads"
        raise ResultFileError(f"{Path(inp.path)}: a probe {what}: nothing to advise from")


def advise(inp: Input) -> list[Advice]:
    return from_env(inp) if inp.kind == "env" else from_probe(inp)


def from_env(inp: Input) -> list[Advice]:
    """What the stamp alone says: whether CC-aware settings apply; no number, so measure."""
    out, add = adder(inp)
    cc = state(inp)
    if not inp.cc_applies:
        add("all", "engine defaults (async scheduling, pinned host buffers, CUDA graphs as shipped)",
            f"{cc}, nothing emulated: CC-aware settings do not apply" if envmod.cc_mode(inp.env) == "off" else
            f"{cc} (no NVML reading), nothing emulated: CC-aware settings only if this machine runs CC on")
        return out
    no_multicast(inp, add, "engines that want a multicast workspace must do without")
    then = f"{cc}, no measurement in this stamp: confirm with `ccbridge probe`"
    add("vLLM", "--async-scheduling only with readbacks on a ccbridge.serve.DrainWorker; otherwise scheduling sync",
        then)
    add("SGLang/TRT-LLM", "drain sampled-token readbacks on a worker (ccbridge.serve.DrainWorker)", then)
    add("all", "keep CUDA graphs on (vLLM: no --enforce-eager; SGLang: no --disable-cuda-graph)", then)
    add("torch", "per-step inputs through ccbridge.serve.StagedH2D (packed, idle stream)", then)
    return out


def from_probe(inp: Input) -> list[Advice]:
    res = inp.result
    out, add = adder(inp)
    if not inp.cc_applies:
        add("all", "no CC-specific change; the lines below follow the measurements only",
            f"{state(inp)}, nothing emulated")
    for family in (_copies_on_a_busy_stream, _pinning, _launch_toll, _contexts):
        family(res, add)
    _small_readbacks(inp, add)
    return out


def _copies_on_a_busy_stream(res: Result, add: Add) -> None:
    """semantics.nonblocking: a readback or an input copy that held the host calls for a drain or staging."""
    sem = res.by_test("semantics.nonblocking")
    d2h = one(sem, dir="d2h", mem="pinned", stream="same")
    if d2h:
        if d2h.median > HOLDS:
            why = f"a pinned D2H on a busy stream held the host for {d2h.median:.0%} of the queued work"
            add("vLLM", "--async-scheduling off (scheduling sync), or on only with readbacks drained on a "
                "ccbridge.serve.DrainWorker", why, d2h)
            add("SGLang", "--disable-overlap-schedule, unless sampled tokens are read back on a DrainWorker", why, d2h)
            add("TRT-LLM", "disable_overlap_scheduler=True, unless readbacks go to a DrainWorker", why, d2h)
            add("torch", "read back on ccbridge.serve.DrainWorker, off the thread that launches", why, d2h)
        else:
            add("vLLM/SGLang/TRT-LLM", "async / overlap scheduling on (engine default)",
                f"a pinned D2H on a busy stream returned at once ({d2h.median:.0%} of the queued work)", d2h)
    h2d, idle = one(sem, dir="h2d", mem="pinned", stream="same"), one(sem, dir="h2d", mem="pinned", stream="idle")
    if h2d and h2d.median > HOLDS:
        cites = [h2d] + ([idle] if idle else [])
        add("torch", "per-step inputs through ccbridge.serve.StagedH2D (idle prep stream, one packed crossing)",
            f"a pinned H2D on a busy stream held the host for {h2d.median:.0%} of the queued work"
            + (f", on an idle stream {idle.median:.0%}" if idle else ""), *cites)


def _pinning(res: Result, add: Add) -> None:
    """transfer.sweep: pinned against pageable H2D at the largest size both measured."""
    bw = [r for r in res.by_test("transfer.sweep") if r.metric == "bandwidth" and r.params.get("dir") == "h2d"]
    both = {r.params["bytes"] for r in bw if r.params["mem"] == "pinned"} & \
        {r.params["bytes"] for r in bw if r.params["mem"] == "pageable"}
    if not both:
        return
    top = max(both)
    pin, page = one(bw, mem="pinned", bytes=top), one(bw, mem="pageable", bytes=top)
    ratio = pin.median / page.median if page.median else float("inf")
    why = f"pinned/pageable H2D = {ratio:.2f}x at {human_bytes(top)}"
    if ratio >= PINNED_WINS:
        add("torch", "pin host buffers (DataLoader pin_memory=True, persistent pinned staging)", why, pin, page)
        add("vLLM", "KV offload / swap space in pinned host memory (the default)", why, pin, page)
        add("loader", "ccbridge load --staging pinned", why, pin, page)
    else:
        add("torch", "pageable host buffers: pin_memory buys little here (skip fresh pin_memory() per batch)",
            why, pin, page)
        add("vLLM", "KV offload: pinned host memory gains little; size the CPU tier by host RAM, not pin limits",
            why, pin, page)
        add("loader", "ccbridge load --staging pageable", why, pin, page)


def _launch_toll(res: Result, add: Add) -> None:
    """launch.cost (or framework.launch): CUDA graphs where a pipelined launch pays LAUNCH_TOLL_US or more."""
    launch = {r.params.get("mode"): r for r in res.by_test("launch.cost")}
    fw = {r.params.get("mode"): r for r in res.by_test("framework.launch") if r.metric == "time_per_op"}
    pipe = launch.get("pipelined") or fw.get("pipelined")
    if not pipe:
        return
    graph = launch.get("graph")
    cites = [pipe] + ([graph] if graph else [])
    why = f"launch toll {pipe.median:.1f} us per kernel" + (f", {graph.median:.2f} us in a graph" if graph else "")
    if pipe.median >= LAUNCH_TOLL_US:
        add("vLLM", "CUDA graphs on: no --enforce-eager; raise --max-num-seqs capture sizes to cover decode batches",
            why, *cites)
        add("SGLang", "CUDA graphs on (no --disable-cuda-graph); --cuda-graph-max-bs to your decode batch", why, *cites)
        add("TRT-LLM", "cuda_graph_config enabled with batch sizes covering decode", why, *cites)
        add("torch", "torch.compile(mode=\"reduce-overhead\") or torch.cuda.CUDAGraph for the step", why, *cites)
    else:
        add("all", "CUDA graphs as the engine ships them (the launch toll is small here)", why, *cites)


def _contexts(res: Result, add: Add) -> None:
    """concurrency.scaling: a pool of contexts where H2D from several scales by SCALES or more."""
    conc = res.by_test("concurrency.scaling")
    ctx = sorted((r for r in conc if r.params.get("mode") == "contexts" and r.params.get("dir") == "h2d"),
                 key=lambda r: r.params["n"])
    if not ctx or ctx[0].params["n"] != 1:
        return
    first, best = ctx[0], max(ctx[1:] or ctx, key=lambda r: r.median)
    gain = best.median / first.median if first.median else 0.0
    why = f"H2D with {best.params['n']} contexts {gain:.2f}x one context (the best N measured)"
    if gain >= SCALES:
        n = best.params["n"]
        add("loader", f"pool of {n} contexts: ccbridge load --contexts {n} --workers {n}", why, first, best)
        add("torch", f"DataLoader/loader H2D from {n} processes or contexts, not one", why, first, best)
    else:
        add("loader", "one context (ccbridge load --contexts 0): more contexts add nothing", why, first, best)


def _small_readbacks(inp: Input, add: Add) -> None:
    """smallcopy.d2h32: under CC, small readbacks that serialize across streams are packed into one."""
    small = sorted(inp.result.by_test("smallcopy.d2h32"), key=lambda r: r.params.get("streams", 0))
    if len(small) >= 2 and inp.cc_applies:
        first, many = small[0], small[-1]
        if many.median and first.median / many.median < 1.25:
            add("torch", "one D2H per step for all sampled tokens (small readbacks serialize across streams)",
                f"32-byte D2H {many.median:.1f} us per copy at {many.params['streams']} streams vs "
                f"{first.median:.1f} us at 1", first, many)
