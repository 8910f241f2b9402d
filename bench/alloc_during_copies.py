"""Do copies into a context keep moving while torch allocates fresh device memory?

    python3 bench/alloc_during_copies.py [--gib 16] [--pieces 64]

A thread copies 64 MiB H2D chunks from pinned memory in a loop (ccbridge's native copy loop: it holds no
GIL); meanwhile the main thread allocates GIB of fresh device memory with torch (the caching allocator
emptied first, as a load's destinations are). Printed per context the copies run on (the primary one,
where torch allocates, and one of their own): the allocation's time alone and during the copies, and the
copies' GB/s inside the allocation's window against outside it. The loader starts its load while it
allocates (bench/RESULTS.md 2026-11-27 session 19); this tells whether that can overlap.
"""

import argparse
import threading
import time

import torch

from ccbridge.bindings import core

MiB = 1 << 20


def allocate(gib: int, pieces: int) -> float:
    torch.cuda.empty_cache()
    t = time.perf_counter()
    keep = [torch.empty((gib << 30) // pieces, dtype=torch.uint8, device="cuda:0") for _ in range(pieces)]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    del keep
    torch.cuda.empty_cache()
    return dt


def one(own_context: bool, gib: int, pieces: int) -> None:
    alone = allocate(gib, pieces)
    with core.Session(0, "pinned", 64 * MiB, own_context=own_context) as s:
        s.copy("h2d", 64 * MiB, 20)  # warm
        got = {}

        def copier():
            got["out"], got["samples"] = s.copy("h2d", 64 * MiB, 1200, sync_every=1)

        th = threading.Thread(target=copier)
        th.start()
        time.sleep(0.3)
        ta = core.now_ns() / 1e9  # the copy loop's clock
        during = allocate(gib, pieces)
        tb = ta + during
        th.join()
    ends, t = [], got["out"].start_ns / 1e9
    for ns in got["samples"]:
        t += ns / 1e9
        ends.append((t, ns / 1e9))
    inside = [d for e, d in ends if ta <= e - d and e <= tb]
    outside = [d for e, d in ends if e < ta or e - d > tb]
    rate = lambda ds: len(ds) * 64 * MiB / sum(ds) / 1e9 if ds else float("nan")  # noqa: E731
    covered = sum(min(e, tb) - max(e - d, ta) for e, d in ends if e > ta and e - d < tb)
    print(f"copies on {'a context of their own' if own_context else 'the primary context'}: allocation of "
          f"{gib} GiB in {pieces} tensors {alone * 1e3:.1f} ms alone, {during * 1e3:.1f} ms during the copies; "
          f"copies {rate(outside):.2f} GB/s outside it, {rate(inside):.2f} GB/s of {len(inside)} copies wholly "
          f"inside it; copy time covering it {covered / during:.2f} of it")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--pieces", type=int, default=64)
    a = ap.parse_args()
    print(torch.cuda.get_device_name(0))
    for own in (False, True, False, True):
        one(own, a.gib, a.pieces)


if __name__ == "__main__":
    main()
