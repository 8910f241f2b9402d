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
    return out


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


def kept(native: Input, cc: Input, add: Add, tok: list[dict]) -> None:
    """A CC-off and a CC (or emulated) decode result with TP degrees: per degree, the share of native tok/s
    the CC run keeps at the largest batch both measured, async (narrower keeps more: bridge law 6)."""
    common = set(tok[0]) & set(tok[1])
    tps = sorted({t for t, _, _ in common if t is not None})
    if len(tps) < 2:
        return
    b = max(bb for _, bb, m in common if m == "async") if any(m == "async" for *_, m in common) else None
    if b is None:
        return
    share = {t: (tok[1][(t, b, "async")], tok[0][(t, b, "async")]) for t in tps if (t, b, "async") in common}
    why = (f"{state(cc)} vs {Path(native.path).name}, batch {b}, async: kept "
           + ", ".join(f"TP {t} {c.median / n.median:.2f}" for t, (c, n) in share.items()))
    for t, (c, n) in share.items():
        add("all", f"TP {t}: keeps {c.median / n.median:.2f} of native tok/s", why, c, n,
            brief=f"{c.median:.0f} vs {n.median:.0f} tok/s")
