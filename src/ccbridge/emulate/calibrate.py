"""Calibration: the emulated probe next to the native probe and the published targets.

Two kinds of check. Profile targets are published figures (a CC-on/CC-off
ratio or a CC-on value) that the emulated run must reproduce within the
target's tolerance. Law checks are the bridge law's shape, the same for every
profile: verdicts of the semantics family, no bandwidth from streams, more
from contexts and processes, pageable above pinned. Every figure here comes
from the emulator and is labelled so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from ccbridge.emulate.profiles import Profile
from ccbridge.errors import ProfileError, UsageError
from ccbridge.results import Result, Row

PROBE_TESTS = "transfer,smallcopy,semantics,launch,compute,concurrency,lifecycle"

# bridge-law section 2, property 2: what each non_blocking copy does under CC.
LAW_VERDICTS = {
    ("h2d", "pinned", "same"): "blocks", ("h2d", "pinned", "idle"): "async", ("h2d", "pinned", "event-wait"): "blocks",
    ("h2d", "pageable", "same"): "blocks", ("h2d", "pageable", "idle"): "async", ("h2d", "pageable", "event-wait"): "blocks",
    ("d2h", "pinned", "same"): "blocks", ("d2h", "pinned", "idle"): "async", ("d2h", "pinned", "event-wait"): "blocks",
    ("d2h", "pageable", "same"): "blocks", ("d2h", "pageable", "idle"): "async", ("d2h", "pageable", "event-wait"): "blocks",
    ("d2d", "device", "same"): "async",
}
RISE_AT_LEAST = 1.5   # aggregate at the largest N over N=1, for contexts and processes
FLAT_AT_MOST = 1.15   # the same for streams


@dataclass
class Check:
    id: str
    what: str
    measured: float | str | None
    target: str
    ok: bool | None  # None: the rows it needs are missing
    source: str = ""


def _rows(res: Result, test: str, metric: str, **params) -> list[Row]:
    return [r for r in res.rows if r.test == test and r.metric == metric
            and all(r.params.get(k) == v for k, v in params.items())]


def _one(res: Result, test: str, metric: str, **params) -> float | None:
    rows = _rows(res, test, metric, **params)
    return rows[0].median if rows else None


def _largest(res: Result, direction: str, mem: str) -> tuple[int, float] | None:
    rows = _rows(res, "transfer.sweep", "bandwidth", dir=direction, mem=mem)
    if not rows:
        return None
    r = max(rows, key=lambda r: r.params["bytes"])
    return r.params["bytes"], r.median


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _transfer_ratio(direction: str) -> Callable[[Result, Result], float | None]:
    def f(nat: Result, emu: Result):
        e = _largest(emu, direction, "pinned")
        return _ratio(e[1], _one(nat, "transfer.sweep", "bandwidth", dir=direction, mem="pinned", bytes=e[0])) if e else None
    return f


def _smallcopy(emu: Result) -> dict[int, float]:
    return {r.params["streams"]: r.median for r in _rows(emu, "smallcopy.d2h32", "per_copy_time")}


def _best(res: Result, mode: str, direction: str) -> float | None:
    rows = _rows(res, "concurrency.scaling", "aggregate_bandwidth", mode=mode, dir=direction)
    return max(r.median for r in rows) if rows else None


def _gain(res: Result, mode: str, direction: str) -> float | None:
    by_n = {r.params["n"]: r.median for r in _rows(res, "concurrency.scaling", "aggregate_bandwidth", mode=mode, dir=direction)}
    return by_n[max(by_n)] / by_n[1] if len(by_n) > 1 and 1 in by_n else None


def _launch(mode: str):
    return lambda nat, emu: _ratio(_one(emu, "launch.cost", "time_per_kernel", mode=mode),
                                   _one(nat, "launch.cost", "time_per_kernel", mode=mode))


def _peak(res: Result, metric: str) -> float | None:
    """Best of the row's samples: parity of capability, not of clock or thermal drift between runs."""
    rows = _rows(res, "compute.parity", metric)
    return (rows[0].max if rows[0].higher_is_better else rows[0].min) if rows else None


def _compute(metric: str):
    return lambda nat, emu: _ratio(_peak(emu, metric), _peak(nat, metric))


# target id -> (what, how to get the measured value from (native, emulated))
TARGETS: dict[str, tuple[str, Callable[[Result, Result], float | None]]] = {
    "h2d_pinned_ratio": ("pinned H2D, one context, largest size: emulated / native", _transfer_ratio("h2d")),
    "d2h_pinned_ratio": ("pinned D2H, one context, largest size: emulated / native", _transfer_ratio("d2h")),
    "h2d_pinned_value_gbps": ("pinned H2D, one context, largest size (GB/s, emulated)",
                              lambda nat, emu: (_largest(emu, "h2d", "pinned") or (0, None))[1]),
    "smallcopy_flatness": ("32-byte D2H per copy, 16 streams / 1 stream (emulated)",
                           lambda nat, emu: _ratio(_smallcopy(emu).get(16), _smallcopy(emu).get(1))),
    "smallcopy_1stream_us": ("32-byte D2H per copy, 1 stream (us, emulated)", lambda nat, emu: _smallcopy(emu).get(1)),
    "launch_pipelined_ratio": ("pipelined launch: emulated / native", _launch("pipelined")),
    "launch_wait_ratio": ("launch + wait: emulated / native", _launch("launch+wait")),
    "matmul_ratio": ("bf16 matmul TFLOP/s, best of N: emulated / native", _compute("matmul_bf16")),
    "graph_ratio": ("chained matmuls in one graph, best time: emulated / native", _compute("graph_replay_time")),
    "multiprocess_h2d_ratio": ("aggregate H2D, best N processes: emulated / native",
                               lambda nat, emu: _ratio(_best(emu, "processes", "h2d"), _best(nat, "processes", "h2d"))),
    "multiprocess_d2h_ratio": ("aggregate D2H, best N processes: emulated / native",
                               lambda nat, emu: _ratio(_best(emu, "processes", "d2h"), _best(nat, "processes", "d2h"))),
    "processes_h2d_best_gbps": ("aggregate H2D, best N processes (GB/s, emulated)",
                                lambda nat, emu: _best(emu, "processes", "h2d")),
    "ctx_create_8_s": ("create 8 contexts (s, emulated)", lambda nat, emu: _one(emu, "lifecycle.contexts", "create_time", contexts=8)),
    "ctx_destroy_8_s": ("destroy 8 contexts (s, emulated)", lambda nat, emu: _one(emu, "lifecycle.contexts", "destroy_time", contexts=8)),
}


def profile_checks(profile: Profile, native: Result, emulated: Result) -> list[Check]:
    out = []
    for tid, t in profile.targets.items():
        if tid not in TARGETS:
            raise ProfileError(f"profile {profile.name}: target {tid!r} has no calibration rule (known: {', '.join(TARGETS)})")
        what, get = TARGETS[tid]
        v = get(native, emulated)
        ok = None if v is None else abs(v / t.value - 1) <= t.tolerance
        out.append(Check(tid, what, v, f"{t.value:g} ±{t.tolerance:.0%}", ok, t.source))
    return out


def law_checks(emulated: Result) -> list[Check]:
    out = []
    got = {(r.params["dir"], r.params["mem"], r.params["stream"]): r.extra.get("verdict")
           for r in _rows(emulated, "semantics.nonblocking", "return_fraction")}
    if got:
        wrong = [f"{'/'.join(k)}: {got.get(k)} (law: {v})" for k, v in LAW_VERDICTS.items() if got.get(k) != v]
        out.append(Check("semantics", "non_blocking copy verdicts vs a busy stream", f"{len(LAW_VERDICTS) - len(wrong)}/{len(LAW_VERDICTS)} as the law says"
                         + (f"; {'; '.join(wrong)}" if wrong else ""), "all as property 2", not wrong, "bridge law, section 2, property 2"))
    else:
        out.append(Check("semantics", "non_blocking copy verdicts vs a busy stream", None, "all as property 2", None))
    pin, pag = _largest(emulated, "h2d", "pinned"), _largest(emulated, "h2d", "pageable")
    out.append(Check("pageable_over_pinned", "H2D pageable / pinned bandwidth, largest size (emulated)",
                     _ratio(pag[1], pin[1]) if pin and pag else None, "> 1",
                     (pag[1] > pin[1]) if pin and pag else None, "bridge law section 4: pageable over pinned under CC"))
    for mode, rule in (("streams", "flat"), ("contexts", "rise"), ("processes", "rise")):
        for direction in ("h2d", "d2h"):
            g = _gain(emulated, mode, direction)
            ok = None if g is None else (g <= FLAT_AT_MOST if rule == "flat" else g >= RISE_AT_LEAST)
            out.append(Check(f"{mode}_{direction}", f"aggregate {direction.upper()}, largest N / N=1, {mode} (emulated)", g,
                             f"<= {FLAT_AT_MOST}" if rule == "flat" else f">= {RISE_AT_LEAST}", ok,
                             "bridge law section 2, property 1"))
    return out


def evaluate(profile: Profile, native: Result, emulated: Result) -> list[Check]:
    if not emulated.emulated:
        raise UsageError("the 'emulated' result was not made under the emulator (its env stamp says native)")
    if native.emulated:
        raise UsageError("the 'native' result was made under the emulator")
    return profile_checks(profile, native, emulated) + law_checks(emulated)


def _fmt(v) -> str:
    if v is None:
        return "missing"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def render(profile: Profile, checks: list[Check], native: Result, emulated: Result) -> str:
    from ccbridge.report.tables import run_line

    passed = sum(c.ok is True for c in checks)
    lines = [f"# Calibration of profile `{profile.name}` (EMULATED)", "",
             f"> Every emulated figure here was produced by the ccbridge emulator on a CC-off GPU, "
             f"not measured on confidential-computing hardware.", "",
             f"- native run: {run_line(native)}", f"- emulated run: {run_line(emulated)}", "",
             f"{passed} of {len(checks)} checks hold.", "",
             "| check | what | emulated | target | holds | source |", "|---|---|---|---|---|---|"]
    for c in checks:
        mark = {True: "yes", False: "NO", None: "n/a"}[c.ok]
        lines.append(f"| {c.id} | {c.what} | {_fmt(c.measured)} | {c.target} | {mark} | {c.source} |")
    return "\n".join(lines) + "\n"


def to_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
