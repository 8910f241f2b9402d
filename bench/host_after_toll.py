"""Does host code run slower right after an emulated launch toll? (issue 31: TP2's host work grows under emulation)

On 4x H200, every TP2 account so far found the ranks' host work (time outside every traced call) grown under the
b300 profile (+4% to +27% of the slowdown), and a re-read of session 9's TP2 traces put the growth in the gaps
between consecutive launches (+1.3 to +4.2 us a gap). The emulator pays a launch toll by spinning inside the call
(native/emu/pace.c): if the Python that follows a spin runs slower, that is the emulator's own cost, not the
program's. This loop launches one small kernel, then times a fixed piece of Python work, N times, and prints the
work's median and p90 in ns. Run it natively and under each setting, in the same session on the same GPU:

    python3 bench/host_after_toll.py
    ccbridge run --profile passthrough -- python3 bench/host_after_toll.py
    ccbridge run --profile b300 -- python3 bench/host_after_toll.py
    ccbridge run --profile b300 --set launch_toll_us=0 -- python3 bench/host_after_toll.py

The same work timed after a spin the script makes itself (no launch) says whether a spin alone does it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def work(d: dict) -> int:
    """A fixed piece of interpreter work, ~5 us: what a framework does between two launches."""
    s = 0
    for i in range(60):
        s += d[i % 200]
    return s


def timed(n: int, before, d: dict) -> list[int]:
    out = []
    for _ in range(n):
        before()
        t0 = time.perf_counter_ns()
        work(d)
        out.append(time.perf_counter_ns() - t0)
    return out


def spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=20000, help="iterations per case (default 20000)")
    ap.add_argument("--spin-us", type=float, default=20.0, help="the script's own spin, us (default 20)")
    args = ap.parse_args()
    if args.n < 100 or args.spin_us < 0:
        print("host_after_toll: -n must be >= 100 and --spin-us >= 0", file=sys.stderr)
        return 2
    import torch  # deferred: torch (seconds of import), after the arguments are checked
    if not torch.cuda.is_available():
        print("host_after_toll: needs a CUDA GPU", file=sys.stderr)
        return 2
    x = torch.zeros(1024, device="cuda")
    d = {i: i * i for i in range(200)}
    cases = {"launch": lambda: x.add_(1), "nothing": lambda: None,
             "spin": lambda: spin(int(args.spin_us * 1e3))}
    for before in cases.values():  # warm: the interpreter's caches, the kernel's module
        timed(200, before, d)
    torch.cuda.synchronize()
    out = {}
    for _ in range(3):  # the cases in turn, three rounds: drift shows as rounds that disagree
        for name, before in cases.items():
            ns = timed(args.n, before, d)
            torch.cuda.synchronize()
            out.setdefault(name, []).append((statistics.median(ns), sorted(ns)[int(0.9 * len(ns))]))
    for name, rounds in out.items():
        print(f"{name:<8} work after it: median " + " / ".join(f"{m:.0f}" for m, _ in rounds) + " ns, p90 "
              + " / ".join(f"{p:.0f}" for _, p in rounds) + " ns", file=sys.stderr)
    print(json.dumps({k: [{"median_ns": m, "p90_ns": p} for m, p in v] for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
