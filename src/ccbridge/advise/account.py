"""Advice from an account result (`ccbridge account`): the settings the call families that explain most of a
CC slowdown call for, where in the program they sit, and for collectives (kind collective) under GPU-CC: every
cross-GPU operation pays a per-operation toll set up by the GPU's secure firmware, whatever its size (bridge
law, section 6), so fewer, larger collectives dilute it (DDP buckets, a fused all-reduce), CUDA graphs that
capture them drop their launch tolls, not theirs, and a narrower TP degree pays it on fewer GPUs."""

from __future__ import annotations

from ccbridge.account import kind_dir_mem
from ccbridge.advise.core import Add, Advice, Input, adder, state
from ccbridge.advise.engines import stacks
from ccbridge.advise.multicast import no_multicast
from ccbridge.results import Row
from ccbridge.ui import approx_bytes

TOP_ACCOUNT = 5
MIN_SHARE = 0.05
# A slowdown that prints as 0.0 ms: its shares are of nothing (100% of 0.0 ms is no reason for a change).
NO_SLOWDOWN_MS = 0.05
DDP_DEFAULT_MB = 25  # torch DDP's bucket_cap_mb default
DDP_BUCKET_MB = 100  # where to start instead: 4x fewer all-reduces, each 4x larger
KIND_DIR_MEM = ("kind", "dir", "mem")
CC_ANSWERS = ("query", "timing")  # kinds of calls whose answer under CC is the finding (cc_answers)


def check(inp: Input) -> None:
    """Every account result can be read (an empty one says so in its advice)."""


def by_rank(res) -> tuple[Row | None, list[Row]]:
    """A multi-process job's account (account.rank rows): all ranks summed, as the single-process account reads:
    the slowdown (s) and each API's share of it (share_of_slowdown rows, their evidence in extra)."""
    rows = [r for r in res.by_test("account.rank") if r.params.get("rank") == "all" and r.metric == "slowdown"]
    if not rows:
        return None, []
    total = Row.of("account.rank", "slowdown", "s", [rows[0].median / 1e3], rank="all")
    shares = []
    for r in res.by_test("account.rank_api"):
        if r.params.get("rank") == "all" and r.extra.get("share") is not None:
            params = {k: v for k, v in r.params.items() if k != "rank"}
            shares.append(Row.of("account.rank_api", "share_of_slowdown", "fraction", [r.extra["share"]], **params))
            shares[-1].extra.update(r.extra)
    return total, shares


def advise(inp: Input) -> list[Advice]:
    res = inp.result
    out, add = adder(inp)
    # the slowdown the shares are of (the driver-call span's since share_base exists; before, the wall time's;
    # a job of several ranks: all ranks' windows summed)
    totals = {r.metric: r for r in res.by_test("account.total")}
    total, rank_shares = by_rank(res)
    total = total or totals.get("share_base") or totals.get("wall_slowdown")
    if total is not None and total.median * 1e3 < NO_SLOWDOWN_MS:
        add("all", "no change: OTHER was not measurably slower than BASE",
            f"{state(inp)}; a slowdown of {total.median * 1e3:.1f} ms: no call family to recover it from", total,
            brief=f"slowdown {total.median * 1e3:.1f} ms")
        return out
    cc_answers(inp, add)
    # query and timing rows: what the driver answers, not a cost; cc_answers gives their advice
    shares = [r for r in rank_shares or res.by_test("account.api") if r.metric == "share_of_slowdown"
              and r.params.get("kind") not in CC_ANSWERS]
    # one setting, one line: the rows whose recoveries call for the same settings (cuLaunchKernel and
    # cuLaunchKernelEx: CUDA graphs; a synchronize's and a readback's: a DrainWorker) summed, and kept where together
    # they explain MIN_SHARE; a collective stays a line of its own (its advice depends on its size)
    groups: dict[tuple, list[Row]] = {}
    for r in shares:
        key = ("collective", id(r)) if r.params.get("kind") == "collective" else \
            tuple(stacks(str(r.extra.get("recovery", ""))))
        groups.setdefault(key, []).append(r)
    groups = {k: g for k, g in groups.items() if sum(r.median for r in g) >= MIN_SHARE}
    top = sorted(groups.items(), key=lambda kg: -sum(r.median for r in kg[1]))[:TOP_ACCOUNT]
    if not top:
        add("all", "no change: no call family explains 5% of the slowdown",
            f"{state(inp)}; largest shares under {MIN_SHARE:.0%}", *([total] if total else []))
        return out
    at_sites = [x for x in res.by_test("account.site") if x.metric == "share_of_slowdown"]
    brief = f" ({total.median * 1e3:.1f} ms)" if total else ""
    of = f" ({total.median * 1e3:.1f} ms{summed(res)})" if total else ""
    for settings, group in top:  # the largest share first, collectives among the rest
        if group[0].params.get("kind") == "collective":
            collectives(inp, add, group, total)
            continue
        share = sum(r.median for r in group)
        recoveries = "; ".join(dict.fromkeys(str(r.extra.get("recovery", "")) for r in group))
        whats = [f"{r.params.get('api')} ({kind_dir_mem(*(r.params.get(k, '') for k in KIND_DIR_MEM))})"
                 for r in group]
        # where in the program: the call sites of these APIs that explain most of the slowdown, each site's
        # APIs summed (a line's launches through cuLaunchKernel and cuLaunchKernelEx are one figure)
        sites: dict[str, list[Row]] = {}
        for x in at_sites:
            if any(all(x.params.get(k) == r.params.get(k) for k in ("api", "dir", "mem")) for r in group):
                sites.setdefault(x.params["site"], []).append(x)
        where = sorted(((sum(x.median for x in g), site, g) for site, g in sites.items()), key=lambda w: -w[0])
        where = [w for w in where if w[0] >= MIN_SHARE][:2]
        why = (f"{' and '.join(whats)}: {share:.0%} of the slowdown{of}"
               + "".join(f"; {v:.0%} at {site}" for v, site, _ in where) + f"; {recoveries}")
        cites = group + [x for *_, g in where for x in g] + ([total] if total else [])
        for stack, setting in settings:
            add(stack, setting, why, *cites, brief=f"{share:.0%} of slowdown{brief}")
    colls = [g[0] for _, g in top if g[0].params.get("kind") == "collective"]
    if colls:
        no_multicast(inp, add, "the collectives above run on this fabric", colls[0])
    return out


def ranks(res) -> int:
    """The ranks an account of a job compared (its account.rank rows; 0: an account of one process)."""
    return len({(r.params.get("rank"), r.params.get("world")) for r in res.by_test("account.rank")
                if r.params.get("rank") != "all"})


def summed(res) -> str:
    """', N ranks summed' where the slowdown is all ranks' (a job's account), else nothing."""
    n = ranks(res)
    return f", {n} ranks summed" if n > 1 else ""


def cc_answers(inp: Input, add: Add) -> None:
    """What CC drivers answer that the program relies on, from its trace's query and timing lines: pointer-type
    queries of pinned memory answered 'managed' (TensorRT PR #4740; vLLM issue #57224: an is_pinned() gate served
    stale data), and GPU time read from CUDA events (unreliable under CC: TensorRT PR #4740)."""
    rows = [r for r in inp.result.by_test("account.api") + inp.result.by_test("account.site")
            if r.metric == "share_of_slowdown" and r.params.get("kind") in CC_ANSWERS]
    for kind in CC_ANSWERS:
        mine = [r for r in rows if r.params["kind"] == kind and (r.extra.get("calls") or [0, 0])[-1] > 0]
        if not mine:
            continue
        calls = sum(r.extra["calls"][-1] for r in mine if r.test == "account.api")
        sites = sorted({r.params["site"] for r in mine if r.params.get("site")})[:2]
        where = f" at {'; '.join(sites)}" if sites else ""
        if kind == "query":
            add("torch", "at risk under CC: pinned memory reads as managed, so is_pinned() is False; don't gate a live "
                "view or a re-pin on it (take the view with cudaHostGetDevicePointer; keep pinned buffers)",
                f"{state(inp)}; {calls} pointer-type queries of pinned memory answered 'managed'{where} "
                "(TensorRT PR #4740; vLLM issue #57224, PRs #50671/#57404)", *mine[:3], brief=f"{calls} queries")
        else:
            add("torch", "time GPU work with %globaltimer stamps where CC is on (TensorRT-LLM PR #11657, FlashInfer "
                "PR #3870; ccbridge: --timer globaltimer)", f"{state(inp)}; {calls} reads of GPU time from CUDA "
                f"events{where}; under CC event timing is unreliable (TensorRT PR #4740)", *mine[:3],
                brief=f"{calls} event reads")


def collectives(inp: Input, add: Add, shares: list[Row], total: Row | None) -> None:
    """Account rows of collectives (kind collective) that explain MIN_SHARE of the slowdown: fewer, larger
    collectives (DDP buckets, a fused all-reduce), graphs that capture them, a narrower TP degree."""
    res = inp.result
    for r in shares:
        p = r.params
        # beside it: account.api's rows of its params, or (a job's ranks) account.rank_api's of all ranks
        same = [x for x in res.by_test("account.api") if x.params == p] + \
            [x for x in res.by_test("account.rank_api") if x.params == dict(p, rank="all")]
        gpu = next((x for x in same if x.metric == "gpu_time"), None)
        size = next((x for x in same if x.metric == "payload_per_op"), None)
        calls = (r.extra.get("calls") or [0, 0])[-1]
        cites = [r] + [x for x in (size, gpu, total) if x]
        per_op = approx_bytes(size.median) if size else "?"
        # by_rank's rows sum a job's ranks: its operations and device time are per rank times the ranks
        n = max(ranks(res), 1) if r.test == "account.rank_api" else 1
        even = n > 1 and calls % n == 0
        ops, each = (calls // n, f" x {n} ranks") if even else (calls, f" over {n} ranks" if n > 1 else "")
        why = (f"{state(inp)}; {ops} {p['api']}{' a rank' if even else ''}{each} of {per_op} each: {r.median:.0%} "
               "of the slowdown" + (f" ({total.median * 1e3:.1f} ms{summed(res)})" if total else "")
               + (f"; {gpu.median / n:.1f} ms{' a rank' if n > 1 else ''} of device time the emulator queued ahead "
                  "of them (toll_ns)" if gpu else "")
               + f"; {r.extra.get('recovery', '')}")
        brief = f"{ops} ops{each} of {per_op}, {r.median:.0%}"
        if size and size.median > (1 << 20):  # bandwidth-bound: per-operation advice dilutes nothing
            add("DDP/torch", "overlap collectives with compute (DDP's default: keep gradient sync in backward)",
                why, *cites, brief=brief)
            add("vLLM/SGLang", "a narrower tensor-parallel degree moves fewer bytes per token (measure with "
                "`ccbridge bench decode` at each degree)", why, *cites, brief=brief)
            continue
        add("DDP", f"DistributedDataParallel(bucket_cap_mb={DDP_BUCKET_MB}): fewer, larger all-reduces than the "
            f"default {DDP_DEFAULT_MB} (sweep with `ccbridge bench ddp --buckets`)", why, *cites, brief=brief)
        add("torch", "fuse a step's small all-reduces into one flat buffer (one ncclAllReduce per step)", why,
            *cites, brief=brief)
        add("vLLM", "CUDA graphs on (no --enforce-eager): captured collectives drop their launch tolls, each "
            "still pays its own", why, *cites, brief=brief)
        add("SGLang", "CUDA graphs on (no --disable-cuda-graph) over the decode batches", why, *cites, brief=brief)
        add("vLLM/SGLang", "a narrower tensor-parallel degree: TP pays two all-reduces per layer per token "
            "(compare degrees with `ccbridge bench decode`)", why, *cites, brief=brief)
