"""Do CUDA events and %globaltimer stamps agree on the GPU-time figures ccbridge reports? (issue 32)

TensorRT-LLM and FlashInfer accept the globaltimer backend where it agrees with events within 5% with CC off;
here the bound is max(5%, twice the stamp's own cost over the interval): two back-to-back stamps are the
smallest interval the stamps measure. Run natively and under an emulator profile:
    python bench/timer_agreement.py > native.json
    ccbridge run --profile b300 -- python bench/timer_agreement.py > b300.json
Each figure is timed by both backends in alternation (ROUNDS rounds, medians): one JSON object per line on
stdout, a table on stderr; exit 1 when a figure is out of its bound. --peer adds the peer family's per-op
all_reduce rows (4 KiB, 64 KiB, 1 MiB; eager and graph-replayed) on every GPU, one rank per GPU, both timers in
alternation inside the same ranks (2+ GPUs; the bound's interval is a sample's ops together).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from ccbridge import gputimer, ranks
from ccbridge.bindings import core
from ccbridge.probe import peer

ROUNDS, REPS = 5, 7
PEER = peer.Plan("all_reduce", (4 << 10, 64 << 10, 1 << 20), (), ops=20, reps=REPS)


def figures() -> dict:
    """name -> (fn, inner calls per sample): the shapes of the probe's GPU-time rows and decode's steps."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    x = torch.randn(1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(50):
            x.add_(1.0)
    return {"matmul_bf16_4096": (lambda: a @ a, 1), "device_copy_256MiB": (lambda: dst.copy_(src), 1),
            "small_kernels_x100": (lambda: x.add_(1.0), 100), "graph_replay_50": (g.replay, 1)}


def peer_figures() -> dict:
    """name -> (events ms per op by round, globaltimer ms per op by round, ops per sample): the peer rows."""
    n = torch.cuda.device_count()
    got = ranks.run(n, peer.timer_pairs, PEER, ROUNDS, label="timer agreement", backend="nccl",
                    devices=list(range(n)), rendezvous="file", timeout_s=peer.RANK_TIMEOUT_S)[0]
    return {f"peer_allreduce_{mode}_{nbytes >> 10}KiB_x{n}": (by["events"], by["globaltimer"], PEER.ops)
            for mode, sizes in got.items() for nbytes, by in sizes.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", action="store_true", help="also the peer family's per-op all_reduce rows (2+ GPUs)")
    args = ap.parse_args()
    if args.peer and torch.cuda.device_count() < 2:
        print(f"--peer needs 2 or more GPUs, this machine has {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    dev = torch.cuda.current_device()
    own_ns = gputimer.stamp_cost_ns(torch, dev)
    got: dict[str, dict[str, list[float]]] = {}
    for name, (fn, inner) in figures().items():
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        for _ in range(ROUNDS):
            for b in gputimer.BACKENDS:
                got.setdefault(name, {}).setdefault(b, []).append(
                    statistics.median(gputimer.time_ms(torch, fn, REPS, inner, backend=b)))
    with core.Session(dev, "pinned", 1 << 20) as s:
        for _ in range(ROUNDS):
            for b in gputimer.BACKENDS:  # the calibrated collectives' device-side wait is shortened by this
                got.setdefault("kernel_gap", {}).setdefault(b, []).append(s.kernel_gap(21, b) / 1e6)
    spans = {}  # a figure's samples span this many of its per-call times (the bound's interval)
    if args.peer:
        for name, (ev, gt, ops) in peer_figures().items():
            got[name], spans[name] = {"events": ev, "globaltimer": gt}, ops
    bad = 0
    print(f"{'figure':<32} {'events ms':>11} {'globaltimer ms':>15} {'diff':>8} {'bound':>7}", file=sys.stderr)
    for name, by in got.items():
        ev, gt = statistics.median(by["events"]), statistics.median(by["globaltimer"])
        diff = abs(gt - ev) / ev if ev > 0 else float("inf")
        bound = max(0.05, 2 * own_ns / 1e6 / (ev * spans.get(name, 1))) if ev > 0 else 0.05
        bad += diff > bound
        print(json.dumps({"figure": name, "events_ms": ev, "globaltimer_ms": gt, "diff": diff, "bound": bound,
                          "within": diff <= bound, "stamp_cost_ns": own_ns, "rounds": by}))
        print(f"{name:<32} {ev:>11.4f} {gt:>15.4f} {diff:>7.1%} {bound:>6.0%}{'' if diff <= bound else '  OUT'}",
              file=sys.stderr)
    print(f"# a stamp's own cost (two back-to-back stamps): {own_ns:.0f} ns, taken off each globaltimer interval",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
