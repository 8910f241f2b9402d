"""Markdown rendering of a probe result: findings first, then the tables."""

from __future__ import annotations

from ccbridge.findings import shown
from ccbridge.report.tables import (Table, emulation_banner, errors_table, headline_table, machine_table,
                                    run_line, skipped_table, test_tables, title)
from ccbridge.results import Result


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def table_md(t: Table, level: int = 2) -> str:
    if not t.rows:
        return ""
    lines = [f"{'#' * level} {t.title}", ""]
    if t.note:
        lines += [t.note, ""]
    lines.append("| " + " | ".join(t.headers) + " |")
    lines.append("|" + "---|" * len(t.headers))
    lines += ["| " + " | ".join(_esc(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines) + "\n"


def render(res: Result) -> str:
    parts = [f"# {title(res)}", ""]
    banner = emulation_banner(res)
    if banner:
        parts += [f"> **{banner}**", ""]
    parts += [run_line(res), ""]
    if res.kind == "probe":
        parts += ["## Findings", ""]
        parts += [f"- {f.text}" for f in shown(res)] or ["- No GPU family ran, so there are no bridge findings."]
        parts.append("")
    if res.no_gpu:
        parts += [f"The GPU families need a GPU and were skipped: {res.no_gpu}.", ""]
    for t in (headline_table(res), errors_table(res), machine_table(res.env), *test_tables(res), skipped_table(res)):
        md = table_md(t)
        if md:
            parts.append(md)
    return "\n".join(parts)
