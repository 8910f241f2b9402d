"""The secure benches' Results (kinds ddp, cipher, collectives) and the tables printed from them (net's too).

The benches (secure/bench.py) run on GPUs; their ranks send back plain dicts. What is built here from
those dicts needs neither torch nor a GPU, so the tests build Results from recorded dicts on a CPU.
One row per measured quantity: `compare`, `report` and `advise` read them as any other result's.
"""

from __future__ import annotations

from typing import Any

from ccbridge.results import Result, Row
from ccbridge.textfit import WIDTH

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
    """bench net's account for a terminal (secure/netbench.py's rows): per encrypted row what judges it, the
    plugin's uncoupled bound measured right after it (`at once`, at the largest size) and the row's share of it
    (`of it`, the median of the repeats' shares), and plain TCP at as many streams; then the one-way trips. The
    evidence behind them (each repeat, the cores and CPU-s/GB per side, the CPU bound and its inputs, the AES-GCM
    rates, the bound's own parts) is in the rows' extra: --json."""
    out = [f"{'size (B)':>10}  {'lanes':>5}  {'encrypted GB/s':>14}  {'at once GB/s':>12}  {'of it':>5}  "
           f"{'plain TCP GB/s':>14}"]
    for r in res.rows:
        if r.metric == "stream":
            x = r.extra
            out.append(f"{r.params['size']:>10}  {r.params['lanes']:>5}  {r.median:>14.2f}  "
                       f"{_fraction(x.get('uncoupled_gbps')):>12}  {_fraction(x.get('of_uncoupled')):>5}  "
                       f"{_fraction(x.get('tcp_gbps')):>14}" + ("  WRONG BYTES" if x.get("bad") else ""))
    if len(out) > 1:
        out += ["at once: the plugin's work with none of its waits (ccbridge-net-bound), right after each repeat at "
                "the largest size;",
                "  of it: the row's share. Plain TCP: as many streams (Python threads), largest size. Cores, CPU-s/GB, "
                "CPU bound: --json"]
        # where it did not run (not built, or it failed): why, since every row's `at once` is then "-"
        out += [s["reason"] for s in res.skipped if s.get("test") == "net_loopback:uncoupled"]
    by_lanes: dict[int, dict[int, float]] = {}
    for r in res.rows:
        if r.metric == "half_rtt":
            by_lanes.setdefault(r.params["lanes"], {})[r.params["size"]] = r.median
    if by_lanes:
        sizes = sorted({s for got in by_lanes.values() for s in got})
        each = [f"{n} lane{'s' if n != 1 else ''} " + " / ".join(f"{got[s]:.1f}" if s in got else "-" for s in sizes)
                for n, got in by_lanes.items()]
        line = f"one-way trip (us) at {' / '.join(map(str, sizes))} B: {each[0]}"
        for part in each[1:]:  # within the terminal's columns, a lane count's trips kept on one line
            if len(line) + 2 + len(part) > WIDTH:
                out.append(line + ";")
                line = "  " + part
            else:
                line += "; " + part
        out.append(line)
    return "\n".join(line.rstrip() for line in out)
