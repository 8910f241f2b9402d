"""`ccbridge load --bench`: ccbridge against the other loaders, same files, same device.

Each loader loads the whole checkpoint `repeat` times, the loaders taking
turns (so drift hits all alike); the page cache is warmed by a full read pass
first. A load is timed from the call to every tensor on the device
(torch.cuda.synchronize). ccbridge is timed twice: `cold`, making its own
pool inside the call (everything included), and `prewarmed`, with a pool
made before the clock starts (what a server that prewarms at start-up gets);
its stage breakdown comes from LoadStats. The two pools may differ: under
emulated CC the cold pool is planned for that one load (its contexts' making
counted, policy.cold_contexts), so the report shows each. The first ccbridge load is compared
bitwise with safetensors' own (not checked where safetensors is not installed: its rows are skipped, as
fastsafetensors' are); a mismatch fails the bench. On the host (device cpu) safetensors hands back
views of the file's mapping, which copy nothing: its rows copy them out, as ccbridge does, and say so. Asked for, the loader's uncoupled bound
(load/bound.py: its reads and copies at once, nothing coupling them) runs last, on the same files in the
prewarmed pool's shape, once that pool is closed; a bound that fails is reported, as a failed baseline is.
The bound runs after all the loaders' rounds, not in turns with them: drift between the two (the host warming,
a neighbour's load) is not shared as it is between the loaders. Its ratio is shown on the prewarmed row alone.
run() returns the report that render() prints; `--json` writes it as a Result of kind load (benchresult.py),
whose benchresult.report_of() gives that report back.
"""

from __future__ import annotations

import gc
import importlib
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

from ccbridge.load import bound, checkpoint, loader
from ccbridge.load.loader import LoadStats
from ccbridge.results import ResultFileError, load as load_result
from ccbridge.ui import human_bytes


@dataclass
class Outcome:
    name: str
    seconds: list[float] = field(default_factory=list)
    error: str | None = None
    stages: dict = field(default_factory=dict)
    skipped: bool = False  # not installed here: not measured, not failed

    def gbps(self, nbytes: int) -> float | None:
        return nbytes / statistics.median(self.seconds) / 1e9 if self.seconds else None


def warm_page_cache(files: list[str], block: int = 64 << 20) -> float:
    """Read every byte once; seconds taken."""
    t = time.perf_counter()
    buf = bytearray(block)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t


def _sync(torch):
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _safetensors_load_file(files, device):
    from safetensors.torch import load_file  # deferred: safetensors, an optional dependency (the baseline)

    out = {}
    for f in files:
        got = load_file(f, device=device)
        # on the host its tensors are views of the file's mapping (safetensors 0.8): nothing is read until
        # touched, so the row clones them to move the bytes ccbridge moves; to a GPU the load is the copy
        out.update({k: t.clone() for k, t in got.items()} if _on_host(device) else got)
    return out


def _on_host(device) -> bool:
    return str(device) == "cpu"


def _safetensors_safe_open(files, device):
    from safetensors import safe_open  # deferred: safetensors, an optional dependency (the baseline)

    out = {}
    for f in files:
        with safe_open(f, framework="pt", device="cpu") as g:
            for k in g.keys():
                out[k] = g.get_tensor(k).to(device, copy=True)  # on the host .to alone keeps the mapping's view
    return out


def _fastsafetensors(files, device):
    from fastsafetensors import fastsafe_open  # deferred: fastsafetensors, an optional dependency

    with fastsafe_open(files, device=device, nogds=True) as g:
        return {k: g.get_tensor(k) for k in g.keys()}


# the optional loaders the bench compares with: row -> the module it needs
_BASELINES = {"safetensors load_file": "safetensors", "safetensors safe_open + .to": "safetensors",
              "fastsafetensors (nogds)": "fastsafetensors"}


def _not_installed(module: str) -> str | None:
    """None where `module` imports; else the row's reason, as the table and a result's `skipped` show it."""
    try:
        importlib.import_module(module)  # only asked whether it is installed
    except Exception as e:  # a broken install is as absent as a missing one: its rows cannot run
        return f"not installed here ({type(e).__name__}: {e})"
    return None


def _check(report: dict) -> str:
    """The bitwise check's line: its verdict, or why there is none (a load failed, or safetensors is absent)."""
    if report["verified"] is not None:
        return report["verified"]
    ref = report["loaders"].get("safetensors load_file") or {}
    if ref.get("skipped"):
        return "not checked: safetensors is not installed"
    failed = [n for n in ("ccbridge prewarmed", "safetensors load_file")
              if not (report["loaders"].get(n) or {}).get("seconds")]
    return f"not checked: {' and '.join(failed) or 'no round'} loaded nothing"


def _equal(torch, a: dict, b: dict) -> str | None:
    """None if a and b hold the same names, dtypes, shapes and bytes; else what differs."""
    if a.keys() != b.keys():
        return f"names differ: {sorted(a.keys() ^ b.keys())[:3]}"
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        if x.numel() and not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            return f"{k}: bytes differ"
    return None


def run(paths, device: str = "cuda:0", repeat: int = 3, overrides: dict | None = None, log=print,
        with_bound: bool = False, before_bound=None) -> dict:
    """with_bound: after the loaders, the loader's uncoupled bound (load/bound.py) in the prewarmed pool's shape
    on the same files, `repeat` times (UsageError before any load where the plan has no such bound).
    before_bound(report), if given, gets the report before the bound runs (the loaders' results, the bound
    marked not measured): the caller can keep it should the bound be interrupted or fail unexpectedly."""
    import torch  # deferred: torch, an optional dependency (seconds of import)

    overrides = overrides or {}
    files, _, _ = checkpoint.resolve(paths)
    nbytes = sum(os.path.getsize(f) for f in files)
    index = loader.resolve_device(torch, device)[1]
    plan = loader.policy.for_device(index, **overrides)
    shape = bound.shape_of(plan.config) if with_bound else None  # refused before minutes of loads, not after
    log(f"checkpoint: {len(files)} files, {nbytes / 1e9:.2f} GB; warming the page cache...")
    warm_s = warm_page_cache(files)
    log(f"page cache warm ({nbytes / warm_s / 1e9:.1f} GB/s read pass)")

    results = {n: Outcome(n) for n in ("ccbridge prewarmed", "ccbridge cold", "safetensors load_file",
                                       "safetensors safe_open + .to", "fastsafetensors (nogds)")}
    for name, module in _BASELINES.items():  # a baseline not installed is skipped, not failed, on every row
        results[name].error = _not_installed(module)
        results[name].skipped = results[name].error is not None
    verified = None
    cold_pool: dict = {}  # the pool each cold load made for itself (the same plan every round)
    pool = loader.Pool(plan.config)
    pool_prewarm = pool.ready()

    def timed(name, fn):
        out = results[name]
        if out.error:
            return None
        gc.collect()
        torch.cuda.empty_cache()
        _sync(torch)
        t = time.perf_counter()
        try:
            got = fn()
            _sync(torch)
        except Exception as e:  # a baseline that fails is reported, not fatal
            out.error = f"{type(e).__name__}: {e}"
            return None
        out.seconds.append(time.perf_counter() - t)
        return got

    try:
        for r in range(repeat):
            log(f"round {r + 1}/{repeat}")
            st = LoadStats()
            mine = timed("ccbridge prewarmed", lambda: loader.load_safetensors(files, device, pool=pool, stats=st))
            st.join_teardown()
            if mine is not None:
                results["ccbridge prewarmed"].stages.setdefault("runs", []).append(_stages(st))
            ref = timed("safetensors load_file", lambda: _safetensors_load_file(files, device))
            if verified is None and mine is not None and ref is not None:
                verified = _equal(torch, mine, ref) or "bitwise equal"
                log(f"ccbridge vs safetensors: {verified}")
            del mine, ref
            cold = LoadStats()
            got = timed("ccbridge cold", lambda: loader.load_safetensors(files, device, stats=cold, **overrides))
            del got
            cold.join_teardown()
            results["ccbridge cold"].stages.setdefault("runs", []).append(_stages(cold))
            if cold.pool:
                cold_pool = {**cold.pool, "why": cold.why}
            got = timed("safetensors safe_open + .to", lambda: _safetensors_safe_open(files, device))
            del got
            got = timed("fastsafetensors (nogds)", lambda: _fastsafetensors(files, device))
            del got
    finally:
        pool.close()

    report = {
        "device": device,
        "gpu": torch.cuda.get_device_name(index) if index >= 0 else "cpu",
        "files": len(files),
        "bytes": nbytes,
        "repeat": repeat,
        "page_cache_read_gbps": nbytes / warm_s / 1e9,
        "pool": {**asdict(pool.config), "prewarm_s": pool_prewarm, "teardown_s": pool.teardown_s},
        "why": plan.why,
        "cold_pool": cold_pool or None,
        "verified": verified,
        "loaders": {n: {"gbps": o.gbps(nbytes), "seconds": o.seconds, "error": o.error, "stages": o.stages,
                        **({"skipped": True} if o.skipped else {})} for n, o in results.items()},
    }
    if verified not in (None, "bitwise equal"):
        report["error"] = f"ccbridge's tensors differ from safetensors': {verified}"
    if shape is not None:  # the pool is closed: its contexts and staging are gone before the bound runs
        report["bound"] = {**shape.describe(), "error": "the run stopped before the bound finished"}
        if before_bound:
            before_bound(report)
        report["bound"] = bound.measured(files, shape, repeat, log)
    return report


def _stages(st: LoadStats) -> dict:
    return {"total_s": st.total_s, "headers_s": st.headers_s, "alloc_s": st.alloc_s, "prewarm_s": st.prewarm_s,
            "prewarm_wait_s": st.prewarm_wait_s, "load_s": st.load_s, "read_s": st.read_s, "copy_s": st.copy_s,
            "teardown_s": st.teardown_s, "unmap_s": st.unmap_s}


def render(report: dict, ceiling: float | None = None) -> str:
    """The comparison table, fastest first, with the ceiling ratio when one is given and, when the report holds
    a measured bound, its best repeat's ratio on the prewarmed row (the bound was measured in that pool's shape);
    a warning line where that row beat the bound."""
    def shape(p: dict) -> str:
        return (f"{p['workers']} workers, {p['contexts']} contexts, {p['staging']} staging, "
                f"{human_bytes(p['chunk_bytes'])} chunks")

    pool, cold = report["pool"], report.get("cold_pool")
    same = cold is None or all(cold[k] == pool[k] for k in ("workers", "contexts", "staging", "chunk_bytes"))
    copied = report["gpu"] == "cpu"  # into host memory: the safetensors rows copy out of the mapping (_on_host)
    lines = [f"{report['files']} files, {report['bytes'] / 1e9:.2f} GB, "
             f"{'host memory' if copied else report['gpu']} ({report['device']}), "
             f"median of {report['repeat']}; page cache warm",
             f"{'pool' if same else 'prewarmed pool'}: {shape(pool)} ({report['why']}); prewarm "
             f"{pool['prewarm_s']:.2f} s, teardown {pool['teardown_s'] or 0:.2f} s"]
    if not same:
        lines.append(f"cold pool (made inside each cold load): {shape(cold)} ({cold['why']})")
    lines += [f"check: ccbridge vs safetensors: {_check(report)}", ""]
    b = report.get("bound")
    bound_gbps = b["best"]["both_at_once"] if b and not b.get("error") else None
    hdr = (f"{'loader':30} {'GB/s':>8} {'s (median)':>11}" + (f" {'/ ceiling':>10}" if ceiling else "")
           + (f" {'/ bound':>10}" if bound_gbps else ""))
    lines += [hdr, "-" * len(hdr)]
    rows = sorted(report["loaders"].items(), key=lambda kv: -(kv[1]["gbps"] or 0))
    for name, o in rows:
        label = f"{name}*" if copied and name.startswith("safetensors") else name
        if o["gbps"] is None:
            lines.append(f"{label:30} {'-':>8} {'-':>11}  {o['error'] or 'not run'}")
            continue
        s = f"{label:30} {o['gbps']:8.2f} {statistics.median(o['seconds']):11.3f}"
        if ceiling:
            s += f" {o['gbps'] / ceiling:10.3f}"
        if bound_gbps:  # measured in the prewarmed pool's shape: no other row's
            s += f" {o['gbps'] / bound_gbps:10.3f}" if name == "ccbridge prewarmed" else f" {'-':>10}"
        lines.append(s)
    if copied:
        lines.append("* then copied (.clone(), .to(copy=True)): into host memory, safetensors returns views of the "
                     "file's mapping (no copy)")
    for name in ("ccbridge prewarmed", "ccbridge cold"):
        runs = report["loaders"][name]["stages"].get("runs")
        if runs:
            med = {k: statistics.median(r[k] for r in runs if r[k] is not None) if any(r[k] is not None for r in runs) else None
                   for k in runs[0]}
            lines.append(f"{name} stages (median s): " + ", ".join(
                f"{k[:-2]} {v:.3f}" for k, v in med.items() if v is not None))
    if ceiling:
        lines.append(f"ceiling: {ceiling:.2f} GB/s (the probe's best multi-worker H2D)")
    if b:
        lines += bound.render_lines(b)
    mine = report["loaders"]["ccbridge prewarmed"]["gbps"]
    if bound_gbps and mine and mine > bound_gbps:
        lines.append(f"warning: ccbridge prewarmed moved {mine / bound_gbps:.3f} of the bound: it understates this "
                     "host (repeat noise; its readers never wait)")
    return "\n".join(lines)


def probe_ceiling(result_path: str) -> float:
    """The best aggregate H2D bandwidth of a probe result (concurrency family), GB/s."""
    res = load_result(result_path)
    best = [r.median for r in res.rows if r.test == "concurrency.scaling" and r.params.get("dir") == "h2d"]
    if not best:
        raise ResultFileError(f"{result_path} has no concurrency.scaling H2D rows: run `ccbridge probe --tests concurrency`")
    return max(best)
