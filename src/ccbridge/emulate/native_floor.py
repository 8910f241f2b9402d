"""This machine's native pinned bandwidths, for the emulator's floor, and its GPU-GPU rate.

A profile holds published CC-on figures; an emulated channel must also never
beat this machine's own native path times the published CC-on/CC-off ratio.
The launcher measures the two pinned bandwidths once per `ccbridge run`, with
the probe's copy loop, before the program starts, and hands them to the
interposer as native_*_pinned_gbps: the pinned DMA is steady. A pageable
crossing goes through the driver's own pageable path and is capped by that
copy's time, crossing by crossing (native/emu/channel.c, pageable_floor): a
host's pageable rate drifts 15-30% between minutes (bench/RESULTS.md, runs K
and L), so a snapshot taken here let copies beat native x ratio.

With two or more GPUs it also times a GPU 0 -> GPU 1 copy over peer access (NVLink where there is one): a
collective's bandwidth-kept term is its wire bytes at that rate x (1/kept - 1) (native/emu/collective.c).
Without a second GPU, or without peer access, there is no rate and no such term (the per-operation toll stays).
And it times the GPU time one more empty kernel adds to a busy stream: the collectives' device-side wait is such
a kernel, and is shortened by it, so that a stream is held for the charge and not the charge plus the wait's own
dispatch (about 1.5 us on an H100, 12% of a 12.5 us toll).

`host_facts` times one call's pageable H2D for the programs that plan by it (the loader's policy: the emulator ends a
pageable crossing no sooner than that copy over the published ratio, so one context moves at most that much). It is a
snapshot for planning, written as a `#host` line the interposer skips; the floor itself stays crossing by crossing.
"""

from __future__ import annotations

from ccbridge import gputimer
from ccbridge.bindings import core
from ccbridge.errors import GpuError

# The slower of two sizes, so the floor holds at both. About 0.1 s in all at PCIe speeds.
SIZES, ITERS = (64 << 20, 256 << 20), 3
PEER_BYTES, PEER_ITERS = 256 << 20, 5  # a few ms over NVLink
GAP_REPS = 21  # 200 us each
PAGEABLE_BYTES = 64 << 20  # the loader's chunk from the page-cache mapping under CC; about 40 ms for the four copies


def measure(device: int = 0, collectives: bool = True, links: bool = True,
            host: dict[str, float] | None = None) -> dict[str, float]:
    """{native_<dir>_pinned_gbps: GB/s, native_kernel_ns, native_nvlink_gbps}; empty when no GPU is usable (no
    floor then). collectives / links: the profile charges NCCL operations at all / a bandwidth-kept term (else
    the kernel gap / the GPU-GPU rate, unused, are not timed: no second GPU touched for nothing). host: a dict
    that takes host_facts, timed while this measurement holds the primary context (apart, the launcher's
    process would make that context a second time: 0.1-0.3 s)."""
    out: dict[str, float] = {}
    try:
        with core.Session(device, "pinned", max(SIZES)) as s:
            for d in ("h2d", "d2h"):
                for n in SIZES:
                    s.copy(d, n, 1)  # warm-up
                    res, _ = s.copy(d, n, ITERS)
                    gbps = round(res.bytes / res.seconds / 1e9, 3)
                    key = f"native_{d}_pinned_gbps"
                    out[key] = min(out.get(key, gbps), gbps)
            if collectives:
                out["native_kernel_ns"] = round(s.kernel_gap(GAP_REPS, gputimer.choose()), 1)
            if host is not None:
                host.update(host_facts(device))
    except GpuError:
        return {}
    try:
        if collectives and links and core.device_count() >= 2:
            out["native_nvlink_gbps"] = round(core.peer_rate(0, 1, PEER_BYTES, PEER_ITERS) / 1e9, 3)
    except GpuError:
        pass  # no peer access: the collectives pay their toll without a bandwidth term
    return out


def host_facts(device: int = 0) -> dict[str, float]:
    """{native_h2d_pageable_gbps: one call's pageable H2D, GB/s}; empty when no GPU is usable."""
    try:
        with core.Session(device, "pageable", PAGEABLE_BYTES) as s:
            s.copy("h2d", PAGEABLE_BYTES, 1)  # warm-up: the pages faulted in, the driver's staging made
            res, _ = s.copy("h2d", PAGEABLE_BYTES, ITERS)
    except GpuError:
        return {}
    return {"native_h2d_pageable_gbps": round(res.bytes / res.seconds / 1e9, 3)}
