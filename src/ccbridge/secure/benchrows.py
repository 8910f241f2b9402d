"""The secure benches' Results (kinds ddp, cipher, collectives) and the tables printed from them (net's too).

The benches (secure/bench.py) run on GPUs; their ranks send back plain dicts. What is built here from
those dicts needs neither torch nor a GPU, so the tests build Results from recorded dicts on a CPU.
One row per measured quantity: `compare`, `report` and `advise` read them as any other result's.
"""

from __future__ import annotations

import statistics
from typing import Any

from ccbridge.results import Result, Row

# ---- bench ddp: one row per model, world size, mode and bucket size ----

# what a rank's row says beside its timings, kept in the Row's extra
_DDP_EXTRA = ("grads_agree", "loss_equal", "loss_max_rel_diff", "losses", "batch_per_gpu", "nets")


def ddp_rows(run: dict[str, Any]) -> list[Row]:
    """One world size's rows (secure.bench's rank dicts: iter_ms_all, each timed iteration in ms)."""
    out = []
    for r in run["rows"]:
        row = Row.of("ddp", "iter_ms", "ms", r["iter_ms_all"], model=r["model"], nranks=r["nranks"], mode=r["mode"],
                     wrap=r.get("wrap", "ddp"), bucket_cap_mb=r["bucket_cap_mb"])
        row.extra = {"parameters": r["params"], **{k: r[k] for k in _DDP_EXTRA if k in r}}
        out.append(row)
    return out


def render_ddp(res: Result, nranks: int | None = None) -> str:
    """The table of one world size (or every row), each mode against its model's plaintext run."""
    rows = [r for r in res.rows if nranks is None or r.params["nranks"] == nranks]
    base = {r.params["model"]: r.median for r in rows if r.params["mode"] in ("plain", "nccl-sockets")}
    out = [f"{'model':>11} {'GPUs':>4} {'wrap':>4} {'mode':>13} {'bucket MB':>9} {'ms/iter':>9} {'vs plain':>8} "
           f"{'grads':>6}  losses vs plain"]
    for r in rows:
        p, x = r.params, r.extra
        agree = {True: "agree", False: "DIFFER", None: "-"}[x.get("grads_agree")]
        eq, rel = x.get("loss_equal"), x.get("loss_max_rel_diff")
        losses = "-" if eq is None else "equal" if eq else f"max rel diff {rel:.1e}"
        out.append(f"{p['model']:>11} {p['nranks']:>4} {p['wrap']:>4} {p['mode']:>13} "
                   f"{p['bucket_cap_mb'] or '-':>9} {r.median:>9.1f} {r.median / base[p['model']]:>8.2f}x "
                   f"{agree:>6}  {losses}")
    return "\n".join(out)


def grads_differ(res: Result) -> bool:
    return any(r.extra.get("grads_agree") is False for r in res.rows)


# ---- bench cipher: GB/s per kernel and size ----

CIPHER_OPS = ("encrypt", "decrypt", "reduce_hop")


def cipher_result(got: dict[str, Any], env: dict[str, Any], iters: int) -> Result:
    """secure.bench.cipher's measurement ({"device", "rows": [{size, chunk, encrypt, decrypt, reduce_hop}]}):
    one row per size and kernel, each the mean GB/s of `iters` calls."""
    res = Result(kind="cipher", env=env, settings={"device": got["device"], "iters": iters})
    for r in got["rows"]:
        for op in CIPHER_OPS:
            res.rows.append(Row.of("cipher", "throughput", "GB/s", [r[op]], op=op, bytes=r["size"]))
            res.rows[-1].extra["chunk"] = r["chunk"]
    return res


def render_cipher(res: Result) -> str:
    out = [f"AES-256-GCM kernels on {res.settings['device']} (GB/s of plaintext)",
           f"{'size':>12} {'chunk':>8} {'encrypt':>9} {'decrypt':>9} {'reduce hop':>10}"]
    by_size: dict[int, dict[str, Row]] = {}
    for r in res.rows:
        by_size.setdefault(r.params["bytes"], {})[r.params["op"]] = r
    for size, ops in by_size.items():
        out.append(f"{size:>12} {ops['encrypt'].extra['chunk']:>8} {ops['encrypt'].median:>9.1f} "
                   f"{ops['decrypt'].median:>9.1f} {ops['reduce_hop'].median:>10.1f}")
    return "\n".join(out)


# ---- collectives: time, algbw and busbw per size, plaintext and encrypted ----

_SIDES = {"plain": ("plain", "wrong_plain"), "encrypted": ("secure", "wrong")}  # side -> the rank dict's names
_METRICS = {"time": ("us", "us"), "algbw": ("algbw", "GB/s"), "busbw": ("busbw", "GB/s")}  # -> dict key, unit


def collectives_result(got: dict[str, Any], env: dict[str, Any], settings: dict[str, Any]) -> Result:
    """secure.bench.collectives' measurement (its per-size rows: size, count, type, plain_us/algbw/busbw,
    wrong_plain and the encrypted side's secure_* and wrong): three rows per size and side, each one sample
    (the mean of the timed iterations, as nccl-tests reports). The rest of the dict goes to settings."""
    res = Result(kind="collectives", env=env, settings={**{k: v for k, v in got.items() if k != "rows"}, **settings})
    for r in got["rows"]:
        for side, (prefix, wrong) in _SIDES.items():
            if f"{prefix}_us" not in r:
                continue
            rows = [Row.of("collectives", metric, unit, [r[f"{prefix}_{key}"]], op=got["op"], dtype=r["type"],
                           nranks=got["nranks"], bytes=r["size"], side=side)
                    for metric, (key, unit) in _METRICS.items()]
            for row in rows:  # n is 1: say so where a reader of the row would take it for one iteration
                row.extra["note"] = "one sample: the mean of the timed iterations (settings), as nccl-tests reports"
            rows[0].extra.update(count=r["count"], wrong=r[wrong])  # on the time row
            res.rows += rows
    return res


def collectives_rows(res: Result) -> list[dict[str, Any]]:
    """The per-size dicts render_collectives prints, from a collectives Result's rows."""
    by_size: dict[int, dict[str, Any]] = {}
    for r in res.rows:
        prefix, wrong = _SIDES[r.params["side"]]
        d = by_size.setdefault(r.params["bytes"], {"size": r.params["bytes"], "type": r.params["dtype"]})
        d[f"{prefix}_{_METRICS[r.metric][0]}"] = r.median
        if r.metric == "time":
            d.update({"count": r.extra["count"], wrong: r.extra["wrong"]})
    return list(by_size.values())


def wrong_elements(res: Result) -> bool:
    return any(r.extra.get("wrong") for r in res.rows)


def render_collectives(rows: list[dict], header: bool = True, encrypted: str = "ccbridge.secure") -> str:
    """nccl-tests' table: per size, plaintext and encrypted time, algbw, busbw, #wrong, and the busbw ratio
    (rows: the per-size dicts, as ranks report them while they run or collectives_rows gives them)."""
    lines = []
    if header:
        lines.append(f"{'':>34}  {'plaintext':^36}  {encrypted + ' (AES-256-GCM)':^36}")
        lines.append(f"{'size':>12} {'count':>12} {'type':>8}  " + "  ".join(
            [f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>7}"] * 2) + f"  {'busbw':>6}")
        lines.append(f"{'(B)':>12} {'(elements)':>12} {'':>8}  "
                     + "  ".join([f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>7}"] * 2) + f"  {'ratio':>6}")
    for r in rows:
        if "secure_us" not in r:  # a plaintext-only pass (progress while --net runs)
            lines.append(f"{r['size']:>12} {r['count']:>12} {r['type']:>8}  {r['plain_us']:>9.1f} "
                         f"{r['plain_algbw']:>7.2f} {r['plain_busbw']:>7.2f} {r['wrong_plain']:>7}")
            continue
        lines.append(f"{r['size']:>12} {r['count']:>12} {r['type']:>8}  "
                     f"{r['plain_us']:>9.1f} {r['plain_algbw']:>7.2f} {r['plain_busbw']:>7.2f} {r['wrong_plain']:>7}  "
                     f"{r['secure_us']:>9.1f} {r['secure_algbw']:>7.2f} {r['secure_busbw']:>7.2f} {r['wrong']:>7}  "
                     f"{r['secure_busbw'] / r['plain_busbw']:>6.3f}")
    return "\n".join(line.rstrip() for line in lines)


# ---- bench net: the tables of netbench.loopback's Result ----

def _fraction(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def link_lines(res: Result, gbits: float) -> tuple[list[str], bool]:
    """bench net --link: whether an encrypted row at the largest size moved the link's rate here, and per lane
    count what sending and receiving at that rate takes in cores at the row's CPU-s/GB (a host of a ring collective
    does both). Loopback puts both sides on this host's cores; two hosts have a side each. (lines, carried)"""
    need = gbits / 8
    rows = [r for r in res.rows if r.metric == "stream"]
    if not rows:
        return [f"link {gbits:g} Gb/s: no encrypted row was measured"], False
    top = max(r.params["size"] for r in rows)
    rows = sorted((r for r in rows if r.params["size"] == top), key=lambda r: r.params["lanes"])
    cores = rows[0].extra.get("cores_visible")
    out = [f"link {gbits:g} Gb/s = {need:.2f} GB/s, {top} B messages, {cores} cores here (loopback: both sides on "
           "them):"]
    for r in rows:
        s, v = r.extra.get("cpu_s_per_gb_send"), r.extra.get("cpu_s_per_gb_recv")
        at = "-" if s is None or v is None else f"{need * s:.1f} sending + {need * v:.1f} receiving"
        lanes = f"{r.params['lanes']} lane" + ("s" if r.params["lanes"] != 1 else "")
        out.append(f"{lanes:>8}: {r.median:.2f} GB/s ({r.median / need:.2f} of the link); at the "
                   f"link a host needs {at} cores")
    best = max(rows, key=lambda r: r.median)
    carried = best.median >= need
    out.append(f"carried here at {best.params['lanes']} lanes ({best.median:.2f} GB/s)" if carried else
               f"not carried here: at most {best.median:.2f} GB/s ({best.params['lanes']} lanes, "
               f"{best.median / need:.2f} of the link)")
    return out, carried


def render_net(res: Result) -> str:
    """bench net's tables (secure/netbench.py's rows): each encrypted row beside its anchors, then plain TCP, the
    uncoupled bound, the AES-GCM rates and the one-way trips."""
    out = [f"{'size (B)':>10} {'lanes':>5} {'GB/s':>7} {'cores s/r':>9} {'CPU-s/GB s/r':>13} "
           f"{'TCP GB/s':>8} {'of TCP':>6} {'bound GB/s':>10} {'of bound':>8} {'CPU eff':>7} {'at once':>7} "
           f"{'of it':>5}"]
    for r in res.rows:
        if r.metric == "stream":
            x = r.extra
            per = "/".join("-" if x.get(f"cpu_s_per_gb_{s}") is None else f"{x[f'cpu_s_per_gb_{s}']:.3f}"
                           for s in ("send", "recv"))
            cores = f"{max(x['plugin_cores_send']):.1f}/{max(x['plugin_cores_recv']):.1f}"
            tcp = "-" if x.get("tcp_gbps") is None else f"{x['tcp_gbps']:.2f}"
            bound = "-" if x.get("bound_gbps") is None else f"{x['bound_gbps']:.2f}"
            out.append(f"{r.params['size']:>10} {r.params['lanes']:>5} {r.median:>7.2f} {cores:>9} {per:>13} "
                       f"{tcp:>8} {_fraction(x.get('of_tcp')):>6} {bound:>10} {_fraction(x.get('of_bound')):>8} "
                       f"{_fraction(x.get('cpu_efficiency')):>7} {_fraction(x.get('uncoupled_gbps')):>7} "
                       f"{_fraction(x.get('of_uncoupled')):>5}")
    tcp = [r for r in res.rows if r.metric == "tcp_plaintext"]
    if tcp:
        out.append(f"{'size (B)':>10} {'streams':>7} {'plain TCP GB/s':>14} {'cores s/r':>9} {'CPU-s/GB s/r':>13}")
        out += [f"{r.params['size']:>10} {r.params['streams']:>7} {r.median:>14.2f} "
                f"{max(r.extra['cores_send']):>4.1f}/{max(r.extra['cores_recv']):<4.1f} "
                f"{r.extra['cpu_s_per_gb_send']:>6.3f}/{r.extra['cpu_s_per_gb_recv']:<6.3f}" for r in tcp]
    both = [r for r in res.rows if r.metric == "uncoupled"]
    if both:
        out.append(f"{'size (B)':>10} {'lanes':>5} {'at once GB/s':>12} {'streams alone':>13} {'AES-GCM alone':>13} "
                   f"{'cores':>5}")
        out += [f"{r.params['size']:>10} {r.params['streams']:>5} {r.median:>12.2f} "
                f"{statistics.median(r.extra['streams']):>13.2f} {statistics.median(r.extra['crypto']):>13.2f} "
                f"{statistics.median(r.extra['cores']):>5.1f}" for r in both]
    gcm = [r for r in res.rows if r.metric.startswith("aes_gcm")]
    if gcm:
        out.append(f"{'record (B)':>10} {'threads':>7} {'AES-GCM GB/s per core: encrypt':>31} {'decrypt':>7}")
        out += [f"{e.params['record']:>10} {e.params['threads']:>7} {e.median:>31.2f} {d.median:>7.2f}"
                for e, d in zip(gcm[::2], gcm[1::2])]
    bounded = [r for r in res.rows if r.extra.get("bound_gbps")]
    if bounded:
        cores = bounded[0].extra["cores_visible"]  # the run's, which its bound was made of (netbench._compare)
        out += [f"bound = cores / (plain TCP's CPU-s/GB send + recv at as many streams + 1 / AES-GCM encrypt + "
                "1 / decrypt GB/s", f"  per core at the row's record size, on all {cores} cores this "
                "process may use (sched_getaffinity)), measured in this run:",
                "  each encrypted byte costs what TCP's does plus one seal and one open. CPU eff = that CPU-s/GB over "
                "the row's own", "  (plugin threads, both sides). TCP GB/s: the plain TCP row of the same lane "
                "count (its size: the largest)."]
    if both:
        out += ["at once: the plugin's work with none of its waits (ccbridge-net-bound: as many plain TCP streams and "
                "threads a lane", "  as the plugin's sealing (sender) and opening (receiver) the same bytes in its "
                "records where it finds them,", "  native, nothing coupling them; a polling thread a side as the "
                "bench's), GB/s when both sides are done, measured", "  right after each repeat of the row: the limit "
                "it is judged by (of it: the median of the repeats' shares; the CPU", "  bound assumes every core "
                "busy)."]
    rtt = [r for r in res.rows if r.metric == "half_rtt"]
    if rtt:
        out.append(f"{'size (B)':>10} {'lanes':>5} {'one-way us':>10}")
        out += [f"{r.params['size']:>10} {r.params['lanes']:>5} {r.median:>10.1f}" for r in rtt]
    return "\n".join(line.rstrip() for line in out)
