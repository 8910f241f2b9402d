"""The framework calibration loops, call by call: what the emulator charges each iteration.

    python3 bench/framework_ledger.py [--profile b300] [--n 1000]

For each loop that `ccbridge calibrate` checks at the framework level
(`x.add_(1)` pipelined; `x.add_(1)` + `torch.cuda.synchronize()`; a 32-byte
`.to("cpu", non_blocking=True)` from a side stream + `torch.cuda.synchronize()`)
it runs the loop natively, then under the profile with `--record`, keeps the
trace rows of the timed iterations, and prints per iteration: the wall time
natively and emulated, each hooked driver call with its count, its time in
the call, the emulator's stream wait and the toll it charged, and what the
tolls leave unexplained (emulated - native - tolls: the emulator's own
mechanics, or time outside any hooked call). A toll charged twice shows as
its API's toll per iteration above the profile's figure; a cost outside the
tolls shows as the unexplained rest. Prints JSON last. EMULATED figures.

A D2H crossing makes the host wait once: its channel copies wait on the GPU
for the copy's place in its stream, and its stream wait is read off the
channel's timing events. An idle stream skips the GPU-side wait, and a D2H's
tolls start where this machine's native small D2H would have ended. Still, on
an H100 (2026-11-22, session 4) the d2h32 loop took 39 us per iteration more
than native + tolls, outside any hooked call. To find where: each loop also
runs natively under `--record` (what it spends outside hooked calls without
the emulator), the d2h32 loops time each Python statement (stream switch,
copy, release of the last iteration's tensor, synchronize) natively and
emulated, and `d2h32-into` copies into one preallocated pinned tensor (no
host allocator in the loop).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

LOOPS = ("pipelined", "launch+synchronize", "d2h32+synchronize", "d2h32-into+synchronize")


def child(loop: str, n: int) -> None:
    import torch

    from ccbridge.probe.framework import launch_bodies

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    split: dict[str, int] = defaultdict(int)  # ns per statement of the d2h32 loops
    clock = time.perf_counter_ns
    if loop.startswith("d2h32"):  # as framework.small_d2h, 1 stream, sync each
        src = torch.arange(8, dtype=torch.float32, device=dev)
        side, last = torch.cuda.Stream(device=dev), []
        into = torch.empty(8, dtype=torch.float32, pin_memory=True)  # -into: no host allocator in the loop

        def body():
            a = clock()
            with torch.cuda.stream(side):
                b = clock()
                out = into.copy_(src, non_blocking=True) if loop.startswith("d2h32-into") else src.to("cpu", non_blocking=True)
                c = clock()
            d = clock()
            last[:] = [out]  # frees the previous iteration's tensor (the host allocator's event, when it made it)
            e = clock()
            torch.cuda.synchronize()
            f = clock()
            for k, v in (("stream enter+exit", b - a + d - c), ("copy", c - b), ("release", e - d), ("synchronize", f - e)):
                split[k] += v
    else:
        x = torch.zeros(1, device=dev)
        body = launch_bodies(torch, x, torch.cuda.current_stream(dev))[loop]
    for _ in range(50):  # warm: kernel load, the pinned host allocator's cache
        body()
    torch.cuda.synchronize()
    split.clear()
    t0 = time.monotonic_ns()  # CLOCK_MONOTONIC, the trace's clock
    for _ in range(n):
        body()
    torch.cuda.synchronize()
    t1 = time.monotonic_ns()
    print(json.dumps({"loop": loop, "n": n, "t0": t0, "t1": t1, "per_iter_us": (t1 - t0) / n / 1e3,
                      "split_us": {k: v / n / 1e3 for k, v in split.items()}}))


def _run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ledger(prefix: str, t0: int, t1: int, n: int) -> dict[str, dict[str, float]]:
    """{api: per-iteration count, in-call us, stream-wait us, toll us} from the rows that began in [t0, t1]."""
    from ccbridge.emulate.trace import COLUMNS, check_header

    agg: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for path in glob.glob(f"{glob.escape(prefix)}.*.csv"):
        with open(path, newline="") as f:
            check_header(path, f.readline(), f.readline())
            for r in csv.DictReader(f, fieldnames=list(COLUMNS)):
                if t0 <= int(r["t_enter_ns"]) <= t1:
                    a = agg[r["api"]]
                    a["calls"] += 1 / n
                    a["in_call_us"] += (int(r["t_return_ns"]) - int(r["t_enter_ns"])) / 1e3 / n
                    a["stream_wait_us"] += int(r["blocked_stream_ns"]) / 1e3 / n
                    a["toll_us"] += int(r["toll_ns"]) / 1e3 / n
    return {k: dict(v) for k, v in agg.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="b300")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.n)
    from ccbridge.emulate import profiles

    prof = profiles.load(a.profile)
    p = {k: v.value for k, v in prof.params.items()}
    expect = {"pipelined": p["launch_toll_us"], "launch+synchronize": p["launch_toll_us"] + p["sync_toll_us"],
              "d2h32+synchronize": p["d2h_toll_us"] + p["sync_toll_us"],
              "d2h32-into+synchronize": p["d2h_toll_us"] + p["sync_toll_us"]}
    report = []
    with tempfile.TemporaryDirectory(prefix="ccb-ledger-") as tmp:
        for loop in a.loops.split(","):
            me = [sys.executable, os.path.abspath(__file__), "--child", loop, "--n", str(a.n)]
            nat = _run(me)
            prefix = os.path.join(tmp, loop.replace("+", "_"))
            # natively once more, recorded (no emulation): the time this loop spends outside hooked calls here
            nrec = _run([sys.executable, "-m", "ccbridge", "run", "--record", prefix + "-native", "--"] + me)
            ncalls = ledger(prefix + "-native", nrec["t0"], nrec["t1"], a.n)
            emu = _run([sys.executable, "-m", "ccbridge", "run", "--profile", a.profile, "--record", prefix, "--"] + me)
            calls = ledger(prefix, emu["t0"], emu["t1"], a.n)
            tolls = sum(c["toll_us"] for c in calls.values())
            delta = emu["per_iter_us"] - nat["per_iter_us"]
            outside = {"native": nrec["per_iter_us"] - sum(c["in_call_us"] for c in ncalls.values()),
                       "emulated": emu["per_iter_us"] - sum(c["in_call_us"] for c in calls.values())}
            report.append({"loop": loop, "profile": a.profile, "native_us": nat["per_iter_us"],
                           "emulated_us": emu["per_iter_us"], "delta_us": delta, "tolls_us": tolls,
                           "ledger_us": expect[loop], "unexplained_us": delta - tolls, "calls": calls,
                           "native_recorded_us": nrec["per_iter_us"], "native_calls": ncalls,
                           "outside_hooked_calls_us": outside,
                           "split_us": {"native": nat["split_us"], "emulated": emu["split_us"]}})
            print(f"\n{loop} ({a.profile}, EMULATED): native {nat['per_iter_us']:.2f} us, emulated "
                  f"{emu['per_iter_us']:.2f} us, delta {delta:+.2f}; tolls charged {tolls:.2f} us per iteration "
                  f"(profile ledger {expect[loop]:.2f}); unexplained {delta - tolls:+.2f}; outside hooked calls "
                  f"{outside['native']:.2f} us natively (recorded), {outside['emulated']:.2f} emulated", file=sys.stderr)
            print(f"  {'api':<26} {'calls/iter':>10} {'in call us':>11} {'native us':>10} {'stream wait':>12} {'toll us':>8}",
                  file=sys.stderr)
            for api, c in sorted(calls.items(), key=lambda kv: -kv[1]["in_call_us"]):
                nc = ncalls.get(api, {}).get("in_call_us", float("nan"))
                print(f"  {api:<26} {c['calls']:>10.3f} {c['in_call_us']:>11.2f} {nc:>10.2f} {c['stream_wait_us']:>12.2f} "
                      f"{c['toll_us']:>8.2f}", file=sys.stderr)
            for k in nat["split_us"]:
                print(f"  python: {k:<22} {nat['split_us'][k]:>8.2f} us native, {emu['split_us'].get(k, 0):>8.2f} emulated",
                      file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
