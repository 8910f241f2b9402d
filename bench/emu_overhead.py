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
    for i in range(2000):  # GPU-bound: ~0.2 ms of tensor-core work per step, few launches
        c = torch.relu(a @ b)
        if i % 50 == 49:
            c.sum().item()
    torch.cuda.synchronize()
    loop_s = time.perf_counter() - t
    # per call, from the probe's C loops (no Python in the timed region)
    from ccbridge import native

    with native.Session(0, "pinned", 4096) as s:
        s.launch(native.LAUNCH_PIPELINED, 2000)
        launch_us = min(s.launch(native.LAUNCH_PIPELINED, 20000) for _ in range(5)) / 1e3
        s.copy("h2d", 4096, 200, sync_every=1)
        copy_us = min(s.copy("h2d", 4096, 2000)[0].seconds / 2000 * 1e6 for _ in range(5))
    print(json.dumps({"loop_s": loop_s, "launch_us": launch_us, "copy4k_us": copy_us}))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    me = [sys.executable, __file__, "--child"]
    under = [sys.executable, "-m", "ccbridge", "run", "--profile", "passthrough", "--"] + me
    nat, pas = [], []
    for _ in range(5):  # alternate, so drift hits both
        nat.append(run(me))
        pas.append(run(under))
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    out = {k: {"native": med(nat, k), "passthrough": med(pas, k)} for k in nat[0]}
    out["loop_overhead_pct"] = (out["loop_s"]["passthrough"] / out["loop_s"]["native"] - 1) * 100
    out["launch_overhead_us"] = out["launch_us"]["passthrough"] - out["launch_us"]["native"]
    out["copy_overhead_us"] = out["copy4k_us"]["passthrough"] - out["copy4k_us"]["native"]
    out["runs"] = {"native": nat, "passthrough": pas}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
