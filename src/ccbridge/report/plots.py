"""Plots as PNG bytes (matplotlib, Agg backend), for the self-contained HTML reports."""

from __future__ import annotations

import functools
import io

from ccbridge.results import Result

# The PNGs' resolution. Every figure is made at it: tight_layout lays the labels out at the figure's dpi and
# savefig draws at this one, and a figure made at matplotlib's default (100) measured its labels again at 110
# (a tenth of the transfer and concurrency charts' CPU time); the pictures are the same size in pixels.
DPI = 110


def _plt():
    import matplotlib  # deferred: matplotlib, only for a report's charts (a second of import)

    matplotlib.use("Agg")  # before pyplot: files, never a display
    import matplotlib.pyplot as plt  # deferred: matplotlib

    return plt


def ready() -> None:
    """matplotlib imported, its fonts loaded and its mathtext parser built (a log axis labels its ticks 2^k in
    mathtext; the first chart with one paid a few tenths of a second for it), for a renderer started early."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(2, 2), dpi=DPI)
    ax.plot([1, 2], [1, 2], marker="o", label="0")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend()
    _png(fig)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    _plt().close(fig)
    return buf.getvalue()


def _series(rows, key_params, x_param):
    """Group rows into lines keyed by key_params, sorted along x_param."""
    lines: dict[tuple, list] = {}
    for r in rows:
        lines.setdefault(tuple(r.params[k] for k in key_params), []).append(r)
    return {k: sorted(v, key=lambda r: r.params[x_param]) for k, v in lines.items()}


def _lines(ax, series, x_param, label_fmt):
    for key, rows in series.items():
        xs = [r.params[x_param] for r in rows]
        ax.plot(xs, [r.median for r in rows], marker="o", label=label_fmt(key))
        ax.fill_between(xs, [r.p10 for r in rows], [r.p90 for r in rows], alpha=0.2)


def transfer(res: Result):
    rows = res.by_test("transfer.sweep")
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=DPI)
    for ax, metric, ylabel in ((axes[0], "bandwidth", "GB/s"), (axes[1], "latency", "us per copy")):
        _lines(ax, _series([r for r in rows if r.metric == metric], ("dir", "mem"), "bytes"), "bytes",
               lambda k: f"{k[0].upper()} {k[1]}")
        ax.set_xscale("log", base=2)
        if metric == "latency":
            ax.set_yscale("log")
        ax.set_xlabel("copy size (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"transfer {metric} vs size")
        ax.grid(alpha=0.3)
        ax.legend()
    return _png(fig)


def concurrency(res: Result):
    rows = res.by_test("concurrency.scaling")
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True, dpi=DPI)
    for ax, d in zip(axes, ("h2d", "d2h")):
        _lines(ax, _series([r for r in rows if r.params["dir"] == d], ("mode",), "n"), "n", lambda k: k[0])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N")
        ax.set_ylabel("aggregate GB/s")
        ax.set_title(f"{d.upper()} scaling with N")
        ax.grid(alpha=0.3)
        ax.legend()
    return _png(fig)


def _bars(labels, rows, ylabel, title):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=DPI)
    med = [r.median for r in rows]
    err = [[r.median - r.p10 for r in rows], [r.p90 - r.median for r in rows]]
    ax.bar(labels, med, yerr=err, capsize=4, color="#4878a8")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    return _png(fig)


def launch(res: Result):
    rows = res.by_test("launch.cost")
    return _bars([r.params["mode"] for r in rows], rows, "us per kernel", "launch costs") if rows else None


def smallcopy(res: Result):
    rows = sorted(res.by_test("smallcopy.d2h32"), key=lambda r: r.params["streams"])
    return _bars([str(r.params["streams"]) for r in rows], rows, "us per 32-byte D2H",
                 "small-copy time vs streams in one context") if rows else None


def hostcrypto(res: Result):
    rows = res.by_test("hostcrypto.aes256gcm")
    return _bars([f"{r.params['variant']} {r.params['op']} x{r.params['threads']}" for r in rows], rows, "GB/s",
                 "CPU AES-256-GCM (OpenSSL)") if rows else None


# The other trace's waits and tolls a bar of the "Where the time went" chart is split into, in its order, then the
# rest of the growth: (extra's key, colour, legend)
PARTS = (("stream_wait_ms", "#c0504d", "stream wait"), ("channel_wait_ms", "#f79646", "channel wait"),
         ("toll_ms", "#8064a2", "toll"))
REST = ("#4f81bd", "rest of the growth")
LABEL_W = 70  # a bar's label, in characters


def bar_label(params: dict) -> str:
    """A bar's label: the API (with its direction and memory, where a crossing), after the call site where the
    row is one site's: two APIs from one line are two bars, each named. A long site loses its start, not its API."""
    what = " ".join(v for v in (params["api"], params.get("dir"), params.get("mem")) if v and v != "-")
    site = params.get("site")
    if not site:
        return what[:LABEL_W]
    room = max(LABEL_W - len(what) - 3, 10)
    return f"{site if len(site) <= room else '...' + site[-(room - 3):]} [{what}]"


def account_bars(res: Result, top: int = 10) -> list[tuple[str, list[str], list[list[float]]]]:
    """The "Where the time went" chart's panels (by API, then by call site), each (title, labels, segments): a
    row per call that grew (the top ones), its bar split into the PARTS then the rest, in ms. The parts are taken
    in turn and capped at what of the row's growth is left, so a bar sums to its growth and never passes it (the
    other trace's waits and tolls can exceed what its call grew by: the base trace's call took time too)."""
    panels = []
    for test, title in (("account.api", "by API"), ("account.site", "by call site")):
        rows = sorted((r for r in res.by_test(test) if r.metric == "in_call_delta" and r.median > 0),
                      key=lambda r: -r.median)[:top]
        if not rows:
            continue
        segments = []
        for r in rows:
            left, parts = 0.0, []
            for key, _, _ in PARTS:
                parts.append(min(max(r.extra.get(key, 0.0), 0.0), max(r.median - left, 0.0)))
                left += parts[-1]
            segments.append(parts + [max(r.median - left, 0.0)])
        panels.append((title, [bar_label(r.params) for r in rows], segments))
    return panels


def account(res: Result, top: int = 10):
    """Where a CC tax went: the calls that grew most (per API, then per call site), each bar split into the
    other trace's waits for the stream and the channel, its tolls, and the rest of the growth (account_bars)."""
    panels = account_bars(res, top)
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(0.35 * len(p[1]) + 1.3 for p in panels)),
                             squeeze=False, dpi=DPI)
    for ax, (title, labels, segments) in zip(axes[:, 0], panels):
        at = list(range(len(labels)))  # one place a row: rows never share a bar, whatever their labels
        left = [0.0] * len(labels)
        for i, (color, legend) in enumerate([(c, name) for _, c, name in PARTS] + [REST]):
            vals = [seg[i] for seg in segments]
            ax.barh(at, vals, left=left, color=color, label=legend)
            left = [a + b for a, b in zip(left, vals)]
        ax.set_yticks(at, labels)
        ax.set_xlabel("ms more in the call than in the base trace")
        ax.set_title(title)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


PLOTS = (("Bandwidth and latency vs size", transfer), ("Scaling vs N", concurrency), ("Launch costs", launch),
         ("Small-copy serialization", smallcopy), ("Host AES-256-GCM", hostcrypto),
         ("Where the time went", account))


def _plot(res: Result, i: int) -> bytes | None:
    return PLOTS[i][1](res)


def all_plots(res: Result, pool=None) -> list[tuple[str, bytes]]:
    """(name, PNG) of each chart the result has data for, in PLOTS' order. pool: a process executor that draws them
    side by side, one chart a worker (the report renderer's, cli.reports.chart_pool: its workers forked after
    ready(), so each starts warm); the same PNGs, a report's wall time that of its slowest chart instead of their
    sum. A worker that dies raises BrokenProcessPool."""
    draw = functools.partial(_plot, res)
    pngs = pool.map(draw, range(len(PLOTS))) if pool is not None else map(draw, range(len(PLOTS)))
    return [(name, png) for (name, _), png in zip(PLOTS, pngs) if png]


def ratio_chart(items: list[tuple[str, float, float, float]]) -> bytes | None:
    """Horizontal log-scale bars of OTHER/BASE ratios with their ranges."""
    if not items:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(items) + 1.2), dpi=DPI)
    labels = [i[0] for i in items]
    ratios = [i[1] for i in items]
    err = [[max(r - lo, 0) for _, r, lo, _ in items], [max(hi - r, 0) for _, r, _, hi in items]]
    ax.barh(labels, ratios, xerr=err, capsize=3, color=["#c0504d" if r < 1 else "#4f81bd" for r in ratios])
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("OTHER / BASE (median; bars show the p10/p90 range)")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)
