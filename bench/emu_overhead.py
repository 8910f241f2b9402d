"""Interposer overhead: a GPU-bound PyTorch loop and per-call costs, native vs passthrough.

    python bench/emu_overhead.py            # parent: runs the children, prints JSON
The passthrough profile keeps every hook on and adds no cost, so the
difference is the interposer's own.
"""

import json
import statistics
import subprocess
import sys
import time


def child():
    import torch

    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    for _ in range(20):
        torch.relu(a @ b)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(400):  # GPU-bound: ~0.2 ms of tensor-core work per step, few launches
        c = torch.relu(a @ b)
        if i % 50 == 49:
            c.sum().item()
    torch.cuda.synchronize()
    loop_s = time.perf_counter() - t
    x = torch.zeros(1, device=dev)
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    launch_us = (time.perf_counter() - t) / n * 1e6
    h = torch.randn(1024).pin_memory()
    d = torch.empty(1024, device=dev)
    for _ in range(100):
        d.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(2000):
        d.copy_(h, non_blocking=True)
        torch.cuda.current_stream().synchronize()
    copy_us = (time.perf_counter() - t) / 2000 * 1e6
    print(json.dumps({"loop_s": loop_s, "launch_us": launch_us, "copy4k_sync_us": copy_us}))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    me = [sys.executable, __file__, "--child"]
    under = [sys.executable, "-m", "ccbridge", "run", "--profile", "passthrough", "--"] + me
    nat, pas = [], []
    for _ in range(3):  # alternate, so drift hits both
        nat.append(run(me))
        pas.append(run(under))
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    out = {k: {"native": med(nat, k), "passthrough": med(pas, k)} for k in nat[0]}
    out["loop_overhead_pct"] = (out["loop_s"]["passthrough"] / out["loop_s"]["native"] - 1) * 100
    out["launch_overhead_us"] = out["launch_us"]["passthrough"] - out["launch_us"]["native"]
    out["copy_overhead_us"] = out["copy4k_sync_us"]["passthrough"] - out["copy4k_sync_us"]["native"]
    out["runs"] = {"native": nat, "passthrough": pas}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
