"""Which hooks see which library's work: run one component under `ccbridge run`
and print what the interposer counted while it ran (JSON on the last line).

    python tests/gpu/coverage.py torch_copy|cublas|triton|cupy|graph
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
    else:
        raise SystemExit(f"unknown component {component}")
    d = delta(before, counters())
    d["ok"] = bool(ok)
    print(json.dumps(d))


if __name__ == "__main__":
    main(sys.argv[1])
