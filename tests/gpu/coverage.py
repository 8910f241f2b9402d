"""Which hooks see which library's work: run one component under `ccbridge run`
and print what the interposer counted while it ran (JSON on the last line).

    python tests/gpu/coverage.py torch_copy|cublas|triton|cupy|graph|workload

`workload` runs every kind of work a torch program does (eager ops, copies of
every kind, synchronizes, a CUDA graph, cuBLAS, Triton if it imports, a
1-rank NCCL group) so that `ccbridge run --coverage` lists every driver entry
point torch and its libraries resolve (tests/test_emulator_gpu.py fails on
any MISSING).
"""

import ctypes
import json
import os
import sys


def counters():
    lib = ctypes.CDLL(os.environ["CCBRIDGE_EMU_LIB"])  # already preloaded: the same copy
    buf = ctypes.create_string_buffer(1 << 16)
    if lib.ccbemu_summary(buf, len(buf)) != 0:
        raise RuntimeError("summary did not fit")
    return json.loads(buf.value)


def delta(before, after):
    calls = {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items() if v - before["calls"].get(k, 0)}
    cross = {k: v["count"] - before["crossings"][k]["count"] for k, v in after["crossings"].items()
             if v["count"] - before["crossings"][k]["count"]}
    return {"calls": calls, "crossings": cross}


def main(component):
    import torch

    torch.cuda.init()
    dev = torch.device("cuda")
    x = torch.randn(1 << 20)
    torch.ones(1, device=dev)
    torch.cuda.synchronize()
    ok = True
    if component == "torch_copy":
        pinned = x.pin_memory()
        before = counters()
        a = x.to(dev, non_blocking=True)            # pageable H2D
        b = pinned.to(dev, non_blocking=True)       # pinned H2D
        back = b.cpu()                              # D2H
        out = torch.empty_like(pinned).pin_memory()
        out.copy_(a, non_blocking=True)             # pinned D2H
        torch.cuda.synchronize()
        ok = torch.equal(back, x) and torch.equal(out, x)
    elif component == "cublas":
        a = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
        torch.mm(a, a)
        torch.cuda.synchronize()
        before = counters()
        for _ in range(3):
            torch.mm(a, a)
        torch.cuda.synchronize()
    elif component == "triton":
        import triton
        import triton.language as tl

        @triton.jit
        def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)

        a = torch.randn(4096, device=dev)
        o = torch.empty_like(a)
        add[(4,)](a, a, o, a.numel(), BLOCK=1024)  # compile outside the window
        torch.cuda.synchronize()
        before = counters()
        for _ in range(3):
            add[(4,)](a, a, o, a.numel(), BLOCK=1024)
        torch.cuda.synchronize()
        ok = torch.allclose(o, 2 * a)
    elif component == "cupy":
        import cupy
        import numpy as np

        h = np.random.default_rng(1).integers(0, 255, 1 << 20, dtype=np.uint8)
        cupy.asarray(h[:16]).sum()
        cupy.cuda.Device().synchronize()
        before = counters()
        d = cupy.asarray(h)
        s = (d.astype(cupy.int64) * 2).sum()
        back = cupy.asnumpy(d)
        ok = int(s) == int(h.astype(np.int64).sum() * 2) and (back == h).all()
    elif component == "graph":
        a = torch.randn(256, 256, device=dev)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            a @ a
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = a @ a
            y += 1
        before = counters()
        g.replay()
        torch.cuda.synchronize()
        ok = torch.allclose(y, a @ a + 1)
    elif component == "workload":
        before = counters()
        ok = workload(torch, dev)
    else:
        raise SystemExit(f"unknown component {component}")
    d = delta(before, counters())
    d["ok"] = bool(ok)
    print(json.dumps(d))


def workload(torch, dev) -> bool:
    """Every kind of driver work torch does; True when the results are right."""
    x = torch.randn(1 << 16)
    pinned = x.pin_memory()
    ok = True
    # eager ops, pipelined, then every kind of synchronize
    y = torch.zeros(1024, device=dev)
    for _ in range(50):
        y.add_(1)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y.mul_(2)
    s.synchronize()
    e = torch.cuda.Event()
    e.record(s)
    e.synchronize()
    e.query()
    s.query()
    torch.cuda.current_stream().wait_event(e)
    ok &= y.sum().item() == 100 * 1024
    # copies: pageable and pinned, blocking and non_blocking, both directions
    a = x.to(dev)
    b = pinned.to(dev, non_blocking=True)
    back = torch.empty_like(pinned)
    back.copy_(b, non_blocking=True)
    torch.cuda.synchronize()
    ok &= torch.equal(a.cpu(), x) and torch.equal(back, x)
    # cuBLAS
    m = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
    (m @ m).float().sum().item()
    # a CUDA graph: capture (a copy inside it too) and replay
    static_in = torch.zeros(1 << 16, device=dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_in.copy_(pinned, non_blocking=True)
        out = static_in * 2 + 1
    g.replay()
    torch.cuda.synchronize()
    ok &= torch.allclose(out.cpu(), x * 2 + 1)
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def add(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            msk = i < n
            tl.store(out_ptr + i, tl.load(x_ptr + i, mask=msk) + 1, mask=msk)

        o = torch.empty_like(a)
        add[(triton.cdiv(a.numel(), 1024),)](a, o, a.numel(), BLOCK=1024)
        ok &= torch.allclose(o.cpu(), x + 1)
    except ImportError:
        pass
    import torch.distributed as dist

    if dist.is_nccl_available():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev if dev.index is not None else torch.device("cuda:0"))
        t = torch.ones(8, device=dev)
        dist.all_reduce(t)
        ok &= t.sum().item() == 8
        dist.destroy_process_group()
    torch.cuda.synchronize()
    return bool(ok)


if __name__ == "__main__":
    main(sys.argv[1])
