"""Where a multi-process job's CC tax goes: each rank compared over its job's steady-state window
(emulate/windows.py: its marks, else its first to last collective), every rank summed, the straggler; the rank
table and its rows. The per-call attribution itself is account.py's."""

from __future__ import annotations

from dataclasses import dataclass

from ccbridge.account import Line, collective_rows, compared, measurable, recovery_name
from ccbridge.emulate import runs, trace
from ccbridge.emulate.trace import TraceSummary
from ccbridge.results import Row
from ccbridge.textfit import wrap as _wrap

EXPLAINED_KINDS = ("collective", "launch", "crossing", "sync")  # the rest: context, alloc, query, timing


@dataclass
class RankAccount:
    """One rank of a multi-process job: its window in each trace, and its calls' lines over that window."""
    rank: int
    window: str  # how the window was found: marks (ccbridge.mark) or collectives (first to last)
    base_ms: float
    other_ms: float
    lines: list[Line]
    world: int = 0  # the job's ranks (0: not known)
    name: str = ""  # as printed: the rank, "rank/world" where the trace holds several jobs, "all"
    job: tuple[int, int] = (0, 0)  # the job's key (world size, its order among the jobs of that size)
    # ms waiting for the job's last rank each step, BASE and OTHER (graph-launched steps: windows.peer_waits; eager
    # collectives: windows.eager_waits; None: not measured, the steps or the collectives did not pair up)
    peer_ms: tuple[float, float] | None = None

    @property
    def slowdown_ms(self) -> float:
        """The measured wall-time difference of the rank's window: the denominator of its shares."""
        return self.other_ms - self.base_ms

    @property
    def measurable(self) -> bool:
        return measurable(self.slowdown_ms / 1e3, self.base_ms / 1e3)

    def by_kind(self) -> dict[str, float]:
        """ms of the slowdown each kind of call explains (net: growth less shrinkage), 'other' for the rest."""
        out = dict.fromkeys(EXPLAINED_KINDS + ("other",), 0.0)
        for x in self.lines:
            out[x.kind if x.kind in EXPLAINED_KINDS else "other"] += x.delta_ms
        return out

    @property
    def explained_ms(self) -> float:
        """The calls' growth, less the growth of the rank's waits for its peers (their host work: no toll)."""
        return sum(self.by_kind().values()) - self.peers_delta_ms

    @property
    def peers_delta_ms(self) -> float:
        return self.peer_ms[1] - self.peer_ms[0] if self.peer_ms else 0.0

    def host_ms(self, i: int) -> float:
        """Of the window in trace i (0 BASE, 1 OTHER), the time no call of the rank held: its host work (its
        threads' calls counted once each instant, windows.exclusive)."""
        return (self.base_ms, self.other_ms)[i] - sum(x.in_call_ms[i] for x in self.lines)

    @property
    def host_delta_ms(self) -> float:
        """The growth of the rank's host work: with the calls' growth, its whole slowdown. Not a toll: in a job
        that steps together a rank whose host work grew makes the others wait in their calls."""
        return self.host_ms(1) - self.host_ms(0)


def multi_process(base: TraceSummary, other: TraceSummary) -> bool:
    """A job of several ranks (processes that named a rank: NCCL's, or the launcher's RANK) in either trace."""
    return any(sum(p.rank is not None for p in t.procs) > 1 for t in (base, other))


def per_rank(base: TraceSummary, other: TraceSummary) -> tuple[list[RankAccount], list[str]]:
    """Each rank of both traces compared over its job's window; notes on what could not be paired."""
    # keyed by (the job, rank): a run that starts jobs one after another (bench decode --tp 2 4) has a rank 0 in
    # each, and each is compared with its own twin (the job of the same size and order in the other trace)
    b, o = runs.by_job_rank(base), runs.by_job_rank(other)
    jobs = {j for j, _ in set(b) | set(o)}

    def job_name(job: tuple[int, int]) -> str:  # its size, and its order where the trace holds two of that size
        return f"{job[0]}" + (f".{job[1] + 1}" if any(w == job[0] and i for w, i in jobs) else "")

    def job_label(job: tuple[int, int]) -> str:  # in notes: "the 2-rank job" ("the 2-rank job 2.1" beside a twin)
        return f"the {job[0]}-rank job" + (f" {job_name(job)}" if "." in job_name(job) else "")

    name = {k: str(k[1]) if len(jobs) == 1 else f"{k[1]}/{job_name(k[0])}" for k in set(b) | set(o)}
    notes = [f"rank {name[k]} is only in the {'BASE' if k in b else 'OTHER'} trace: not compared"
             for k in sorted(set(b) ^ set(o))]
    apart = sorted({k[0] for k in set(b) & set(o) if b[k].job and o[k].job and not (b[k].joined and o[k].joined)})
    notes += [f"the ranks of {job_label(job)}: each on its own window (their mark spans do not pair up)"
              for job in apart]
    notes += _peer_notes(b, o, job_label)
    out = []
    for k in sorted(set(b) & set(o)):
        pb, po = b[k], o[k]
        if not (pb.window and po.window):
            notes.append(f"rank {name[k]}: no steady-state window (no marks, no collectives) in "
                         f"{'BASE' if not pb.window else 'OTHER'}: not compared")
            continue
        acc = RankAccount(k[1], po.window, pb.window_ns / 1e6, po.window_ns / 1e6, [], world=k[0][0], name=name[k],
                          job=k[0])
        acc.lines = compared(pb.summary.by_api, po.summary.by_api, acc.slowdown_ms / 1e3 if acc.measurable else 0.0)
        if pb.peers_ns is not None and po.peers_ns is not None and pb.peers_how == po.peers_how:
            acc.peer_ms = (pb.peers_ns / 1e6, po.peers_ns / 1e6)
        out.append(acc)
    return out, notes


def _peer_notes(b: dict, o: dict, job_label) -> list[str]:
    """Per job of the two traces' ranks (runs.by_job_rank), how its peers were had, or why they were not."""
    notes = []
    for job in sorted({k[0] for t in (b, o) for k, p in t.items() if p.joined}):
        mine = [p for t in (b, o) for k, p in t.items() if k[0] == job]
        how = {p.peers_how for p in mine if p.peers_ns is not None}
        graphs = any(p.handoffs is None or any(p.handoffs) for p in mine)
        if not graphs and not any(trace.eager(p.summary) for p in mine):
            continue  # no collective in its window: no step to wait for a peer in
        if len(how) > 1:
            notes.append(f"peers of {job_label(job)}: not compared (BASE's and OTHER's were had in two ways: "
                         "graph-launched steps in one, its eager collectives in the other)")
        elif any(p.peers_ns is None for p in mine):
            notes.append(f"peers of {job_label(job)}: not measured " + (
                "(its ranks' graph-launched steps do not pair up, or a rank hands its GPU steps with no readback or "
                "synchronize between them: its host's lag is not the GPU's)" if graphs else
                "(eager collectives: no collective was issued as many times on every rank, or a rank blocked in no "
                "traced call inside the window, its waits polled or spun outside them)"))
        elif how == {"waits"}:
            notes.append(f"peers of {job_label(job)}, eager collectives: matched by collective, the span from a "
                         "rank's j-th to its j+1-th the same step's on every rank (sends and receives left out where "
                         "their counts differ between ranks); a rank's wait is its time blocked there (synchronizes "
                         "and readbacks) beyond the least blocked rank's; a wait polled between traced calls is host "
                         "work unless the program writes it (ccbridge.marks.waited, as ccbridge.secure does)")
    return notes


def overall(base: TraceSummary, other: TraceSummary, ranks: list[RankAccount]) -> RankAccount | None:
    """Every compared rank together (rank -1): their windows and their windowed calls summed, the shares of the
    summed slowdown."""
    if not ranks:
        return None
    want = {(a.job, a.rank) for a in ranks}
    tables = [runs.summed(p.summary.by_api for k, p in runs.by_job_rank(t).items() if k in want) for t in (base, other)]
    acc = RankAccount(-1, "sum", sum(a.base_ms for a in ranks), sum(a.other_ms for a in ranks), [], name="all")
    acc.lines = compared(*tables, acc.slowdown_ms / 1e3 if acc.measurable else 0.0)
    if any(a.peer_ms for a in ranks):
        acc.peer_ms = tuple(sum(a.peer_ms[i] for a in ranks if a.peer_ms) for i in (0, 1))
    return acc


def straggler(ranks: list[RankAccount]) -> RankAccount | None:
    """Of one job's ranks, the one whose calls held least of its emulated window (the most host work between
    them): the one the others wait for at each collective. (A job's ranks share one window: emulate/windows.py.)"""
    return max(ranks, key=lambda a: a.host_ms(1) / a.other_ms if a.other_ms > 0 else 0.0) if ranks else None


def rank_rows(ranks: list[RankAccount]) -> list[Row]:
    """account.rank rows per rank (window base/other/slowdown, what each kind explains) and account.rank_api
    rows per rank and API; every number the rank table prints, with its row key."""
    out = []
    for a in ranks:
        p = dict(rank=a.rank if a.rank >= 0 else "all", **({"world": a.world} if a.rank >= 0 else {}))
        out += [Row.of("account.rank", "window_base", "ms", [a.base_ms], **p),
                Row.of("account.rank", "window_other", "ms", [a.other_ms], **p),
                Row.of("account.rank", "slowdown", "ms", [a.slowdown_ms], **p)]
        out[-1].extra.update(window=a.window, measurable=a.measurable)
        for kind, ms in a.by_kind().items():
            out.append(Row.of("account.rank", "calls", "ms", [ms], kind=kind, **p))
            out[-1].extra["what"] = "the growth of the window's time in this kind of call"
        out.append(Row.of("account.rank", "explained", "ms", [a.explained_ms], **p))
        out[-1].extra["what"] = "the calls' growth less peers: what the tolls explain"
        out.append(Row.of("account.rank", "host", "ms", [a.host_delta_ms], **p))
        out[-1].extra.update(base_ms=a.host_ms(0), other_ms=a.host_ms(1),
                             what="the growth of the window's time outside every call (host work): not a toll")
        if a.peer_ms:
            out.append(Row.of("account.rank", "peers", "ms", [a.peers_delta_ms], **p))
            out[-1].extra.update(base_ms=a.peer_ms[0], other_ms=a.peer_ms[1],
                                 what="the growth of the rank's waits for its job's last rank each step (their host "
                                      "work): in its calls, not a toll; explained is the calls less it")
        for x in a.lines:
            q = dict(p, api=x.api, kind=x.kind, dir=x.dir, mem=x.mem)
            out.append(Row.of("account.rank_api", "delta", "ms", [x.delta_ms], **q))
            out[-1].extra.update(calls=list(x.calls), share=x.share if a.measurable else None,
                                 recovery=x.recovery, replays=x.replays)
            if x.kind == "collective":  # its size and device time, as a one-process account gives them
                out += collective_rows("account.rank_api", x, q)
    return out


def render_ranks(ranks: list[RankAccount], notes: list[str], mgpu_factor: float | None = None) -> str:
    """The per-rank table in 120 columns: each rank's window, its slowdown and the share each kind of call
    explains (of that slowdown: the measured difference of the window's wall time), the straggler, and the
    collectives behind the largest share."""
    out = ["per rank, on its job's steady-state window (marks, else first to last collective; the span all its ranks "
           "are in);",
           "shares of the window's measured slowdown. collect. to other: each kind of call's growth; peers: the part of "
           "it",
           "spent waiting for the job's last rank each step; explained = calls - peers; host: the rank's own",
           "work between calls (peers and host: no toll); explained + peers + host = the slowdown",
           f"{'rank':>5} {'window':<11} {'base ms':>10} {'other ms':>10} {'slowdown':>10} {'explained':>9} "
           f"{'collect.':>8} {'launch':>7} {'crossing':>8} {'sync':>7} {'other':>7} {'peers':>6} {'host':>6}"]
    for a in ranks:
        k = a.by_kind()
        if a.rank < 0:
            out.append("-" * 24 + " all ranks, summed " + "-" * 24)
        if a.measurable:
            pct = lambda v: f"{v / a.slowdown_ms:>7.0%}"
            peers = f"{a.peers_delta_ms / a.slowdown_ms:>6.0%}" if a.peer_ms else f"{'-':>6}"
            tail = (f"{a.explained_ms / a.slowdown_ms:>9.0%} {pct(k['collective']):>8} {pct(k['launch'])} "
                    f"{pct(k['crossing']):>8} {pct(k['sync'])} {pct(k['other'])} {peers} "
                    f"{a.host_delta_ms / a.slowdown_ms:>6.0%}")
        else:
            tail = "  no measurable slowdown: no shares"
        out.append(f"{a.name:>5} {a.window:<11} {a.base_ms:>10.2f} {a.other_ms:>10.2f} {a.slowdown_ms:>+10.2f} {tail}")
    ranks = [a for a in ranks if a.rank >= 0]
    for job in sorted({a.job for a in ranks}):
        mine = [a for a in ranks if a.job == job]
        s = straggler(mine)
        if s and len(mine) > 1:
            out += _wrap([f"straggler: rank {s.name} (host work {s.host_ms(1):.2f} of {s.other_ms:.2f} ms emulated, "
                          "its job's most: the others wait for it at each collective)"])
    for a in ranks:
        col = [x for x in a.lines if x.kind == "collective" and x.calls[1]]
        if col and a.measurable:
            x = max(col, key=lambda y: y.delta_ms)
            out += _wrap([f"rank {a.name}: {x.api} {x.calls[1]} operations ({x.replays} replayed from CUDA graphs), "
                          f"{x.what}, {x.queued}, charged "
                          f"{x.delta_ms:+.2f} ms ({x.delta_ms / a.slowdown_ms:.0%}); {recovery_name(x.recovery)}"])
    if mgpu_factor and mgpu_factor != 1:
        out.append(f"launch: each launch paid the launch toll x {mgpu_factor:g} (mgpu_launch_factor: the process "
                   "is multi-GPU)")
    moved = [a for a in ranks if host_moved(a)]
    if moved:
        out += _wrap(["host work between calls changed between the runs, which no toll does by itself: " + ", ".join(
            f"rank {a.name} {a.host_ms(0):.2f} -> {a.host_ms(1):.2f} ms" for a in moved) + "; in a job that steps "
            "together the others wait in their calls for a rank whose host work grew, and a rank whose host work "
            "shrank waits more in its own. Either the host ran at another speed (CPU placement, SMT siblings, other "
            "processes, a VM's vCPUs at half speed for seconds, pinned or not: pin each rank to its own cores, "
            "ccbridge's benches with CCBRIDGE_RANK_CPUS=auto, and sum runs, --repeat K), or the program did other "
            "host work under CC (pinned memory typed managed: copies torch makes), "
            "or a wait moved: BASE waited for its GPU or its peers outside traced calls (polling an event, as DDP "
            "comm hooks do) where OTHER waits in a readback that blocks under CC, or pays launch tolls in that wait"])
    return "\n".join(out + _wrap(notes))


HOST_MOVED = 0.25  # a rank's host work changed by this fraction of the slowdown
HOST_NOISE = 0.05  # and by more than this fraction of its own BASE host work


def host_moved(a: RankAccount) -> bool:
    """The rank's host work between calls grew or shrank by more than HOST_MOVED of its slowdown (and beyond
    HOST_NOISE of itself): its share of calls cannot be read as the tolls' alone; in a job that steps together the
    change moves waits to the other ranks."""
    d = a.host_delta_ms
    return a.measurable and abs(d) > HOST_MOVED * a.slowdown_ms and abs(d) > HOST_NOISE * a.host_ms(0)
