"""Self-contained HTML: the Markdown report's content plus embedded PNG plots."""

from __future__ import annotations

import base64
import html

from ccbridge.findings import shown
from ccbridge.report.plots import all_plots
from ccbridge.report.tables import (Table, emulation_banner, errors_table, headline_table, machine_table, run_line,
                                    skipped_table, test_tables, title)

CSS = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f0f0f0}.banner{background:#fff3cd;border:1px solid #e0c36a;padding:.6em 1em;font-weight:bold}
img{max-width:100%}li{margin:.25em 0}"""


def table_html(t: Table) -> str:
    if not t.rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    note = f"<p>{html.escape(t.note)}</p>" if t.note else ""
    return f"<h2>{html.escape(t.title)}</h2>{note}<table><tr>{head}</tr>{body}</table>"


def img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def page(title: str, banner: str, intro: list[str], bullets: list[str], plots: list[tuple[str, bytes]], tables: list[Table]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    if banner:
        parts.append(f"<p class='banner'>{html.escape(banner)}</p>")
    parts += [f"<p>{html.escape(p)}</p>" for p in intro]
    if bullets:
        parts.append("<h2>Findings</h2><ul>" + "".join(f"<li>{html.escape(b)}</li>" for b in bullets) + "</ul>")
    for name, png in plots:
        parts.append(f"<h2>{html.escape(name)}</h2>{img(png, name)}")
    parts += [table_html(t) for t in tables]
    parts.append("</body></html>")
    return "\n".join(parts)


def render(res, pool=None) -> str:
    """The page; pool: the charts' drawing pool, if any (plots.all_plots)."""
    intro = [run_line(res)]
    tables = [headline_table(res), errors_table(res), machine_table(res.env), *test_tables(res), skipped_table(res)]
    return page(title(res), emulation_banner(res), intro, [f.text for f in shown(res)], all_plots(res, pool), tables)
