"""Where a tensor-parallel decode step's time goes outside its collectives, one rank's shard on one GPU (issue 31).

`bench decode --tp N` reports the native step outside the collectives over the HBM roofline (the weight bytes a
rank reads per step at the device copy rate): llama-8b read 2.01x at TP1 and 4.10x at TP4 on 4x H200 (the goal:
2x). The collectives are not in question here, so each degree's rank-0 shard is built on one GPU with no
collective, its decode step captured in a CUDA graph and replayed as the bench replays it (inputs copied in, the
token read back), for each variant of the layer (serve/engine.py):
  eager       the engine's decode step uncompiled (session 13's 4.31x at TP4 was the engine before 0b3fe6b: SDPA
              for decode too, each residual add its own kernel)
  compiled    each layer's two halves (before and after each all-reduce) compiled by torch.compile, their GEMVs by
              cuBLAS (the bench's engine at batch 1 until the fused GEMVs; at every other batch still)
  autotuned   the same compiled with mode max-autotune-no-cudagraphs (inductor tunes its GEMM templates against
              cuBLAS: the split-K GEMVs and their reduce kernels; minutes of compiling)
  compiled-lt compiled, its GEMMs by cuBLASLt (torch.backends.cuda.preferred_blas_library): another heuristic
              for the GEMVs, which cuBLAS splits along K with a reduce kernel each
  compiled-kn compiled, every weight stored K-major (its transpose contiguous): the GEMVs as NN GEMMs instead of
              the TN ones of an (N, K) weight
  fused       compiled, each weight GEMV one Triton kernel with the residual add and RMSNorm, or SiLU x up, in its
              prologue (serve/gemv.py): what the bench's engine runs at batch 1 on a GPU with triton, each shape's
              tile tuned on this GPU as the engine builds (serve/gemv_tune.py, cached; CCBRIDGE_GEMV_TUNE=0: the
              rule's; --tiles F: bench/gemv.py's best instead), printed under its row; launched with PDL as the
              engine does (on a Hopper GPU unless CCBRIDGE_GEMV_PDL=0; its row says which)
  fused-pdl   fused, every fused GEMV launched with PDL whatever CCBRIDGE_GEMV_PDL says
  fused-nopdl fused, none launched with PDL (an A/B in one process: --variants fused-nopdl fused-pdl)
(On H200s, 2026-11-27, neither -lt nor -kn moved the TP4 step: cuBLAS chose the same split-K kernels.)
For each: the step's wall time (replay + read back), its GPU time (events around the replays), over the
roofline, kernels per step (torch.profiler, one eager step), their summed time and what the step spends between
them, the top kernels, and the first step's logits against the first variant's (the bf16 tolerance of
serve.tp.logits_tol). With PDL a GEMV starts before the kernel ahead of it ends and waits inside, so the profiled
kernels' summed time counts that wait and "between them" shrinks by it: judge PDL by the step's wall time and x roof.
    python bench/tp_step.py --model llama-8b --tp 1 4 [--variants eager compiled autotuned] [--tiles F] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # as the bench's ranks compile (serve/tp.py)
import torch  # noqa: E402 - after the environment inductor reads at import

from ccbridge import gputimer, textfit
from ccbridge.errors import UsageError
from ccbridge.serve import decode, engine, gemv, tp

PROMPT, STEPS = 128, 64


# variant -> (engine.build's compiled, torch.compile's mode, the BLAS library torch's GEMMs call, K-major weights,
# engine.build's fused, PDL for the fused GEMVs: None as CCBRIDGE_GEMV_PDL says)
VARIANTS = {"eager": (False, None, "cublas", False, False, None),
            "compiled": (True, None, "cublas", False, False, None),
            "autotuned": (True, "max-autotune-no-cudagraphs", "cublas", False, False, None),
            "compiled-lt": (True, None, "cublaslt", False, False, None),
            "compiled-kn": (True, None, "cublas", True, False, None),
            "fused": (True, None, "cublas", False, True, None), "fused-pdl": (True, None, "cublas", False, True, True),
            "fused-nopdl": (True, None, "cublas", False, True, False)}


def build(spec, n, dev, dtype, variant: str, env_pdl: bool):
    compiled, engine.MODE, blas, k_major, fused, pdl = VARIANTS[variant]
    gemv.PDL = env_pdl if pdl is None else pdl  # read as torch.compile traces the fused GEMVs, at the first step
    torch.backends.cuda.preferred_blas_library(blas)
    m = engine.build(spec, 0, n, dev, dtype, 0, None, compiled, fused)  # rank 0's shard, no collective
    if k_major:  # the same values, each weight's transpose contiguous (F.linear then calls an NN GEMM)
        for lay in m.layers:
            for name in ("qkv", "gate_up", "o", "down"):
                setattr(lay, name, getattr(lay, name).t().contiguous().t())
        m.lm_head = m.lm_head.t().contiguous().t()
    return m


@torch.no_grad()
def measure(m, spec, dev) -> dict:
    ids = decode.prompts(spec["vocab_size"], 1, PROMPT, 0).to(dev)
    cache = m.static_cache(1, PROMPT + STEPS + 8)
    out = m(input_ids=ids, past_key_values=cache, cache_position=torch.arange(PROMPT, device=dev), use_cache=True,
            logits_to_keep=1)
    first = out.logits[:, -1].float()
    tok = torch.zeros((1, 1), dtype=torch.int64, device=dev)
    pos = torch.full((1, 1), PROMPT, dtype=torch.int64, device=dev)
    cp = torch.tensor([PROMPT], device=dev)
    step = lambda: m(input_ids=tok, position_ids=pos, past_key_values=cache, cache_position=cp, use_cache=True,
                     logits_to_keep=1).logits[:, -1].argmax(-1)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    top: dict[str, list[float]] = {}
    for e in kern:
        top.setdefault(e.name[:60], []).append(e.time_range.elapsed_us())
    g, nxt = gputimer.graphed(torch, step)
    host_tok = torch.zeros((1, 1), dtype=torch.int64)
    walls, a, b = [], torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(3):
        a.record()
        t0 = time.perf_counter()
        for i in range(STEPS - 8):
            pos.fill_(PROMPT + i)  # as the bench: inputs in, one replay, the token back
            tok.copy_(host_tok, non_blocking=True)
            g.replay()
            host_tok[0, 0] = nxt.item()
        b.record()
        b.synchronize()
        walls.append(((time.perf_counter() - t0) * 1e3 / (STEPS - 8), a.elapsed_time(b) / (STEPS - 8)))
    roof = m.weight_bytes(1) / (statistics.median(gputimer.device_copy_gbps(torch, dev, 5)) * 1e9) * 1e3
    wall, gpu = statistics.median(w for w, _ in walls), statistics.median(x for _, x in walls)
    ranked = sorted(((sum(v), k, len(v)) for k, v in top.items()), reverse=True)  # every kernel to the JSON
    return {"wall_ms": wall, "gpu_ms": gpu, "roofline_ms": roof, "over_roof": wall / roof,
            "kernels_per_step": len(kern), "top": [(k, n, t) for t, k, n in ranked], "first_logits": first}


def tiles(path: str) -> dict:
    """bench/gemv.py's --json rows as serve/gemv.py's TUNED: (n, k) -> each shape's best tile (3 ints)."""
    with open(path) as fh:
        out = {(int(r["n"]), int(r["k"])): tuple(int(v) for v in r["tile"]) for r in json.load(fh)}
    if not out or any(len(t) != 3 for t in out.values()):
        raise ValueError("no rows, or a tile that is not 3 numbers")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-8b", choices=sorted(decode.PRESETS))
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--variants", nargs="+", default=["compiled", "fused"], choices=list(VARIANTS))
    ap.add_argument("--json")
    ap.add_argument("--tiles", help="bench/gemv.py --json output: the fused GEMVs take each shape's best tile from it "
                                    "(instead of the engine's tuning)")
    args = ap.parse_args()
    if min(args.tp) < 1:
        print(f"tp_step: --tp takes degrees of 1 or more (got {min(args.tp)})", file=sys.stderr)
        return 2
    if args.tiles:
        try:
            gemv.TUNED.update(tiles(args.tiles))
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = e.strerror if isinstance(e, OSError) else f"not bench/gemv.py's --json rows ({e})"
            print(textfit.cut(f"tp_step: --tiles {args.tiles}: {why}", textfit.WIDTH), file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("tp_step: needs a CUDA GPU", file=sys.stderr)
        return 2
    spec, dev = decode.PRESETS[args.model], torch.device("cuda", 0)
    try:
        env_pdl = gemv.pdl_from_env(dev, graphs=True)  # its steps replay as CUDA graphs
    except UsageError as e:
        print(textfit.cut(f"tp_step: {e}", textfit.WIDTH), file=sys.stderr)
        return 2
    rows, bad = [], 0
    for n in args.tp:
        ref = None
        for v in args.variants:
            t0 = time.perf_counter()
            m = build(spec, n, dev, torch.bfloat16, v, env_pdl)
            r = measure(m, spec, dev)
            first = r.pop("first_logits")
            ref = first if ref is None else ref
            diff = float((first - ref).abs().max() / ref.abs().max())
            ok = diff <= tp.logits_tol(torch.bfloat16, spec["num_hidden_layers"])
            bad += not ok
            pdl = bool(m.gemv_tiles and gemv.PDL and gemv.launches_pdl(dev))  # the PDL layout elsewhere: plain
            rows.append(dict(r, model=args.model, tp=n, variant=v, logits_vs_first=diff, within_tol=ok,
                             seconds=time.perf_counter() - t0, gemv_tiles=m.tiles_used(), gemv_pdl=pdl))
            print(f"tp {n} {v:<9} wall {r['wall_ms']:7.3f} ms  gpu {r['gpu_ms']:7.3f}  roof {r['roofline_ms']:6.3f}"
                  f"  x{r['over_roof']:5.2f}  kernels {r['kernels_per_step']:5d}  logits {diff:.4f}"
                  f"{'' if ok else ' BEYOND'}  ({time.perf_counter() - t0:.0f} s)", flush=True)
            busy = sum(us for _, _, us in r["top"]) / 1e3  # the profiled step's kernels, end to end of each
            print(f"      kernels {busy:.3f} ms of the step; between them {r['wall_ms'] - busy:.3f} ms "
                  f"({(r['wall_ms'] - busy) * 1e3 / max(r['kernels_per_step'], 1):.2f} us a kernel)")
            for name, cnt, us in r["top"][:6]:
                print(f"      {us / 1e3:8.3f} ms  x{cnt:<5d} {name}")
            if m.gemv_tiles:
                shown = ", ".join(f"{shape} {'/'.join(map(str, t))}" for shape, t in m.tiles_used().items())
                print(textfit.cut(f"      GEMVs {'with' if pdl else 'without'} PDL ({gemv.ENV}); tiles {shown}",
                                  textfit.WIDTH))
            del m
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
