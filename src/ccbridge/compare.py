"""compare BASE OTHER: OTHER/BASE ratios for every common row, and the findings that changed."""

from __future__ import annotations

from dataclasses import dataclass

from ccbridge import env as envmod
from ccbridge.errors import UsageError
from ccbridge.findings import findings
from ccbridge.report import html as H
from ccbridge.report.markdown import table_md
from ccbridge.report.plots import ratio_chart
from ccbridge.report.tables import Table, fmt_params, num
from ccbridge.results import Result, Row
from ccbridge.textfit import table, wrap


@dataclass
class Ratio:
    base: Row
    other: Row

    @property
    def ratio(self) -> float:
        return self.other.median / self.base.median if self.base.median else float("nan")

    @property
    def range(self) -> tuple[float, float]:
        """The ratio's plausible range from both runs' p10/p90."""
        if self.base.p10 <= 0 or self.base.p90 <= 0:
            return (float("nan"), float("nan"))
        return self.other.p10 / self.base.p90, self.other.p90 / self.base.p10

    @property
    def cost(self) -> float:
        """How much worse OTHER is than BASE (0.25 = 25% worse; negative = better)."""
        r = self.ratio
        return (1 / r - 1) if self.base.higher_is_better else (r - 1)


@dataclass
class Comparison:
    base: Result
    other: Result
    ratios: list[Ratio]
    only_base: list[Row]
    only_other: list[Row]
    changed: list[tuple[str, str, str, str]]  # id, base outcome, other outcome, other text


def compare(base: Result, other: Result) -> Comparison:
    """Two results of one kind, row by row; UsageError for two kinds (a probe's rows and a bench's share none)."""
    if base.kind != other.kind:
        raise UsageError(f"BASE is a {base.kind} result and OTHER a {other.kind} result: compare takes two results "
                         "of one kind")
    bmap = {r.key(): r for r in base.rows}
    omap = {r.key(): r for r in other.rows}
    ratios = [Ratio(bmap[k], omap[k]) for k in bmap if k in omap]
    bf = {f.id: f for f in findings(base)}
    of = {f.id: f for f in findings(other)}
    changed = [(i, bf[i].outcome if i in bf else "absent", of[i].outcome if i in of else "absent",
                of[i].text if i in of else bf[i].text)
               for i in dict.fromkeys([*bf, *of]) if (bf.get(i) and bf[i].outcome) != (of.get(i) and of[i].outcome)]
    return Comparison(base, other, ratios, [bmap[k] for k in bmap if k not in omap],
                      [omap[k] for k in omap if k not in bmap], changed)


def _label(res: Result) -> str:
    emu = res.env.get("emulation", {})
    what = f"EMULATED profile {emu.get('profile')}" if emu.get("active") else f"CC {envmod.cc_mode(res.env)}"
    return f"{envmod.gpu_name(res.env)}, {what}, {res.created[:10]}"


def ratio_table(c: Comparison) -> Table:
    t = Table("Ratios (OTHER / BASE)", ["test", "parameters", "metric", "unit", "BASE median", "OTHER median",
                                        "ratio", "ratio range", "spread BASE / OTHER", "OTHER worse by"])
    for r in c.ratios:
        lo, hi = r.range
        t.rows.append([r.base.test, fmt_params(r.base.params), r.base.metric, r.base.unit, num(r.base.median),
                       num(r.other.median), f"{r.ratio:.3f}", f"{lo:.3f} – {hi:.3f}",
                       f"{r.base.spread:.1%} / {r.other.spread:.1%}", f"{r.cost:+.1%}"])
    t.note = ("ratio range: OTHER p10/BASE p90 to OTHER p90/BASE p10. "
              "'OTHER worse by' reads as the CC tax when BASE is CC-off and OTHER is CC-on.")
    return t


def changed_table(c: Comparison) -> Table:
    t = Table("Findings that changed", ["finding", "BASE", "OTHER", "OTHER says"])
    t.rows = [list(x) for x in c.changed]
    return t


def headline_items(c: Comparison, limit: int = 40) -> list[tuple[str, float, float, float]]:
    """The chart's bars: headline rows, or every common row when none is marked (capped)."""
    chosen = [r for r in c.ratios if r.base.extra.get("headline") or r.other.extra.get("headline")] or c.ratios
    return [(f"{r.base.test} {r.base.metric} [{fmt_params(r.base.params)}]", r.ratio, *r.range)
            for r in chosen[:limit] if r.ratio == r.ratio]


def timer_mix(c: Comparison) -> str | None:
    """Where the two sides' GPU-time rows come from different timers (gputimer: CUDA events, %globaltimer), a line
    that says so: their GPU-time ratios mix two clocks."""
    timers = [r.settings.get("timer") or next((v.get("timer") for v in r.settings.values() if isinstance(v, dict)), None)
              for r in (c.base, c.other)]
    if None in timers or timers[0] == timers[1]:
        return None
    return f"GPU timers differ: BASE's GPU times are from {timers[0]}, OTHER's from {timers[1]} (see gputimer)"


def render_markdown(c: Comparison) -> str:
    lines = ["# ccbridge compare", "", f"- BASE: {_label(c.base)}", f"- OTHER: {_label(c.other)}", ""]
    if c.base.emulated or c.other.emulated:
        lines += ["> **EMULATED: at least one side was produced by the ccbridge emulator, not measured on CC hardware.**", ""]
    mix = timer_mix(c)
    if mix:
        lines += [f"> {mix}", ""]
    lines += [f"{len(c.ratios)} common rows; {len(c.only_base)} only in BASE, {len(c.only_other)} only in OTHER.", ""]
    for t in (changed_table(c), ratio_table(c)):
        md = table_md(t)
        lines.append(md or f"## {t.title}\n\nnone\n")
    return "\n".join(lines)


def render_text(c: Comparison) -> str:
    """The terminal's version of render_markdown, in 120 columns: each ratio's range and both runs' spreads are in
    compare.md and compare.html (--out)."""
    lines = wrap([f"ccbridge compare: BASE {_label(c.base)}; OTHER {_label(c.other)}"])
    if c.base.emulated or c.other.emulated:
        lines += ["EMULATED: at least one side was produced by the ccbridge emulator, not measured on CC hardware."]
    lines += [f"{len(c.ratios)} common rows; {len(c.only_base)} only in BASE, {len(c.only_other)} only in OTHER."]
    if c.changed:
        lines += ["", "Findings that changed:"] + table(["finding", "BASE -> OTHER", "OTHER says"],
                                                        [[i, f"{b} -> {o}", text] for i, b, o, text in c.changed],
                                                        [34, 26, 56])
    if c.ratios:
        rows = [[r.base.test, fmt_params(r.base.params), r.base.metric, r.base.unit, num(r.base.median),
                 num(r.other.median), f"{r.ratio:.3f}", f"{r.cost:+.1%}"] for r in c.ratios]
        lines += ["", "Ratios (OTHER / BASE); 'OTHER worse by' reads as the CC tax when BASE is CC-off and OTHER "
                  "CC-on:"] + table(["test", "parameters", "metric", "unit", "BASE", "OTHER", "ratio", "worse by"],
                                    rows, [21, 23, 22, 8, 9, 9, 6, 8])
    return "\n".join(lines)


def render_html(c: Comparison) -> str:
    chart = ratio_chart(headline_items(c))
    banner = ("EMULATED: at least one side was produced by the ccbridge emulator, not measured on CC hardware."
              if c.base.emulated or c.other.emulated else "")
    intro = [f"BASE: {_label(c.base)}", f"OTHER: {_label(c.other)}"]
    bullets = [f"{i}: {b} -> {o}. {text}" for i, b, o, text in c.changed]
    plots = [("Headline ratios", chart)] if chart else []
    return H.page("ccbridge compare", banner, intro, bullets, plots, [ratio_table(c)])
