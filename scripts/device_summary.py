"""The short table that scripts/device-check prints last."""

import json
import statistics
import sys
from pathlib import Path

from ccbridge import results
from ccbridge.compare import compare
from ccbridge.load import benchresult
from ccbridge.secure import benchrows


def main(r: Path) -> None:
    times = dict(l.split("=") for l in (r / "times").read_text().split()) if (r / "times").exists() else {}
    print("\n| check | value |\n|---|---|")
    for k, v in times.items():
        print(f"| {k} | {float(v):.1f} s |")
    log = (r / "pytest-gpu.log").read_text().strip().splitlines() if (r / "pytest-gpu.log").exists() else ["?"]
    print(f"| GPU tests | {log[-1]} |")
    over = r / "emu_overhead.json"
    if over.exists() and over.read_text().strip():
        o = json.loads(over.read_text())
        for k in ("passthrough", "record", "record_sites"):
            if k + "_loop_overhead_pct" not in o:
                continue
            print(f"| {k} overhead: GPU-bound loop / eager decode loop / per launch / per 4 KiB copy | "
                  f"{o[k + '_loop_overhead_pct']:.2f}% / {o[k + '_decode_overhead_pct']:.2f}% / "
                  f"{o[k + '_launch_overhead_us']:.2f} us / {o[k + '_copy_overhead_us']:.2f} us |")
        if "record_decode_paired_overhead_pct" in o:
            loop = o.get("record_loop_paired_overhead_pct")
            print(f"| record overhead, recording vs paused in one process: GPU-bound loop / eager decode loop | "
                  f"{'n/a' if loop is None else f'{loop:.2f}%'} / {o['record_decode_paired_overhead_pct']:.2f}% |")
    for cal in sorted(r.glob("calib-*/calibration.json")):
        checks = json.loads(cal.read_text())
        held = sum(c["ok"] is True for c in checks)
        bad, na = ([c["id"] for c in checks if c["ok"] is v] for v in (False, None))
        print(f"| calibration {cal.parent.name} (EMULATED) | {held}/{len(checks)} hold; not: {bad}; n/a: {na} |")
    for name in ("native", "b300"):
        f = r / f"load-{name}.json"
        if f.exists():
            rep = benchresult.report_of(results.load(f))  # the Result (kind load) as the bench's report
            ld = rep["loaders"]
            mine = ld["ccbridge prewarmed"]["gbps"] or 0
            others = {k: v["gbps"] for k, v in ld.items() if not k.startswith("ccbridge") and v["gbps"]}
            ceil = rep.get("ceiling_gbps")
            tag = " (EMULATED)" if rep.get("emulation") else ""
            print(f"| load{tag} {rep['bytes'] / 2**30:.1f} GiB: ccbridge prewarmed / cold | {mine:.2f} / "
                  f"{ld['ccbridge cold']['gbps'] or 0:.2f} GB/s; / ceiling {ceil or 0:.2f}: {mine / ceil if ceil else 0:.3f}; "
                  f"{rep['verified']} |")
            bound_row(rep.get("bound"), tag, mine)
            for k, v in others.items():
                print(f"| load{tag}: {k} | {v:.2f} GB/s (ccbridge x{mine / v:.1f}) |")
    secure_rows(r)
    mgpu_rows(r)
    full = r / "full1" / "result.json"
    if not full.exists():
        return
    res = results.load(full)
    print(f"| probe errors | {len(res.errors)} {[e['test'] for e in res.errors]} |")
    chk = json.loads((r / "copy_check.json").read_text()) if (r / "copy_check.json").exists() else {}
    for d in ("h2d", "d2h"):
        row = next((x for x in res.by_test("transfer.sweep") if x.metric == "bandwidth" and x.params == {"dir": d, "mem": "pinned", "bytes": chk.get("bytes")}), None)
        if row and chk:
            print(f"| pinned {d} 1 GiB probe / event loop | {row.median:.2f} / {chk[d + '_GBps']:.2f} GB/s (ratio {row.median / chk[d + '_GBps']:.3f}) |")
    for x in res.by_test("launch.cost"):
        print(f"| launch {x.params['mode']} | {x.median:.2f} us |")
    for x in res.rows:
        if x.extra.get("headline") and x.test in ("compute.parity", "smallcopy.d2h32"):
            print(f"| {x.test} {x.metric} {x.params} | {x.median:.2f} {x.unit} |")
    f2 = r / "full2" / "result.json"
    if f2.exists():
        c = compare(res, results.load(f2))
        rat = [x.ratio for x in c.ratios if x.ratio == x.ratio]
        print(f"| compare run1/run2 | {len(rat)} rows, median ratio {statistics.median(rat):.3f}, "
              f"middle 80% {sorted(rat)[len(rat) // 10]:.3f}-{sorted(rat)[len(rat) * 9 // 10]:.3f} |")


def bound_row(b: dict | None, tag: str, mine: float) -> None:
    """load --bench --bound: the host's limit with reads and copies at once (its best repeat, as the bench's
    ratio takes it), or why it was not measured."""
    if not b:
        return
    if b.get("error"):
        why = str(b["error"]).replace("|", "/")
        print(f"| load{tag}: uncoupled bound | not measured: {why} |")
        return
    both = b["best"]["both_at_once"]  # the Result's bound rows always give their best repeat (benchresult)
    print(f"| load{tag}: uncoupled bound | {both:.2f} GB/s (best of {b['repeat']}); ccbridge prewarmed / bound "
          f"{mine / both:.3f} |")


def mgpu_rows(r: Path) -> None:
    """The one-rank NCCL job under each profile against native; bench decode vs --tp 1 (PARTS=mgpu)."""
    def job(name):
        f = r / f"nccl1-{name}.json"
        text = f.read_text().strip().splitlines() if f.exists() else []
        return json.loads(text[-1]) if text and text[-1].startswith("{") else None

    native = job("native")
    for name in ("passthrough", "b300", "h200"):
        got = job(name)
        if not (native and got):
            continue
        tag = "" if name == "passthrough" else " (EMULATED)"
        cells = [f"{got[w][k] - native[w][k]:+.2f}" for w, k in (("torch", "eager_device_us"),
                                                                  ("torch", "graph_device_us_per_op"),
                                                                  ("ctypes", "eager_device_us"))]
        exact = all(got[w]["exact"] for w in ("torch", "ctypes"))
        print(f"| 1-rank all_reduce 4 KiB {name}{tag}: +GPU us torch eager/graph, ctypes | {' / '.join(cells)}; "
              f"exact {exact} |")
    for t in ("eager", "graphs"):
        one, tp1 = r / f"decode1-{t}.json", r / f"decodetp1-{t}.json"
        if one.exists() and tp1.exists():
            a, b = results.load(one), results.load(tp1)
            toks = {(x.params["batch"], x.params["mode"]): x.median for x in a.rows if x.metric == "tok_per_s"}
            pairs = [(x.median, toks.get((x.params["batch"], x.params["mode"]))) for x in b.rows if x.metric == "tok_per_s"]
            ratios = [tp / single for tp, single in pairs if single]
            if ratios:
                print(f"| bench decode --tp 1 / bench decode, {t}: tok/s ratio over {len(ratios)} rows | median "
                      f"{statistics.median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f} |")


def secure_rows(r: Path) -> None:
    f = r / "cipher.json"
    if f.exists():
        rows = results.load(f).rows
        size = max(x.params["bytes"] for x in rows)
        best = {x.params["op"]: x.median for x in rows if x.params["bytes"] == size}
        print(f"| AES-256-GCM {size >> 20} MiB: encrypt / decrypt / reduce hop | {best['encrypt']:.1f} / "
              f"{best['decrypt']:.1f} / {best['reduce_hop']:.1f} GB/s |")
    for f in sorted(r.glob("coll-*.json")):
        res = results.load(f)
        rows = benchrows.collectives_rows(res)
        at = next((x for x in rows if x["size"] >= 256 << 20), rows[-1])
        wrong = sum(x["wrong"] for x in rows)
        print(f"| {f.stem} ({res.settings['backend']}, {res.settings.get('transport')}) at {at['size'] >> 20} MiB: "
              "busbw plain / secure | "
              f"{at['plain_busbw']:.1f} / {at['secure_busbw']:.1f} GB/s ({at['secure_busbw'] / at['plain_busbw']:.3f}); "
              f"#wrong {wrong} |")
    net_rows(r)
    serve_rows(r)
    f = r / "ddp.json"
    if f.exists():
        for n, run in _ddp_runs(f).items():
            plain = {x.params["model"]: x.median for x in run if x.params["mode"] == "plain"}
            for m in plain:
                sec = [x for x in run if x.params["model"] == m and x.params["mode"] == "secure"]
                b = min(sec, key=lambda x: x.median)
                print(f"| DDP {m} x{n}: plain / best encrypted (bucket {b.params['bucket_cap_mb']} MB) | "
                      f"{plain[m]:.1f} / {b.median:.1f} ms ({b.median / plain[m]:.2f}x) |")


def _ddp_runs(f: Path) -> dict:
    """A bench ddp result's rows by world size."""
    runs = {}
    for x in results.load(f).rows:
        runs.setdefault(x.params["nranks"], []).append(x)
    return runs



def net_rows(r: Path) -> None:
    """The NCCL net plugin: its loopback stream, and NCCL over it against NCCL's plaintext sockets."""
    f = r / "net.json"
    if f.exists():
        res = results.load(f)
        best = max((x for x in res.rows if x.metric == "stream"), key=lambda x: x.median, default=None)
        if best:
            print(f"| net plugin loopback, best: {best.params['size'] >> 10} KiB x lanes {best.params['lanes']} | "
                  f"{best.median:.2f} GB/s, plugin cores send {max(best.extra['plugin_cores_send']):.1f} / recv "
                  f"{max(best.extra['plugin_cores_recv']):.1f}; bytes wrong {sum(x.extra.get('bad', 0) for x in res.rows)} |")
        for x in res.rows:
            if x.metric == "half_rtt" and x.params["size"] == 4096:
                print(f"| net plugin 4 KiB one-way, lanes {x.params['lanes']} | {x.median:.1f} us |")
    for f in sorted(r.glob("net-*.json")):
        res = results.load(f)
        if res.kind != "collectives":
            continue
        rows = benchrows.collectives_rows(res)
        big = [x for x in rows if x["size"] >= 64 << 20]
        worst = min(big, key=lambda x: x["secure_busbw"] / x["plain_busbw"]) if big else rows[-1]
        small = min(rows, key=lambda x: abs(x["size"] - 4096))
        wrong = sum(x["wrong"] + x["wrong_plain"] for x in rows)
        print(f"| {f.stem}: busbw ratio >= 64 MiB, worst (at {worst['size'] >> 20} MiB) | "
              f"{worst['secure_busbw']:.2f} / {worst['plain_busbw']:.2f} GB/s = {worst['secure_busbw'] / worst['plain_busbw']:.3f}; "
              f"{small['size']} B: {small['secure_us']:.1f} vs {small['plain_us']:.1f} us "
              f"(+{small['secure_us'] - small['plain_us']:.1f}); #wrong {wrong}; nets {res.settings.get('nets')} |")
    for name in ("net-ddp.json", "net-fsdp.json"):
        f = r / name
        if f.exists():
            for n, run in _ddp_runs(f).items():
                base = {x.params["model"]: x.median for x in run if x.params["mode"] == "nccl-sockets"}
                for x in run:
                    if x.params["mode"] == "nccl-ccbridge":
                        m = x.params["model"]
                        print(f"| {x.params['wrap']} {m} x{n}: NCCL sockets / ccbridge plugin | "
                              f"{base[m]:.1f} / {x.median:.1f} ms ({x.median / base[m]:.2f}x); "
                              f"grads {x.extra['grads_agree']}; losses equal to sockets' {x.extra.get('loss_equal')} "
                              f"(max rel diff {x.extra.get('loss_max_rel_diff')}) |")



def serve_rows(r: Path) -> None:
    """Decode tok/s per mode at the largest batch (eager and graphs), the account of the async mode, and KV
    TTFT per threshold, native beside EMULATED b300."""
    for tag in ("decode", "decode-graphs", "decode-prep"):
        runs = {k: results.load(r / f"{tag}-{k}.json") for k in ("native", "b300") if (r / f"{tag}-{k}.json").exists()}
        if not runs:
            continue
        big = max(x.params["batch"] for x in next(iter(runs.values())).rows)
        for mode in ("sync", "async", "staged", "drain"):
            got = {k: next((x for x in runs[k].rows if x.metric == "tok_per_s" and x.params["batch"] == big
                            and x.params["mode"] == mode), None) if k in runs else None for k in ("native", "b300")}
            print(f"| {tag} batch {big} {mode}: tok/s native / EMULATED b300 (tokens) | "
                  + " / ".join(f"{v.median:.0f} ({'same' if v.extra.get('tokens_match') else 'DIFFER'}, "
                               f"{v.extra.get('near_ties', 0)} near ties)" if v else "-" for v in got.values()) + " |")
    acc = r / "account-decode" / "result.json"
    if acc.exists():
        res = results.load(acc)
        total = {x.metric: x.median for x in res.rows if x.test == "account.total"}
        wall, net = total.get("share_base", total.get("wall_slowdown")), total.get("net_in_calls")
        grew = sum(x.median for x in res.rows if x.test == "account.api" and x.metric == "share_of_slowdown" and x.median > 0)
        print(f"| account decode async: calls that grew explain | {grew:.0%} of the slowdown |")
        where = {x.params["phase"]: x.median for x in res.rows if x.test == "account.phase"}
        if where and net is not None:
            span = where.get("driver calls", 0)
            print(f"| account decode async: slowdown by phase (ms) | " + ", ".join(f"{k} {v * 1e3:+.0f}" for k, v in where.items())
                  + f"; calls hold {net * 1e3:.0f} ms net" + (f" = {net / span:.0%} of the driver-call span's" if span > 0 else "") + " |")
        for test in ("account.api", "account.site"):
            top = sorted((x for x in res.rows if x.test == test and x.metric == "share_of_slowdown"),
                         key=lambda x: -x.median)[:3]
            for x in top:
                print(f"| account decode async ({test.split('.')[1]}): {x.params.get('site') or x.params['api']} "
                      f"{x.params.get('dir') or ''} | {x.median:.0%} of {wall * 1e3 if wall else 0:.0f} ms |")
    for tag, k in ((t, k) for t in ("kv", "kvsmall") for k in ("native", "b300")):
        f = r / f"{tag}-{k}.json"
        if f.exists():
            res = results.load(f)
            for x in res.rows:
                if x.metric == "ttft_ms":
                    spill = next(y.median for y in res.rows if y.metric == "spill_bytes" and y.params == x.params)
                    print(f"| {tag} {'EMULATED b300' if k == 'b300' else 'native'} threshold {x.params['threshold']} "
                          f"{x.params['mode']}: TTFT p50 / p99, spill | {x.median:.1f} / {x.extra['p99']:.1f} ms, "
                          f"{spill / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
