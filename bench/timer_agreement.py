"""Do CUDA events and %globaltimer stamps agree on the GPU-time figures ccbridge reports? (issue 32)

TensorRT-LLM and FlashInfer accept the globaltimer backend where it agrees with events within 5% with CC off;
here the bound is max(5%, twice the stamp's own cost over the interval): two back-to-back stamps are the
smallest interval the stamps measure. Run natively and under an emulator profile:
    python bench/timer_agreement.py > native.json
    ccbridge run --profile b300 -- python bench/timer_agreement.py > b300.json
Each figure is timed by both backends in alternation (ROUNDS rounds, the order swapped every round; medians; the
difference judged is the median of each round's signed paired difference): one JSON object per line on stdout, a
table on stderr; exit 1 when a figure is out of its bound. --peer adds the peer family's per-op all_reduce rows
(4 KiB, 64 KiB, 1 MiB; eager and graph-replayed) on every GPU, one rank per GPU, both timers in alternation inside
the same ranks (2+ GPUs; the bound's interval is a sample's ops together). --rejudge FILE judges a recorded run's
JSON lines again (no GPU).
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
CALLS = {"small_kernels_x100": 100}  # a figure's calls per sample where more than one (figures())
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
            "small_kernels_x100": (lambda: x.add_(1.0), CALLS["small_kernels_x100"]),
            "graph_replay_50": (g.replay, 1)}


def peer_figures() -> dict:
    """name -> (events ms per op by round, globaltimer ms per op by round, ops per sample): the peer rows."""
    n = torch.cuda.device_count()
    got = ranks.run(n, peer.timer_pairs, PEER, ROUNDS, label="timer agreement", backend="nccl",
                    devices=list(range(n)), rendezvous="file", timeout_s=peer.RANK_TIMEOUT_S)[0]
    return {f"peer_allreduce_{mode}_{nbytes >> 10}KiB_x{n}": (by["events"], by["globaltimer"], PEER.ops)
            for mode, sizes in got.items() for nbytes, by in sizes.items()}


def paired_diff(events: list[float], stamps: list[float]) -> float:
    """How far the two timers part on one figure: |the median over rounds of each round's signed relative
    difference|. A round times both in turn (gputimer.in_turn: the order swaps every round), so its pair saw the
    same state of the machine; between rounds a row moves by more than the timers part (a peer row by up to 20%:
    4x H200, 2026-11-26), which a ratio of the two medians would count as disagreement, and the median of the
    absolute differences would count each round's noise."""
    rel = [(g - e) / e if e > 0 else float("inf") for e, g in zip(events, stamps)]
    return abs(statistics.median(rel)) if rel else float("inf")


def judge(got: dict, calls: dict, own_ns: float) -> int:
    """Print each figure (JSON on stdout, a table on stderr); the number out of their bounds. calls: a figure's
    calls (or ops) per sample, whose time together is the interval the stamp's resolution bounds."""
    bad = 0
    print(f"{'figure':<32} {'events ms':>11} {'globaltimer ms':>15} {'diff':>8} {'bound':>7}", file=sys.stderr)
    for name, by in got.items():
        ev, gt = statistics.median(by["events"]), statistics.median(by["globaltimer"])
        diff = paired_diff(by["events"], by["globaltimer"])
        bound = max(0.05, 2 * own_ns / 1e6 / (ev * calls.get(name, 1))) if ev > 0 else 0.05
        bad += diff > bound
        print(json.dumps({"figure": name, "events_ms": ev, "globaltimer_ms": gt, "diff": diff, "bound": bound,
                          "within": diff <= bound, "stamp_cost_ns": own_ns, "calls": calls.get(name, 1),
                          "stamp_taken_off": False, "rounds": by}))
        print(f"{name:<32} {ev:>11.4f} {gt:>15.4f} {diff:>7.1%} {bound:>6.0%}{'' if diff <= bound else '  OUT'}",
              file=sys.stderr)
    print(f"# a stamp's own cost (two back-to-back stamps): {own_ns:.0f} ns (the bound's resolution)", file=sys.stderr)
    return bad


def rejudge(path: str) -> int:
    """A recorded run's JSON lines judged again. Lines from before 34f5b6e (no "stamp_taken_off") had a stamp's
    cost taken off each globaltimer interval, as gputimer did then: it is added back, per call, as the timer now
    reads (not to kernel_gap, timed in C, which never took it off); their calls per sample are the figures'."""
    got, calls, own_ns = {}, {}, 0.0
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            name, by, own_ns = d["figure"], d["rounds"], d["stamp_cost_ns"]
            n = d.get("calls", PEER.ops if name.startswith("peer_") else CALLS.get(name, 1))
            if "stamp_taken_off" not in d and name != "kernel_gap":
                by = dict(by, globaltimer=[g + own_ns / 1e6 / n for g in by["globaltimer"]])
            got[name], calls[name] = by, n
    if not got:
        raise ValueError("no figure line")
    return judge(got, calls, own_ns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", action="store_true", help="also the peer family's per-op all_reduce rows (2+ GPUs)")
    ap.add_argument("--rejudge", metavar="FILE", help="judge a recorded run's JSON lines again (no GPU)")
    args = ap.parse_args()
    if args.rejudge:
        try:
            return 1 if rejudge(args.rejudge) else 0
        except (OSError, ValueError, KeyError, TypeError) as e:  # not a file this script wrote
            print(f"--rejudge {args.rejudge}: not a timer_agreement record ({type(e).__name__}: {e})"[:200],
                  file=sys.stderr)
            return 2
    if args.peer and torch.cuda.device_count() < 2:
        print(f"--peer needs 2 or more GPUs, this machine has {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    dev = torch.cuda.current_device()
    own_ns = gputimer.stamp_cost_ns(torch, dev)
    got: dict[str, dict[str, list[float]]] = {}
    calls = {}  # a figure's samples span this many of its per-call times (the bound's interval)
    for name, (fn, inner) in figures().items():
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        calls[name] = inner
        for r in range(ROUNDS):
            for b in gputimer.in_turn(r):
                got.setdefault(name, {}).setdefault(b, []).append(
                    statistics.median(gputimer.time_ms(torch, fn, REPS, inner, backend=b)))
    with core.Session(dev, "pinned", 1 << 20) as s:
        for r in range(ROUNDS):
            for b in gputimer.in_turn(r):  # the calibrated collectives' device-side wait is shortened by this
                got.setdefault("kernel_gap", {}).setdefault(b, []).append(s.kernel_gap(21, b) / 1e6)
    if args.peer:
        for name, (ev, gt, ops) in peer_figures().items():
            got[name], calls[name] = {"events": ev, "globaltimer": gt}, ops
    return 1 if judge(got, calls, own_ns) else 0


if __name__ == "__main__":
    sys.exit(main())
