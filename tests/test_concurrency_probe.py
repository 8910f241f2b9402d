"""The concurrency family's order of work on the CPU, over stand-ins for the native core and the worker pool: the
modes' set-ups may overlap one another, never a measurement."""

import itertools
import multiprocessing as mp
import threading
import time

import pytest

from ccbridge.bindings import core
from ccbridge.errors import GpuError
from ccbridge.probe import concurrency, registry, sessions


class World:
    """What happened, in order: sessions opened and closed, workers started and opened, each measurement."""

    def __init__(self, fail_mode=None):
        self.log = []
        self.live = set()  # own-context sessions not yet closed
        self.pool_started = self.pool_open = False
        self.fail_mode = fail_mode

    def session(self, device, mem, nbytes, nstreams=1, own_context=False):
        world = self

        class Session:
            def __init__(self):
                self.own = own_context
                world.log.append(("open", own_context))
                if own_context:
                    world.live.add(self)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

            def close(self):
                time.sleep(0.005)  # a context takes a while to go: a measurement that did not wait would see it
                world.log.append(("close", self.own))
                world.live.discard(self)

            def copy(self, direction, nbytes, iters, nstreams=1, sync_every=0):
                world.measured("streams")
                return core.CopyOut(0.0, 1e6, 0.0, 55e3), []

        return Session()

    def measured(self, mode):
        self.log.append(("measure", mode))
        if mode == "contexts":
            assert self.pool_started and not self.pool_open, "the workers' start-up ran beside the contexts mode"
        if mode == "processes":
            assert self.pool_open and not self.live, "a context was still being destroyed beside the processes mode"
        if mode == self.fail_mode:
            raise RuntimeError(f"{mode} failed")

    def run_workers(self, sessions, direction, nbytes, iters, streams=None):
        self.measured("contexts" if sessions[0].own else "threads")
        self.log.append(("workers", (len(set(map(id, sessions))), tuple(streams or ()))))
        return [core.CopyOut(0.0, 1e6, 0.0, 55e3) for _ in sessions]

    def pool(self, n, device, nbytes):
        world = self

        class Pool:
            def __enter__(self):
                world.log.append(("spawn", n))
                return self

            def __exit__(self, *exc):
                world.log.append(("pool closed", n))

            def started(self):
                world.pool_started = True

            def open(self, at_once=None):
                assert world.pool_started and at_once == concurrency.MAKING_AT_ONCE
                world.pool_open = True

            def run(self, n, direction, iters):
                world.measured("processes")
                return [core.CopyOut(0.0, 1e6, 0.0, 55e3)] * n

        return Pool()


def _run(monkeypatch, world, quick=True):
    monkeypatch.setattr(concurrency.core, "Session", world.session)
    monkeypatch.setattr(concurrency.core, "run_workers", world.run_workers)
    monkeypatch.setattr(concurrency, "ProcessPool", world.pool)
    ctx = registry.ProbeContext(registry.Settings(quick=quick), registry.Machine(gpu_count=1))
    return concurrency.scaling(ctx), ctx


@pytest.mark.parametrize("quick", [True, False])
def test_rows_as_before_and_no_set_up_beside_a_measurement(monkeypatch, quick):
    world = World()
    rows, ctx = _run(monkeypatch, world, quick)
    ns = (1, 4) if quick else (1, 2, 4, 8, 16)
    assert [(r.params["mode"], r.params["dir"], r.params["n"]) for r in rows] == [
        (m, d, n) for m in concurrency.MODES for d in ("h2d", "d2h") for n in ns]
    assert {(r.metric, r.unit) for r in rows} == {("aggregate_bandwidth", "GB/s")}
    assert sum(1 for r in rows if r.extra.get("headline")) == 2 * len(concurrency.MODES)
    opened = [own for what, own in world.log if what == "open"]
    closed = [own for what, own in world.log if what == "close"]
    assert sorted(opened) == sorted(closed)  # every session closed once
    assert opened.count(True) == max(ns) and not world.live
    # the workers are spawned before this process makes its contexts (their start-ups overlap), and the
    # steps still name what each did
    assert world.log.index(("spawn", max(ns))) < world.log.index(("open", True))
    steps = [m for m, _ in ctx.steps]
    assert steps.index(f"contexts: opening {max(ns)} sessions") < steps.index(
        f"processes: closing contexts, opening {max(ns)} workers")
    assert steps[0] == f"streams: opening one context with {max(ns)} streams"
    # the threads mode: a thread on each of the streams session's streams, no session of its own
    assert opened.count(False) == 1
    threads = [got for what, got in world.log if what == "workers" and got[1]]
    assert threads and set(threads) == {(1, tuple(range(n))) for n in ns}


@pytest.mark.parametrize("mode", ["threads", "contexts", "processes"])
def test_a_failed_mode_leaves_no_session_open(monkeypatch, mode):
    world = World(fail_mode=mode)
    with pytest.raises(RuntimeError, match=f"{mode} failed"):
        _run(monkeypatch, world)
    opened = [own for what, own in world.log if what == "open"]
    closed = [own for what, own in world.log if what == "close"]
    assert sorted(opened) == sorted(closed) and not world.live
    assert ("pool closed", 4) in world.log or mode == "threads"


def _failing_sessions(monkeypatch, fails, pause_s=0.0):
    """core.Session replaced by a stand-in that takes pause_s to make and raises fails(call, nbytes)'s GpuError (the
    calls counted from 0) or None; returns the list of those made, each closed or not."""
    calls, made, lock = itertools.count(), [], threading.Lock()

    class Session:
        def __init__(self, device, mem, nbytes, own_context=False):
            time.sleep(pause_s)
            with lock:
                error = fails(next(calls), nbytes)
            if error:
                raise error
            self.closed = False
            made.append(self)

        def close(self):
            self.closed = True

    monkeypatch.setattr(sessions.core, "Session", Session)
    return made


def test_open_sessions_all_or_none(monkeypatch):
    # the third of four fails
    made = _failing_sessions(monkeypatch, lambda call, nbytes: GpuError("out of memory") if call == 2 else None)
    with pytest.raises(GpuError, match="out of memory"):
        sessions.open_all(0, [("pinned", 1024, True)] * 4)
    assert len(made) == 3 and all(s.closed for s in made)
    assert [s.closed for s in sessions.open_all(0, [("pinned", 1024, False), ("pageable", 1024, False)])] == [False] * 2


def test_worker_processes_start_without_a_context_and_say_why_they_cannot(monkeypatch):
    """The real pool on a machine without a usable driver: its workers start, fail at the driver's start-up (no
    context asked for yet) and say so in one line; the with-block leaves no process behind."""
    try:
        core.device_count()
        pytest.skip("a CUDA driver is here: the workers would start")
    except GpuError:
        pass
    with concurrency.ProcessPool(2, 0, 1 << 20) as pool:
        with pytest.raises(GpuError, match="probe worker process 0: GpuError: "):
            pool.started()
    assert not any(p.is_alive() for p in pool.procs)


@pytest.mark.parametrize("gone", ["before its error", "before it started", "while it waits to open"])
def test_a_worker_whose_parent_is_gone_leaves_quietly(monkeypatch, gone):
    """A worker whose parent died after the driver's start-up (or its failure) leaves without a traceback: what it
    would answer has no one to go to."""
    def device_count():
        if gone == "before its error":
            raise GpuError("no driver")
        return 1

    monkeypatch.setattr(concurrency.core, "device_count", device_count)
    parent, child = mp.get_context("spawn").Pipe()
    reader = threading.Thread(target=lambda: (parent.recv(), parent.close()))  # reads "started", then dies
    if gone == "while it waits to open":
        reader.start()
    else:
        parent.close()
    concurrency._proc_main(child, 0, 1 << 20)  # returns: nothing raised, nothing printed
    child.close()
    if reader.ident is not None:
        reader.join()


def test_sessions_open_at_most_so_many_at_once(monkeypatch):
    """open_all(at_once=k): never more than k sessions being made at one time, every one made, in order."""
    lock, busy, peak = threading.Lock(), [0], [0]

    class Session:
        def __init__(self, device, mem, nbytes, own_context=False):
            with lock:
                busy[0] += 1
                peak[0] = max(peak[0], busy[0])
            time.sleep(0.02)
            with lock:
                busy[0] -= 1
            self.nbytes = nbytes

    monkeypatch.setattr(sessions.core, "Session", Session)
    got = sessions.open_all(0, [("pinned", n, True) for n in range(10)], at_once=3)
    assert [s.nbytes for s in got] == list(range(10)) and peak[0] == 3


def _pool_of_threads(n, ready_after):
    """A ProcessPool whose workers are threads at the pipes' other ends: each answers started, then ready
    ready_after[i] s after it is told to open; what each was told, and how many were opening at once."""
    pool = concurrency.ProcessPool.__new__(concurrency.ProcessPool)
    pool.procs, pool.conns, pool._started = [], [], False
    lock, busy, peak, told, threads = threading.Lock(), [0], [0], [], []

    def worker(i, conn):
        conn.send(("started",))
        msg = conn.recv()
        if msg[0] != "open":
            return
        with lock:
            told.append(i)
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        time.sleep(abs(ready_after[i]))
        with lock:
            busy[0] -= 1
        conn.send(("ready",) if ready_after[i] >= 0 else ("error", "no context"))
        conn.recv()

    for i in range(n):
        parent, child = mp.Pipe()
        pool.conns.append(parent)
        threads.append(threading.Thread(target=worker, args=(i, child), daemon=True))
        threads[-1].start()
    return pool, told, peak, threads


def test_workers_open_at_most_so_many_at_once():
    """ProcessPool.open(at_once=k): the next worker is told to open as soon as any one is ready, never more than k
    opening at a time, every worker opened; a worker's error is raised in its words."""
    delays = [0.25, 0.05, 0.15, 0.05, 0.1, 0.05, 0.2, 0.05]  # long beside a loaded CPU's scheduling delays
    pool, told, peak, threads = _pool_of_threads(len(delays), delays)
    pool.open(at_once=3)
    assert sorted(told) == list(range(len(delays))) and peak[0] == 3
    pool.__exit__(None, None, None)
    for t in threads:
        t.join(timeout=5)
    pool, told, peak, threads = _pool_of_threads(4, [0.3, 0.3, 0.3, 0.3])
    pool.open()  # all at once
    assert peak[0] == 4
    pool.__exit__(None, None, None)
    pool, _, _, _ = _pool_of_threads(3, [0.01, -1, 0.01])
    with pytest.raises(GpuError, match="probe worker process 1: no context"):
        pool.open(at_once=2)
    pool.__exit__(None, None, None)


def test_run_workers_refuses_streams_that_are_not_one_per_session(monkeypatch):
    """REVIEW (rev32), a defect: run_workers(sessions, ..., streams=) built a c_int array of len(sessions) from
    streams, so a shorter list was zero-filled in silence (workers past its end all on stream 0, sharing one
    stream and its buffers: a different measurement, no error) and a longer one raised IndexError from ctypes.
    Each session must have its stream: anything else is refused before the native call."""
    called = []

    class Lib:
        def ccb_workers(self, handles, picked, n, *rest):
            called.append(None if picked is None else list(picked))
            return 0

    class S:
        handle = None

    monkeypatch.setattr(core, "lib", lambda: Lib())
    for streams in ([0, 1], [0, 1, 2, 3]):
        with pytest.raises(ValueError, match="streams: 3 sessions, 2 streams|streams: 3 sessions, 4 streams"):
            core.run_workers([S()] * 3, "h2d", 64, 1, streams=streams)
    assert called == []
    core.run_workers([S()] * 3, "h2d", 64, 1, streams=[0, 1, 2])
    assert called == [[0, 1, 2]]


def test_open_sessions_all_or_none_at_most_so_many_at_once(monkeypatch):
    """REVIEW (rev32), coverage: with at_once, failures among sessions made k at a time (the second and the sixth of
    eight) raise the first in spec order, once, and every session made is closed."""
    made = _failing_sessions(monkeypatch, lambda call, nbytes: GpuError(f"no context {nbytes}") if nbytes in (1, 5)
                             else None, pause_s=0.005)
    with pytest.raises(GpuError, match="^no context 1$"):
        sessions.open_all(0, [("pinned", n, True) for n in range(8)], at_once=2)
    assert len(made) == 6 and all(s.closed for s in made)
