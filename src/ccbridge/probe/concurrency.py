"""Concurrency: aggregate H2D/D2H bandwidth with N streams, threads, contexts, processes.

The bridge law says bandwidth under CC lives in contexts: streams of one
context share its channel, threads too; driver-API contexts and processes get
channels of their own. Natively all four should sit at the link's ceiling.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from multiprocessing import connection

from ccbridge.bindings import core
from ccbridge.errors import GpuError
from ccbridge.probe.registry import test
from ccbridge.probe.sessions import close_all, open_all
from ccbridge.results import Row
from ccbridge.stats import settle_after, settled

MODES = ("streams", "threads", "contexts", "processes")
ANSWER_TIMEOUT_S = 120
# Contexts made at once (this process's threads, or the workers): on one H200 four at once took 0.13 s a context,
# what one takes alone (the quick run's 4, and lifecycle's), where sixteen at once took 0.17 s a context, and
# sixteen workers making theirs while this process destroyed its sixteen took 5.1 s, 1.5 s over the two done one
# after the other (bench/RESULTS.md session 16, run 3): as if the driver made contexts one at a time and a crowd of
# callers only added to that.
MAKING_AT_ONCE = 4


def _worker_iters(total_bytes: int, n: int, nbytes: int) -> int:
    return max(2, total_bytes // (n * nbytes))


def _proc_main(conn, device: int, nbytes: int) -> None:
    """A worker process: the driver started at once (no context: nothing on the GPU), then, once told to open, one
    session on its own primary context, driven over a pipe. Once its parent is gone it leaves, quietly: there is no
    one to tell (its session closed on the way out)."""
    try:
        _serve(conn, device, nbytes)
    except (EOFError, ConnectionError):  # the pipe's other end closed: the parent died or left
        pass


def _serve(conn, device: int, nbytes: int) -> None:
    """_proc_main's answers, in order: started (or error), ready, then warm or done to each ask until close."""
    try:
        core.device_count()  # cuInit: the driver's start-up in this process, no context made
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("started",))
    if conn.recv()[0] != "open":  # closed before it opened: nothing to undo
        return
    try:
        s = core.Session(device, "pinned", nbytes)
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready",))
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "close":
                break
            if msg[0] == "warm":
                s.copy(msg[1], nbytes, 2)
                conn.send(("warm",))
                continue
            _, direction, iters, start_at_ns = msg
            while core.now_ns() < start_at_ns:
                time.sleep(0.0005)
            out, _ = s.copy(direction, nbytes, iters)
            conn.send(("done", out.start_ns, out.end_ns, out.incall_ns, out.bytes))
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        s.close()


class ProcessPool:
    """n worker processes, each with a session; never outlives the with-block. Made, the workers start (their
    interpreters, imports and the driver: no context, nothing on the GPU) while the caller goes on; started()
    waits for that, open() has each make its context and session."""

    def __init__(self, n: int, device: int, nbytes: int):
        ctx = mp.get_context("spawn")  # never fork a process that holds a CUDA context
        self.procs, self.conns = [], []
        try:
            for _ in range(n):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_proc_main, args=(child, device, nbytes), daemon=True)
                p.start()
                self.procs.append(p)
                self.conns.append(parent)
        except BaseException:
            self.__exit__()
            raise
        self._started = False

    def started(self) -> None:
        """Every worker's start-up over (its interpreter, imports and driver), so that none runs beside what the
        caller measures next."""
        if not self._started:
            for i in range(len(self.conns)):
                self._expect(i, "started")
            self._started = True

    def open(self, at_once: int | None = None) -> None:
        """Each worker's context and session made (after started()), at most `at_once` workers making theirs at a
        time (all where None): the next is told to open as soon as one is ready."""
        self.started()
        untold = list(range(len(self.conns)))
        making: dict = {}  # pipe -> worker index, told to open and not yet ready
        while untold or making:
            while untold and len(making) < (at_once or len(self.conns)):
                i = untold.pop(0)
                self.conns[i].send(("open",))
                making[self.conns[i]] = i
            ready = connection.wait(list(making), ANSWER_TIMEOUT_S)
            if not ready:
                raise GpuError(f"probe worker process {min(making.values())} did not answer in {ANSWER_TIMEOUT_S} s")
            for c in ready:
                self._expect(making.pop(c), "ready")

    def _expect(self, i: int, kind: str):
        if not self.conns[i].poll(ANSWER_TIMEOUT_S):
            raise GpuError(f"probe worker process {i} did not answer in {ANSWER_TIMEOUT_S} s")
        msg = self.conns[i].recv()
        if msg[0] == "error":
            raise GpuError(f"probe worker process {i}: {msg[1]}")
        if msg[0] != kind:
            raise GpuError(f"probe worker process {i}: unexpected answer {msg[0]!r}")
        return msg

    def run(self, n: int, direction: str, iters: int) -> list[core.CopyOut]:
        for c in self.conns[:n]:
            c.send(("warm", direction))
        for i in range(n):
            self._expect(i, "warm")
        start_at = core.now_ns() + 20e6  # all warm: start together, whatever the warm-up cost
        for c in self.conns[:n]:
            c.send(("go", direction, iters, start_at))
        outs = []
        for i in range(n):
            _, s, e, incall, b = self._expect(i, "done")
            outs.append(core.CopyOut(s, e, incall, b))
        return outs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for c in self.conns:
            try:
                c.send(("close",))
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _streams_gbps(s, direction: str, nbytes: int, iters: int, n: int) -> float:
    out, _ = s.copy(direction, nbytes, iters, nstreams=n)
    return out.bytes / (out.end_ns - out.start_ns)


@test("concurrency.scaling", "aggregate H2D/D2H GB/s with N streams, threads, contexts, processes", needs=("gpu",))
def scaling(ctx):
    ns = ctx.pick((1, 2, 4, 8, 16), (1, 4))
    nbytes = ctx.pick(32 << 20, 16 << 20)
    total = 1 << 30  # per sample: ~20 ms at the link's rate, a 32 MiB copy 0.6 ms of it
    reps = ctx.pick(3, 2)
    nmax = max(ns)
    rows = []

    def record(mode, direction, n, samples):
        row = Row.of("concurrency.scaling", "aggregate_bandwidth", "GB/s", samples, mode=mode, dir=direction, n=n)
        rows.append(row)

    def sessions_mode(mode: str, sessions: list[core.Session], streams: list[int] | None = None) -> None:
        for direction in ("h2d", "d2h"):
            for n in ns:
                ctx.step(f"{mode} x{n} {direction}")
                iters = _worker_iters(total, n, nbytes)
                picked = None if streams is None else streams[:n]
                record(mode, direction, n, settled(
                    lambda: core.aggregate_gbps(core.run_workers(sessions[:n], direction, nbytes, iters,
                                                                 streams=picked)),
                    settle_after(reps), reps))

    # The threads mode's threads each drive one stream of the streams mode's session, with that stream's own
    # buffers: N threads on the primary context, each with its stream and buffers, as N sessions of one stream
    # there would be, without making and filling a second set.
    ctx.step(f"streams: opening one context with {nmax} streams")
    with core.Session(ctx.device, "pinned", nbytes, nstreams=nmax) as s:
        for direction in ("h2d", "d2h"):
            for n in ns:
                ctx.step(f"streams x{n} {direction}")
                iters = _worker_iters(total, n, nbytes) * n
                s.copy(direction, nbytes, 2 * n, nstreams=n)
                record("streams", direction, n,
                       settled(lambda: _streams_gbps(s, direction, nbytes, iters, n), settle_after(reps), reps))
        sessions_mode("threads", [s] * nmax, streams=list(range(nmax)))

    # The last two modes' set-ups overlap each other, never a measurement: the workers start (interpreters, imports,
    # the driver; no context) while this process makes its contexts, and this process destroys its contexts while
    # the workers make theirs. Each is over before the next measurement: pool.started() before the contexts mode,
    # the closing thread joined before the processes mode. Contexts are made MAKING_AT_ONCE at a time.
    ctx.step(f"contexts: opening {nmax} sessions")
    with ProcessPool(nmax, ctx.device, nbytes) as pool:
        sessions = open_all(ctx.device, [("pinned", nbytes, True)] * nmax, at_once=MAKING_AT_ONCE)
        closing = threading.Thread(target=close_all, args=(sessions,), name="ccbridge-close-contexts")
        try:
            pool.started()
            sessions_mode("contexts", sessions)
            ctx.step(f"processes: closing contexts, opening {nmax} workers")
            closing.start()
            pool.open(at_once=MAKING_AT_ONCE)
        finally:
            if closing.ident is None:  # not started (the contexts mode failed): closed here
                close_all(sessions)
            else:
                closing.join()
        for direction in ("h2d", "d2h"):
            for n in ns:
                ctx.step(f"processes x{n} {direction}")
                iters = _worker_iters(total, n, nbytes)
                record("processes", direction, n,
                       settled(lambda: core.aggregate_gbps(pool.run(n, direction, iters)), settle_after(reps), reps))

    for mode in MODES:  # headline: the best N of each mode and direction
        for direction in ("h2d", "d2h"):
            cand = [r for r in rows if r.params["mode"] == mode and r.params["dir"] == direction]
            max(cand, key=lambda r: r.median).extra["headline"] = True
    return rows
