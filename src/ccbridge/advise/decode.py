"""Advice from a `ccbridge bench decode` result: per batch size the scheduling mode to run (the engine
default, async, unless another beats it by MARGIN), the engines' settings for the largest batch, where serving
concurrency lives; and, beside a CC-off result of the same run, the CC tax per mode and the share of the gap
to native async each mode closes (issue 14's recovery hierarchy). decode_tp builds on what is here."""

from __future__ import annotations

from pathlib import Path

from ccbridge.advise import serving
from ccbridge.advise.core import Add, Advice, Input, adder, state
from ccbridge.advise.engines import MODE_STACKS
from ccbridge.choices import DECODE_MODES
from ccbridge.results import Row

check = serving.check

# decode settings two results must share to be compared (the device by its kind: cuda vs cuda:0 is one run)
SAME_RUN = ("model", "checkpoint", "prompt", "output", "graphs", "dtype", "seed")


def tok(inp: Input) -> dict[tuple, Row]:
    """A decode result's tok/s rows by (TP degree or None, batch, mode)."""
    return {(r.params.get("tp"), r.params["batch"], r.params["mode"]): r for r in inp.result.rows
            if r.metric == "tok_per_s"}


def advise(inp: Input) -> list[Advice]:
    out, add = adder(inp)
    if serving.trustworthy(inp, add):
        schedule(inp, add, {(b, m): r for (_, b, m), r in tok(inp).items()})
    return out


def schedule(inp: Input, add: Add, tok: dict[tuple, Row], at: str = "") -> None:
    """Per batch size, the scheduling mode to run; the engines' settings for the largest batch. tok: {(batch,
    mode): Row}; at: what the rows are of, in front of each setting (a TP degree)."""
    batches = sorted({b for b, _ in tok})
    if "async" not in {m for _, m in tok}:
        add("all", "none yet: measure async too (`--modes ... async`), the engines' default a change must beat",
            f"{state(inp)}; modes measured: {', '.join(sorted({m for _, m in tok}))}", *tok.values())
        return
    picks = {}
    for b in batches:
        modes = {m: r for (bb, m), r in tok.items() if bb == b}
        if "async" not in modes:
            continue
        pick = serving.pick(modes, ["async", "sync", "staged", "drain"], serving.more)
        picks[b] = pick
        others = ", ".join(f"{m} {r.median:.0f}" for m, r in modes.items())
        gain = "" if pick == "async" else f" ({modes[pick].median / modes['async'].median:.2f}x async)"
        add("torch", f"{at}batch {b}: {pick} scheduling", f"{state(inp)}; tok/s {others}" + gain, *modes.values(),
            brief=f"{pick} {modes[pick].median:.0f} tok/s{gain}")
    top = max(picks)
    modes = {m: r for (bb, m), r in tok.items() if bb == top}
    why = f"{at}batch {top}: {picks[top]} {modes[picks[top]].median:.0f} tok/s" + (
        "" if picks[top] == "async" else f" vs async {modes['async'].median:.0f}")
    for stack, setting in MODE_STACKS[picks[top]]:
        add(stack, setting, why, *modes.values(), brief=why)
    if not inp.settings.get("graphs") and inp.cc_applies:
        add("all", "measure CUDA graphs too (`ccbridge bench decode --graphs`): one launch toll per step",
            "this run decoded eager; under CC every kernel launch pays the toll")


def matched(inputs: list[Input], kind: str) -> list[tuple[Input, Input]]:
    """Each CC (or emulated) result of this kind with the first CC-off one of the same settings, both clean runs
    on a GPU (what has no advice of its own is no half of a comparison either)."""
    runs = [i for i in inputs if i.kind == kind and serving.unusable(i) is None]

    def key(i: Input) -> tuple:
        s = i.settings
        return tuple(s.get(k) for k in SAME_RUN) + (str(s.get("device", "")).split(":")[0], s.get("host_prep_us") or 0)

    return [(n, c) for c in runs if c.cc_applies
            for n in [next((n for n in runs if not n.cc_applies and key(n) == key(c)), None)] if n]


def compare_modes(native: Input, cc: Input, add: Add) -> list[dict]:
    """A CC-off result beside a CC-on (or emulated) one: per TP degree (None: no TP) and mode at the largest
    batch both measured, the CC tax against the same mode natively and the share of the gap to native async
    that the mode closes. The tok/s rows of each, by (TP, batch, mode)."""
    by_tp = [tok(x) for x in (native, cc)]
    for tp in sorted({t for t, _, _ in by_tp[1]}, key=lambda t: t or 0):
        rows = [{(b, m): r for (t, b, m), r in x.items() if t == tp} for x in by_tp]
        _pair_modes(native, cc, add, rows, f"TP {tp}, " if tp else "")
    return by_tp


def pairs(inputs: list[Input]) -> list[Advice]:
    out = []
    for native, cc in matched(inputs, "decode"):
        recs, add = adder(cc)
        compare_modes(native, cc, add)
        out += recs
    return out


def _pair_modes(native: Input, cc: Input, add: Add, tok: list[dict], at: str) -> None:
    both = {b for b, _ in tok[0]} & {b for b, _ in tok[1]}
    if not both:
        return
    b = max(both)
    nat_async, cc_async = tok[0].get((b, "async")), tok[1].get((b, "async"))
    gap = nat_async.median - cc_async.median if nat_async and cc_async else 0.0
    for mode in DECODE_MODES:
        n, c = tok[0].get((b, mode)), tok[1].get((b, mode))
        if not n or not c or not n.median:
            continue
        why = f"{state(cc)} vs {Path(native.path).name}: {c.median:.0f} vs {n.median:.0f} tok/s"
        if gap > 0 and mode != "async":
            why += (f"; closes {(c.median - cc_async.median) / gap:.0%} of the gap to native async "
                    f"({nat_async.median:.0f})")
        add("torch", f"{at}batch {b}, {mode}: CC tax {1 - c.median / n.median:.0%}", why, c, n,
            brief=f"{c.median:.0f} vs {n.median:.0f} tok/s")
