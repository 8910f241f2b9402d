"""Several runs of one command folded into one trace summary a side: what `ccbridge account --repeat K` sums.

On a host whose speed moves from one process to the next (a KVM guest's cores: +-30% between processes, even
pinned), a rank's host work grows or shrinks between one BASE run and one OTHER run by chance, and a single pair
cannot tell that from the emulator's cost. Summed over K runs a side, each rank's host speed averages over K
processes. Each rank is matched across the runs by its job's key and its rank (as account_ranks.per_rank pairs BASE's
with OTHER's); its windows' lengths and its windowed calls are summed, its waits for its peers where every run
measured them. The whole traces' calls, sites and spans are summed too, for a command of one process.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ccbridge.emulate.trace import ProcessTrace, TraceSummary

MIXED = "mixed"  # a rank's window found by marks in one run and by collectives in another


def by_job_rank(t: TraceSummary) -> dict:
    """A trace's ranks by (their job's key, rank): a rank outside any job (its world of one, or no window) under
    (world, 0)."""
    return {(p.job or (p.ranks, 0), p.rank): p for p in t.procs if p.rank is not None}


def summed(tables: Iterable[dict]) -> dict:
    """Call tables (TraceSummary.by_api, by_site: key -> counts and times, and the calls' kind) added up key by
    key; the kind is the first table's."""
    out: dict = {}
    for table in tables:
        for key, agg in table.items():
            into = out.setdefault(key, {k: (v if k == "kind" else 0) for k, v in agg.items()})
            for k, v in agg.items():
                if k != "kind":
                    into[k] = into.get(k, 0) + v
    return out


def merge(traces: list[TraceSummary]) -> tuple[TraceSummary, list[str]]:
    """One side's K traces as one: every count and time summed, each rank that is in all K (its windows, its
    windowed calls, its peer waits where all K measured them); notes on the ranks left out and the peers not
    summed. One trace is itself, no note."""
    if len(traces) == 1:
        return traces[0], []
    out = TraceSummary(processes=sum(t.processes for t in traces), by_api=summed(t.by_api for t in traces),
                       by_site=summed(t.by_site for t in traces), profiles=set().union(*(t.profiles for t in traces)),
                       emulated=any(t.emulated for t in traces), span_ns=sum(t.span_ns for t in traces))
    for t in traces:
        for k, v in t.calls.items():
            out.calls[k] += v
    out.crossings = summed(t.crossings for t in traces)
    if all(t.first_ns is not None for t in traces):  # the runs end to end: the first and last calls' distance summed
        out.first_ns, out.last_ns = 0, sum(t.last_ns - t.first_ns for t in traces)
    ranks = [by_job_rank(t) for t in traces]
    notes = []
    for key in sorted(set().union(*ranks)):
        mine = [r[key] for r in ranks if key in r]
        who = f"rank {key[1]} of the job of {key[0][0]}"
        if len(mine) < len(traces):
            notes.append(f"{who}: in {len(mine)} of the {len(traces)} runs: not summed, not compared")
            continue
        out.procs.append(_merged(mine))
        if out.procs[-1].peers_ns is None and any(p.peers_ns is not None for p in mine):
            notes.append(f"{who}: peers measured in {sum(p.peers_ns is not None for p in mine)} of the "
                         f"{len(traces)} runs" + (", by steps in some and by waits in others" if not
                                                   out.procs[-1].peers_how else "")
                         + ": not summed ('-'); its waits for them stay in its calls")
    return out, notes


def _merged(procs: list[ProcessTrace]) -> ProcessTrace:
    """One rank's K runs as one process: its windows' lengths and calls summed; no window where a run had none."""
    kinds = {p.window for p in procs}
    window = "" if "" in kinds else kinds.pop() if len(kinds) == 1 else MIXED
    own = TraceSummary(processes=len(procs), by_api=summed(p.summary.by_api for p in procs),
                       by_site=summed(p.summary.by_site for p in procs),
                       profiles=set().union(*(p.summary.profiles for p in procs)),
                       emulated=any(p.summary.emulated for p in procs), span_ns=sum(p.summary.span_ns for p in procs))
    handoffs = None if any(p.handoffs is None for p in procs) else [h for p in procs for h in p.handoffs]
    how = {p.peers_how for p in procs}  # peers had one way in every run, else not summed
    peers = None if any(p.peers_ns is None for p in procs) or len(how) > 1 else sum(p.peers_ns for p in procs)
    first = procs[0]
    return ProcessTrace(first.pid, first.rank, first.ranks, window, sum(p.window_ns for p in procs), own, [],
                        first.job, all(p.joined for p in procs), handoffs, peers, how.pop() if len(how) == 1 else "")


def phases(each: list[dict[str, float]]) -> dict[str, float]:
    """The runs' phases (account.phases) summed; none where a run has none."""
    if not all(each):
        return {}
    out: dict[str, float] = defaultdict(float)
    for where in each:
        for k, v in where.items():
            out[k] += v
    return dict(out)
