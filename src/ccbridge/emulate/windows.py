"""The spans `ccbridge account` compares a process over: its steady-state window, its job's, and which call holds
each instant of it.

A process's window: the spans between its marks named begin and end (ccbridge.mark), else from its first
collective to its last. The ranks of one job step together, so they share one window: span by span, the latest
begin to the earliest end of their own (jobs()). A rank that reached its begin mark first waits for the last one
inside its first collective (its readback, with graphs), which is start-up skew, not the steady state: with its
own window it would count that wait and the last rank none of it (issue 31: 4 ranks' windows 331.9 to 358.1 ms,
ends within 0.1 ms, begins 10 ms apart). Left as it is: such a rank's first step in flight at the common begin
keeps its wait inside the window and its launch and collectives before it, so its split between collectives and
crossings can be off by one step in N (1 in 62 on the recorded TP4 traces); the window's time is exact.

Inside a window each instant of a process is given to one call (exclusive()), so a process's calls and its host
work (what no call holds) add up to its window.

A job that steps together waits, each step, for its last rank to hand the GPU that step: a rank whose host work
between steps grew makes every other rank's waits grow, a toll of nobody's. peer_waits() measures it where the
steps are CUDA graph launches that replay collectives, each followed by a block on the GPU (a TP engine's decode
step: launch, then read the token back): the k-th launch of every rank is one step, and a rank's wait for its
peers is the last rank's launch less its own, at most its block. A host that hands steps ahead of its GPU (no
block between launches: piecewise graphs, async loops) is not matched: its host's lag is not the GPU's. A job whose
collectives are eager (DDP) is matched by its collectives instead (eager_waits): the span between a rank's j-th and
j+1-th is the same step's on every rank, and a rank's time blocked there beyond the least blocked rank's is its
wait for its peers.
"""

from __future__ import annotations

import bisect
import csv
from dataclasses import dataclass

# Which call an instant of a process's window is given to when several of its threads are in calls at once (a
# training step's main thread waiting in a readback while the autograd thread pays launch tolls): a call that
# pays a toll on the host before the waits its tolls cause, a crossing before a synchronize; among equals, the
# one that entered first.
FIRST = {"launch": 0, "collective": 0, "context": 0, "alloc": 0, "crossing": 1, "sync": 2, "query": 3, "timing": 3}

Span = tuple[int, int]


def windows(lines) -> tuple[str, list[Span]]:
    """A process's steady state from its (t_enter, t_return, row) lines: ("marks", spans), else ("collectives",
    [first to last]) (graph captures excluded: they run nothing), else ("", [])."""
    spans, opened, first, last = [], None, None, None
    for t0, t1, row in lines:
        kind = row["kind"]
        if kind == "mark" and row["api"] == "begin":
            opened = t0
        elif kind == "mark" and row["api"] == "end" and opened is not None:
            spans.append((opened, t0))
            opened = None
        elif kind == "collective" and row["graph"] != "capture":
            first, last = t0 if first is None else min(first, t0), t1 if last is None else max(last, t1)
    if spans:
        return "marks", spans
    return ("collectives", [(first, last)]) if first is not None else ("", [])


def scan(path: str) -> list[Span]:
    """The window of one trace file, read fast (only its marks and collectives; lines it cannot read are left to
    the full read, which says what is wrong with them)."""
    keep = []
    try:
        with open(path, newline="") as f:
            for cols in csv.reader(f):
                if len(cols) > 17 and cols[6] in ("mark", "collective"):
                    try:
                        keep.append((int(cols[0]), int(cols[1]), {"kind": cols[6], "api": cols[5], "graph": cols[17]}))
                    except ValueError:
                        continue
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    return windows(keep)[1]


@dataclass
class Member:
    """One process of a trace as jobs() sees it."""
    pid: int
    rank: int | None
    ranks: int
    spans: list[Span]


def jobs(members: list[Member]) -> dict[int, tuple[tuple[int, int], list[Span] | None]]:
    """pid -> (its job's key, the job's common spans, or None where the process keeps its own). A job: one rank of
    each number of a world size, taken in the order their windows begin (jobs of one size run one after another:
    bench decode --tp 2 2; two at once cannot be told apart); its key (world size, its order among the jobs of
    that size) pairs it with its twin in the other trace. Where a job's ranks' spans do not pair up (other counts,
    or no overlap) each keeps its own."""
    out: dict[int, tuple[tuple[int, int], list[Span] | None]] = {}
    groups: list[list[Member]] = []
    for m in sorted((m for m in members if m.rank is not None and m.ranks > 1 and m.spans), key=lambda m: m.spans[0]):
        job = next((g for g in groups if len(g) < m.ranks and g[0].ranks == m.ranks and m.rank not in
                    {q.rank for q in g}), None)
        if job is None:
            groups.append([m])
        else:
            job.append(m)
    order: dict[int, int] = {}
    for g in groups:
        key = (g[0].ranks, order.setdefault(g[0].ranks, 0))
        order[g[0].ranks] += 1
        n = len(g[0].spans)
        common = None
        if len(g) > 1 and all(len(q.spans) == n for q in g):
            common = [(max(q.spans[i][0] for q in g), min(q.spans[i][1] for q in g)) for i in range(n)]
            if any(a >= b for a, b in common):
                common = None
        for q in g:
            out[q.pid] = (key, common)
    return out


def handoffs(lines, spans: list[Span], blocks: list[Span]) -> list[list[tuple[int, int]]] | None:
    """Per span of a process's own window, its steps in order: (when it handed its GPU a step of graph-replayed
    collectives: a graph launch's replay lines share one time, the launch's return; how long it then blocked on
    the GPU, in synchronizes and readbacks (blocks: their (t_enter, t_return), in time order), before its next
    hand-off or the span's end). None where two hand-offs have no block between them: a host that runs ahead of its
    GPU hands steps early, and its lag is not the GPU's."""
    starts = [a for a, _ in spans]
    handed: list[set[int]] = [set() for _ in spans]
    for t0, _, row in lines:
        if row["kind"] == "collective" and row["graph"] == "replay":
            i = bisect.bisect_right(starts, t0) - 1
            if i >= 0 and t0 <= spans[i][1]:
                handed[i].add(t0)
    block_starts = [a for a, _ in blocks]
    out = []
    for (_, end), times in zip(spans, handed):
        times, steps = sorted(times), []
        for j, t in enumerate(times):
            until = times[j + 1] if j + 1 < len(times) else end
            k, blocked = bisect.bisect_left(block_starts, t), 0
            while k < len(blocks) and blocks[k][0] < until:
                blocked += max(0, min(blocks[k][1], until) - blocks[k][0])
                k += 1
            if not blocked and j + 1 < len(times):
                return None
            steps.append((t, blocked))
        out.append(steps)
    return out


def peer_waits(handed: list[list[list[tuple[int, int]]] | None], common: list[Span]) -> list[int] | None:
    """Of a job's ranks (each one's handoffs() over its own spans), each rank's time waiting for the rank that
    handed the GPU each step last (ns): per step inside the common spans, the last hand-off less its own, at most
    what it then blocked (the wait falls in its readback). None where there is no step to match, the ranks'
    counts of steps in a span differ (the k-th would not be one step), or a rank's steps are not matched
    (handoffs() None). A step handed before the common begin is start-up skew: not counted (what an early rank
    waited for it inside the window stays in its calls)."""
    if any(h is None for h in handed):
        return None
    waits, steps = [0] * len(handed), 0
    for i, (a, b) in enumerate(common):
        per = [h[i] if i < len(h) else [] for h in handed]
        if len({len(p) for p in per}) != 1:
            return None
        for step in zip(*per):
            times = [t for t, _ in step]
            if a <= min(times) and max(times) <= b:
                steps += 1
                last = max(times)
                for k, (t, blocked) in enumerate(step):
                    waits[k] += min(last - t, blocked)
    return waits if steps else None


def blocking(row: dict) -> bool:
    """A call the host blocks in until its GPU reaches a point: a synchronize (secure.poll's waits too) or a
    readback."""
    return row["kind"] == "sync" or (row["kind"] == "crossing" and row.get("dir") == "d2h")


def eager_waits(ranks: list[tuple[dict[str, list[int]], list[Span]]], spans: list[Span]) -> list[int] | None:
    """Of a job whose collectives are eager (no graph-launched step for peer_waits), each rank's wait for its peers
    inside the common spans (ns). ranks: per rank, when it issued each eager collective (by NCCL name) and its
    blocking calls' (t_enter, t_return), each in time order. Every rank issues a collective the same number of
    times in the same order (NCCL's contract; point-to-point sends and receives need not be, and are left out where
    their counts differ), so the span from its j-th collective to its j+1-th is the same step's on every rank; a
    rank's time blocked there (its synchronizes and readbacks, once where two of its threads blocked together, cut
    to the window) beyond the least blocked rank's is its wait for its peers. What every rank waits alike (its own
    GPU's work, a synchronize's toll, a toll its GPU hid) cancels, so BASE and OTHER read alike. None where no
    collective's count is the same on every rank, or a rank blocked in no traced call inside the spans (its waits,
    if any, were polled or spun outside them: not seen)."""
    names = [n for n in ranks[0][0] if len({len(at.get(n, ())) for at, _ in ranks}) == 1]
    if not names:
        return None
    per = []
    for by_name, blocks in ranks:
        at = sorted(t for n in names for t in by_name[n])
        held = _union([(max(a, x), min(b, y)) for a, b in blocks for x, y in spans if max(a, x) < min(b, y)])
        if not held:
            return None
        steps = [0] * (len(at) + 1)  # before its first collective, between each two, after its last
        for a, b in held:
            k = bisect.bisect_right(at, a)
            while a < b:
                end = min(b, at[k]) if k < len(at) else b
                steps[k] += end - a
                a, k = end, k + 1
        per.append(steps)
    out = [0] * len(ranks)
    for step in zip(*per):
        least = min(step)
        for r, w in enumerate(step):
            out[r] += w - least
    return out


def inside(spans: list[Span], t0: int, t1: int) -> bool:
    """Whether a call entered inside the spans (sorted, disjoint); a zero-length line at a span's end counts (a
    graph launch's replayed collectives, written at its return, end a first-to-last-collective window)."""
    i = bisect.bisect_right(spans, (t0, float("inf"))) - 1
    return i >= 0 and (spans[i][0] <= t0 < spans[i][1] or t0 == t1 == spans[i][1])


def exclusive(calls: list[tuple[int, int, str]], spans: list[Span]) -> list[int]:
    """Each call's (t0, t1, kind) time inside the spans (sorted, disjoint) that no call before it in FIRST's order
    (then by entry) already holds: the process's window, each instant counted once; what no call holds is host
    work."""
    starts = [a for a, _ in spans]
    pieces: dict[int, list[tuple[int, int, int, int]]] = {}
    for i, (t0, t1, k) in enumerate(calls):
        j = max(0, bisect.bisect_right(starts, t0) - 1)
        while j < len(spans) and spans[j][0] < t1:
            a, b = max(t0, spans[j][0]), min(t1, spans[j][1])
            if b > a:
                pieces.setdefault(FIRST.get(k, 3), []).append((a, t0, i, b))
            j += 1
    held: list[Span] = []  # disjoint, sorted: the instants given so far
    out = [0] * len(calls)
    for rank in sorted(pieces):
        taken, reach = [], -1
        ends = [e for _, e in held]
        for a, _, i, b in sorted(pieces[rank]):  # by the cut start, then entry, then the line's order
            a = max(a, reach)  # an earlier call of this rank (another thread) holds up to reach
            if b > a:
                out[i] += b - a - _overlap(held, ends, a, b)
                taken.append((a, b))
            reach = max(reach, b)
        held = _union(held + taken)
    return out


def _overlap(held: list[Span], ends: list[int], a: int, b: int) -> int:
    """How much of [a, b) the sorted disjoint intervals hold."""
    n, j = 0, bisect.bisect_right(ends, a)
    while j < len(held) and held[j][0] < b:
        n += min(b, held[j][1]) - max(a, held[j][0])
        j += 1
    return n


def _union(intervals: list[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
