"""Plain-language findings drawn from a result's rows.

Each rule reads rows only and yields a Finding with a stable id and a
categorical outcome, so `compare` can say which findings changed between a
CC-off and a CC-on run. Rules whose rows are absent say nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ccbridge import stats
from ccbridge.results import Result, Row
from ccbridge.ui import human_bytes


@dataclass
class Finding:
    id: str
    outcome: str  # categorical, compared across runs
    text: str
    shown: bool = True  # False: kept for compare, folded into a summary in reports
    test: str = ""  # the rows' test it reads: compare leaves it out where one side ran no such test


def _one(rows: list[Row], **params) -> Row | None:
    for r in rows:
        if all(r.params.get(k) == v for k, v in params.items()):
            return r
    return None


def small_copies(res: Result):
    rows = res.by_test("smallcopy.d2h32")
    if len(rows) < 2:
        return
    one = min(rows, key=lambda r: r.params["streams"])
    many = max(rows, key=lambda r: r.params["streams"])
    k = many.params["streams"]
    gain = one.median / many.median
    if gain < 1.25:
        yield Finding("smallcopy.overlap", "serialized",
                      f"32-byte D2H copies on {k} streams got no overlap: {many.median:.1f} us per copy at {k} streams "
                      f"vs {one.median:.1f} us at 1 ({gain:.2f}x), so streams of one context serialize.")
    else:
        yield Finding("smallcopy.overlap", "overlapped",
                      f"32-byte D2H copies overlap across streams: {one.median:.1f} us per copy at 1 stream, "
                      f"{many.median:.1f} us at {k} ({gain:.1f}x better).")


_DESCRIBE = {"same": "on the busy stream", "idle": "on an idle stream", "event-wait": "on a stream that event-waits on the busy one"}


def semantics(res: Result):
    rows = res.by_test("semantics.nonblocking")
    for r in rows:
        d, m, s = r.params["dir"], r.params["mem"], r.params["stream"]
        v = r.extra.get("verdict", "?")
        what = f"non_blocking {d.upper()} ({m}) {_DESCRIBE[s]}"
        busy = r.extra.get("busy_ms", 0)
        if v == "blocks":
            text = f"{what} blocked for the whole busy kernel (returned after {r.median:.0%} of the {busy:.0f} ms queued)."
        elif v == "partial":
            text = f"{what} blocked for part of the busy kernel ({r.median:.0%} of {busy:.0f} ms)."
        else:
            text = f"{what} returned at once ({r.extra.get('call_us', 0):.0f} us of {busy:.0f} ms queued)."
        yield Finding(f"semantics.{d}.{m}.{s}", v, text, shown=False)
    # One line per direction and memory kind for the reader.
    for (d, m) in dict.fromkeys((r.params["dir"], r.params["mem"]) for r in rows):
        cases = [r for r in rows if r.params["dir"] == d and r.params["mem"] == m]
        parts = [f"{r.extra.get('verdict')} {_DESCRIBE[r.params['stream']]} ({r.median:.0%} of the queued "
                 f"{r.extra.get('busy_ms', 0):.0f} ms)" for r in cases]
        yield Finding(f"semantics.{d}.{m}", "/".join(r.extra.get("verdict", "?") for r in cases),
                      f"non_blocking {d.upper()} from {m} memory: " + "; ".join(parts) + ".")


def transfer(res: Result):
    rows = [r for r in res.by_test("transfer.sweep") if r.metric == "bandwidth"]
    if not rows:
        return
    top = max(r.params["bytes"] for r in rows)
    for d in ("h2d", "d2h"):
        pin, page = _one(rows, dir=d, mem="pinned", bytes=top), _one(rows, dir=d, mem="pageable", bytes=top)
        if not (pin and page):
            continue
        if page.median > pin.median:
            yield Finding(f"transfer.{d}.pinned_vs_pageable", "pageable-faster",
                          f"{d.upper()} from pageable memory ({page.median:.1f} GB/s) beat pinned ({pin.median:.1f} GB/s) "
                          f"at {human_bytes(top)}: the pinned fast path has collapsed, as under CC.")
        else:
            yield Finding(f"transfer.{d}.pinned_vs_pageable", "pinned-faster",
                          f"{d.upper()} sustained {pin.median:.1f} GB/s pinned and {page.median:.1f} GB/s pageable "
                          f"at {human_bytes(top)}.")
    frac = [r for r in res.by_test("transfer.sweep") if r.metric == "in_call_fraction"
            and r.params["mem"] == "pinned" and r.params["bytes"] == top]
    for r in frac:
        blocked = r.median > 0.8
        yield Finding(f"transfer.{r.params['dir']}.pinned_in_call", "host-blocked" if blocked else "host-free",
                      f"During sustained pinned {r.params['dir'].upper()} the host thread spent {r.median:.0%} of the time "
                      f"inside the copy calls" + (" (asynchrony revoked)." if blocked else "."))


def concurrency(res: Result):
    rows = res.by_test("concurrency.scaling")
    for d in ("h2d", "d2h"):
        gains = {}
        for mode in ("streams", "threads", "contexts", "processes"):
            mrows = sorted((r for r in rows if r.params["mode"] == mode and r.params["dir"] == d), key=lambda r: r.params["n"])
            if len(mrows) >= 2:
                gains[mode] = (mrows[-1].median / mrows[0].median, mrows[0], mrows[-1])
        if not gains:
            continue
        scaling = sorted(m for m, (g, _, _) in gains.items() if g >= 1.3)
        parts = [f"{m} {g:.2f}x ({lo.median:.1f} -> {hi.median:.1f} GB/s at N={hi.params['n']})" for m, (g, lo, hi) in gains.items()]
        outcome = "scales with " + "+".join(scaling) if scaling else "flat"
        lead = f"Aggregate {d.upper()} bandwidth " + (f"rises with {', '.join(scaling)}" if scaling else "does not rise with N")
        yield Finding(f"concurrency.{d}", outcome, f"{lead}: " + "; ".join(parts) + ".")


def launch(res: Result):
    rows = {r.params["mode"]: r for r in res.by_test("launch.cost")}
    if rows:
        parts = [f"{m} {r.median:.2f} us" for m, r in rows.items()]
        yield Finding("launch.cost", "measured", "Empty-kernel launch cost: " + ", ".join(parts) + " per kernel.")


def toll(res: Result):
    rows = res.by_test("toll.h2d_idioms")
    for size in sorted({r.params["bytes"] for r in rows}):
        fresh, pers = _one(rows, idiom="fresh-pinned", bytes=size), _one(rows, idiom="persistent-pinned", bytes=size)
        if fresh and pers:
            ratio = fresh.median / pers.median
            yield Finding(f"toll.{size}", "fresh-costly" if ratio > 2 else "fresh-cheap",
                          f"At {human_bytes(size)}, pin_memory().to(non_blocking=True) took {fresh.median:.0f} us "
                          f"against {pers.median:.0f} us for copy_ into a persistent pinned tensor ({ratio:.1f}x).")


def hostcrypto(res: Result):
    rows = res.by_test("hostcrypto.aes256gcm")
    base = _one(rows, variant="default", op="encrypt", threads=1)
    if not base:
        return
    parts = [f"{base.median:.2f} GB/s per core"]
    masked = {"no-wide-vector": "the wide-vector (VAES/VPCLMUL) paths", "no-aes-ni": "every AES-NI path"}
    for v, what in masked.items():
        r = _one(rows, variant=v, op="encrypt", threads=1)
        # A ratio only where the rows' p10-p90 ranges are apart (as compare's ratio range judges): on a loaded
        # machine the masked/default ratio went 0.39x to 2.22x run to run, noise stated as a finding.
        if not r:
            continue
        if min(r.n, base.n) < 3:  # no range to judge by
            parts.append(f"with {what} masked, too few samples to compare")
        elif stats.apart((r.p10, r.p90), (base.p10, base.p90)):
            parts.append(f"{r.median / base.median:.2f}x with {what} masked")
        else:
            parts.append(f"with {what} masked, no difference beyond this run's noise (p10-p90 ranges overlap)")
    yield Finding("hostcrypto", "measured", "CPU AES-256-GCM (OpenSSL): " + "; ".join(parts) + ".")


def lifecycle(res: Result):
    rows = res.by_test("lifecycle.contexts")
    create = next((r for r in rows if r.metric == "create_time" and r.params.get("contexts") == 8), None)
    destroy = next((r for r in rows if r.metric == "destroy_time" and r.params.get("contexts") == 8), None)
    if create and destroy:
        yield Finding("lifecycle", "measured",
                      f"8 driver-API contexts took {create.median:.2f} s to create and {destroy.median:.2f} s to destroy.")


def peer(res: Result):
    p2p = [r for r in res.by_test("peer.p2p") if r.metric == "bandwidth"]
    if p2p:
        lo, hi = min(p2p, key=lambda r: r.median), max(p2p, key=lambda r: r.median)
        yield Finding("peer.p2p", "measured", f"GPU-to-GPU copies: {lo.median:.0f} to {hi.median:.0f} GB/s over "
                      f"{len(p2p)} ordered pairs (slowest GPU{lo.params['src']}->GPU{lo.params['dst']}).")
    for r in res.by_test("peer.allreduce"):
        if r.metric == "time":  # a result from before the eager/graph rows
            yield Finding(f"peer.allreduce.{r.params['bytes']}", "measured",
                          f"NCCL all-reduce of {human_bytes(r.params['bytes'])} on {r.params['gpus']} GPUs: "
                          f"{r.median:.0f} us (bus bandwidth {r.extra.get('busbw_GBps', 0):.1f} GB/s).")
    for test, what in (("peer.allreduce", "all_reduce"), ("peer.sendrecv", "send/recv ring"),
                       ("peer.allreduce_1rank", "one-rank all_reduce")):
        yield from _nccl(res, test, what)


def _nccl(res: Result, test: str, what: str):
    """Per-op time of the smallest message (graph-replayed and eager) and bus bandwidth of the largest."""
    ops = [r for r in res.by_test(test) if r.metric == "time_per_op"]
    if not ops:
        return
    b = min(r.params["bytes"] for r in ops)
    graph, eager = (_one(ops, bytes=b, mode=m) for m in ("graph", "eager"))
    if not (graph and eager):
        return
    bus = max((r for r in res.by_test(test) if r.metric == "busbw"), key=lambda r: r.params["bytes"], default=None)
    yield Finding(test, "measured", f"NCCL {what}, {graph.params['ranks']} GPU(s), {human_bytes(b)}: "
                  f"{graph.median:.1f} us per op in a CUDA graph, {eager.median:.1f} eager"
                  + (f"; bus bandwidth {bus.median:.0f} GB/s at {human_bytes(bus.params['bytes'])}." if bus else "."))


RULES = (small_copies, semantics, transfer, concurrency, launch, toll, hostcrypto, lifecycle, peer)


def shown(res: Result) -> list[Finding]:
    """The findings a reader sees (per-case ones are folded into summaries)."""
    return [f for f in findings(res) if f.shown]


# the test whose rows each finding reads, by the finding id's start (peer's rule reads three tests)
TESTS = {"smallcopy.": "smallcopy.d2h32", "semantics.": "semantics.nonblocking", "transfer.": "transfer.sweep",
         "concurrency.": "concurrency.scaling", "launch.": "launch.cost", "toll.": "toll.h2d_idioms",
         "hostcrypto": "hostcrypto.aes256gcm", "lifecycle": "lifecycle.contexts", "peer.p2p": "peer.p2p",
         "peer.allreduce_1rank": "peer.allreduce_1rank", "peer.allreduce": "peer.allreduce",
         "peer.sendrecv": "peer.sendrecv"}


def findings(res: Result) -> list[Finding]:
    out = []
    for rule in RULES:
        out += list(rule(res))
    for f in out:
        f.test = next((t for prefix, t in TESTS.items() if f.id.startswith(prefix)), "")
    return out
