"""`ccbridge advise`: the CC-mode-aware settings for the stacks people run, from files ccbridge wrote.

Each input is an env stamp (`ccbridge env --json`), a probe result (`ccbridge
probe`), an account result (`ccbridge account`), a decode result (`ccbridge
bench decode`) or a KV-offload result (`ccbridge bench kv`); its kind is read
from its content. Every recommendation names the stack, the setting, why (the row key,
its median and unit: the number behind it) and whether that number is
EMULATED. A stamp alone carries no number: it says whether CC-aware settings
apply at all, and what to measure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ccbridge import env as _env
from ccbridge import results, textfit
from ccbridge.choices import DECODE_MODES  # bench decode's modes, as its tables list them
from ccbridge.errors import ResultFileError
from ccbridge.results import Result, Row
from ccbridge.ui import approx_bytes

PROBE_TESTS = ("semantics.", "transfer.", "launch.", "framework.", "concurrency.", "smallcopy.", "toll.")
HOLDS = 0.2  # return fraction above which a non_blocking copy held the host (semantics.ASYNC_BELOW)
PINNED_WINS = 1.5  # pinned/pageable bandwidth ratio above which pinning pays
LAUNCH_TOLL_US = 10.0  # pipelined per-kernel launch cost above which graphs are a must
SCALES = 1.3  # aggregate bandwidth gain over one context that a pool must buy
TOP_ACCOUNT = 5
MIN_SHARE = 0.05
MARGIN = 1.05  # a mode or threshold must beat the engine default by this much to be worth a change (run noise)


@dataclass
class Cite:
    key: str
    median: float
    unit: str

    @classmethod
    def of(cls, row: Row) -> "Cite":
        return cls(row.key(), row.median, row.unit)

    def text(self) -> str:
        return f"{self.key} = {self.median:.4g} {self.unit}"


@dataclass
class Advice:
    stack: str
    setting: str
    why: str
    source: str
    emulated: bool
    cites: list[Cite] = field(default_factory=list)
    brief: str = ""  # the number behind it in a few words, for the 120-column table (why and cites: --why, --json)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Input:
    path: str
    kind: str  # "env", "probe", "account", "decode" or "kv"
    env: dict[str, Any]
    result: Result | None
    emulated: bool
    test: str = ""  # its serving rows' test and settings key: kind, or decode_tp for `bench decode --tp`

    def summary(self) -> dict[str, Any]:
        emu = self.env.get("emulation") or {}
        return {"file": self.path, "kind": self.kind, "gpu": _env.gpu_name(self.env), "cc_mode": _env.cc_mode(self.env),
                "tee": (self.env.get("tee") or {}).get("kind", "unknown"), "emulated": self.emulated,
                "emulation_profile": (_env.emulation_label(emu) if emu.get("active") else
                                      (self.result.settings.get("profile") if self.result and self.emulated else None)),
                "cc_applies": self.cc_applies}

    @property
    def cc_applies(self) -> bool:
        return _env.cc_mode(self.env) == "on" or self.emulated


def read(path: str | Path) -> Input:
    """One input file, by its kind; every defect is a ResultFileError naming the file."""
    p = Path(path)
    stamp, res = results.read_stamped(p, "pass a result.json or an env stamp")
    if res is None:
        if "emulation" in stamp:
            return Input(str(p), "env", stamp, None, bool(stamp["emulation"].get("active")))
        raise ResultFileError(f"{p}: not a ccbridge result or env stamp (`ccbridge env --json`)")
    kind = res.kind
    if kind in _SERVING:
        metric = "ttft_ms" if kind == "kv" else "tok_per_s"
        if not any(r.test == kind and r.metric == metric for r in res.rows):
            raise ResultFileError(f"{p}: a {kind} result with no {kind}:{metric} rows (an interrupted "
                                  f"`{results.KINDS[kind]}`?): nothing to advise from")
        _check_serving(p, kind, res)
        # serve/tp.py's rows are decode's with a tp param, under their own test name
        return Input(str(p), "kv" if kind == "kv" else "decode", res.env, res, res.emulated, kind)
    if kind == "account":
        # account --profile: the stamp is the parent's, the OTHER trace ran under the emulator
        return Input(str(p), "account", res.env, res, res.emulated or bool(res.settings.get("profile")))
    if kind == "probe":
        if not any(r.test.startswith(PROBE_TESTS) for r in res.rows):
            what = "of a machine with no usable GPU" if res.no_gpu else "with none of the GPU families advise reads"
            raise ResultFileError(f"{p}: a probe {what}: nothing to advise from")
        return Input(str(p), "probe", res.env, res, res.emulated)
    raise ResultFileError(f"{p}: a {kind} result: advise reads env stamps and probe, account, decode, decode_tp "
                          "and kv results")


# What bench decode and bench kv write, per row: the parameter that tells rows apart and its values.
_SERVING = {"decode": ("batch", DECODE_MODES), "decode_tp": ("batch", DECODE_MODES), "kv": ("threshold", ("sync", "async"))}


def _check_serving(p: Path, kind: str, res: Result) -> None:
    """Rows as bench decode / bench kv write them: a positive integer batch or threshold, a known mode, a
    positive median, one row per quantity; ResultFileError naming the row otherwise."""
    if not isinstance(res.settings.get(kind, {}), dict):
        raise ResultFileError(f"{p}: settings.{kind} must be an object")
    by, modes = _SERVING[kind]
    seen = set()
    for i, r in enumerate(res.rows):
        if r.test != kind:
            continue
        v, mode = r.params.get(by), r.params.get("mode")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ResultFileError(f"{p}: rows[{i}] params.{by} must be a positive integer, not {v!r}")
        if mode not in modes:
            raise ResultFileError(f"{p}: rows[{i}] params.mode must be one of {', '.join(modes)}, not {mode!r}")
        tp = r.params.get("tp")  # bench decode --tp: the tensor-parallel degree
        if tp is not None and (not isinstance(tp, int) or isinstance(tp, bool) or tp < 1):
            raise ResultFileError(f"{p}: rows[{i}] params.tp must be a positive integer, not {tp!r}")
        if r.metric in ("tok_per_s", "ttft_ms") and not r.median > 0:
            raise ResultFileError(f"{p}: rows[{i}] {kind}:{r.metric} median must be positive, not {r.median!r}")
        key = (r.metric, v, mode, tuple(sorted((k, str(x)) for k, x in r.params.items())))
        if key in seen:
            raise ResultFileError(f"{p}: rows[{i}] repeats {r.key()}: which one holds?")
        seen.add(key)


def _size(n: int) -> str:
    from ccbridge.probe.transfer import human_bytes

    return human_bytes(n)


def _one(rows: list[Row], **params) -> Row | None:
    return next((r for r in rows if all(r.params.get(k) == v for k, v in params.items())), None)


def _state(inp: Input) -> str:
    if inp.emulated:
        return "CC emulated"
    return {"on": "CC on (NVML)", "off": "CC off (NVML)"}.get(_env.cc_mode(inp.env), "CC state unknown")


def from_env(inp: Input) -> list[Advice]:
    """What the stamp alone says: whether CC-aware settings apply; no number, so measure."""
    out, add = _adder(inp)
    state = _state(inp)
    if not inp.cc_applies:
        add("all", "engine defaults (async scheduling, pinned host buffers, CUDA graphs as shipped)",
            f"{state}, nothing emulated: CC-aware settings do not apply" if _env.cc_mode(inp.env) == "off" else
            f"{state} (no NVML reading), nothing emulated: CC-aware settings only if this machine runs CC on")
        return out
    from ccbridge import advise_mgpu

    advise_mgpu.no_multicast(inp, add, "engines that want a multicast workspace must do without")
    then = f"{state}, no measurement in this stamp: confirm with `ccbridge probe`"
    add("vLLM", "--async-scheduling only with readbacks on a ccbridge.serve.DrainWorker; otherwise scheduling sync", then)
    add("SGLang/TRT-LLM", "drain sampled-token readbacks on a worker (ccbridge.serve.DrainWorker)", then)
    add("all", "keep CUDA graphs on (vLLM: no --enforce-eager; SGLang: no --disable-cuda-graph)", then)
    add("torch", "per-step inputs through ccbridge.serve.StagedH2D (packed, idle stream)", then)
    return out


def _adder(inp: Input):
    """A list of advice for one input, and the function that appends to it."""
    out: list[Advice] = []

    def add(stack: str, setting: str, why: str, *rows: Row, brief: str | None = None) -> None:
        cites = [Cite.of(r) for r in rows]
        out.append(Advice(stack, setting, why, inp.path, inp.emulated, cites,
                          brief if brief is not None else _brief(cites)))

    return out, add


def _brief(cites: list[Cite]) -> str:
    """The first number cited, in a few words: its metric and median (fractions as percentages)."""
    if not cites:
        return "no measurement"
    c = cites[0]
    value = f"{c.median:.0%}" if c.unit == "fraction" else f"{c.median:.3g} {c.unit}"
    return f"{c.key.split(':')[1].split('[')[0].replace('_', ' ')} {value}"


def from_probe(inp: Input) -> list[Advice]:
    res = inp.result
    out, add = _adder(inp)
    if not inp.cc_applies:
        add("all", "no CC-specific change; the lines below follow the measurements only",
            f"{_state(inp)}, nothing emulated")
    sem = res.by_test("semantics.nonblocking")
    d2h = _one(sem, dir="d2h", mem="pinned", stream="same")
    if d2h:
        if d2h.median > HOLDS:
            why = f"a pinned D2H on a busy stream held the host for {d2h.median:.0%} of the queued work"
            add("vLLM", "--async-scheduling off (scheduling sync), or on only with readbacks drained on a "
                "ccbridge.serve.DrainWorker", why, d2h)
            add("SGLang", "--disable-overlap-schedule, unless sampled tokens are read back on a DrainWorker", why, d2h)
            add("TRT-LLM", "disable_overlap_scheduler=True, unless readbacks go to a DrainWorker", why, d2h)
            add("torch", "read back on ccbridge.serve.DrainWorker, off the thread that launches", why, d2h)
        else:
            add("vLLM/SGLang/TRT-LLM", "async / overlap scheduling on (engine default)",
                f"a pinned D2H on a busy stream returned at once ({d2h.median:.0%} of the queued work)", d2h)
    h2d, idle = _one(sem, dir="h2d", mem="pinned", stream="same"), _one(sem, dir="h2d", mem="pinned", stream="idle")
    if h2d and h2d.median > HOLDS:
        cites = [h2d] + ([idle] if idle else [])
        add("torch", "per-step inputs through ccbridge.serve.StagedH2D (idle prep stream, one packed crossing)",
            f"a pinned H2D on a busy stream held the host for {h2d.median:.0%} of the queued work"
            + (f", on an idle stream {idle.median:.0%}" if idle else ""), *cites)

    bw = [r for r in res.by_test("transfer.sweep") if r.metric == "bandwidth" and r.params.get("dir") == "h2d"]
    both = {r.params["bytes"] for r in bw if r.params["mem"] == "pinned"} & \
        {r.params["bytes"] for r in bw if r.params["mem"] == "pageable"}
    if both:
        top = max(both)
        pin, page = _one(bw, mem="pinned", bytes=top), _one(bw, mem="pageable", bytes=top)
        ratio = pin.median / page.median if page.median else float("inf")
        why = f"pinned/pageable H2D = {ratio:.2f}x at {_size(top)}"
        if ratio >= PINNED_WINS:
            add("torch", "pin host buffers (DataLoader pin_memory=True, persistent pinned staging)", why, pin, page)
            add("vLLM", "KV offload / swap space in pinned host memory (the default)", why, pin, page)
            add("loader", "ccbridge load --staging pinned", why, pin, page)
        else:
            add("torch", "pageable host buffers: pin_memory buys little here (skip fresh pin_memory() per batch)",
                why, pin, page)
            add("vLLM", "KV offload: pinned host memory gains little; size the CPU tier by host RAM, not pin limits",
                why, pin, page)
            add("loader", "ccbridge load --staging pageable", why, pin, page)

    launch = {r.params.get("mode"): r for r in res.by_test("launch.cost")}
    fw = {r.params.get("mode"): r for r in res.by_test("framework.launch") if r.metric == "time_per_op"}
    pipe = launch.get("pipelined") or fw.get("pipelined")
    if pipe:
        graph = launch.get("graph")
        cites = [pipe] + ([graph] if graph else [])
        why = f"launch toll {pipe.median:.1f} us per kernel" + (f", {graph.median:.2f} us in a graph" if graph else "")
        if pipe.median >= LAUNCH_TOLL_US:
            add("vLLM", "CUDA graphs on: no --enforce-eager; raise --max-num-seqs capture sizes to cover decode batches",
                why, *cites)
            add("SGLang", "CUDA graphs on (no --disable-cuda-graph); --cuda-graph-max-bs to your decode batch", why, *cites)
            add("TRT-LLM", "cuda_graph_config enabled with batch sizes covering decode", why, *cites)
            add("torch", "torch.compile(mode=\"reduce-overhead\") or torch.cuda.CUDAGraph for the step", why, *cites)
        else:
            add("all", "CUDA graphs as the engine ships them (the launch toll is small here)", why, *cites)

    conc = res.by_test("concurrency.scaling")
    ctx = sorted((r for r in conc if r.params.get("mode") == "contexts" and r.params.get("dir") == "h2d"),
                 key=lambda r: r.params["n"])
    if ctx and ctx[0].params["n"] == 1:
        one, best = ctx[0], max(ctx[1:] or ctx, key=lambda r: r.median)
        gain = best.median / one.median if one.median else 0.0
        why = f"H2D with {best.params['n']} contexts {gain:.2f}x one context (the best N measured)"
        if gain >= SCALES:
            n = best.params["n"]
            add("loader", f"pool of {n} contexts: ccbridge load --contexts {n} --workers {n}", why, one, best)
            add("torch", f"DataLoader/loader H2D from {n} processes or contexts, not one", why, one, best)
        else:
            add("loader", "one context (ccbridge load --contexts 0): more contexts add nothing", why, one, best)

    small = sorted(res.by_test("smallcopy.d2h32"), key=lambda r: r.params.get("streams", 0))
    if len(small) >= 2 and inp.cc_applies:
        one, many = small[0], small[-1]
        if many.median and one.median / many.median < 1.25:
            add("torch", "one D2H per step for all sampled tokens (small readbacks serialize across streams)",
                f"32-byte D2H {many.median:.1f} us per copy at {many.params['streams']} streams vs "
                f"{one.median:.1f} us at 1", one, many)
    return out


def _stacks(recovery: str) -> list[tuple[str, str]]:
    """The per-stack settings an account row's recovery calls for."""
    r = recovery
    if "CUDA graphs" in r:
        return [("vLLM", "CUDA graphs on (no --enforce-eager)"), ("SGLang", "CUDA graphs on (no --disable-cuda-graph)"),
                ("TRT-LLM", "cuda_graph_config enabled"), ("torch", "torch.cuda.CUDAGraph / torch.compile(mode=\"reduce-overhead\")")]
    if "DrainWorker" in r:
        return [("vLLM", "--async-scheduling with readbacks on a ccbridge.serve.DrainWorker, else scheduling sync"),
                ("SGLang", "sampled tokens read back on a DrainWorker, else --disable-overlap-schedule"),
                ("TRT-LLM", "readbacks on a DrainWorker, else disable_overlap_scheduler=True"),
                ("torch", "ccbridge.serve.DrainWorker for readbacks and synchronizes")]
    if "small readbacks" in r:
        return [("vLLM/SGLang/TRT-LLM", "one D2H per step for all sampled tokens and logprobs (gathered on the device)"),
                ("torch", "torch.cat a step's small results on the device, then one .to(\"cpu\") per step")]
    if "StagedH2D" in r:
        return [("vLLM/SGLang/TRT-LLM", "per-step metadata (positions, slot mappings, sampling params) through one "
                 "ccbridge.serve.StagedH2D"), ("torch", "ccbridge.serve.StagedH2D: packed inputs on an idle stream")]
    if "create contexts once" in r:
        return [("all", "create CUDA contexts once per process and keep them (no context per request or per worker "
                 "restart)")]
    if "pinned buffers once" in r:
        return [("torch", "allocate pinned host buffers once and reuse them (no fresh pin_memory() per step)"),
                ("vLLM", "keep swap / KV-offload space allocated at startup (its default), not per request")]
    if "contexts" in r:
        return [("loader", "ccbridge load --contexts N --workers N (a context pool)"),
                ("torch", "H2D from several processes or contexts")]
    if "fewer crossings" in r:
        return [("DDP", "larger buckets (bucket_cap_mb 100+; sweep with `ccbridge bench ddp --buckets`)"),
                ("torch", "batch copies: one large crossing instead of many")]
    return [("all", r)]


def from_account(inp: Input) -> list[Advice]:
    res = inp.result
    out, add = _adder(inp)
    # the slowdown the shares are of (the driver-call span's since share_base exists; before, the wall time's)
    totals = {r.metric: r for r in res.by_test("account.total")}
    total = totals.get("share_base") or totals.get("wall_slowdown")
    shares = sorted((r for r in res.by_test("account.api") if r.metric == "share_of_slowdown" and r.median >= MIN_SHARE),
                    key=lambda r: -r.median)[:TOP_ACCOUNT]
    if not shares:
        add("all", "no change: no call family explains 5% of the slowdown",
            f"{_state(inp)}; largest shares under {MIN_SHARE:.0%}", *([total] if total else []))
        return out
    at_sites = [x for x in res.by_test("account.site") if x.metric == "share_of_slowdown"]
    from ccbridge import advise_mgpu

    advise_mgpu.from_collectives(inp, add, [r for r in shares if r.params.get("kind") == "collective"], total)
    for r in (r for r in shares if r.params.get("kind") != "collective"):
        p = r.params
        what = f"{p.get('api')} ({'/'.join(x for x in (p.get('kind'), p.get('dir'), p.get('mem')) if x)})"
        # where in the program: the call sites of this API that explain most of the slowdown
        where = sorted((x for x in at_sites if all(x.params.get(k) == p.get(k) for k in ("api", "dir", "mem"))
                        and x.median >= MIN_SHARE), key=lambda x: -x.median)[:2]
        why = (f"{what}: {r.median:.0%} of the slowdown"
               + (f" ({total.median * 1e3:.1f} ms)" if total else "")
               + "".join(f"; {x.median:.0%} at {x.params['site']}" for x in where)
               + f"; {r.extra.get('recovery', '')}")
        brief = f"{r.median:.0%} of slowdown" + (f" ({total.median * 1e3:.1f} ms)" if total else "")
        for stack, setting in _stacks(str(r.extra.get("recovery", ""))):
            add(stack, setting, why, *([r] + where + ([total] if total else [])), brief=brief)
    return out


# What each decode scheduling mode means in the engines people run (bench decode's modes, ccbridge.serve.decode).
_MODE_STACKS = {
    "sync": [("vLLM", "scheduling sync: leave --async-scheduling off"),
             ("SGLang", "--disable-overlap-schedule"), ("TRT-LLM", "disable_overlap_scheduler=True"),
             ("torch", "read step N's tokens before preparing step N+1")],
    "async": [("vLLM/SGLang/TRT-LLM", "async / overlap scheduling on (the engine default)"),
              ("torch", "launch step N+1 before reading step N")],
    "staged": [("vLLM/SGLang/TRT-LLM", "async scheduling, with per-step inputs (positions, slot mappings) through "
                "one ccbridge.serve.StagedH2D"), ("torch", "ccbridge.serve.StagedH2D: packed inputs on an idle stream")],
    "drain": _stacks("DrainWorker") + [("torch", "per-step inputs through ccbridge.serve.StagedH2D as well")],
}


def _more(a: Row, b: Row) -> float:
    """How many times a beats b where more is better (tok/s); medians are positive (read checks them)."""
    return a.median / b.median


def _less(a: Row, b: Row) -> float:
    """How many times a beats b where less is better (TTFT)."""
    return b.median / a.median


def _pick(measured: dict, order: list, gain):
    """The first choice in order (the engine default first, then the least change) within MARGIN of the best
    measured (gain(a, b): how many times a beats b), so run noise never turns into a recommendation."""
    ref = next(iter(measured.values()))
    best = measured[max(measured, key=lambda k: gain(measured[k], ref))]
    return next(k for k in order if k in measured and gain(best, measured[k]) < MARGIN)


def from_decode(inp: Input) -> list[Advice]:
    """Per batch size, the scheduling mode to run (the engine default, async, unless another beats it by
    MARGIN); the engines' settings for the largest batch measured, where serving concurrency lives."""
    from ccbridge import advise_mgpu

    res = inp.result
    out, add = _adder(inp)
    by_tp = _tok(inp)
    if not _trustworthy(inp, add):
        return out
    at_tp = None  # several TP degrees: the modes at the one advised
    if len({t for t, _, _ in by_tp}) > 1:
        at_tp = advise_mgpu.from_tp(inp, add, by_tp)
    elif any(t and t > 1 for t, _, _ in by_tp):
        advise_mgpu.no_multicast(inp, add, "TP above 1 runs its all-reduces on this fabric", *by_tp.values())
    tok = {(b, m): r for (t, b, m), r in by_tp.items() if at_tp is None or t == at_tp}
    at = f"TP {at_tp}, " if at_tp else ""
    batches = sorted({b for b, _ in tok})
    if "async" not in {m for _, m in tok}:
        add("all", "none yet: measure async too (`--modes ... async`), the engines' default a change must beat",
            f"{_state(inp)}; modes measured: {', '.join(sorted({m for _, m in tok}))}", *tok.values())
        return out
    picks = {}
    for b in batches:
        modes = {m: r for (bb, m), r in tok.items() if bb == b}
        if "async" not in modes:
            continue
        pick = _pick(modes, ["async", "sync", "staged", "drain"], _more)
        picks[b] = pick
        others = ", ".join(f"{m} {r.median:.0f}" for m, r in modes.items())
        gain = "" if pick == "async" else f" ({modes[pick].median / modes['async'].median:.2f}x async)"
        add("torch", f"{at}batch {b}: {pick} scheduling", f"{_state(inp)}; tok/s {others}" + gain, *modes.values(),
            brief=f"{pick} {modes[pick].median:.0f} tok/s{gain}")
    top = max(picks)
    modes = {m: r for (bb, m), r in tok.items() if bb == top}
    why = f"{at}batch {top}: {picks[top]} {modes[picks[top]].median:.0f} tok/s" + (
        "" if picks[top] == "async" else f" vs async {modes['async'].median:.0f}")
    for stack, setting in _MODE_STACKS[picks[top]]:
        add(stack, setting, why, *modes.values(), brief=why)
    if not res.settings.get(inp.test, {}).get("graphs") and inp.cc_applies:
        add("all", "measure CUDA graphs too (`ccbridge bench decode --graphs`): one launch toll per step",
            "this run decoded eager; under CC every kernel launch pays the toll")
    return out


_MISMATCH = {"decode": "its modes generated different tokens", "kv": "restored KV gave different first tokens"}


def _clean(inp: Input) -> tuple[str, str] | None:
    """Why a serving result can carry no advice (setting, reason), or None: recorded errors, a token
    mismatch, or a CPU run."""
    res = inp.result
    mismatch = any((not r.extra.get("tokens_match", True)) if inp.kind == "decode" else r.extra.get("mismatches")
                   for r in res.rows if r.test == inp.test and r.metric in ("tok_per_s", "ttft_ms"))
    if res.errors or mismatch:
        first = res.errors[0].get("error", "") if res.errors else _MISMATCH[inp.kind]
        return (f"none from this run: {_MISMATCH[inp.kind] if mismatch else 'it recorded errors'}",
                f"{_state(inp)}; a failed run measures a bug, not a setting (first: {first})")
    if str((res.settings.get(inp.test) or {}).get("device", "")).startswith("cpu"):
        return ("none for GPU engines: measured on the CPU, where nothing crosses a bridge",
                f"run `ccbridge bench {inp.kind}` on a GPU, natively and under `ccbridge run --profile NAME --`")
    return None


def _trustworthy(inp: Input, add) -> bool:
    """A serving result advice can stand on (else the one line saying why)."""
    why = _clean(inp)
    if why:
        add("all", *why)
    return why is None


def from_kv(inp: Input) -> list[Advice]:
    """Per scheduling mode, the store threshold to run: the lowest warm TTFT p50, preferring the engine
    default (threshold 1: no filter) unless another beats it by MARGIN; spill volumes cited beside."""
    res = inp.result
    out, add = _adder(inp)
    rows = {(r.params["threshold"], r.params["mode"], r.metric): r for r in res.rows if r.test == "kv"}
    ttft = {k[:2]: r for k, r in rows.items() if k[2] == "ttft_ms"}
    if not _trustworthy(inp, add):
        return out
    best = {}
    for mode in sorted({m for _, m in ttft}):
        by_th = {t: r for (t, m), r in sorted(ttft.items()) if m == mode}
        if 1 not in by_th:
            add("all", f"{mode} scheduling: none yet: measure threshold 1 too (no filter, the engines' default)",
                f"{_state(inp)}; thresholds measured: {', '.join(map(str, by_th))}", *by_th.values())
            continue
        th = _pick(by_th, sorted(by_th), _less)
        best[mode] = (th, by_th[th])
        base = by_th.get(min(by_th))
        spill = rows.get((th, mode, "spill_bytes"))
        spill0 = rows.get((min(by_th), mode, "spill_bytes"))
        why = (f"{_state(inp)}, scheduling {mode}: warm TTFT p50 {by_th[th].median:.1f} ms at threshold {th}"
               + (f" vs {base.median:.1f} ms at {min(by_th)}" if th != min(by_th) else "")
               + (f"; spill D2H {approx_bytes(spill.median)}" if spill else "")
               + (f" vs {approx_bytes(spill0.median)}" if spill and spill0 and th != min(by_th) else ""))
        cites = [by_th[th]] + ([base] if th != min(by_th) else []) + [r for r in (spill, spill0) if r]
        cfg = '{"store_threshold": %d}' % th if th >= 2 else "no store_threshold (every evicted block is stored)"
        add("vLLM", f"{mode} scheduling: OffloadingConnector kv_connector_extra_config {cfg}", why, *cites)
        add("torch", f"{mode} scheduling: ccbridge.serve.KVCache(threshold={th})", why, *cites)
    if len(best) > 1:
        at_best = {m: row for m, (_, row) in best.items()}
        mode = _pick(at_best, ["async", "sync"], _less)
        other = "sync" if mode == "async" else "async"
        a, b = at_best[mode], at_best[other]
        add("vLLM", "scheduling sync while KV restores are frequent (leave --async-scheduling off)" if mode == "sync"
            else "async scheduling (the default) with the offload tier", f"{_state(inp)}: warm TTFT p50 {a.median:.1f} "
            f"ms {mode} vs {b.median:.1f} ms {other}, each at its best threshold", a, b)
    return out


# decode settings two results must share to be compared (the device by its kind: cuda vs cuda:0 is one run)
_SAME_RUN = ("model", "checkpoint", "prompt", "output", "graphs", "dtype", "seed")


def _tok(inp: Input) -> dict[tuple, Row]:
    """A decode result's tok/s rows by (TP degree or None, batch, mode)."""
    return {(r.params.get("tp"), r.params["batch"], r.params["mode"]): r for r in inp.result.rows
            if r.test == inp.test and r.metric == "tok_per_s"}


def from_decode_pair(native: Input, cc: Input) -> list[Advice]:
    """A CC-off decode result beside a CC-on (or emulated) one of the same run: per TP degree (where given)
    and mode at the largest batch both measured, the CC tax against the same mode natively and the share of
    the gap to native async that the mode closes (issue 14's recovery hierarchy); per TP degree, what is kept."""
    from ccbridge import advise_mgpu

    out, add = _adder(cc)
    by_tp = [_tok(x) for x in (native, cc)]
    for tp in sorted({t for t, _, _ in by_tp[1]}, key=lambda t: t or 0):
        tok = [{(b, m): r for (t, b, m), r in x.items() if t == tp} for x in by_tp]
        _pair_modes(native, cc, add, tok, f"TP {tp}, " if tp else "")
    advise_mgpu.tp_kept(native, cc, add, by_tp)
    return out


def _pair_modes(native: Input, cc: Input, add, tok: list[dict], at: str) -> None:
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
        why = f"{_state(cc)} vs {Path(native.path).name}: {c.median:.0f} vs {n.median:.0f} tok/s"
        if gap > 0 and mode != "async":
            why += f"; closes {(c.median - cc_async.median) / gap:.0%} of the gap to native async ({nat_async.median:.0f})"
        add("torch", f"{at}batch {b}, {mode}: CC tax {1 - c.median / n.median:.0%}", why, c, n,
            brief=f"{c.median:.0f} vs {n.median:.0f} tok/s")


def _pairs(inputs: list[Input]) -> list[tuple[Input, Input]]:
    """Each CC (or emulated) decode result with the first CC-off one of the same settings, both clean runs
    on a GPU (what _trustworthy says no advice of its own for is no half of a comparison either)."""
    dec = [i for i in inputs if i.kind == "decode" and _clean(i) is None]

    def key(i: Input) -> tuple:
        s = i.result.settings.get(i.test, {})
        return tuple(s.get(k) for k in _SAME_RUN) + (str(s.get("device", "")).split(":")[0], s.get("host_prep_us") or 0)

    return [(n, c) for c in dec if c.cc_applies
            for n in [next((n for n in dec if not n.cc_applies and key(n) == key(c)), None)] if n]


def advise(paths: list[str]) -> tuple[list[Input], list[Advice]]:
    inputs = [read(p) for p in paths]  # every file checked before any advice
    out: list[Advice] = []
    for inp in inputs:
        out += {"env": from_env, "probe": from_probe, "account": from_account, "decode": from_decode,
                "kv": from_kv}[inp.kind](inp)
    for native, cc in _pairs(inputs):
        out += from_decode_pair(native, cc)
    return inputs, out


def _header(inp: Input) -> str:
    s = inp.summary()
    return (f"# {s['file']}: {s['kind']}, {s['gpu']}, {_state(inp)}"
            + (f" (profile {s['emulation_profile']})" if s["emulated"] else "")
            + ("" if s["cc_applies"] else ": CC-aware settings do not apply"))


def _label(a: Advice) -> str:
    return "EMULATED" if a.emulated else "measured" if a.cites else "-"


# stack, setting, emulated or measured, the number in a few words: 19 + 56 + 8 + 31 and three gaps of 2 = 120
COLUMNS = (("stack", 19), ("setting", 56), ("figure", 8), ("number behind it (--why)", 31))


def render(inputs: list[Input], recs: list[Advice]) -> str:
    """The advice in 120 columns, under the input it came from: setting, EMULATED or measured, and the number
    behind it in a few words (the row keys and the reasoning: render_why, --json)."""
    lines = []
    for inp in inputs:
        lines += textfit.wrap([_header(inp)])
        mine = [a for a in recs if a.source == inp.path]
        if mine:
            lines += textfit.table([h for h, _ in COLUMNS], [[a.stack, a.setting, _label(a), a.brief] for a in mine],
                                   [w for _, w in COLUMNS])
    return "\n".join(lines)


def render_why(inputs: list[Input], recs: list[Advice]) -> str:
    """--why: per line, the setting, why, and each row key with its median behind it, wrapped to 120 columns."""
    lines = []
    for inp in inputs:
        lines += textfit.wrap([_header(inp)])
        for a in (a for a in recs if a.source == inp.path):
            lines += textfit.wrap([f"{a.stack}: {a.setting} [{_label(a)}]"])
            lines += textfit.wrap([f"  why: {a.why}"], indent="    ")
            lines += textfit.wrap([f"  [{c.text()}]" for c in a.cites] or ["  [no measurement]"], indent="    ")
    return "\n".join(lines)


def to_json(inputs: list[Input], recs: list[Advice]) -> dict[str, Any]:
    return {"inputs": [i.summary() for i in inputs], "advice": [a.as_dict() for a in recs]}
