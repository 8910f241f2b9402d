"""Advice from a `ccbridge bench kv` result: per scheduling mode the store threshold to run (the lowest warm
TTFT p50, preferring the engine default, threshold 1: no filter, unless another beats it by MARGIN), spill
volumes cited beside; and sync or async scheduling while KV restores are frequent."""

from __future__ import annotations

from ccbridge.advise import serving
from ccbridge.advise.core import Advice, Input, adder, state
from ccbridge.ui import approx_bytes

check = serving.check


def advise(inp: Input) -> list[Advice]:
    out, add = adder(inp)
    rows = {(r.params["threshold"], r.params["mode"], r.metric): r for r in inp.result.rows}
    ttft = {k[:2]: r for k, r in rows.items() if k[2] == "ttft_ms"}
    if not serving.trustworthy(inp, add):
        return out
    best = {}
    for mode in sorted({m for _, m in ttft}):
        by_th = {t: r for (t, m), r in sorted(ttft.items()) if m == mode}
        if 1 not in by_th:
            add("all", f"{mode} scheduling: none yet: measure threshold 1 too (no filter, the engines' default)",
                f"{state(inp)}; thresholds measured: {', '.join(map(str, by_th))}", *by_th.values())
            continue
        th = serving.pick(by_th, sorted(by_th), serving.less)
        best[mode] = (th, by_th[th])
        base = by_th.get(min(by_th))
        spill = rows.get((th, mode, "spill_bytes"))
        spill0 = rows.get((min(by_th), mode, "spill_bytes"))
        why = (f"{state(inp)}, scheduling {mode}: warm TTFT p50 {by_th[th].median:.1f} ms at threshold {th}"
               + (f" vs {base.median:.1f} ms at {min(by_th)}" if th != min(by_th) else "")
               + (f"; spill D2H {approx_bytes(spill.median)}" if spill else "")
               + (f" vs {approx_bytes(spill0.median)}" if spill and spill0 and th != min(by_th) else ""))
        cites = [by_th[th]] + ([base] if th != min(by_th) else []) + [r for r in (spill, spill0) if r]
        cfg = '{"store_threshold": %d}' % th if th >= 2 else "no store_threshold (every evicted block is stored)"
        add("vLLM", f"{mode} scheduling: OffloadingConnector kv_connector_extra_config {cfg}", why, *cites)
        add("torch", f"{mode} scheduling: ccbridge.serve.KVCache(threshold={th})", why, *cites)
    if len(best) > 1:
        at_best = {m: row for m, (_, row) in best.items()}
        mode = serving.pick(at_best, ["async", "sync"], serving.less)
        other = "sync" if mode == "async" else "async"
        a, b = at_best[mode], at_best[other]
        add("vLLM", "scheduling sync while KV restores are frequent (leave --async-scheduling off)" if mode == "sync"
            else "async scheduling (the default) with the offload tier", f"{state(inp)}: warm TTFT p50 {a.median:.1f} "
            f"ms {mode} vs {b.median:.1f} ms {other}, each at its best threshold", a, b)
    return out
