"""Markdown rendering of a probe result: findings first, then the tables."""

from __future__ import annotations

from ccbridge.findings import findings
from ccbridge.report.tables import (Table, emulation_banner, errors_table, headline_table, machine_table, skipped_table,
                                    test_tables, title)
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
    mode = "quick" if res.settings.get("quick") else "full"
    parts += [f"Run: {mode} suite on device {res.settings.get('device', 0)}, {res.duration_s:.0f} s, {len(res.rows)} rows, "
              f"created {res.created}.", ""]
    fs = findings(res)
    parts += ["## Findings", ""]
    parts += [f"- {f.text}" for f in fs if f.shown] or ["- No GPU family ran, so there are no bridge findings."]
    parts.append("")
    no_gpu = res.settings.get("missing", {}).get("gpu")
    if no_gpu and res.skipped:
        parts += [f"The GPU families need a GPU and were skipped: {no_gpu}.", ""]
    for t in (headline_table(res), errors_table(res), machine_table(res.env), *test_tables(res), skipped_table(res)):
        md = table_md(t)
        if md:
            parts.append(md)
    return "\n".join(parts)
