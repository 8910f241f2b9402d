"""Read the interposer's accounting: per-process summaries and per-call CSV traces.

One trace schema for record-only runs (`ccbridge run --record T`, no
profile: the native machine, or a real CC-on machine), emulated runs (with
--profile) and anything else the interposer writes, so that any two traces
compare. The interposer writes it (native/emu/trace.c, EMU_TRACE_SCHEMA and
EMU_TRACE_COLUMNS in emu.h); tests/test_trace_schema.py holds the C side to
SCHEMA and COLUMNS here. Each CSV starts with

    # ccbridge trace schema 5, profile NAME, emulate 0|1
    t_enter_ns,t_return_ns,...

and has one line per crossing (a host<->device copy), launch (kernel, graph,
host function), synchronize, context created or destroyed, pinned host
allocation, NCCL collective (and each replay of one a CUDA graph captured),
pointer-type query answered "managed", event-time read, and mark the program
made (ccbridge.mark).
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import glob
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from ccbridge import schema, ui
from ccbridge.emulate import interposer, sites, windows
from ccbridge.emulate import recorded as stamps  # (summarize's own `recorded` says a run just recorded)
from ccbridge.errors import EmulatorError, ResultFileError, UsageError
from ccbridge.textfit import cut, cut_start, first_fit, json_why, wrap

SCHEMA = 5
# column -> what it holds; the order is the file's
COLUMNS: dict[str, str] = {
    "t_enter_ns": "CLOCK_MONOTONIC ns when the call began",
    "t_return_ns": "when it returned",
    "tid": "the calling thread (Linux thread id)",
    "ctx": "the context whose channel a crossing used (empty when not known: launches, syncs, not emulated)",
    "stream": "the stream as the program gave it (empty: the legacy default stream)",
    "api": "the driver entry point",
    "kind": "crossing | launch | sync | context (created or destroyed) | alloc (pinned host memory allocated or "
            "registered, refused ones too) | collective (an NCCL operation: api is its NCCL name) | mark (a point "
            "the program named with ccbridge.mark: api is the name) | query (a pointer-type query of pinned memory "
            "answered 'managed', as CC drivers answer) | timing (cuEventElapsedTime: GPU time read from events)",
    "dir": "h2d | d2h (crossings only)",
    "mem": "pinned | pageable (crossings, and queries: the memory asked about)",
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
    "graph": "collectives: capture (recorded into a CUDA graph: no GPU time yet) or replay (run again by a graph "
             "launch, at the launch's time: its toll_ns is paid on every replay); empty: an eager operation",
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
    """A trace folded per API (and per Python call site where the run noted sites): the whole trace, or one
    process of it (procs) over its steady-state window."""
    processes: int = 0
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    crossings: dict[str, dict[str, float]] = field(default_factory=dict)
    # (api, dir, mem) -> count, bytes, blocked_ns (time in the call), stream_wait_ns, channel_wait_ns, toll_ns, kind;
    # collectives also captured (operations recorded into a CUDA graph: not in count, no GPU time) and replays
    # (run again by a graph launch: in count, with the GPU time each replay paid)
    by_api: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    # (site, api, dir, mem) -> as by_api, where the run noted Python call sites (emulate/sites.py)
    by_site: dict[tuple[str, str, str, str], dict] = field(default_factory=dict)
    profiles: set[str] = field(default_factory=set)  # profile of each traced process ("passthrough": record-only)
    emulated: bool = False  # a traced process ran under an emulating profile (its header says emulate 1)
    span_ns: int = 0  # summed over processes: first call's entry to last call's return in each trace file
    # over all processes (CLOCK_MONOTONIC ns; None: none): the first call's entry, the last call's return
    first_ns: int | None = None
    last_ns: int | None = None
    procs: list["ProcessTrace"] = field(default_factory=list)  # each traced process on its own
    stamp: dict | None = None  # the machine that recorded it (emulate/recorded.py; None: no stamp beside it)

    def total_crossings(self) -> int:
        return int(sum(c["count"] for c in self.crossings.values()))

    def total(self, kind: str) -> int:
        return sum(a["count"] for a in self.by_api.values() if a["kind"] == kind)


@dataclass
class ProcessTrace:
    """One process of a trace: its rank (NCCL's, else the launcher's RANK; None: not a rank) and its calls
    inside its steady-state window (emulate/windows.py): marks the program made, else its first to its last
    collective; for the ranks of one job, the part of those windows all its ranks are in."""
    pid: int
    rank: int | None
    ranks: int
    window: str  # "marks" | "collectives" | "" (no window: the whole trace, as a process that is no rank)
    window_ns: int  # the window's length (marks: the windows' summed)
    summary: TraceSummary
    spans: list[tuple[int, int]] = field(default_factory=list)  # the window's spans (CLOCK_MONOTONIC ns)
    job: tuple[int, int] | None = None  # a rank's job: (world size, its order among the jobs of that size)
    joined: bool = False  # on its job's common window (False: its own, the job's ranks' spans did not pair up)
    # a joined rank's steps handed to its GPU (windows.handoffs; None: handed ahead of its GPU, not matched)
    handoffs: list | None = field(default_factory=list)
    peers_ns: int | None = None  # its wait for its job's last rank each step (None: not measured; peers_how says how)
    # how peers_ns was had: "steps" (graph-launched steps matched, windows.peer_waits) or "waits" (an eager job's
    # spans between its collectives matched, windows.eager_waits)
    peers_how: str = "steps"
    # a joined rank's eager collectives (NCCL name -> when it issued each, in order) and blocking calls'
    # (t_enter, t_return), in order, the whole trace's: its waits for its peers where the job has no graph steps
    eager_at: dict = field(default_factory=dict)
    blocks: list = field(default_factory=list)


def check_header(path: str, first: str, second: str) -> re.Match:
    """The schema line and the column line; ResultFileError for another schema."""
    m = SCHEMA_LINE.fullmatch(first.rstrip("\r\n"))
    if not m:
        what = "an older ccbridge (schema 1)" if first.startswith("t_enter_ns,") else "not a ccbridge trace"
        raise ResultFileError(f"trace {path}: {what}; this ccbridge reads trace schema {SCHEMA}: record it again")
    if int(m.group(1)) != SCHEMA:
        raise ResultFileError(f"trace {path}: trace schema {m.group(1)}; this ccbridge reads schema {SCHEMA}: "
                              "read it with the ccbridge that wrote it, or record it again")
    if second.rstrip("\r\n").split(",") != list(COLUMNS):
        raise ResultFileError(f"trace {path}: the columns are not those of trace schema {SCHEMA}")
    return m


def _u64(row: dict, column: str) -> int:
    """A number column as the interposer writes it: a 64-bit unsigned integer."""
    try:
        v = int(row[column])
    except (TypeError, ValueError):  # (int()'s own message names Python, not the column)
        v = -1
    if not 0 <= v < 1 << 64:
        raise ValueError(f"{column} {cut(row[column] or '', 16)!r} is not a 64-bit count")
    return v


KINDS = ("crossing", "launch", "sync", "context", "alloc", "collective", "mark", "query", "timing")
GRAPH = ("", "capture", "replay")


def _add_time(table: dict, key: tuple, row: dict, in_call_ns: int) -> dict:
    """Only the time of a call (its part inside a window that started during it), not the call."""
    agg = table.setdefault(key, {"kind": row["kind"], "count": 0, "bytes": 0, "blocked_ns": 0,
                                 "stream_wait_ns": 0, "channel_wait_ns": 0, "toll_ns": 0, "captured": 0, "replays": 0})
    agg["blocked_ns"] += in_call_ns
    return agg


def _add(table: dict, key: tuple, row: dict, in_call_ns: int) -> None:
    agg = _add_time(table, key, row, in_call_ns)
    if row["graph"] == "capture":  # recorded into a graph: the GPU pays at each replay, not now
        agg["captured"] += 1
        return
    agg["replays"] += row["graph"] == "replay"
    agg["count"] += 1
    agg["bytes"] += _u64(row, "bytes")
    agg["stream_wait_ns"] += _u64(row, "blocked_stream_ns")
    agg["channel_wait_ns"] += _u64(row, "blocked_channel_ns")
    agg["toll_ns"] += _u64(row, "toll_ns")


def _rows(path: str, s: TraceSummary):
    """The lines of one trace file as (t_enter, t_return, row), checked; the header's profile noted in s."""
    line = 1
    try:
        with open(path, newline="") as f:
            head = f.readline()
            m = check_header(path, head, f.readline())
            if m.group(2):
                s.profiles.add(m.group(2))
            s.emulated |= m.group(3) == "1"
            for line, row in enumerate(csv.DictReader(f, fieldnames=list(COLUMNS)), start=3):
                if row["t_enter_ns"].startswith("# ccbridge trace schema") or row["t_enter_ns"] == "t_enter_ns":
                    continue  # the process reopened its file (a flush after a close appends, header first)
                t0, t1 = _u64(row, "t_enter_ns"), _u64(row, "t_return_ns")
                if t1 < t0:
                    raise ValueError(f"t_return_ns {t1} is before t_enter_ns {t0}")
                if row["kind"] not in KINDS or row["graph"] not in GRAPH:
                    bad = ("kind", row["kind"]) if row["kind"] not in KINDS else ("graph", row["graph"])
                    raise ValueError(f"unknown {bad[0]} {bad[1][:24]!r}")
                yield t0, t1, row
    except ResultFileError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error, KeyError, ValueError, TypeError) as e:
        why = e if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"  # a ValueError: ours, or csv's
        raise ResultFileError(f"unreadable trace {path}, line {line}: {why}") from None


def _fold(s: TraceSummary, lines, site_of, spans: list[tuple[int, int]] | None = None) -> None:
    """Add the call lines (marks are not calls) to s; spans: only the calls in them (a window), each call's time
    cut to them (a call the window starts inside counts its time in the window, not the call: a rank's readback
    that waited for the job's other ranks to arrive) and counted once where several threads were in calls at once
    (windows.exclusive())."""
    first = last = None
    lines = list(lines)
    calls = [(t0, t1, row["kind"]) for t0, t1, row in lines if row["kind"] != "mark"]
    alone = iter(windows.exclusive(calls, spans) if spans is not None else [t1 - t0 for t0, t1, _ in calls])
    for t0, t1, row in lines:
        first, last = t0 if first is None else min(first, t0), t1 if last is None else max(last, t1)
        if row["kind"] == "mark":
            continue
        in_call, counted = next(alone), True
        if spans is not None:
            counted = windows.inside(spans, t0, t1)
            if not counted and not in_call:
                continue
        key = (row["api"], row["dir"] or "-", row["mem"] or "-")
        add = _add if counted else _add_time
        add(s.by_api, key, row, in_call)
        if site_of is not None:
            add(s.by_site, (site_of.label(row["site"]), *key), row, in_call)
    if first is not None:
        s.span_ns += last - first
        s.first_ns = first if s.first_ns is None else min(s.first_ns, first)
        s.last_ns = last if s.last_ns is None else max(s.last_ns, last)


def _process(path: str, pid: int, s: TraceSummary, meta: dict, job) -> ProcessTrace:
    """One trace file: folded into s (the whole trace) and on its own over its window, its job's where it is a
    rank of one (job: windows.jobs()'s (key, common spans or None), or None)."""
    site_of = sites.for_trace(path)
    lines = list(_rows(path, s))
    _fold(s, lines, site_of)
    kind, spans = windows.windows(lines)
    joined = bool(job and job[1] and spans)
    # a rank's blocking calls and eager collectives, for its waits for its peers (_peers); in time order: threads
    # write their lines in chunks
    blocks = sorted((t0, t1) for t0, t1, row in lines if windows.blocking(row)) if joined else []
    eager_at: dict[str, list[int]] = {}  # NCCL name -> when it issued each eager one (whole trace)
    for t0, _, row in lines if joined else ():
        if row["kind"] == "collective" and not row["graph"]:
            eager_at.setdefault(row["api"], []).append(t0)
    for times in eager_at.values():
        times.sort()
    handed = windows.handoffs(lines, spans, blocks) if joined else []  # matched by order within its own spans
    if joined:
        spans = job[1]
    own = TraceSummary(processes=1, profiles=set(s.profiles), emulated=s.emulated)
    _fold(own, lines, site_of, spans or None)
    return ProcessTrace(pid, *_rank_of(meta.get(pid, {})), kind, sum(b - a for a, b in spans) if spans else own.span_ns,
                        own, spans, job[0] if job else None, joined, handed, eager_at=eager_at, blocks=blocks)


def _rank_of(meta: dict) -> tuple[int | None, int]:
    """A process's rank (None: not a rank) and its job's size, from its summary's."""
    rank = meta.get("rank", -1)
    return rank if isinstance(rank, int) and rank >= 0 else None, int(meta.get("ranks", 0) or 0)


# <prefix>.<pid>.summary.json, as the interposer writes it (native/emu/trace.c): call and crossing counts.
# (The CSV's header is two text lines, no JSON document: check_header holds it to SCHEMA and COLUMNS.)
SUMMARY = schema.Schema(schema.record({
    "pid": schema.INTEGER, "calls": schema.mapping(schema.COUNT),
    "crossings": schema.mapping(schema.mapping(schema.COUNT)), "ranks": schema.COUNT, "rank": schema.INTEGER,
}, required=("pid", "calls", "crossings")))


SUMMARY_MAX = 1 << 20  # a summary is a few KiB (calls per hook)


def _summary_doc(path: str) -> dict:
    """A process's summary as the interposer writes it; a ResultFileError naming the field otherwise."""
    try:
        d = json.loads(ui.read_small(path, SUMMARY_MAX))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ResultFileError(f"unreadable trace summary {path}: {json_why(e)}") from None
    SUMMARY.check(d, f"trace summary {path}", ResultFileError)
    return d


MESSAGE_W = 102  # a refusal of a prefix, in columns: `ccbridge account: ` before it, 120 in all
TRACE_FILE = re.compile(r"(.+)\.\d+\.(?:csv|summary\.json)")  # a trace's files, by which its prefix is known


def prefixes_in(folder: str) -> list[str]:
    """The prefixes of the traces in folder (PREFIX of each PREFIX.<pid>.csv or .summary.json there), sorted."""
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return []
    return sorted({m.group(1) for name in names if (m := TRACE_FILE.fullmatch(name))})


def _shown(path: str, width: int) -> str:
    """A path as a message shows it: relative to the working folder where it lies inside it, and where longer than
    width columns, its start left out (its end names the trace)."""
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except (OSError, ValueError):  # no working folder
        pass
    return cut_start(path, width)


def _say(template: str, path: str, then: str = "", names: list[str] = ()) -> str:
    """template's {} filled with path, then `then` and as many of names as fit MESSAGE_W columns (the rest
    counted); the path's start left out where it is long (20 columns kept at least; up to 34 left for names)."""
    fixed = len(template) - 2 + len(then)
    shown = _shown(path, max(MESSAGE_W - fixed - min(len(", ".join(cut(n, 28) for n in names)), 34), 20))
    return template.format(shown) + then + _names(names, MESSAGE_W - fixed - len(shown))


def _names(names: list[str], width: int) -> str:
    """Names, comma-separated, in about width columns: the first ones, and how many more (one at least, each
    cut to 28 columns)."""
    out: list[str] = []
    for i, name in enumerate(names):
        if out and len(", ".join(out + [cut(name, 28)])) + (len(" and 99 more") if names[i + 1:] else 0) > width:
            return ", ".join(out) + f" and {len(names) - i} more"
        out.append(cut(name, 28))
    return ", ".join(out)


def has_trace(prefix: str) -> bool:
    """Whether a program recorded at prefix left a trace: a process's calls (its .csv) or summary, not its call
    sites alone (a Python process that made no driver call notes them too) nor the stamp."""
    return any(_files(prefix, suffix) for suffix in ("csv", "summary.json"))


def has_files(prefix: str) -> bool:
    """Whether any of a trace's files (its call sites alone too, not its stamp alone) are at prefix."""
    return has_trace(prefix) or bool(_files(prefix, "sites.json"))


def _check_prefix(prefix: str, recorded: bool) -> None:
    """UsageError, one line, where prefix cannot be a trace's: a folder (the traces in it named), a trace's file
    (its prefix named), or a prefix no file has (the nearest prefixes in its folder named, or how traces are made),
    unless a program was just run to record there (recorded)."""
    made = "`ccbridge run --record T -- CMD` records one"
    if os.path.isdir(prefix) and not has_files(prefix):
        inside = prefixes_in(prefix) or [os.path.join(sub, p) for sub in _folders(prefix)
                                         for p in prefixes_in(os.path.join(prefix, sub))]
        raise UsageError(_say("{} is a folder, not a trace prefix; its traces: ", prefix, "", inside) if inside else
                         _say("{} is a folder holding no trace; ", prefix, made))
    if not os.path.basename(prefix):
        raise UsageError(_say("{}: give a trace prefix (T of `ccbridge run --record T`)", prefix))
    if re.search(r"(\.\d+\.(csv|summary\.json|sites\.json)|\.env\.json)$", prefix):
        raise UsageError(_say("give the trace's prefix {}", re.sub(r"[.]([0-9]+[.].*|env[.]json)$", "", prefix),
                              f", not its file {cut(os.path.basename(prefix), 40)}"))
    if recorded or has_files(prefix):
        return
    folder, name = os.path.split(prefix)
    there = prefixes_in(folder)
    near = difflib.get_close_matches(name, there, n=3)
    raise UsageError(_say("no trace has the prefix {}; ", prefix,
                          *(("the nearest in its folder: ", near) if near else ("the traces in its folder: ", there)
                            if there else (made,))))


def _folders(folder: str) -> list[str]:
    """The folders in folder, sorted (none where it cannot be read)."""
    try:
        return sorted(e.name for e in os.scandir(folder) if e.is_dir())
    except OSError:
        return []


def summarize(prefix: str, recorded: bool = False) -> TraceSummary:
    """Fold every <prefix>.<pid>.summary.json and .csv into one summary, and each process on its own (procs);
    ResultFileError naming the file and the line for one the interposer did not write or of another schema;
    UsageError for a prefix that is no trace's (_check_prefix). recorded: the caller just ran a program to record
    at prefix, so no file there is no mistake of the user's: its program made no CUDA driver call (the interposer
    writes nothing then), which the caller says (an empty summary)."""
    _check_prefix(prefix, recorded)
    s = TraceSummary(stamp=stamps.read(prefix))
    meta = {}  # pid -> the summary's rank and ranks
    for _, path in _files(prefix, "summary.json"):
        d = _summary_doc(path)
        for k, v in d["calls"].items():
            s.calls[k] += v
        for k, v in d["crossings"].items():
            agg = s.crossings.setdefault(k, {"count": 0, "bytes": 0, "blocked_ns": 0})
            for name in agg:
                agg[name] += v.get(name, 0)
        meta[d["pid"]] = {"rank": d.get("rank", -1), "ranks": d.get("ranks", 0)}
        s.processes += 1
    files = _files(prefix, "csv")
    # a job's window is decided before any of its ranks is folded: only ranks of a job of 2+ are scanned for it
    ranked = {pid: _rank_of(meta.get(pid, {})) for pid, _ in files}
    plan = windows.jobs([windows.Member(pid, *ranked[pid], windows.scan(path)) for pid, path in files
                         if ranked[pid][0] is not None and ranked[pid][1] > 1])
    for pid, path in files:
        s.procs.append(_process(path, pid, s, meta, plan.get(pid)))
    _peers(s.procs)
    return s


def _peers(procs: list[ProcessTrace]) -> None:
    """Each joined rank's wait for its job's last rank to hand the GPU each step (windows.peer_waits), where the
    job's graph-launched steps pair up; where the job has none and its collectives are eager (DDP), its time
    blocked beyond each span's least blocked rank between its j-th and j+1-th collectives (windows.eager_waits)."""
    jobs: dict = {}
    for p in procs:
        if p.joined:
            jobs.setdefault(p.job, []).append(p)
    for members in jobs.values():
        waits = windows.peer_waits([p.handoffs for p in members], members[0].spans)
        for p, ns in zip(members, waits or []):
            p.peers_ns = ns
        graphs = any(p.handoffs is None or any(p.handoffs) for p in members)
        if waits is None and not graphs and any(p.eager_at for p in members):
            for p, ns in zip(members, windows.eager_waits([(p.eager_at, p.blocks) for p in members],
                                                          members[0].spans) or []):
                p.peers_ns, p.peers_how = ns, "waits"


def eager(s: TraceSummary) -> int:
    """Collectives the host issued one by one (not replayed by a graph launch)."""
    return sum(a["count"] - a["replays"] for a in s.by_api.values() if a["kind"] == "collective")


def _files(prefix: str, suffix: str) -> list[tuple[int, str]]:
    """(pid, path) of each <prefix>.<pid>.<suffix>, by pid; other names beside them (a copy, another prefix that
    starts with this one) are not this trace's."""
    found = []
    for path in glob.glob(f"{glob.escape(prefix)}.*.{suffix}"):
        m = re.fullmatch(rf"\.(\d+)\.{re.escape(suffix)}", path[len(prefix):])
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)


def _mib(nbytes: int) -> str:
    """MiB to one decimal; a few bytes read <0.1, not 0.0 (ten 32-byte copies moved something)."""
    mib = nbytes / 2**20
    return "<0.1" if 0 < mib < 0.05 else f"{mib:.1f}"


def _num(x: float, width: int) -> str:
    """A figure in its column: a long trace's large ones lose their decimals, then go to e-notation."""
    return first_fit(width, f"{x:.2f}", f"{x:.0f}", f"{x:.1e}", f"{x:.0e}")


# The per-API table: (header, width) of each column, 120 columns in all with a space between ("collective", the
# longest kind, fits its column; an API name longer than its column is cut)
TABLE = (("api", 27), ("kind", 10), ("dir", 4), ("mem", 8), ("count", 7), ("MiB", 8), ("in call ms", 10),
         ("stream wait ms", 14), ("channel wait ms", 15), ("toll ms", 8))


def _row(cells: list[str]) -> str:
    """Cells in TABLE's columns: the first four to the left, the figures to the right."""
    return " ".join(f"{c:<{w}}" if i < 4 else f"{c:>{w}}" for i, (c, (_, w)) in enumerate(zip(cells, TABLE)))


def render(s: TraceSummary) -> str:
    lines = [("EMULATED " if s.emulated else "") + f"trace: {s.processes} process(es)"
             + (f" ({', '.join(sorted(s.profiles))})" if s.profiles else "")
             + f", {s.total('crossing')} crossings, {s.total('launch')} launches, {s.total('sync')} synchronizes"
             + f", {s.total('context')} context and {s.total('alloc')} pinned-allocation calls"]
    head = len(lines) + bool(s.stamp)
    if s.stamp:
        lines.append(f"recorded on {stamps.machine(s.stamp)}")
    if s.by_api:
        lines.append(_row([h for h, _ in TABLE]))
        for (api, d, m), a in sorted(s.by_api.items(), key=lambda kv: -kv[1]["blocked_ns"]):
            times = [_num(a[k] / 1e6, w) for k, (_, w) in zip(("blocked_ns", "stream_wait_ns", "channel_wait_ns",
                                                                "toll_ns"), TABLE[6:])]
            count = first_fit(TABLE[4][1], str(a["count"]), f"{a['count']:.1e}")
            mib = first_fit(TABLE[5][1], _mib(a["bytes"]), f"{a['bytes'] / 2**20:.1e}")
            lines.append(_row([cut(api, TABLE[0][1]), a["kind"], d, m, count, mib, *times]))
    top = sorted(s.calls.items(), key=lambda kv: -kv[1])
    if top:  # the interposer's count of each hook: calls in paused regions and calls no trace line is written for
        lines += wrap(["hooked calls, the paused (trace.paused) and untraced ones too: "
                       + ", ".join(f"{k} {v}" for k, v in top)])
    return "\n".join(wrap(lines[:head]) + lines[head:])
