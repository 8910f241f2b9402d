"""Peer (2+ GPUs): P2P copy bandwidth matrix, small-message latency, NCCL all-reduce time."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time

from ccbridge.probe._torch import event_time_ms
from ccbridge.probe.registry import test
from ccbridge.results import Row

P2P_BYTES = 256 << 20
ALLREDUCE_BYTES = (4 << 10, 256 << 20)


@test("peer.p2p", "GPU-to-GPU copy bandwidth matrix and 8-byte exchange latency", needs=("gpu", "torch", "multi_gpu"))
def p2p(ctx):
    import torch

    n = torch.cuda.device_count()
    reps = ctx.pick(5, 3)
    rows = []
    bufs = [torch.randint(0, 255, (P2P_BYTES,), dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    small = [torch.randint(1, 255, (8,), dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            ctx.step(f"GPU{i} -> GPU{j}")
            dst = torch.empty_like(bufs[i], device=f"cuda:{j}")
            dst.copy_(bufs[i])
            torch.cuda.synchronize(j)
            if not torch.equal(dst.cpu()[:4096], bufs[i].cpu()[:4096]):
                raise RuntimeError(f"GPU{i}->GPU{j} copy is not byte-exact")
            with torch.cuda.device(j):
                ms = event_time_ms(torch, lambda: dst.copy_(bufs[i]), reps=reps)
            rows.append(Row.of("peer.p2p", "bandwidth", "GB/s", [P2P_BYTES / (t * 1e-3) / 1e9 for t in ms], src=i, dst=j))
            del dst
            lat = []
            sdst = torch.empty(8, dtype=torch.uint8, device=f"cuda:{j}")
            for _ in range(ctx.pick(200, 50)):
                t0 = time.perf_counter()
                sdst.copy_(small[i])
                torch.cuda.synchronize(j)
                lat.append((time.perf_counter() - t0) * 1e6)
            rows.append(Row.of("peer.p2p", "latency_8B", "us", lat, src=i, dst=j))
    return rows


def _allreduce_rank(rank: int, world: int, init_file: str, sizes, reps: int, queue) -> None:
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
        result = {}
        for size in sizes:
            x = torch.full((size // 4,), float(rank + 1), device=f"cuda:{rank}")
            dist.all_reduce(x)
            expect = world * (world + 1) / 2
            if not torch.all(x == expect):
                raise RuntimeError(f"all-reduce of {size} B gave a wrong sum")
            for _ in range(3):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            result[size] = event_time_ms(torch, lambda: dist.all_reduce(x), reps=reps, inner=5)
        queue.put((rank, "ok", result))
        dist.destroy_process_group()
    except Exception as e:
        queue.put((rank, "error", f"{type(e).__name__}: {e}"))


@test("peer.allreduce", "NCCL all-reduce time, small and large messages, all GPUs", needs=("gpu", "torch", "multi_gpu"))
def allreduce(ctx):
    import torch

    world = torch.cuda.device_count()
    reps = ctx.pick(10, 5)
    ctx.step(f"NCCL all-reduce on {world} GPUs")
    mpc = mp.get_context("spawn")
    queue = mpc.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [mpc.Process(target=_allreduce_rank, args=(r, world, init, ALLREDUCE_BYTES, reps, queue), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            answers = [queue.get(timeout=300) for _ in range(world)]
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
    errors = [a for a in answers if a[1] == "error"]
    if errors:
        raise RuntimeError(f"rank {errors[0][0]}: {errors[0][2]}")
    rank0 = next(a[2] for a in answers if a[0] == 0)
    rows = []
    for size, ms in rank0.items():
        row = Row.of("peer.allreduce", "time", "us", [t * 1e3 for t in ms], bytes=size, gpus=world)
        # nccl-tests' bus bandwidth for all-reduce: size/time * 2(n-1)/n
        row.extra["busbw_GBps"] = size / (row.median * 1e-6) * 2 * (world - 1) / world / 1e9
        rows.append(row)
    return rows
