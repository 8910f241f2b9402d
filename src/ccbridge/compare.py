"""compare BASE OTHER: OTHER/BASE ratios for every common row, and the findings that changed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ccbridge import stats
from ccbridge.errors import UsageError
from ccbridge.findings import Finding, findings
from ccbridge.report import html as H
from ccbridge.report.markdown import table_md
from ccbridge.report.plots import ratio_chart
from ccbridge.report.tables import Table, fmt_params, num
from ccbridge.results import Result, Row, cc_state, emulated_as, machine_name
from ccbridge.textfit import first_fit, table, wrap


@dataclass
class Ratio:
    base: Row
    other: Row

    @property
    def ratio(self) -> float:
        """OTHER's median over BASE's; NaN where BASE's is 0 or either is not finite (no ratio to give)."""
        b, o = self.base.median, self.other.median
        return o / b if b and math.isfinite(b) and math.isfinite(o) else float("nan")

    @property
    def range(self) -> tuple[float, float]:
        """The ratio's plausible range from both runs' p10/p90."""
        return stats.ratio_range((self.other.p10, self.other.p90), (self.base.p10, self.base.p90))

    @property
    def cost(self) -> float:
        """How much worse OTHER is than BASE (0.25 = 25% worse; negative = better); NaN where the ratio is."""
        r = self.ratio
        if not self.base.higher_is_better:
            return r - 1
        return 1 / r - 1 if r else float("inf")  # none of a throughput: infinitely worse


@dataclass
class Comparison:
    base: Result
    other: Result
    ratios: list[Ratio]
    only_base: list[Row]
    only_other: list[Row]
    changed: list[tuple[str, str, str, str]]  # id, base outcome, other outcome, other text ("" where none)
    unlike: list[tuple[Row, Row]] = field(default_factory=list)  # one quantity in two units: no ratio
    ran_once: tuple[list[str], list[str]] = ([], [])  # tests with rows only in BASE, only in OTHER
    same: bool = False  # one result twice (a file and itself, or a copy): nothing to compare


def compare(base: Result, other: Result) -> Comparison:
    """Two results of one kind, row by row; UsageError for two kinds (a probe's rows and a bench's share none)."""
    if base.kind != other.kind:
        raise UsageError(f"BASE is a {base.kind} result and OTHER a {other.kind} result: compare takes two results "
                         "of one kind")
    bmap = {r.key(): r for r in base.rows}
    omap = {r.key(): r for r in other.rows}
    both = [k for k in bmap if k in omap]
    ran_b, ran_o = {r.test for r in base.rows}, {r.test for r in other.rows}
    return Comparison(base, other, [Ratio(bmap[k], omap[k]) for k in both if bmap[k].unit == omap[k].unit],
                      [bmap[k] for k in bmap if k not in omap], [omap[k] for k in omap if k not in bmap],
                      _changed(findings(base), findings(other), ran_b & ran_o),
                      [(bmap[k], omap[k]) for k in both if bmap[k].unit != omap[k].unit],
                      (sorted(ran_b - ran_o), sorted(ran_o - ran_b)), base.to_json() == other.to_json())


def _changed(base: list[Finding], other: list[Finding], ran: set[str]) -> list[tuple[str, str, str, str]]:
    """The findings whose outcome differs, of tests both sides ran: one that a side could not draw from a test it
    never ran (skipped, not asked for) is no change."""
    bf = {f.id: f for f in base if not f.test or f.test in ran}
    of = {f.id: f for f in other if not f.test or f.test in ran}
    out = []
    for i in dict.fromkeys([*bf, *of]):
        b, o = bf.get(i), of.get(i)
        if (b and b.outcome) != (o and o.outcome):
            out.append((i, b.outcome if b else "absent", o.outcome if o else "absent", o.text if o else ""))
    return out


def _label(res: Result) -> str:
    prof = emulated_as(res)
    what = f"EMULATED profile {prof}" if prof else f"CC {cc_state(res)}"
    return f"{machine_name(res)}, {what}, {res.created[:10]}"


# The terminal's ratio columns; each formatter below gives at most its column's width, so no number is wrapped.
MEDIAN_W, RATIO_W, COST_W = 8, 8, 9


def fmt_median(x: float) -> str:
    return first_fit(MEDIAN_W, num(x), f"{x:.3g}", f"{x:.2g}", f"{x:.0e}")  # .0e: at most -2e+308


def fmt_ratio(x: float) -> str:
    """A ratio in at most RATIO_W columns: 0.907, 456.7, 1.2e+04; n/a where there is none."""
    if not math.isfinite(x):
        return "n/a"
    if x == 0 or 0.001 <= abs(x) < 1000:
        return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"
    return first_fit(RATIO_W, f"{x:.1e}", f"{x:.0e}")


def fmt_cost(c: float) -> str:
    """'OTHER worse by' in at most COST_W columns: +5.6%, +1.2e+06%; n/a where there is no ratio."""
    if not math.isfinite(c * 100):
        return "n/a"
    return f"{c:+.1%}" if abs(c) < 10 else first_fit(COST_W, f"{c * 100:+.1e}%", f"{c * 100:+.0e}%")


def fmt_range(r: Ratio) -> str:
    lo, hi = r.range
    return f"{fmt_ratio(lo)} – {fmt_ratio(hi)}" if math.isfinite(lo) and math.isfinite(hi) else "n/a"


def ratio_table(c: Comparison) -> Table:
    t = Table("Ratios (OTHER / BASE)", ["test", "parameters", "metric", "unit", "BASE median", "OTHER median",
                                        "ratio", "ratio range", "spread BASE / OTHER", "OTHER worse by"])
    for r in c.ratios:
        t.rows.append([r.base.test, fmt_params(r.base.params), r.base.metric, r.base.unit, num(r.base.median),
                       num(r.other.median), fmt_ratio(r.ratio), fmt_range(r),
                       f"{r.base.spread:.1%} / {r.other.spread:.1%}", fmt_cost(r.cost)])
    t.note = "ratio range: OTHER p10/BASE p90 to OTHER p90/BASE p10; n/a: no ratio (BASE's median 0)."
    return t


def changed_table(c: Comparison) -> Table:
    t = Table("Findings that changed", ["finding", "BASE", "OTHER", "OTHER says"])
    t.rows = [list(x) for x in c.changed]
    return t


def headline_items(c: Comparison, limit: int = 40) -> list[tuple[str, float, float, float]]:
    """The chart's bars: headline rows, or every common row when none is marked (capped)."""
    chosen = [r for r in c.ratios if r.base.extra.get("headline") or r.other.extra.get("headline")] or c.ratios
    return [(f"{r.base.test} {r.base.metric} [{fmt_params(r.base.params)}]", r.ratio, *r.range)
            for r in chosen[:limit] if math.isfinite(r.ratio)]


def timer_mix(c: Comparison) -> str | None:
    """Where the two sides' GPU-time rows come from different timers (gputimer: CUDA events, %globaltimer), a line
    that says so: their GPU-time ratios mix two clocks."""
    timers = [r.settings.get("timer") or next((v.get("timer") for v in r.settings.values() if isinstance(v, dict)), None)
              for r in (c.base, c.other)]
    if None in timers or timers[0] == timers[1]:
        return None
    return f"GPU timers differ: BASE's GPU times are from {timers[0]}, OTHER's from {timers[1]} (see gputimer)"


def _machine(res: Result) -> tuple[str, str | None, str]:
    return machine_name(res), (res.env.get("cpu") or {}).get("model"), cc_state(res)


def reading(c: Comparison) -> str | None:
    """What 'OTHER worse by' is: a CC tax only where one machine ran both, CC-off as BASE and CC-on (or under the
    emulator) as OTHER; where the GPUs or CPUs differ, the ratios compare the machines too."""
    (bg, bcpu, bcc), (og, ocpu, occ) = _machine(c.base), _machine(c.other)
    differ = ([f"GPUs ({bg} vs {og})"] if bg != og else []) + \
        ([f"CPUs ({bcpu} vs {ocpu})"] if bcpu and ocpu and bcpu != ocpu else [])
    if differ:
        cc = f" in different CC states ({bcc} vs {occ})" if bcc != occ else ""
        return (f"BASE and OTHER ran on different {' and '.join(differ)}{cc}: the ratios compare machines, not "
                + ("only a CC tax" if cc else "a CC tax"))
    if bcc != occ and "unknown" not in (bcc, occ) and not (c.base.emulated or c.other.emulated):
        if bcc == "off":
            return "one machine, BASE CC-off and OTHER CC-on: 'OTHER worse by' is the CC tax"
        return ("one machine, BASE CC-on and OTHER CC-off: give the CC-off run as BASE to read 'OTHER worse by' as "
                "the CC tax")
    if c.base.emulated != c.other.emulated and bcc == occ:
        emu = (c.other if c.other.emulated else c.base).env["emulation"].get("profile")
        if c.other.emulated:
            return (f"one machine, OTHER under the emulator: 'OTHER worse by' is profile {emu}'s CC tax, EMULATED, "
                    "not measured")
        return f"one machine, BASE under the emulator (profile {emu}): give it as OTHER to read its EMULATED CC tax"
    return None


def ran_once(c: Comparison) -> str | None:
    """The tests only one side ran (skipped, not asked for, or failed there): their findings are not compared."""
    def named(tests: list[str], there: Result, side: str) -> str:
        failed = {e.get("test") for e in there.errors}
        return ", ".join(t + (f" (failed in {side})" if t in failed else "") for t in tests)

    b, o = c.ran_once
    parts = ([f"only BASE ran {named(b, c.other, 'OTHER')}"] if b else []) + \
        ([f"only OTHER ran {named(o, c.base, 'BASE')}"] if o else [])
    return "; ".join(parts) + ": their findings are not compared" if parts else None


def unlike(c: Comparison) -> str | None:
    """The rows both sides have in different units: no ratio of them means anything."""
    if not c.unlike:
        return None
    shown = "; ".join(f"{b.key()}: units differ: {b.unit} vs {o.unit}" for b, o in c.unlike[:3])
    more = f"; {len(c.unlike) - 3} more" if len(c.unlike) > 3 else ""
    return f"{len(c.unlike)} row(s) of both not comparable ({shown}{more})"


def notes(c: Comparison) -> list[str]:
    """The lines that say what the tables are (each one line, wrapped in a terminal); one only for one result."""
    if c.same:
        return ["BASE and OTHER are one result (a file and itself, or a copy of it): nothing to compare"]
    counts = f"{len(c.ratios)} common rows; {len(c.only_base)} only in BASE, {len(c.only_other)} only in OTHER."
    return [x for x in (timer_mix(c), reading(c), counts, unlike(c), ran_once(c)) if x]


def tables(c: Comparison) -> tuple[Table, Table] | None:
    """The findings that changed and the ratios; None for one result twice, which has nothing to compare (notes()
    says so instead). Every renderer asks here, so they all leave out the same parts."""
    return None if c.same else (changed_table(c), ratio_table(c))


def render_markdown(c: Comparison) -> str:
    lines = ["# ccbridge compare", "", f"- BASE: {_label(c.base)}", f"- OTHER: {_label(c.other)}", ""]
    if c.base.emulated or c.other.emulated:
        lines += ["> **EMULATED: at least one side was produced by the ccbridge emulator, not measured on CC hardware.**", ""]
    for x in notes(c):
        lines += [f"> {x}", ""]
    for t in tables(c) or ():
        md = table_md(t)
        lines.append(md or f"## {t.title}\n\nnone\n")
    return "\n".join(lines)


def render_text(c: Comparison) -> str:
    """The terminal's version of render_markdown, in 120 columns: each ratio's range and both runs' spreads are in
    compare.md and compare.html (--out)."""
    lines = wrap([f"ccbridge compare: BASE {_label(c.base)}; OTHER {_label(c.other)}"])
    if c.base.emulated or c.other.emulated:
        lines += ["EMULATED: at least one side was produced by the ccbridge emulator, not measured on CC hardware."]
    lines += wrap(notes(c))
    shown = tables(c)
    if shown and shown[0].rows:
        lines += ["", "Findings that changed:"] + table(["finding", "BASE -> OTHER", "OTHER says"],
                                                        [[i, f"{b} -> {o}", text] for i, b, o, text in shown[0].rows],
                                                        [34, 26, 56])
    if shown and c.ratios:  # the terminal's own columns, from the ratios rather than the table's cells
        rows = [[r.base.test, fmt_params(r.base.params), r.base.metric, r.base.unit, fmt_median(r.base.median),
                 fmt_median(r.other.median), fmt_ratio(r.ratio), fmt_cost(r.cost)] for r in c.ratios]
        lines += ["", "Ratios (OTHER / BASE):"] + table(
            ["test", "parameters", "metric", "unit", "BASE", "OTHER", "ratio", "worse by"], rows,
            [21, 22, 22, 8, MEDIAN_W, MEDIAN_W, RATIO_W, COST_W])
    return "\n".join(lines)


def render_html(c: Comparison) -> str:
    shown = tables(c)
    chart = ratio_chart(headline_items(c)) if shown else None
    banner = ("EMULATED: at least one side was produced by the ccbridge emulator, not measured on CC hardware."
              if c.base.emulated or c.other.emulated else "")
    intro = [f"BASE: {_label(c.base)}", f"OTHER: {_label(c.other)}", *notes(c)]
    # the findings that changed as bullets, the ratios as the page's one table
    bullets = [f"{i}: {b} -> {o}." + (f" {text}" if text else "") for i, b, o, text in shown[0].rows] if shown else []
    plots = [("Headline ratios", chart)] if chart else []
    return H.page("ccbridge compare", banner, intro, bullets, plots, [shown[1]] if shown else [])
