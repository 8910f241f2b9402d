"""This machine's native crossing bandwidths, for the emulator's floor.

A profile holds published CC-on figures; an emulated channel must also never
beat this machine's own native path times the published CC-on/CC-off ratio
(a host whose pageable path is slow would otherwise show no CC tax). The
launcher measures the four native bandwidths once per `ccbridge run`, with the
probe's copy loop, before the program starts, and hands them to the
interposer as native_*_gbps.
"""

from __future__ import annotations

from ccbridge import native
from ccbridge.errors import GpuError

# The slowest of two sizes: a pageable copy's native rate falls with size once the host's
# caches no longer hold it (H100 host: 14.4 GB/s at 16 MiB, 11.3 at 64, 9.0 at 256 through torch),
# and the floor must hold at every size. About 1 s in all at PCIe speeds.
SIZES, ITERS = (64 << 20, 256 << 20), 3


def measure(device: int = 0) -> dict[str, float]:
    """{native_<dir>_<mem>_gbps: GB/s}; empty when no GPU is usable (no floor then)."""
    out: dict[str, float] = {}
    try:
        for mem in ("pinned", "pageable"):
            with native.Session(device, mem, max(SIZES)) as s:
                for d in ("h2d", "d2h"):
                    for n in SIZES:
                        s.copy(d, n, 1)  # warm-up
                        res, _ = s.copy(d, n, ITERS)
                        gbps = round(res.bytes / res.seconds / 1e9, 3)
                        key = f"native_{d}_{mem}_gbps"
                        out[key] = min(out.get(key, gbps), gbps)
    except GpuError:
        return {}
    return out
