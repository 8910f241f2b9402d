"""Text that fits a terminal: what a person reads is at most WIDTH columns; the evidence behind a number goes
to --why (wrapped here too), --json and the reports."""

from __future__ import annotations

import json
import re
import textwrap
from itertools import zip_longest

WIDTH = 120


def wrap(paragraphs: list[str], indent: str = "  ", width: int = WIDTH) -> list[str]:
    """Each paragraph in lines of at most `width` columns, the continuations indented (a word longer than a
    line, as a row key, is broken)."""
    return [line for p in paragraphs
            for line in textwrap.wrap(p, width, subsequent_indent=indent, break_on_hyphens=False) or [""]]


def fit(text: str, width: int = WIDTH) -> str:
    """Every line of text in at most `width` columns: a longer one wrapped, its continuations indented (a `# `
    heading line's under `#`, so that they stay headings). Lines that fit are kept as they are."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
        else:
            out += textwrap.wrap(line, width, subsequent_indent="#   " if line.startswith("#") else "    ",
                                 break_on_hyphens=False)
    return "\n".join(out)


def json_why(e: BaseException) -> str:
    """Why a JSON file could not be read, in a few words (json's own messages run long, or name Python)."""
    if isinstance(e, json.JSONDecodeError):
        return f"not JSON (line {e.lineno} column {e.colno})"
    if isinstance(e, RecursionError):
        return "not JSON: nested too deep"
    if isinstance(e, UnicodeDecodeError):
        return "not UTF-8"
    return getattr(e, "strerror", None) or str(e)


def first_fit(width: int, *texts: str) -> str:
    """The first of texts in at most width columns (the last where none is): a figure in its column's width, in
    the most detail that fits."""
    return next((t for t in texts if len(t) <= width), texts[-1])


def cut(text: str, width: int) -> str:
    """text in at most `width` columns, its end replaced by ... where it is longer."""
    return text if len(text) <= width else text[:width - 3] + "..."


def cut_start(text: str, width: int) -> str:
    """text in at most `width` columns, its start replaced by ... where it is longer (a path: its end names it)."""
    return text if len(text) <= width else "..." + text[-(width - 3):]


# Where a word longer than its column may break: after these (a path's /, a site's :, a key's =, a list's ,)
_BREAKS = re.compile(r"[^/:.,;=-]+[/:.,;=-]*|[/:.,;=-]+")


def cell(text: str, width: int) -> list[str]:
    """text in lines of at most width columns, broken at spaces; a word longer than that after one of its
    separators (api=/cuStreamSynchronize, site=examples//decode_loop.py:/45), only a part still longer anywhere."""
    lines: list[str] = []
    cur = ""
    for word in text.split():
        parts = [word] if len(word) <= width else [p[i:i + width] for p in _BREAKS.findall(word)
                                                   for i in range(0, len(p), width)]
        for j, part in enumerate(parts):
            glue = " " if cur and j == 0 else ""
            if len(cur) + len(glue) + len(part) <= width:
                cur += glue + part
            else:
                if cur:
                    lines.append(cur)
                cur = part
    return lines + [cur]  # [""] for no text, as textwrap's callers had it


def table(header: list[str], rows: list[list[str]], widths: list[int]) -> list[str]:
    """Columns of the given widths, two spaces apart, each cell wrapped within its column (cell(): at spaces,
    else after a separator; a row takes as many lines as its tallest cell); the last column may be narrower than
    its width."""
    def line(cells):
        return "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths)).rstrip()

    out = [line(header)]
    for row in rows:
        cols = [cell(c, w) for c, w in zip(row, widths)]
        out += [line([c or "" for c in cells]) for cells in zip_longest(*cols)]
    return out
