"""Read the emulator's accounting: per-process summaries and per-crossing CSV traces."""

from __future__ import annotations

import csv
import glob
import json
from collections import defaultdict
from dataclasses import dataclass, field

from ccbridge.errors import ResultFileError


@dataclass
class TraceSummary:
    processes: int = 0
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    crossings: dict[str, dict[str, float]] = field(default_factory=dict)
    by_api: dict[tuple[str, str, str], dict[str, float]] = field(default_factory=dict)

    def total_crossings(self) -> int:
        return int(sum(c["count"] for c in self.crossings.values()))


def summarize(prefix: str) -> TraceSummary:
    """Fold every <prefix>.<pid>.summary.json and .csv into one summary; ResultFileError
    naming the file and the line for one the emulator did not write."""
    s = TraceSummary()
    for path in sorted(glob.glob(f"{glob.escape(prefix)}.*.summary.json")):
        try:
            with open(path) as f:
                d = json.load(f)
            for k, v in d.get("calls", {}).items():
                s.calls[k] += v
            for k, v in d.get("crossings", {}).items():
                agg = s.crossings.setdefault(k, {"count": 0, "bytes": 0, "blocked_ns": 0})
                for name in agg:
                    agg[name] += v.get(name, 0)
        except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError, RecursionError) as e:
            raise ResultFileError(f"unreadable trace summary {path}: {e}") from None
        s.processes += 1
    for path in sorted(glob.glob(f"{glob.escape(prefix)}.*.csv")):
        line = 1
        try:
            with open(path, newline="") as f:
                for line, row in enumerate(csv.DictReader(f), start=2):
                    key = (row["api"], row["dir"], row["mem"])
                    agg = s.by_api.setdefault(key, {"count": 0, "bytes": 0, "blocked_ns": 0, "stream_wait_ns": 0,
                                                    "channel_wait_ns": 0})
                    agg["count"] += 1
                    agg["bytes"] += int(row["bytes"])
                    agg["blocked_ns"] += int(row["t_return_ns"]) - int(row["t_enter_ns"])
                    agg["stream_wait_ns"] += int(row["blocked_stream_ns"])
                    agg["channel_wait_ns"] += int(row["blocked_channel_ns"])
        except (OSError, UnicodeDecodeError, csv.Error, KeyError, ValueError, TypeError) as e:
            raise ResultFileError(f"unreadable trace {path}, line {line}: {type(e).__name__}: {e}") from None
    return s


def render(s: TraceSummary) -> str:
    lines = [f"emulator trace: {s.processes} process(es), {s.total_crossings()} crossings"]
    if s.by_api:
        lines.append(f"{'api':<28} {'dir':<4} {'mem':<9} {'count':>8} {'MiB':>10} {'blocked ms':>11} {'stream wait':>12} {'channel wait':>13}")
        for (api, d, m), a in sorted(s.by_api.items(), key=lambda kv: -kv[1]["blocked_ns"]):
            lines.append(f"{api:<28} {d:<4} {m:<9} {a['count']:>8} {a['bytes'] / 2**20:>10.1f} {a['blocked_ns'] / 1e6:>11.2f} "
                         f"{a['stream_wait_ns'] / 1e6:>12.2f} {a['channel_wait_ns'] / 1e6:>13.2f}")
    top = sorted(s.calls.items(), key=lambda kv: -kv[1])
    if top:
        lines.append("hooked calls: " + ", ".join(f"{k} {v}" for k, v in top))
    return "\n".join(lines)
