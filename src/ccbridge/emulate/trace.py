"""Read the interposer's accounting: per-process summaries and per-call CSV traces.

One trace schema for record-only runs (`ccbridge run --record T`, no
profile: the native machine, or a real CC-on machine), emulated runs (with
--profile) and anything else the interposer writes, so that any two traces
compare. The interposer writes it (native/emu/trace.c, EMU_TRACE_SCHEMA and
EMU_TRACE_COLUMNS in emu.h); tests/test_trace_schema.py holds the C side to
SCHEMA and COLUMNS here. Each CSV starts with

    # ccbridge trace schema 4, profile NAME, emulate 0|1
    t_enter_ns,t_return_ns,...

and has one line per crossing (a host<->device copy), launch (kernel, graph,
host function), synchronize, context created or destroyed, pinned host
allocation, and NCCL collective.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from ccbridge.emulate import interposer, sites
from ccbridge.errors import EmulatorError, ResultFileError

SCHEMA = 4
# column -> what it holds; the order is the file's
COLUMNS: dict[str, str] = {
    "t_enter_ns": "CLOCK_MONOTONIC ns when the call began",
    "t_return_ns": "when it returned",
    "tid": "the calling thread (Linux thread id)",
    "ctx": "the context whose channel a crossing used (empty when not known: launches, syncs, not emulated)",
    "stream": "the stream as the program gave it (empty: the legacy default stream)",
    "api": "the driver entry point",
    "kind": "crossing | launch | sync | context (created or destroyed) | alloc (pinned host memory allocated or "
            "registered, refused ones too) | collective (an NCCL operation: api is its NCCL name)",
    "dir": "h2d | d2h (crossings only)",
    "mem": "pinned | pageable (crossings only)",
    "bytes": "bytes crossing",
    "blocked_channel_ns": "time the emulator waited for the context's channel (0 when not emulating)",
    "blocked_stream_ns": "time the emulator waited for the stream to reach the copy (0 when not emulating: "
                         "the driver's own waits are inside t_return - t_enter)",
    "toll_ns": "fixed cost the emulator added (crossing toll + round trip, launch toll, synchronize round trip); "
               "collectives: device-side time queued on the op's stream ahead of it (per-op toll + bandwidth kept), "
               "not time the host waited",
    "rc": "the CUresult returned (collectives: the ncclResult_t; 7, in progress, is a non-blocking communicator's "
          "success)",
    "site": "the Python call site that issued it: an id in <prefix>.<pid>.sites.json (empty: none noted; "
            "`ccbridge run --record T --sites`)",
    "ranks": "collectives: the communicator's size (empty on other lines)",
    "wire_bytes": "collectives: bytes each rank puts on the links by the ring algorithm (nccl-tests' bus bytes: "
                  "all_reduce 2(n-1)/n x bytes, all_gather/reduce_scatter (n-1)/n x the whole, others x 1)",
}
LIB_ENV = interposer.LIB_ENV


def _switch(required: bool):
    """The interposer's trace switch (ccbemu_trace_pause), or None outside `ccbridge run` when not required."""
    return interposer.switch("ccbemu_trace_pause", required,
                             "trace.paused() works inside `ccbridge run` (with --record T to have a trace to pause)")


def pause(required: bool = True) -> bool:
    """Stop writing trace lines; True if a trace was being written (give it to resume()). required=False:
    outside `ccbridge run` nothing happens and the answer is False. Without --record there is no trace:
    False. The per-process summary's call counts still count the paused calls."""
    fn = _switch(required)
    return bool(fn(1)) if fn else False


def resume(was_recording: bool) -> None:
    """Write trace lines again, if pause() stopped a trace."""
    if was_recording:
        _switch(True)(0)


@contextlib.contextmanager
def paused(required: bool = True):
    """Inside, a program run under `ccbridge run --record T` writes no trace lines (emulation, if any, goes
    on); yields whether a trace was being written. Record only the steps you care about:

        with ccbridge.emulate.trace.paused():
            load_and_warm_up()
        serve()   # recorded
    """
    was = pause(required)
    try:
        yield was
    finally:
        resume(was)


@contextlib.contextmanager
def resumed(was_recording: bool):
    """Inside a paused() block, record again for a while (given paused()'s answer)."""
    resume(was_recording)
    try:
        yield
    finally:
        if was_recording:
            pause()


SCHEMA_LINE = re.compile(r"# ccbridge trace schema (\d+)(?:, profile ([^,]*), emulate (\d))?")


@dataclass
class TraceSummary:
    processes: int = 0
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    crossings: dict[str, dict[str, float]] = field(default_factory=dict)
    # (api, dir, mem) -> count, bytes, blocked_ns (time in the call), stream_wait_ns, channel_wait_ns, toll_ns, kind
    by_api: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    # (site, api, dir, mem) -> as by_api, where the run noted Python call sites (emulate/sites.py)
    by_site: dict[tuple[str, str, str, str], dict] = field(default_factory=dict)
    profiles: set[str] = field(default_factory=set)  # profile of each traced process ("passthrough": record-only)
    emulated: bool = False  # a traced process ran under an emulating profile (its header says emulate 1)
    span_ns: int = 0  # summed over processes: first call's entry to last call's return in each trace file
    # over all processes (CLOCK_MONOTONIC ns; None: none): the first call's entry, the last call's return
    first_ns: int | None = None
    last_ns: int | None = None

    def total_crossings(self) -> int:
        return int(sum(c["count"] for c in self.crossings.values()))

    def total(self, kind: str) -> int:
        return sum(a["count"] for a in self.by_api.values() if a["kind"] == kind)


def check_header(path: str, first: str, second: str) -> re.Match:
    """The schema line and the column line; ResultFileError for another schema."""
    m = SCHEMA_LINE.fullmatch(first.rstrip("\r\n"))
    if not m:
        what = "written by an older ccbridge (schema 1)" if first.startswith("t_enter_ns,") else "not a ccbridge trace"
        raise ResultFileError(f"trace {path}: {what}; this ccbridge reads trace schema {SCHEMA}: record it again")
    if int(m.group(1)) != SCHEMA:
        raise ResultFileError(f"trace {path}: trace schema {m.group(1)}; this ccbridge reads schema {SCHEMA}: "
                              "read it with the ccbridge that wrote it, or record it again")
    if second.rstrip("\r\n").split(",") != list(COLUMNS):
        raise ResultFileError(f"trace {path}: the columns are not those of trace schema {SCHEMA}")
    return m


def _u64(row: dict, column: str) -> int:
    """A number column as the interposer writes it: a 64-bit unsigned integer."""
    v = int(row[column])
    if not 0 <= v < 1 << 64:
        raise ValueError(f"{column} {row[column][:24]}{'...' if len(row[column]) > 24 else ''} is not a 64-bit count")
    return v


def _add(table: dict, key: tuple, row: dict, in_call_ns: int) -> None:
    agg = table.setdefault(key, {"kind": row["kind"], "count": 0, "bytes": 0, "blocked_ns": 0,
                                 "stream_wait_ns": 0, "channel_wait_ns": 0, "toll_ns": 0})
    agg["count"] += 1
    agg["bytes"] += _u64(row, "bytes")
    agg["blocked_ns"] += in_call_ns
    agg["stream_wait_ns"] += _u64(row, "blocked_stream_ns")
    agg["channel_wait_ns"] += _u64(row, "blocked_channel_ns")
    agg["toll_ns"] += _u64(row, "toll_ns")


def summarize(prefix: str) -> TraceSummary:
    """Fold every <prefix>.<pid>.summary.json and .csv into one summary; ResultFileError
    naming the file and the line for one the interposer did not write or of another schema."""
    if not os.path.basename(prefix):
        raise ResultFileError(f"{prefix!r}: give a trace prefix (T of `ccbridge run --record T`)")
    if re.search(r"\.\d+\.(csv|summary\.json|sites\.json)$", prefix):
        raise ResultFileError(f"{prefix}: give the trace's prefix, without .<pid>.csv "
                              f"({re.sub(r'[.][0-9]+[.].*$', '', prefix)})")
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
        site_of = sites.for_trace(path)
        try:
            with open(path, newline="") as f:
                m = check_header(path, f.readline(), f.readline())
                if m.group(2):
                    s.profiles.add(m.group(2))
                s.emulated |= m.group(3) == "1"
                first = last = None
                for line, row in enumerate(csv.DictReader(f, fieldnames=list(COLUMNS)), start=3):
                    t0, t1 = _u64(row, "t_enter_ns"), _u64(row, "t_return_ns")
                    if t1 < t0:
                        raise ValueError(f"t_return_ns {t1} is before t_enter_ns {t0}")
                    first, last = t0 if first is None else min(first, t0), t1 if last is None else max(last, t1)
                    key = (row["api"], row["dir"] or "-", row["mem"] or "-")
                    _add(s.by_api, key, row, t1 - t0)
                    if site_of is not None:
                        _add(s.by_site, (site_of.label(row["site"]), *key), row, t1 - t0)
                if first is not None:
                    s.span_ns += last - first
                    s.first_ns = first if s.first_ns is None else min(s.first_ns, first)
                    s.last_ns = last if s.last_ns is None else max(s.last_ns, last)
        except ResultFileError:
            raise
        except (OSError, UnicodeDecodeError, csv.Error, KeyError, ValueError, TypeError) as e:
            raise ResultFileError(f"unreadable trace {path}, line {line}: {type(e).__name__}: {e}") from None
    return s


def render(s: TraceSummary) -> str:
    lines = [f"trace: {s.processes} process(es)" + (f" ({', '.join(sorted(s.profiles))})" if s.profiles else "")
             + f", {s.total('crossing')} crossings, {s.total('launch')} launches, {s.total('sync')} synchronizes"
             + f", {s.total('context')} context and {s.total('alloc')} pinned-allocation calls"]
    if s.by_api:
        lines.append(f"{'api':<30} {'kind':<8} {'dir':<4} {'mem':<9} {'count':>8} {'MiB':>10} {'in call ms':>11} "
                     f"{'stream wait':>12} {'channel wait':>13} {'toll ms':>9}")
        for (api, d, m), a in sorted(s.by_api.items(), key=lambda kv: -kv[1]["blocked_ns"]):
            lines.append(f"{api:<30} {a['kind']:<8} {d:<4} {m:<9} {a['count']:>8} {a['bytes'] / 2**20:>10.1f} "
                         f"{a['blocked_ns'] / 1e6:>11.2f} {a['stream_wait_ns'] / 1e6:>12.2f} "
                         f"{a['channel_wait_ns'] / 1e6:>13.2f} {a['toll_ns'] / 1e6:>9.2f}")
    top = sorted(s.calls.items(), key=lambda kv: -kv[1])
    if top:
        lines.append("hooked calls: " + ", ".join(f"{k} {v}" for k, v in top))
    return "\n".join(lines)
