"""The load bench's report as a Result (kind load), and back: what `ccbridge load --bench --json` writes and what
readers of that file (scripts/device_summary.py, the round trip of render) get from it.

bench.run() builds the report, a dict that bench.render() prints; to_result() turns it into rows and settings:

  settings  the run's inputs and what it found beside the figures: device, gpu, files, bytes, repeat, the read
            pass's GB/s, the prewarmed pool and the cold one, why that pool, the bitwise check, the emulation
            label, the ceiling, `error` where ccbridge's tensors differ, and `bound` (its shape and byte counts)
            where --bound was asked
  rows      test "load": one per loader that loaded (metric: its id in LOADERS, params {"loader": its name}),
            GB/s per repeat (the checkpoint's bytes over each repeat's seconds), extra: gbps (the table's figure),
            seconds, stages, the error that stopped its later repeats, and on the prewarmed row its ratios to the
            ceiling and the bound (ceiling_ratio, bound_ratio)
            test "load_bound": one per figure of the bound (bound.ROWS), GB/s per repeat, extra: the best repeat
            and the repeats' values; the figures from the run at once (both_at_once's row) carry its evidence
  skipped   a loader not installed here ("load:<id>")
  errors    a loader that failed before any repeat ("load:<id>", its stages kept), and a bound not measured
            ("load_bound")

report_of() is the inverse: render(report_of(to_result(rep))) prints what render(rep) does.
"""

from __future__ import annotations

import statistics
from typing import Any

from ccbridge.load.bound import EVIDENCE, ROWS
from ccbridge.results import Result, Row

# the loaders in the bench's order (its rounds, and render's order among equals): display name -> metric id
LOADERS = {
    "ccbridge prewarmed": "ccbridge_prewarmed",
    "ccbridge cold": "ccbridge_cold",
    "safetensors load_file": "safetensors_load_file",
    "safetensors safe_open + .to": "safetensors_safe_open",
    "fastsafetensors (nogds)": "fastsafetensors_nogds",
}
BOUND_TEST = "load_bound"
# the report's settings, copied as they are (emulation and ceiling_gbps: set by the CLI)
_SETTINGS = ("device", "gpu", "files", "bytes", "repeat", "page_cache_read_gbps", "pool", "why", "cold_pool",
             "verified", "emulation", "ceiling_gbps")
_NOT_RUN = "not run"


def to_result(report: dict, env: dict, duration_s: float = 0.0) -> Result:
    """The report (bench.run's, with the CLI's emulation and ceiling_gbps) as a Result of kind load."""
    settings: dict[str, Any] = {k: report.get(k) for k in _SETTINGS}
    if report.get("error"):
        settings["error"] = report["error"]
    res = Result(kind="load", env=env, settings=settings, duration_s=duration_s)
    b = report.get("bound")
    best = b["best"]["both_at_once"] if b and not b.get("error") else None
    ceiling = report.get("ceiling_gbps")
    nbytes = report["bytes"]
    for name, ident in LOADERS.items():
        o = report["loaders"].get(name)
        if o is None:
            continue
        test = f"load:{ident}"
        if not o["seconds"]:
            reason = o.get("error") or _NOT_RUN
            if o.get("skipped") or not o.get("error"):
                res.skipped.append({"test": test, "reason": reason})
            else:
                res.errors.append({"test": test, "error": reason, "stages": o.get("stages") or {}})
            continue
        row = Row.of("load", ident, "GB/s", [nbytes / s / 1e9 for s in o["seconds"]], loader=name)
        # gbps: the table's figure, the bytes over the median seconds (the row's median is the repeats' median GB/s,
        # the same figure for an odd number of repeats)
        row.extra = {"gbps": o["gbps"], "seconds": list(o["seconds"]), "stages": o.get("stages") or {}}
        if o.get("error"):
            row.extra["error"] = o["error"]
        if name == "ccbridge prewarmed" and o["gbps"]:
            if ceiling:
                row.extra["ceiling_ratio"] = o["gbps"] / ceiling
            if best:
                row.extra["bound_ratio"] = o["gbps"] / best
        res.rows.append(row)
    if b is not None:
        _bound(res, b)
    return res


def _bound(res: Result, b: dict) -> None:
    """The bound's inputs in the settings; its figures as rows, or its error."""
    res.settings["bound"] = {k: v for k, v in b.items() if k not in ("gbps", "best", "samples", "error")}
    if b.get("error"):
        res.errors.append({"test": BOUND_TEST, "error": b["error"]})
        return
    for k in ROWS:
        row = Row.of(BOUND_TEST, k, "GB/s", b["samples"][k])
        row.extra = {"best": b["best"][k], "repeats": list(b["samples"][k])}
        if k == "both_at_once":
            row.extra.update({e: list(b["samples"][e]) for e in EVIDENCE if e in b["samples"]})
        res.rows.append(row)


def report_of(res: Result) -> dict:
    """The report that to_result(report) was made from, as render() and device_summary read it."""
    if res.kind != "load":
        raise ValueError(f"a {res.kind} result is not a load bench's")
    s = res.settings
    rep: dict[str, Any] = {k: s.get(k) for k in _SETTINGS}
    if s.get("error"):
        rep["error"] = s["error"]
    rows = {r.metric: r for r in res.by_test("load")}
    skipped = {e["test"]: e["reason"] for e in res.skipped}
    errors = {e["test"]: e for e in res.errors}
    loaders = {}
    for name, ident in LOADERS.items():
        test, row = f"load:{ident}", rows.get(ident)
        if row is not None:
            secs = row.extra["seconds"]
            loaders[name] = {"gbps": row.extra["gbps"], "seconds": secs,
                             "error": row.extra.get("error"), "stages": row.extra.get("stages", {})}
        elif test in errors:
            loaders[name] = {"gbps": None, "seconds": [], "error": errors[test]["error"],
                             "stages": errors[test].get("stages", {})}
        elif test in skipped:
            reason = skipped[test]
            loaders[name] = {"gbps": None, "seconds": [], "error": None if reason == _NOT_RUN else reason,
                             "stages": {}, **({"skipped": True} if reason != _NOT_RUN else {})}
    rep["loaders"] = loaders
    if "bound" in s:
        rep["bound"] = _bound_of(res, s["bound"], errors.get(BOUND_TEST))
    return rep


def _bound_of(res: Result, inputs: dict, error: dict | None) -> dict:
    if error is not None:
        return {**inputs, "error": error["error"]}
    rows = {r.metric: r for r in res.by_test(BOUND_TEST)}
    both = rows["both_at_once"].extra
    samples = {k: rows[k].extra["repeats"] for k in ROWS} | {e: both[e] for e in EVIDENCE if e in both}
    return {**inputs, "gbps": {k: statistics.median(rows[k].extra["repeats"]) for k in ROWS},
            "best": {k: rows[k].extra["best"] for k in ROWS}, "samples": samples}
