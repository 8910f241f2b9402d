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

NBYTES, ITERS = 64 << 20, 4  # about 0.1 s per kind at PCIe speeds; the first copy is a warm-up


def measure(device: int = 0) -> dict[str, float]:
    """{native_<dir>_<mem>_gbps: GB/s}; empty when no GPU is usable (no floor then)."""
    out = {}
    try:
        for mem in ("pinned", "pageable"):
            with native.Session(device, mem, NBYTES) as s:
                for d in ("h2d", "d2h"):
                    s.copy(d, NBYTES, 1)
                    res, _ = s.copy(d, NBYTES, ITERS)
                    out[f"native_{d}_{mem}_gbps"] = round(res.bytes / res.seconds / 1e9, 3)
    except GpuError:
        return {}
    return out
