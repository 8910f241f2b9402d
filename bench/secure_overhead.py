"""Where the fixed cost of an encrypted all_reduce goes (2 ranks, 16-byte tensors):
wall time per op with a wait after each, per op with 50 issued before one wait
(is the host or the GPU chain the limit?), the host profile (cProfile) and the
device profile (torch.profiler, CUDA time per kernel)."""

import cProfile
import io
import pstats
import sys
import time

import torch

from ccbridge.secure import bench


def rank(r, n):
    g = bench._init(r, n, "nccl")
    x = torch.ones(4, device=g.device)
    for _ in range(10):
        g.all_reduce(x)
    out = io.StringIO()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        g.all_reduce(x)
    t_sync = (time.perf_counter() - t0) / 50
    t0 = time.perf_counter()
    works = [g.all_reduce(x, async_op=True) for _ in range(50)]
    t_issue = (time.perf_counter() - t0) / 50
    for w in works:
        w.wait()
    t_async = (time.perf_counter() - t0) / 50
    print(f"per op: {t_sync * 1e6:.0f} us waited each, {t_async * 1e6:.0f} us with 50 in flight "
          f"(host issue {t_issue * 1e6:.0f} us)", file=out)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        g.all_reduce(x)
    prof.disable()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            g.all_reduce(x)
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=15), file=out)
    torch.distributed.destroy_process_group()
    return out.getvalue() if r == 0 else ""


if __name__ == "__main__":
    print(bench.launch(rank, int(sys.argv[1]) if len(sys.argv) > 1 else 2))
