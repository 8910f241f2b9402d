"""A decode step's weight GEMVs as one Triton kernel each, fused with what comes before them, against cuBLAS (issue 31).

bench/tp_step.py found one rank's llama-8b TP4 decode step at 2.41x its HBM roofline (goal 2x): its weight GEMVs
and cuBLAS's split-K reduce kernels took 1.34 ms for 0.87 ms of weights at the copy rate, and 532 kernels a step
cost ~1.1 us each between them. This asks whether one kernel per GEMV does better at those shapes: each program
reads BLOCK_N rows of the weight across K once, with the RMSNorm before QKV and gate-up (and the residual add before
it) or the SiLU x up before down computed in the kernel's prologue, so neither the norm, nor SiLU x up, nor a
split-K reduce is a kernel of its own. Per shape it times, in CUDA graphs of REPS calls over copies of the weight
that together pass the L2 many times (a step reads each weight from HBM; the step is replayed as a graph): the
engine's cuBLAS way (the norm or SiLU x up, then F.linear, compiled by torch.compile as the engine's halves are)
and the fused kernel over a grid of tile shapes, and checks the fused result against torch's within bf16 rounding.

    python3 bench/gemv.py [--model llama-8b] [--tp 4] [--json F] [--pdl]

The kernel is serve/gemv.py's, as the engine calls it at one sequence; each row also times the rule's tile
(serve/gemv.py's tile(): the engine's with CCBRIDGE_GEMV_TUNE=0) beside the best of the grid. The engine itself
times a compact set of candidates per shape as it builds (serve/gemv_tune.py); this grid is the wider search.
--pdl also times each shape's best tile launched with Programmatic Dependent Launch (serve/gemv.py's PDL) against
without, in the same graphs of back-to-back calls (PDL acts between kernels: each call's first weight tile and launch
overlap the call before it), and checks that both compute the same bits. The grid itself runs without PDL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from ccbridge import gputimer
from ccbridge.serve import gemv as fused

REPS = 200
COLD_BYTES = 1 << 30  # the weight copies a measurement cycles through (an H200's L2: 60 MiB)
EPS = fused.EPS
# K steps past 512 keep more of a weight's bytes in flight per program (a GEMV at batch 1 is latency-bound where
# few programs each ask for little); 128 and 256 never won a shape on an H200. A program's fp32 partial sums
# (BLOCK_N x BLOCK_K) stay within 128 registers a thread: more spills.
TILES = [(bn, bk, w) for bn in (1, 2, 4, 8, 16, 32) for bk in (512, 1024, 2048, 4096) for w in (4, 8)
         if bn * bk <= 128 * 32 * w]


def gemv(w, x, res=None, norm_w=None, silu=False, tile=(8, 256, 4), pdl=False):
    """The fused kernel (serve/gemv.py, as the engine calls it) at one tile, launched with PDL or not."""
    fused.PDL = pdl
    return fused.gemv(w, x, res=res, norm_w=norm_w, silu=silu, tile_nkw=tile)[0]


def torch_way(w, x, res=None, norm_w=None, silu=False):
    """The engine's way (serve/engine.py, eagerly): the residual add and RMSNorm, or SiLU x up, then F.linear."""
    k = w.shape[1]
    if silu:
        x = F.silu(x[:k]) * x[k:]
    elif norm_w is not None:
        x = F.rms_norm(x if res is None else x + res, (k,), norm_w, EPS)
    return F.linear(x, w)


def shapes(spec: dict, n: int) -> dict:
    """One rank's weight GEMVs at degree n: name -> (N, K, prologue)."""
    h, hq, hk = spec["hidden_size"], spec["num_attention_heads"], spec["num_key_value_heads"]
    d, inter = spec.get("head_dim") or h // hq, spec["intermediate_size"]
    return {"qkv": ((hq + 2 * hk) * d // n, h, "norm"), "o": (h, hq * d // n, ""),
            "gate_up": (2 * inter // n, h, "norm"), "down": (h, inter // n, "silu")}


def graph_us(fn, copies: int) -> float:
    """fn(i)'s time per call, REPS calls over the weight's copies in turn captured in one CUDA graph, the median of
    5 replays (us), by the run's GPU timer (gputimer: %globaltimer where CC is on)."""
    g, _ = gputimer.graphed(torch, lambda: [fn(i % copies) for i in range(REPS)])
    return statistics.median(gputimer.time_ms(torch, g.replay, 5)) * 1e3 / REPS


def measure(name, n_out, k, prologue, dev, pdl=False) -> dict:
    g = torch.Generator(device=dev).manual_seed(n_out * 7 + k)
    w = (torch.randn(n_out, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    # as in a decode step, every call reads its weight from HBM: copies in turn, together past the L2 many times
    # (one weight replayed REPS times stays in L2 and reads 1.5-2x faster than a step's)
    ws = [w] + [w.clone() for _ in range(max(1, COLD_BYTES // (w.numel() * w.element_size())))]
    x = torch.randn(2 * k if prologue == "silu" else k, device=dev, generator=g).to(torch.bfloat16)
    res = torch.randn(k, device=dev, generator=g).to(torch.bfloat16) if prologue == "norm" else None
    nw = torch.rand(k, device=dev, generator=g).to(torch.bfloat16) if prologue == "norm" else None
    kw = dict(res=res, norm_w=nw, silu=prologue == "silu")
    ref = torch_way(w, x, **kw).float()
    best, chosen = None, fused.tile(n_out, k)
    for tile in TILES + [chosen] * (chosen not in TILES):
        got = gemv(w, x, tile=tile, **kw).float()
        err = float((got - ref).abs().max() / ref.abs().max())
        us = graph_us(lambda i: gemv(ws[i], x, tile=tile, **kw), len(ws))
        if tile == chosen:
            engine_us = us
        if best is None or us < best[0]:
            best = (us, tile, err)
    engine = torch.compile(torch_way, fullgraph=True)  # as the engine runs it: the prologue one inductor kernel
    torch_us = graph_us(lambda i: engine(ws[i], x, **kw), len(ws))
    gb = w.numel() * w.element_size() / 1e9
    more = {}
    if pdl:  # the best tile again without PDL beside with it: the same graphs, one after the other
        off, on = gemv(w, x, tile=best[1], **kw), gemv(w, x, tile=best[1], pdl=True, **kw)
        more = {"nopdl_us": graph_us(lambda i: gemv(ws[i], x, tile=best[1], **kw), len(ws)),
                "pdl_us": graph_us(lambda i: gemv(ws[i], x, tile=best[1], pdl=True, **kw), len(ws)),
                "pdl_same_bits": bool(torch.equal(off, on))}
        fused.PDL = False
    return more | {"gemv": name, "n": n_out, "k": k, "prologue": prologue or "-", "torch_us": torch_us,
            "fused_us": best[0], "tile": list(best[1]), "max_rel_err": best[2], "engine_tile": list(chosen),
            "engine_tile_us": engine_us, "torch_gbps": gb / torch_us * 1e6,
            "fused_gbps": gb / best[0] * 1e6}


def main() -> int:
    from ccbridge.serve import decode  # deferred with torch's other users: the presets

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-8b", choices=sorted(decode.PRESETS))
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--json", help="the rows; bench/tp_step.py --tiles takes each shape's best tile from it")
    ap.add_argument("--pdl", action="store_true", help="each best tile also timed launched with PDL (Hopper on)")
    args = ap.parse_args()
    if args.tp < 1:
        print(f"gemv: --tp takes a degree of 1 or more (got {args.tp})", file=sys.stderr)
        return 2
    if not fused.available() or not torch.cuda.is_available():
        print("gemv: needs a CUDA GPU and triton", file=sys.stderr)
        return 2
    dev, rows = torch.device("cuda", 0), []
    print(f"{'gemv':<8} {'N x K':>12} {'prologue':>8} {'torch us':>9} {'fused us':>9} {'torch GB/s':>10} "
          f"{'fused GB/s':>10} {'tile':>12} {'rel err':>8} {'engine tile':>12} {'its us':>7}")
    for name, (n_out, k, prologue) in shapes(decode.PRESETS[args.model], args.tp).items():
        r = measure(name, n_out, k, prologue, dev, args.pdl)
        rows.append(r)
        print(f"{name:<8} {f'{n_out}x{k}':>12} {r['prologue']:>8} {r['torch_us']:9.2f} {r['fused_us']:9.2f} "
              f"{r['torch_gbps']:10.0f} {r['fused_gbps']:10.0f} {'/'.join(map(str, r['tile'])):>12} "
              f"{r['max_rel_err']:8.4f} {'/'.join(map(str, r['engine_tile'])):>12} {r['engine_tile_us']:7.2f}",
              flush=True)
        if args.pdl:
            off, on = r["nopdl_us"], r["pdl_us"]
            print(f"{'':<8} PDL: {off:7.2f} us off, {on:7.2f} us on ({on / off:.3f}x) at "
                  f"{'/'.join(map(str, r['tile']))}; the same bits: {'yes' if r['pdl_same_bits'] else 'NO'}",
                  flush=True)
    if args.pdl:
        off, on = (sum(r[key] for r in rows) for key in ("nopdl_us", "pdl_us"))
        print(f"PDL: a layer's four {off:.2f} us off, {on:.2f} us on ({on / off:.3f}x) at the best tiles, "
              f"back to back in a graph")
    t, f_, e = (sum(r[key] for r in rows) for key in ("torch_us", "fused_us", "engine_tile_us"))
    print(f"a layer's four: torch {t:.2f} us, fused {f_:.2f} us at the best tiles ({f_ / t:.2f}x), {e:.2f} us at the "
          f"rule's\n(serve/gemv.py's tile(); the engine tunes its own: serve/gemv_tune.py); "
          f"bf16 rounding: rel err <= 0.02")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 1 if any(r["max_rel_err"] > 0.02 or not r.get("pdl_same_bits", True) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
