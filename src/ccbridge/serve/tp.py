"""Tensor-parallel decode: decode.py's bench with the model split over N ranks, one process per GPU.

Why: confidential AI serves tensor-parallel across a multi-GPU tenant, and under CC every cross-GPU operation
pays a fixed toll (bridge law, section 6: +10-15 us on B300). Tensor parallelism pays it twice per layer per
token, so a wider split keeps less. This bench measures tok/s per degree and batch, natively or under the
emulator (`ccbridge run --profile b300 -- ccbridge bench decode --tp 2 ...`: the interposer is LD_PRELOADed
through the environment, which the ranks inherit).

The model is serve/engine.py's, as an engine runs one: each rank builds only its own shard (a 70B-class preset
fits no single GPU), fused QKV and gate-up projections, one all-reduce after each layer's attention and MLP, and
none at all at world size 1 (--tp 1 is the single-GPU case: no collective, as vLLM skips it). Embeddings, norms
and lm_head are replicated, so every rank computes the logits, hence the greedy token, from the same all-reduced
hidden state.

Ranks: ccbridge.ranks starts one per GPU (rank r on cuda:r over NCCL; gloo ranks in float32 on --device cpu,
so CI tests TP=2 without a GPU). Each (batch, mode) runs as decode.bench runs it (decode.measure: warm-up, then
timed runs traced alone under `ccbridge run --record`, each run's timed steps between ccbridge.mark("begin")
and ("end") for account's per-rank windows), in every rank at once.

Judged where tokens must be equal: across modes within one degree (the same kernels, the same order of sums)
and across ranks (every rank takes rank 0's tokens, outside the timing, and the group counts those that
differed). Across degrees the order of bf16 sums differs, and random weights leave near-flat logits whose argmax
can flip: there the first decode step's logits (the prefill's last position) are compared with the smallest
degree's within logits_tol() of its largest logit, recorded in the rows; where tokens part, the first diverging
token and whether it was a near tie are information, not failure.

Each row also says what the step is made of (rank 0's): its weight bytes read per step and the HBM roofline they
give at this GPU's measured copy rate (which counts read plus write, as the probe's device copy does), the native
step outside the collectives (the same decode with the all-reduces left out, each rank's kernels alone, natively)
over the roofline, what the collectives add to the step (the native step less that), and the roofline's share of
the step's GPU busy time (hbm_share: what a projection to a faster GPU takes as F, `--project-by hbm:F`;
emulate/targets.py). Under the emulator each (batch, mode) is also run with emulation paused in the same processes
(emulate.interposer.emulation_paused): the native step, and the predicted emulated step (the native step plus
each toll the step pays: collectives x (per-op toll + bandwidth term), the graph or kernel launches, the crossings
and the readback's round trip) beside the measured one.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch
import torch.distributed as dist

from ccbridge import busbw, env, gputimer, ranks
from ccbridge.emulate import interposer
from ccbridge.emulate import trace as emu_trace
from ccbridge.errors import GpuError, UsageError
from ccbridge.results import Result, Row
from ccbridge.serve import decode, engine, fits, gemv, gemv_tune
from ccbridge.serve.judge import Judge

TEST = "decode_tp"  # rows' test name: not decode's, whose readers (advise) key its rows by batch and mode alone
MAX_CPU_RANKS = 4  # gloo ranks on --device cpu: enough to test a split, few enough for a CI runner
STALL_S = 900.0  # no word from any rank this long: stuck (a 70B shard builds, and one (batch, mode) runs, in less)
LOGITS_TOL_F32 = 1e-4  # of the reference's largest logit (decode.TIE_TOL's): float32 (gloo ranks) agree to ~1e-6
# In bf16 every layer's sums run in another order at another degree, so the first-step logits drift apart like a
# random walk of rounding: measured at 0.9-1.4 x u x sqrt(layers) of the largest logit (u = 2^-8, bf16's unit
# roundoff; gloo ranks on the CPU at 2, 32 and 80 layers, and llama-8b TP4 vs TP1, llama-70b TP4 vs TP2 on H200,
# bench/RESULTS.md 2026-11-26). The tolerance allows 4x that; a sharding error is caught exactly in float32.
LOGITS_TOL_WALKS = 4.0


def logits_tol(dtype, layers: int) -> float:
    """How far degrees' first-step logits may differ, as a fraction of the reference's largest logit."""
    if dtype == torch.float32:
        return LOGITS_TOL_F32
    return LOGITS_TOL_WALKS * torch.finfo(dtype).eps / 2 * math.sqrt(layers)
LOGITS_SEQS = 8  # sequences whose first-step logits each degree sends for the comparison
_SPLIT = (("num_attention_heads", "attention heads"), ("num_key_value_heads", "key-value heads"),
          ("intermediate_size", "MLP intermediate features"))


def _divides(name: str, counts: dict, n: int) -> None:
    for key, what in _SPLIT:
        if counts[key] % n:
            raise UsageError(f"--tp {n}: {name} has {counts[key]} {what}, which {n} ranks cannot split evenly")


def check(model: str, degrees: list[int], device: str) -> None:
    """The degrees for this model and device, before any GPU is looked for (bench() counts the GPUs after
    decode.check has found CUDA)."""
    dev = torch.device(device)
    if not degrees or min(degrees) < 1:
        raise UsageError("--tp degrees must be at least 1")
    twice = [n for i, n in enumerate(degrees) if n in degrees[:i]]
    if twice:
        raise UsageError(f"--tp {twice[0]} is given twice")
    if dev.type == "cuda" and dev.index is not None:
        raise UsageError(f"--device {device}: --tp puts rank r on cuda:r; give --device cuda "
                         "(CUDA_VISIBLE_DEVICES picks GPUs)")
    if dev.type == "cpu" and max(degrees) > MAX_CPU_RANKS:
        raise UsageError(f"--tp {max(degrees)}: at most {MAX_CPU_RANKS} ranks on --device cpu")
    for n in sorted(degrees) if model in decode.PRESETS else ():  # an unknown model: decode.check names it
        _divides(model, decode.PRESETS[model], n)
        if decode.PRESETS[model]["intermediate_size"] % (engine.MLP_UNIT * n):
            raise UsageError(f"--tp {n}: {model}'s MLP width is not a multiple of {engine.MLP_UNIT * n}")


def run_ranks(n: int, target: Callable, *args, device: str = "cpu", on_message: Callable = lambda rank, obj: None,
              stall_s: float = STALL_S) -> list:
    """target(rank, n, dev, send, *args) on n tensor-parallel ranks started by ccbridge.ranks: rank r on cuda:r over
    NCCL, or gloo ranks on the CPU, meeting at a free port; their return values, by rank. send(obj) in a rank calls
    on_message(rank, obj) here. A rank's failure is one line (its class kept when it is ccbridge's, else a
    GpuError); ranks that say nothing for stall_s seconds are stopped."""
    cuda = torch.device(device).type == "cuda"
    # the engine's compiled halves are compiled in the rank itself: inductor's worker processes would be more
    # processes of the job (each loading the interposer under `ccbridge run`)
    return ranks.run(n, target, *args, label="tensor-parallel", backend="nccl" if cuda else "gloo",
                     devices=list(range(n)) if cuda else None, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"},
                     on_message=on_message, stall_s=stall_s)


def _agree(runs: list, dev) -> int:
    """Every rank takes rank 0's tokens of each run; the tokens that differed from them, over all ranks."""
    differ = 0
    for r in runs:
        t = r.tokens.to(dev)
        dist.broadcast(t, src=0)
        mine, r.tokens = r.tokens, t.cpu()
        differ += int((mine != r.tokens).sum())
    total = torch.tensor([differ], dtype=torch.int64, device=dev)
    dist.all_reduce(total)
    return int(total)


def _outside_ms(m, ids, output, mode, iters, graphs, host_prep_us) -> float | None:
    """This rank's native step with its all-reduces left out (its shard's kernels alone, the same decode, emulation
    and trace paused): the step's time outside its collectives, measured, not the step less the collectives timed
    apart (64 all-reduces replayed alone took 1.7 ms of a 3.4 ms TP4 step on 4x H200, whose kernels alone took 2.6:
    alone they wait for the other ranks' replays to start). None at world size 1: there the step is all of it."""
    if m.all_reduce is None:
        return None
    keep, m.all_reduce = m.all_reduce, None
    try:
        runs = _native(m, ids, output, mode, max(2, iters), graphs, host_prep_us)
    finally:
        m.all_reduce = keep
    return sorted(r.wall_s / (output - 1) * 1e3 for r in runs)[len(runs) // 2]  # as _step_rows takes native's


def _first_logits(m, ids: torch.Tensor, dev) -> torch.Tensor:
    """The first decode step's logits (the prefill's last position) of the first LOGITS_SEQS sequences."""
    return m(input_ids=ids[:LOGITS_SEQS].to(dev), logits_to_keep=1).logits[:, -1].float().cpu()


def _native(m, ids, output, mode, iters, graphs, host_prep_us) -> list:
    """The same timed runs with emulation paused (not traced): the native step in the same processes."""
    with interposer.emulation_paused(required=False), emu_trace.paused(required=False):
        return [decode.decode(m, ids, output, mode, graphs=graphs, host_prep_us=host_prep_us) for _ in range(iters)]


@torch.no_grad()
def _bench_rank(rank: int, n: int, dev, send, job: dict) -> None:
    """One rank of one degree: build its shard, then every (batch, mode) as decode.bench runs it, in step with
    the other ranks; rank 0 sends each (batch, mode)'s rows, errors and tokens, and each batch's first logits."""
    say = send if rank == 0 else (lambda _: None)
    model, prompt, output, warmup, iters = job["model"], job["prompt"], job["output"], job["warmup"], job["iters"]
    spec = decode.PRESETS[model]
    with emu_trace.paused(required=False) as recording:  # only the timed runs are traced (decode.measure)
        say(("log", f"tp {n}: building {model}'s shards (random weights, seed {job['seed']}), rank 0 on {dev}"))
        gemv.PDL = gemv.pdl_from_env(dev, job["graphs"])  # PDL where steps replay as graphs (engine.build traces it)
        m = engine.build(spec, rank, n, dev, decode.dtype_for(dev), job["seed"], dist.all_reduce if n > 1 else None)
        if m.gemv_tiles:  # rank 0's tiles, which every rank runs
            say(("tiles", m.tiles_used()))
        emulating = interposer.emulating()
        # the roofline's rate (the probe's device copy), on rank 0 alone: the others' rows are not sent
        copy = sorted(gputimer.device_copy_gbps(torch, dev, 5))[2] if rank == 0 and dev.type == "cuda" else None
        with decode.deterministic_attention():
            for b in job["batches"]:
                ids = decode.prompts(spec["vocab_size"], b, prompt, job["seed"])
                say(("logits", {"batch": b, "logits": _first_logits(m, ids, dev)}))
                judge, want = Judge(m, ids), None
                for mode in job["modes"]:
                    what = f"tp {n}, batch {b}, mode {mode}"
                    say(("log", f"{what}: {warmup} warm-up + {iters} timed runs{decode.memory_note(dev)}"))
                    try:
                        runs = decode.measure(m, ids, output, mode, warmup, iters, recording, graphs=job["graphs"],
                                              host_prep_us=job["host_prep_us"])
                        # the native step beside an emulated or traced one: the trace's own cost is not the step's
                        native = _native(m, ids, output, mode, iters, job["graphs"], job["host_prep_us"]) \
                            if emulating or recording else None
                        outside = _outside_ms(m, ids, output, mode, iters, job["graphs"], job["host_prep_us"])
                    except torch.OutOfMemoryError as e:  # the parent keeps the rows so far and says where
                        send(("oom", f"{what}: {str(e).split('. ')[0]}{decode.memory_note(dev)}"))
                        raise
                    differ = _agree(runs, dev) if n > 1 else 0
                    if want is None:
                        want = (f"tp {n} {mode}", runs[0].tokens)
                    bad, ties = decode.verdict(judge, want, runs, what)
                    if rank:
                        continue
                    step = {"weight_bytes": m.weight_bytes(b), "copy_gbps": copy, "outside_ms": outside,
                            "native_step_ms": [r.wall_s / (output - 1) * 1e3 for r in native] if native else None}
                    extra = {"tokens_match": bad is None, "near_ties": len(ties), "ranks_agree": differ == 0,
                             "reference": want[0], "collectives_per_step": 2 * len(m.layers) if n > 1 else 0}
                    wrong = [bad] if bad else []
                    if differ:
                        wrong.append(f"{what}: the ranks sampled different tokens ({differ} differ from rank 0's)")
                    send(("rows", {"batch": b, "mode": mode, "errors": wrong, "tokens": runs[0].tokens.tolist(),
                                   "step": step, "per_step": _per_step(runs[warmup:], output),
                                   "rows": decode.rows_of(TEST, runs[warmup:], output, extra, model=model, tp=n,
                                                          batch=b, mode=mode, graphs=job["graphs"])}))


def _per_step(runs: list, output: int) -> dict:
    """Crossings per decode step (the last run's counts over its steps)."""
    return {k: v / (output - 1) for k, v in runs[-1].stats.items()}


def predicted_ms(params: dict, n: int, batch: int, hidden: int, collectives: int, per_step: dict, graphs: bool,
                 native_ms: float, itemsize: int = 2) -> tuple[float | None, dict]:
    """The emulated step the toll model predicts from the native one (ms) and each toll in it (us), from the
    profile's parameters as the run's env stamp holds them (env.emulation.params, strings): every collective's
    per-op toll (none above nccl_toll_max_bytes) and bandwidth term (busbw's wire bytes of the step's hidden state,
    at this machine's measured GPU-GPU rate, x (1/kept - 1)), the step's launch (one graph; eager launches are not
    counted: None), each input crossing's toll and the readback's toll and round trip. A projected run (dilation):
    None, its step is in dilated time."""
    f = lambda key, default=0.0: float(params.get(key, default))  # noqa: E731
    if not graphs or not params or f("dilation", 1) != 1:  # projected: the step is in dilated time, not modelled
        return None, {}
    size = batch * hidden * itemsize  # one all-reduce of the step's hidden state
    wire = busbw.factor("all_reduce", n) * size if n > 1 else 0
    link = f("native_nvlink_gbps")
    capped = f("nccl_toll_max_bytes") and size > f("nccl_toll_max_bytes")  # the interposer's toll_ns()
    per_op = (0.0 if capped else f("nccl_toll_us")) + (
        wire / (link * 1e3) * (1 / f("nvlink_kept", 1) - 1) if link > 0 else 0.0)
    tolls = {"collectives": collectives * per_op,
             "launch": f("launch_toll_us") * (f("mgpu_launch_factor", 1) if n > 1 or f("multi_gpu") else 1),
             "inputs": (per_step.get("h2d", 0) + per_step.get("staged", 0)) * f("h2d_toll_us"),
             "readback": (per_step.get("readback", 0) + per_step.get("drained", 0)) * (f("d2h_toll_us")
                                                                                        + f("sync_toll_us"))}
    return native_ms + sum(tolls.values()) / 1e3, tolls


def _step_rows(got: dict, n: int, model: str, graphs: bool, params: dict) -> list:
    """The (batch, mode)'s rows about its step: the roofline (rank 0's weight bytes at its copy rate), what the
    collectives add to the native step, the native step outside them over the roofline; emulated: the native step
    (emulation paused) and the predicted emulated step beside the measured one."""
    st, b, mode = got["step"], got["batch"], got["mode"]
    p = dict(model=model, tp=n, batch=b, mode=mode, graphs=graphs)
    measured = next(r for r in got["rows"] if r.metric == "step_ms")
    native = st["native_step_ms"] or [measured.median]
    native_ms = sorted(native)[len(native) // 2]
    outside = native_ms if st["outside_ms"] is None else st["outside_ms"]
    out = [Row.of(TEST, "collective_ms", "ms", [native_ms - outside], **p)]
    out[-1].extra.update(outside_collectives_ms=outside, what="the native step less the same step with its "
                         "all-reduces left out (each rank's kernels alone): what the collectives add to it")
    if st["copy_gbps"]:
        roof = st["weight_bytes"] / (st["copy_gbps"] * 1e9) * 1e3
        out += [Row.of(TEST, "roofline_ms", "ms", [roof], **p), Row.of(TEST, "outside_over_roofline", "x",
                                                                       [outside / roof], **p)]
        out[-2].extra.update(weight_bytes=st["weight_bytes"], copy_gbps=st["copy_gbps"],
                             what="this GPU's weight bytes per step at its measured copy rate (read plus write)")
        out[-1].extra["outside_collectives_ms"] = outside
        busy = next(r for r in got["rows"] if r.metric == "tok_per_s").extra.get("gpu_busy")
        if busy:  # the GPU is never dilated nor emulated: its busy ms are this GPU's in any run
            gpu_ms = busy * measured.median
            out.append(Row.of(TEST, "hbm_share", "of GPU time", [min(1.0, roof / gpu_ms)], **p))
            out[-1].extra.update(gpu_busy_ms=gpu_ms, what="the step's GPU time at its HBM roofline: the F of "
                                                          "--project-by hbm:F for this step")
    if st["native_step_ms"]:
        out.append(Row.of(TEST, "native_step_ms", "ms", native, **p))
        out[-1].extra["what"] = "the same runs with emulation and tracing paused, in the same processes"
        pred, tolls = predicted_ms(params, n, b, decode.PRESETS[model]["hidden_size"],
                                   got["rows"][0].extra.get("collectives_per_step", 0), got["per_step"], graphs,
                                   native_ms)
        if pred is not None:
            out.append(Row.of(TEST, "predicted_step_ms", "ms", [pred], **p))
            out[-1].extra.update(tolls_us=tolls, measured_ms=measured.median,
                                 off_by=measured.median / pred - 1)
    return out


def _compare_degrees(logits: dict, tol: float) -> dict:
    """Each (degree, batch)'s first-step logits against the smallest degree's: the largest difference as a fraction
    of the reference's largest logit, and whether it is within tol (logits_tol's, recorded with it)."""
    out = {}
    for (n, b), lg in logits.items():
        ref_n = min(k for k, bb in logits if bb == b)
        ref = logits[(ref_n, b)]
        rel = float((lg - ref).abs().max() / ref.abs().max())
        out[(n, b)] = {"logits_vs": ref_n, "logits_rel_diff": rel, "logits_tolerance": tol, "logits_within": rel <= tol}
    return out


def _first_parting(tokens: list, ref: list) -> str | None:
    """Where a degree's tokens first part from the smallest degree's: 'sequence s, token t' (None: never)."""
    for s, (a, b) in enumerate(zip(tokens, ref)):
        for t, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"sequence {s}, token {t}"
    return None


def fused_gemv_setting(dev, graphs: bool = False) -> str:
    """The result's fused_gemv setting, as a rank on a GPU like dev runs its batch-1 GEMVs: fused or not
    (engine.fuses), its tiles, and launched with PDL (by default in CUDA graphs) only where the rank's launches
    carry it (gemv.launches_pdl(): CCBRIDGE_GEMV_PDL=1 elsewhere runs the PDL layout launched plainly). A bad
    CCBRIDGE_GEMV_PDL is refused here, fused or not."""
    pdl = gemv.pdl_from_env(dev, graphs) and gemv.launches_pdl(dev)
    if not engine.fuses(dev):
        return "off: cuBLAS/CPU GEMMs at every batch"
    tiles = "tuned on rank 0's GPU, run by every rank (gemv_tiles)" if gemv_tune.enabled() else \
        f"by rule ({gemv_tune.ENV}=0)"
    return (f"batch 1: the weight GEMVs by serve/gemv.py's Triton kernels, tiles {tiles}, launched "
            f"{'with' if pdl else 'without'} PDL")


def bench(model: str, degrees: list[int], batches: list[int], prompt: int, output: int, modes: list[str],
          device: str = "cuda", iters: int = 3, warmup: int = 1, graphs: bool = False, seed: int = 0,
          log: Callable[[str], None] = lambda _: None, host_prep_us: float = 0.0):
    """Every degree (ascending), batch and mode: a Result of decode_tp rows tok_per_s, step_ms, token_gap_ms (params
    model, tp, batch, mode, graphs; tok_per_s's extra: tokens_match (across modes within the degree), near_ties,
    ranks_agree, collectives_per_step, the first-step logits against the smallest degree's and the tolerance,
    where tokens first part from the smallest degree's, gpu_busy and the crossing counts), and the step's rows
    (_step_rows). A degree that runs out of memory keeps its rows so far, says where in Result.errors, and the next
    degree runs; any other rank failure raises."""
    check(model, degrees, device)
    dev = decode.check(model, batches, prompt, output, modes, device, graphs, tp=True)
    if dev.type == "cuda" and max(degrees) > torch.cuda.device_count():
        raise UsageError(f"--tp {max(degrees)}: one process per GPU, and torch sees {torch.cuda.device_count()} GPU(s)")
    fits.check(model, degrees, dev, decode.dtype_for(dev))
    decode.check_host_prep(host_prep_us)
    stamp = env.stamp()
    params = (stamp.get("emulation") or {}).get("params", {}) if stamp.get("emulation", {}).get("active") else {}
    t_start = time.monotonic()
    layers = decode.PRESETS[model]["num_hidden_layers"]
    settings = decode.settings_of(model, dev, decode.dtype_for(dev), prompt, output, batches, modes, iters, warmup,
                                  graphs, seed, host_prep_us)
    settings.update(degrees=sorted(degrees), backend="nccl" if dev.type == "cuda" else "gloo",
                    all_reduces_per_step=2 * layers, replicated="embeddings, norms, lm_head", engine="serve/engine.py",
                    fused_gemv=fused_gemv_setting(dev, graphs),
                    logits_tolerance=logits_tol(decode.dtype_for(dev), layers),
                    reference="within a degree: its first mode's tokens; across degrees: the smallest degree's "
                              "first-step logits")
    res = Result(kind="decode_tp", env=stamp, settings={"decode_tp": settings})
    logits, tokens, rows_of = {}, {}, {}
    for n in sorted(degrees):
        got, oom = [], []

        def on_message(rank, msg):
            kind, body = msg
            if kind == "log":
                log(body)
            elif kind == "oom":
                oom.append(body)
            elif kind == "logits":
                logits[(n, body["batch"])] = body["logits"]
            elif kind == "tiles":
                settings.setdefault("gemv_tiles", {})[str(n)] = body
            else:
                got.append(body)

        job = dict(model=model, batches=list(batches), prompt=prompt, output=output, modes=list(modes), iters=iters,
                   warmup=warmup, graphs=graphs, seed=seed, host_prep_us=host_prep_us)
        try:
            run_ranks(n, _bench_rank, job, device=str(dev), on_message=on_message)
        except GpuError:
            if not oom:
                raise
            res.errors.append({"test": TEST, "error": f"{oom[0]}; the larger batches and later modes did not run "
                                                      f"at tp {n}"})
        for g in got:
            res.rows += g["rows"] + _step_rows(g, n, model, graphs, params)
            res.errors += [{"test": TEST, "error": e} for e in g["errors"]]
            tokens[(n, g["batch"], g["mode"])] = g["tokens"]
            rows_of[(n, g["batch"], g["mode"])] = g["rows"][0]
    across = _compare_degrees(logits, settings["logits_tolerance"])
    for (n, b, mode), row in rows_of.items():
        row.extra.update(across.get((n, b), {}))
        ref = tokens.get((min(d for d, bb, mm in tokens if bb == b and mm == mode), b, mode))
        row.extra["first_parting"] = _first_parting(tokens[(n, b, mode)], ref) if ref else None
        if not row.extra.get("logits_within", True):
            res.errors.append({"test": TEST, "error": f"tp {n}, batch {b}: first-step logits differ from tp "
                               f"{row.extra['logits_vs']}'s by {row.extra['logits_rel_diff']:.3g} of the largest, "
                               f"beyond {row.extra['logits_tolerance']:.2g}"})
    res.duration_s = time.monotonic() - t_start
    return res


def render(res) -> str:
    """A table, one line per (tp, batch, mode): tok/s, step time, the step outside the collectives over the HBM
    roofline, the predicted emulated step (emulated runs), keep vs TP=1, and the verdicts."""
    s = res.settings["decode_tp"]
    where = "one process per GPU, NCCL" if s["backend"] == "nccl" else "CPU ranks, gloo"
    lines = [f"# ccbridge bench decode --tp {' '.join(map(str, s['degrees']))}: {s['model']} (random weights, "
             f"shards built per rank), {s['dtype']} on {s['device']} ({where})",
             f"# prompt {s['prompt']}, output {s['output']}, {'CUDA graphs' if s['graphs'] else 'eager'}, "
             f"{s['iters']} timed runs; {s['all_reduces_per_step']} all-reduces per step (none at TP=1)",
             "# roof: the native step outside the collectives / its HBM roofline; pred: the predicted emulated step",
             f"# logits: first-step logits vs the smallest degree's, within {s['logits_tolerance']:.2g} of the largest "
             f"(in bf16 it grows with the depth)"]
    if s.get("host_prep_us"):
        lines.append(f"# {s['host_prep_us']:g} us of host preparation per step (modelled engine work)")
    if banner := env.emulated_banner(res.env.get("emulation", {})):  # EMULATED, or a projected CC-off run
        lines.append(f"# {banner}")
    first = min(s["degrees"])
    lines.append(f"{'tp':>3} {'batch':>6} {'mode':<7} {decode.TIMING_HEADER} {'roof':>5} {'pred ms':>8} "
                 f"{f'x TP={first}':>7}  tokens; logits")
    by = {(r.params["tp"], r.params["batch"], r.params["mode"], r.metric): r for r in res.rows}
    parted = []
    for r, timing in decode.timing_columns(res, ("tp", "batch", "mode")):
        tp, b, mode = r.params["tp"], r.params["batch"], r.params["mode"]
        one = by.get((first, b, mode, "tok_per_s"))
        roof, pred = by.get((tp, b, mode, "outside_over_roofline")), by.get((tp, b, mode, "predicted_step_ms"))
        # the row's verdict fits 120 columns; what explains it goes under the table
        word = ("RANKS DIFFER" if not r.extra.get("ranks_agree", True) else
                "same" if r.extra["tokens_match"] else "DIFFER")  # tokens_word's, its near ties counted below
        if n := r.extra.get("near_ties"):
            parted.append(f"# tp {tp} batch {b} {mode}: its modes' tokens part at {n} near tie{'s' if n > 1 else ''}")
        if "logits_rel_diff" in r.extra and tp != r.extra.get("logits_vs"):
            word += f"; {r.extra['logits_rel_diff']:.1e}" + ("" if r.extra["logits_within"] else " BEYOND")
        if r.extra.get("first_parting"):
            parted.append(f"# tp {tp} batch {b} {mode}: tokens part from tp {r.extra.get('logits_vs')}'s at "
                          f"{r.extra['first_parting']} (another order of sums; information, not failure)")
        lines.append(f"{tp:>3} {b:>6} {mode:<7} {timing} {'-' if roof is None else f'{roof.median:.2f}':>5} "
                     f"{'-' if pred is None else f'{pred.median:.3f}':>8} "
                     f"{'-' if one is None else f'{r.median / one.median:.2f}':>7}  {word}")
    return "\n".join(lines + parted)
