"""Which driver entry points a program resolved, as the interposer classified them.

The interposer (native/emu/coverage.c) holds the classification (hooked,
harmless, MISSING, unclassified) and writes PREFIX.<pid>.coverage.json per
process at exit; this module folds the processes into one report and renders it.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

from ccbridge.errors import ResultFileError

SCHEMA = 1  # EMU_COVERAGE_SCHEMA in emu.h
CLASSES = ("MISSING", "unclassified", "hooked", "harmless")  # the order a table shows them in


def merge(prefix: str) -> dict:
    """{"schema", "processes", "symbols": {name: {"class", "calls" (None: not hooked), "via"}}}."""
    symbols: dict[str, dict] = {}
    paths = sorted(glob.glob(f"{glob.escape(prefix)}.*.coverage.json"))
    for path in paths:
        try:
            d = json.loads(Path(path).read_text())
            if d.get("schema") != SCHEMA:
                raise ValueError(f"coverage schema {d.get('schema')!r}, this ccbridge reads {SCHEMA}")
            for name, v in d["symbols"].items():
                s = symbols.setdefault(name, {"class": v["class"], "calls": None, "via": []})
                if v["calls"] is not None:
                    s["calls"] = (s["calls"] or 0) + int(v["calls"])
                s["via"] = sorted(set(s["via"]) | set(v["via"]))
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise ResultFileError(f"unreadable coverage file {path}: {e}") from None
    return {"schema": SCHEMA, "processes": len(paths), "symbols": dict(sorted(symbols.items()))}


def missing(report: dict) -> list[str]:
    return [n for n, s in report["symbols"].items() if s["class"] == "MISSING"]


def render(report: dict) -> str:
    rows = sorted(report["symbols"].items(), key=lambda kv: (CLASSES.index(kv[1]["class"]), kv[0]))
    counts = {c: sum(1 for _, s in rows if s["class"] == c) for c in CLASSES}
    lines = [f"driver coverage: {report['processes']} process(es), {len(rows)} symbols: "
             + ", ".join(f"{counts[c]} {c}" for c in CLASSES)]
    lines.append(f"{'symbol':<44} {'class':<13} {'calls':>10}  via")
    for name, s in rows:
        calls = "-" if s["calls"] is None else str(s["calls"])
        lines.append(f"{name:<44} {s['class']:<13} {calls:>10}  {','.join(s['via'])}")
    return "\n".join(lines)
