"""Advice from a `ccbridge bench decode --tp` result: the tensor-parallel degree to run and, at it, decode's
scheduling advice; beside a CC-off result of the same run, per degree the share of native tok/s kept.

Under GPU-CC every cross-GPU operation pays a per-operation toll set up by the GPU's secure firmware,
whatever its size (bridge law, section 6): tensor parallelism pays it twice per layer per token, so a
narrower split keeps more.
"""

from __future__ import annotations

from pathlib import Path

from ccbridge.advise import decode, serving
from ccbridge.advise.core import Add, Advice, Input, adder, state
from ccbridge.advise.multicast import no_multicast

check = serving.check


def advise(inp: Input) -> list[Advice]:
    out, add = adder(inp)
    if not serving.trustworthy(inp, add):
        return out
    by_tp = decode.tok(inp)
    at_tp = None  # several TP degrees: the modes at the one advised
    if len({t for t, _, _ in by_tp}) > 1:
        at_tp = degree(inp, add, by_tp)
    elif any(t and t > 1 for t, _, _ in by_tp):
        no_multicast(inp, add, "TP above 1 runs its all-reduces on this fabric", *by_tp.values())
    decode.schedule(inp, add, {(b, m): r for (t, b, m), r in by_tp.items() if at_tp is None or t == at_tp},
                    f"TP {at_tp}, " if at_tp else "")
    project_by(inp, add, at_tp)
    return out


HBM_BOUND = 0.9  # an hbm_share at least this: the step is HBM-bound, --project-by hbm (the default) fits it


def project_by(inp: Input, add: Add, at_tp: int | None) -> None:
    """Per batch (at the advised degree, else the smallest; async where measured): where the step's GPU time is
    not HBM-bound (its hbm_share row below HBM_BOUND), the --project-by hbm:F that projects it to a faster GPU;
    the datasheet HBM ratio alone takes all of the GPU time as memory-bound and overstates the target's speed-up
    (bench/RESULTS.md 2026-11-26: an H100 projected to an H200 by HBM ran 11-24% short of the H200's times)."""
    share = {(r.params["tp"], r.params["batch"], r.params["mode"]): r for r in inp.result.rows
             if r.metric == "hbm_share"}
    if not share:
        return
    tp = at_tp if at_tp is not None else min(t for t, _, _ in share)
    proj = (inp.env.get("emulation") or {}).get("projection") or {}
    for b in sorted({b for t, b, _ in share if t == tp}):
        modes = sorted(m for t, bb, m in share if (t, bb) == (tp, b))
        row = share[(tp, b, "async" if "async" in modes else modes[0])]
        if row.median >= HBM_BOUND:
            continue
        why = (f"{state(inp)}; TP {tp}, batch {b}, {row.params['mode']}: {row.median:.2f} of the step's GPU time is "
               "at this GPU's HBM roofline (its weight bytes at the measured copy rate), the rest bound by compute "
               "and launches; --project-by hbm takes all of it as memory-bound")
        if proj.get("by") == "hbm":
            why += f"; this run was projected so (x{proj.get('r', 0):.3g}): its times overstate the target's speed-up"
        add("ccbridge", f"TP {tp}, batch {b}: project it with --project-by hbm:{row.median:.2f}", why, row,
            brief=f"{row.median:.2f} HBM-bound")


def degree(inp: Input, add: Add, tok: dict) -> int:
    """Several TP degrees in one decode result: the narrowest within MARGIN of the best tok/s at the largest
    batch all degrees measured (async where measured: the engines' default), which pays the per-operation
    toll on the fewest GPUs; returns it. tok: {(tp, batch, mode): Row}."""
    tps = sorted({t for t, _, _ in tok})
    batches = set.intersection(*({b for t2, b, _ in tok if t2 == t} for t in tps))
    b = max(batches) if batches else max(b for _, b, _ in tok)
    modes = set.intersection(*({m for t2, bb, m in tok if t2 == t and bb == b} for t in tps))
    mode = "async" if "async" in modes else (sorted(modes) or ["async"])[0]
    at = {t: tok[(t, b, mode)] for t in tps if (t, b, mode) in tok}
    if len(at) < 2:
        return max(tps)
    pick = serving.pick(at, sorted(at), serving.more)
    best = max(at, key=lambda t: at[t].median)
    why = (f"{state(inp)}; batch {b}, {mode}: tok/s " + ", ".join(f"TP {t} {r.median:.0f}" for t, r in at.items())
           + "; every TP all-reduce pays the per-operation toll, twice per layer per token")
    brief = f"TP {pick} {at[pick].median:.0f} tok/s" + ("" if pick == best else f" vs TP {best} {at[best].median:.0f}")
    for stack, setting in (("vLLM", f"--tensor-parallel-size {pick}"), ("SGLang", f"--tp-size {pick}"),
                           ("TRT-LLM", f"tensor_parallel_size={pick}")):
        add(stack, setting, why, *at.values(), brief=brief)
    if max(tps) > 1:
        no_multicast(inp, add, f"TP up to {max(tps)} runs its all-reduces on this fabric", *at.values())
    return pick


def pairs(inputs: list[Input]) -> list[Advice]:
    out = []
    for native, cc in decode.matched(inputs, "decode_tp"):
        recs, add = adder(cc)
        kept(native, cc, add, decode.compare_modes(native, cc, add))
        out += recs
    return out


def own_keep(cc: Input, tp: int, batch: int, mode: str) -> float | None:
    """The step the CC (emulated) run's own processes took natively, emulation paused (its native_step_ms row), over
    the step it took (step_ms): the share kept without the difference between two runs' native steps (up to 7%
    on 4x H200, bench/RESULTS.md 2026-11-27). None where the run has no such rows (a CC hardware run)."""
    rows = {r.metric: r for r in cc.result.rows if r.metric in ("native_step_ms", "step_ms")
            and (r.params.get("tp"), r.params.get("batch"), r.params.get("mode")) == (tp, batch, mode)}
    if len(rows) < 2 or rows["step_ms"].median <= 0:
        return None
    return rows["native_step_ms"].median / rows["step_ms"].median


def kept(native: Input, cc: Input, add: Add, tok: list[dict]) -> None:
    """A CC-off and a CC (or emulated) decode result with TP degrees, at each batch both measured: per degree the
    share of native tok/s the CC run keeps, the degree that keeps most, and two TP=N/2 replicas instead of one
    TP=N where the CC run's tok/s say so (the same GPUs; a wider split pays its tolls on more GPUs)."""
    common = set(tok[0]) & set(tok[1])
    tps = sorted({t for t, _, _ in common if t is not None})
    if len(tps) < 2:
        return
    modes = {m for *_, m in common}
    mode = "async" if "async" in modes else sorted(modes)[0]  # the engines' default where measured
    for b in sorted({bb for _, bb, m in common if m == mode}):
        share = {t: (tok[1][(t, b, mode)], tok[0][(t, b, mode)]) for t in tps if (t, b, mode) in common}
        if len(share) < 2:
            continue
        keep = {t: c.median / n.median for t, (c, n) in share.items()}
        why = (f"{state(cc)} vs {Path(native.path).name}, batch {b}, {mode}: kept "
               + ", ".join(f"TP {t} {k:.2f}" for t, k in keep.items()))
        own = {t: own_keep(cc, t, b, mode) for t in share}
        if all(k is not None for k in own.values()):
            why += ("; against its own processes' native step (emulation paused: the two runs' native steps differ "
                    "by host and process) " + ", ".join(f"TP {t} {k:.2f}" for t, k in own.items()))
        for t, (c, n) in share.items():
            add("all", f"batch {b}, TP {t}: keeps {keep[t]:.2f} of native tok/s", why, c, n,
                brief=f"{c.median:.0f} vs {n.median:.0f} tok/s")
        best = max(keep, key=keep.get)
        add("all", f"batch {b}: TP {best} keeps most ({keep[best]:.2f})", why,
            *(x for pair in share.values() for x in pair), brief=f"of TP {', '.join(map(str, share))}")
        for t in share:
            half = share.get(t // 2) if t % 2 == 0 else None
            if half and 2 * half[0].median > share[t][0].median:
                add("all", f"batch {b}: two TP={t // 2} replicas instead of one TP={t}", why, half[0], share[t][0],
                    brief=f"{2 * half[0].median:.0f} vs {share[t][0].median:.0f} tok/s on {t} GPUs")
