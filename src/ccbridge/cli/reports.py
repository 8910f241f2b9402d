"""A result's files, as probe, account and report write them: result.json, report.md, report.html."""

from __future__ import annotations

from pathlib import Path

from ccbridge.report import html, markdown
from ccbridge.textfit import fit


def write_reports(res, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "result.json", out / "report.md", out / "report.html"]
    res.save(paths[0])
    paths[1].write_text(markdown.render(res))
    paths[2].write_text(html.render(res))
    return paths


def wrote(*paths) -> str:
    """`wrote A, B, C` for stderr, within 120 columns however long the paths."""
    return fit("wrote " + ", ".join(str(p) for p in paths))
