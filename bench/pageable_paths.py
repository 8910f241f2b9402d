"""A 256 MiB pageable H2D through torch (as torch places the buffer, page-aligned, page + 64, a fresh tensor)
and through the launcher's C copy loop (ccbridge.bindings.core.Session), in one torch process: GB/s, median and
best of 7.

Why: the emulator capped a pageable crossing at this machine's native rate x the published ratio, the native
rate measured by `ccbridge run`'s launcher in its own process before the program started. On an H100 (2026-11-23,
runs K and L) that process read 8.7 GB/s while every path here read 6.6-7.4, so an emulated torch copy_ could run
at 0.99 of native where the law allows 0.78; the emulator now times each pageable crossing's own native copy
(native/emu/channel.c, pageable_floor). Run: python3 bench/pageable_paths.py (a GPU, torch).
"""

import statistics
import time

import torch

from ccbridge.bindings import core

n = 256 << 20
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
big = torch.empty(n + 8192, dtype=torch.uint8)
big.fill_(7)
base = big.data_ptr()


def rate(src, label, k=7):
    dev[: src.numel()].copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    ts = []
    for _ in range(k):
        t = time.perf_counter()
        dev[: src.numel()].copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"{label}: median {n / ts[k // 2] / 1e9:.2f} GB/s, best {n / ts[0] / 1e9:.2f}")


off = (-base) % 4096
for _ in range(2):
    rate(big[:n], f"as torch gives it (ptr % 4096 = {base % 4096})")
    rate(big[off:off + n], "page-aligned")
    rate(big[off + 64:off + 64 + n], "page + 64")
    fresh = torch.empty(n, dtype=torch.uint8)
    fresh.fill_(3)
    rate(fresh, f"fresh tensor (ptr % 4096 = {fresh.data_ptr() % 4096})")
with core.Session(0, "pageable", n) as s:
    s.copy("h2d", n, 1)
    _, per = s.copy("h2d", n, 7, sync_every=1)
    print(f"the launcher's C loop (ccbridge.bindings.core.Session), in this process: "
          f"median {n / statistics.median(per):.2f} GB/s")
