"""The loader's uncoupled bound (ccbridge.load.bound) without a GPU: the copies faked, the reads real.

The fakes stand where the module reaches the native core (core.Session, core.run_workers) and sleep as copies
would, returning core.CopyOut spans on the native core's clock (CLOCK_MONOTONIC, time.monotonic_ns here).
"""

from __future__ import annotations

import collections
import json
import os
import runpy
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from ccbridge import env, results
from ccbridge.bindings import core
from ccbridge.errors import LoadError, UsageError
from ccbridge.load import bench, benchresult, bound, policy, synth
from ccbridge.load.engine import PoolConfig
from ccbridge.textfit import fit

KiB = 1 << 10
CHUNK = 64 * KiB
COPY_S = 0.05  # each fake copy call's time: long enough that the reads at once start inside it on a busy machine


class Fakes:
    """core.Session and core.run_workers, recording what the bound asked of them."""

    def __init__(self):
        self.sessions: list[dict] = []
        self.copies: list[dict] = []  # one per call: its args and the spans it returned
        self.lock = threading.Lock()

    def out(self, nbytes: float) -> core.CopyOut:
        t0 = time.monotonic_ns()
        time.sleep(COPY_S)
        return core.CopyOut(t0, time.monotonic_ns(), 0.0, nbytes)

    def install(self, monkeypatch):
        fakes = self

        class Session:
            def __init__(self, device, mem, max_bytes, nstreams=1, own_context=False):
                self.args = dict(device=device, mem=mem, max_bytes=max_bytes, nstreams=nstreams,
                                 own_context=own_context)
                self.closed = False
                fakes.sessions.append(self.args)
                self.args["session"] = self

            def copy(self, direction, nbytes, iters, nstreams=1, sync_every=0):
                assert nbytes <= self.args["max_bytes"] and nstreams <= self.args["nstreams"]
                out = fakes.out(float(nbytes) * iters)
                with fakes.lock:
                    fakes.copies.append(dict(kind="copy", direction=direction, nbytes=nbytes, iters=iters,
                                             nstreams=nstreams, outs=[out]))
                return out, []

            def close(self):
                self.closed = True

        def run_workers(sessions, direction, nbytes, iters, warmup=2, streams=None):
            assert streams is not None and len(streams) == len(sessions)
            for s, i in zip(sessions, streams):
                assert 0 <= i < s.args["nstreams"]
            outs = [fakes.out(float(nbytes) * iters)]  # the workers at once: one sleep, each its own span
            outs += [core.CopyOut(outs[0].start_ns, outs[0].end_ns, 0.0, float(nbytes) * iters)
                     for _ in sessions[1:]]
            with fakes.lock:
                fakes.copies.append(dict(kind="workers", direction=direction, nbytes=nbytes, iters=iters,
                                         warmup=warmup, sessions=list(sessions), streams=list(streams), outs=outs))
            return outs

        monkeypatch.setattr(core, "Session", Session)
        monkeypatch.setattr(core, "run_workers", run_workers)
        return self


@pytest.fixture
def fakes(monkeypatch):
    return Fakes().install(monkeypatch)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("bound-ckpt")
    return [str(p) for p in synth.make_checkpoint(d, 3 << 20, 1 << 20, jobs=1)]


def config(workers=3, contexts=0, staging="pinned", chunk=CHUNK, buffers=2) -> PoolConfig:
    return PoolConfig(0, workers, contexts, staging, chunk, buffers)


def total(files) -> int:
    return sum(os.path.getsize(f) for f in files)


def test_figures_are_bytes_over_seconds(files, fakes, monkeypatch):
    """Each figure is its job's own bytes over its own span; both at once, the checkpoint's bytes over the union
    of the reads' span and the copies' span scaled to the checkpoint's bytes."""
    spans = []
    real = bound.read_pass
    monkeypatch.setattr(bound, "read_pass", lambda *a, **k: spans.append(real(*a, **k)) or spans[-1])
    got = bound.measure(files, bound.shape_of(config()), repeat=2)
    n = total(files)
    assert len(spans) == 1 + 2 * 2 and all(s.bytes == n for s in spans)  # warm, then alone and at once per repeat
    assert len(fakes.copies) == 1 + 2 * 2
    for r in range(2):
        alone, once = spans[1 + 2 * r], spans[2 + 2 * r]
        c_alone, c_once = fakes.copies[1 + 2 * r]["outs"][0], fakes.copies[2 + 2 * r]["outs"][0]
        s = {k: v[r] for k, v in got["samples"].items()}
        assert s["reads_alone"] == pytest.approx(n / (alone.end_ns - alone.start_ns))
        assert s["reads_at_once"] == pytest.approx(n / (once.end_ns - once.start_ns))
        assert s["copies_alone"] == pytest.approx(c_alone.bytes / (c_alone.end_ns - c_alone.start_ns))
        assert s["copies_at_once"] == pytest.approx(c_once.bytes / (c_once.end_ns - c_once.start_ns))
        end = c_once.start_ns + (c_once.end_ns - c_once.start_ns) * n / c_once.bytes
        union = max(once.end_ns, end) - min(once.start_ns, c_once.start_ns)
        assert s["both_at_once"] == pytest.approx(n / union)
        # from the samples alone: the copies' span scaled to the checkpoint's bytes bounds both at once
        (r0, r1), (c0, c1) = s["reads_span_ns"], s["copies_span_ns"]
        scaled = c0 + (c1 - c0) * n / s["copy_bytes"]
        assert s["both_at_once"] == pytest.approx(n / (max(r1, scaled) - min(r0, c0)), rel=1e-6)
        assert s["both_at_once"] <= min(s["reads_at_once"], s["copies_at_once"]) * (1 + 1e-6)
        assert s["copy_bytes"] >= n
    assert got["gbps"] == {k: statistics.median(got["samples"][k]) for k in bound.ROWS}
    assert (got["bytes"], got["chunks"], got["repeat"]) == (n, len(bound.chunks(files, CHUNK)), 2)
    # the copies move at least the checkpoint's bytes, in whole chunks
    assert got["copy_bytes"] == fakes.copies[1]["nbytes"] * fakes.copies[1]["iters"] == -(-n // CHUNK) * CHUNK
    assert fakes.copies[0]["iters"] == bound.WARM_COPIES


@pytest.mark.parametrize("opts", [dict(workers=5, staging="pageable"), dict(workers=5, contexts=2)])
def test_workers_that_do_not_divide_the_chunks_still_copy_every_byte(tmp_path, fakes, opts):
    """47 chunks over 5 workers: 10 each (50 chunks), never 9 (45, fewer bytes than the reads); the copy figures
    are the copies' own bytes, both at once the checkpoint's over the scaled span."""
    f = tmp_path / "odd.bin"
    f.write_bytes(os.urandom(46 * CHUNK + 1000))
    n = f.stat().st_size
    got = bound.measure([str(f)], bound.shape_of(config(**opts)), repeat=1)
    timed = fakes.copies[2]  # warm, alone, at once
    assert timed["kind"] == "workers" and timed["iters"] == 10 and len(timed["outs"]) == 5
    assert got["chunks"] == 47 and got["copy_bytes"] == 50 * CHUNK >= n
    out = timed["outs"][0]
    span_ns = out.end_ns - out.start_ns
    assert got["gbps"]["copies_at_once"] == pytest.approx(50 * CHUNK / span_ns)
    assert got["gbps"]["both_at_once"] <= n / (span_ns * n / (50 * CHUNK)) * (1 + 1e-9)


def test_readers_read_every_chunk_exactly_once_per_pass(files, fakes, monkeypatch):
    reads = collections.Counter()
    names = set()
    lock = threading.Lock()
    real = os.preadv

    def counting(fd, bufs, off):
        got = real(fd, bufs, off)
        with lock:
            reads[(os.readlink(f"/proc/self/fd/{fd}"), off)] += got
            names.add(threading.current_thread().name)
        return got

    monkeypatch.setattr(os, "preadv", counting)
    bound.measure(files, bound.shape_of(config(workers=4)), repeat=1)
    passes = 1 + 2  # warm, alone, at once
    assert sum(reads.values()) == passes * total(files)
    want = {(os.path.realpath(p), o): passes * n for p, o, n in bound.chunks(files, CHUNK)}
    assert dict(reads) == want
    assert names <= {f"ccbridge-bound-read-{i}" for i in range(4)}


def test_short_reads_are_finished_and_a_shrunk_file_is_an_error(files, fakes, monkeypatch):
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: real(fd, [bufs[0][:4096]], off))  # 4 KiB at most
    fds = {p: os.open(p, os.O_RDONLY) for p in files}
    try:
        span = bound.read_pass(bound.chunks(files, CHUNK), fds, bound.buffers(bound.shape_of(config())))
    finally:
        for fd in fds.values():
            os.close(fd)
    assert span.bytes == total(files)
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: 0)  # the file ends early
    with pytest.raises(LoadError, match="a checkpoint file changed"):
        bound.measure(files, bound.shape_of(config()), repeat=1)
    assert fakes.sessions and all(s["session"].closed for s in fakes.sessions)  # closed on the way out


def test_the_readers_buffers_are_made_once_and_touched_before_any_pass(files, fakes, monkeypatch):
    shape = bound.shape_of(config(workers=3, buffers=2))
    made = bound.buffers(shape)
    assert [len(b) for b in made] == [2, 2, 2] and all(len(x) == CHUNK and x[::bound.PAGE] == b"\1" * (CHUNK // 4096)
                                                          for b in made for x in b)
    calls, seen = [], []
    real_buffers, real_pass = bound.buffers, bound.read_pass
    monkeypatch.setattr(bound, "buffers", lambda s: calls.append(s) or real_buffers(s))
    monkeypatch.setattr(bound, "read_pass", lambda w, f, b, *a: seen.append(b) or real_pass(w, f, b, *a))
    bound.measure(files, shape, repeat=2)
    assert calls == [shape] and len(seen) == 1 + 2 * 2 and all(b is seen[0] for b in seen)


def test_a_pass_is_timed_from_when_every_reader_runs(files, monkeypatch):
    """Starting the threads is not the reads' time: a slow thread start (100 ms each here) stays out of the span."""
    real_start = threading.Thread.start

    def slow_start(self):
        real_start(self)
        time.sleep(0.1)

    shape = bound.shape_of(config(workers=3))
    bufs = bound.buffers(shape)
    fds = {p: os.open(p, os.O_RDONLY) for p in files}
    monkeypatch.setattr(threading.Thread, "start", slow_start)
    try:
        span = bound.read_pass(bound.chunks(files, CHUNK), fds, bufs)
    finally:
        monkeypatch.undo()
        for fd in fds.values():
            os.close(fd)
    assert span.end_ns - span.start_ns < 0.2e9  # 3 MiB from the page cache: far under the 300 ms of starts


def test_the_run_at_once_overlaps(files, fakes, monkeypatch):
    """The reads at once run while the copies run: their spans intersect."""
    real = os.preadv

    def slow(fd, bufs, off):
        time.sleep(0.002)  # 48 chunks over 3 readers: ~32 ms of reads against 50 ms of copies
        return real(fd, bufs, off)

    spans = []
    real_pass = bound.read_pass
    monkeypatch.setattr(os, "preadv", slow)
    monkeypatch.setattr(bound, "read_pass", lambda *a, **k: spans.append(real_pass(*a, **k)) or spans[-1])
    got = bound.measure(files, bound.shape_of(config()), repeat=1)
    reads, copies = spans[2], fakes.copies[2]["outs"][0]
    assert max(reads.start_ns, copies.start_ns) < min(reads.end_ns, copies.end_ns)
    alone_reads, alone_copies = spans[1], fakes.copies[1]["outs"][0]  # the jobs alone do not overlap
    assert alone_reads.end_ns <= alone_copies.start_ns
    # the evidence in the report: both spans from the earlier start, the copies' bytes, the overlap
    t0 = min(reads.start_ns, copies.start_ns)
    s = got["samples"]
    assert s["reads_span_ns"] == [[round(reads.start_ns - t0), round(reads.end_ns - t0)]]
    assert s["copies_span_ns"] == [[round(copies.start_ns - t0), round(copies.end_ns - t0)]]
    assert s["copy_bytes"] == [copies.bytes] and 0 in s["reads_span_ns"][0] + s["copies_span_ns"][0]
    inter = min(reads.end_ns, copies.end_ns) - max(reads.start_ns, copies.start_ns)
    assert s["overlap"] == [pytest.approx(inter / min(reads.end_ns - reads.start_ns, copies.end_ns - copies.start_ns))]
    assert (got["overlap_warning"] is None) == (s["overlap"][0] >= bound.MIN_OVERLAP)
    json.dumps(got)  # the report as the bench writes it


def test_copies_that_did_not_run_beside_the_reads_are_flagged(files, fakes, monkeypatch):
    """A repeat whose copies at once began after its reads were done overlapped 0: logged, marked in the report
    and printed under the bound's lines."""
    real, calls = fakes.out, []

    def late(nbytes):
        calls.append(nbytes)
        if len(calls) % 2 == 1 and len(calls) > 1:  # the copies at once (warm, then alone and at once per repeat)
            time.sleep(0.3)  # 3 MiB from the page cache read by now
        return real(nbytes)

    monkeypatch.setattr(fakes, "out", late)
    logged = []
    got = bound.measure(files, bound.shape_of(config()), repeat=2, log=logged.append)
    assert got["samples"]["overlap"] == [0.0, 0.0]
    for (r0, r1), (c0, c1) in zip(got["samples"]["reads_span_ns"], got["samples"]["copies_span_ns"]):
        assert r0 == 0 and r1 <= c0
    want = "2 of 2 repeats overlapped under 0.9 (lowest 0.00): their reads and copies did not all run at once"
    assert got["overlap_warning"] == want and f"bound: warning: {want}" in logged
    lines = fit(bench.render(report(got, gbps=1e-6))).splitlines()
    assert lines[-1] == f"bound: warning: {want}" and all(len(line) <= 120 for line in lines)


def alive() -> list[str]:
    """The bound's threads still running: listed by threading.enumerate(), not asked is_alive() (a Thread.join
    that a ^C interrupts marks a running thread stopped, CPython 3.11; it stays listed until it ends)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("ccbridge-bound-")]


def open_fds(files) -> int:
    """This process's descriptors open on the checkpoint's files."""
    real = {os.path.realpath(f) for f in files}
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return sum(link in real for link in links)


def failing_preadv(after: int, exc: BaseException):
    """os.preadv that raises exc on its call number `after` (from 1), slowed to 2 ms a call so a pass lasts."""
    real, calls, lock = os.preadv, [0], threading.Lock()

    def preadv(fd, bufs, off):
        with lock:
            calls[0] += 1
            n = calls[0]
        if n == after:
            raise exc
        time.sleep(0.002)
        return real(fd, bufs, off)
    return preadv


@pytest.mark.parametrize("exc, match", [(OSError(5, "Input/output error"), "OSError: .*Input/output error"),
                                        (MemoryError("no room"), "MemoryError: no room")])
def test_a_reader_that_fails_mid_pass_is_a_load_error_and_nothing_is_left_open(files, fakes, monkeypatch, exc, match):
    """Not "a checkpoint file changed": the reader's own error, named; its fellows stopped and joined, the fds
    and Sessions closed."""
    before = open_fds(files)
    monkeypatch.setattr(os, "preadv", failing_preadv(60, exc))  # the warm pass is 48 chunks: this is the next
    with pytest.raises(LoadError, match=f"the bound's reads failed: {match}"):
        bound.measure(files, bound.shape_of(config()), repeat=1)
    assert alive() == [] and open_fds(files) == before
    assert fakes.sessions and all(s["session"].closed for s in fakes.sessions)


def test_a_keyboard_interrupt_in_a_reader_is_raised_as_is(files, fakes, monkeypatch):
    monkeypatch.setattr(os, "preadv", failing_preadv(5, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        bound.measure(files, bound.shape_of(config()), repeat=1)
    assert alive() == []


def test_a_copy_that_fails_at_once_is_raised_and_the_sessions_closed(files, fakes, monkeypatch):
    from ccbridge.errors import GpuError

    before, real, calls = open_fds(files), fakes.out, []

    def out(nbytes):
        calls.append(nbytes)
        if len(calls) == 3:  # warm, alone, then the copies at once
            raise GpuError("cuMemcpyHtoDAsync: CUDA_ERROR_LAUNCH_FAILED")
        return real(nbytes)

    monkeypatch.setattr(fakes, "out", out)
    with pytest.raises(GpuError, match="LAUNCH_FAILED"):
        bound.measure(files, bound.shape_of(config()), repeat=2)
    assert len(calls) == 3 and alive() == [] and open_fds(files) == before
    assert all(s["session"].closed for s in fakes.sessions)


@pytest.fixture
def sigint():
    """sigint(): SIGINT to the main thread (where pytest runs the test), as a ^C in a terminal gives."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    signal.signal(signal.SIGINT, old)


def test_an_interrupt_during_a_pass_stops_and_joins_every_reader(files, fakes, monkeypatch, sigint):
    real, calls = os.preadv, []

    def preadv(fd, bufs, off):
        calls.append(off)
        if len(calls) == 60:  # inside the first pass after the warm one
            sigint()
        time.sleep(0.005)
        return real(fd, bufs, off)

    before = open_fds(files)
    monkeypatch.setattr(os, "preadv", preadv)
    with pytest.raises(KeyboardInterrupt):
        bound.measure(files, bound.shape_of(config()), repeat=1)
    assert alive() == [] and open_fds(files) == before
    assert len(calls) < 48 * 2  # the readers stopped at their next chunk, not at the pass's end
    assert all(s["session"].closed for s in fakes.sessions)


def test_the_sessions_are_not_closed_under_a_copy_in_flight(files, fakes, monkeypatch, sigint):
    """^C during the reads at once, and again while the copies' native call is still in flight: the copy thread
    is waited for before any Session closes."""
    monkeypatch.setattr(sys.modules[__name__], "COPY_S", 1.0)
    real, timers, closes = os.preadv, [], []

    def again():  # only while the copy is in flight: a ^C after the test would stop pytest itself
        if "ccbridge-bound-copies" in alive():
            sigint()

    def preadv(fd, bufs, off):
        if "ccbridge-bound-copies" in alive() and not timers:
            timers.append(threading.Timer(0.2, again))
            sigint()
            timers[0].start()  # the second ^C lands while the copy thread is waited for
        time.sleep(0.002)
        return real(fd, bufs, off)

    class Session(core.Session):
        def close(self):
            closes.append(alive())
            super().close()

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(core, "Session", Session)
    with pytest.raises(KeyboardInterrupt):
        bound.measure(files, bound.shape_of(config()), repeat=1)
    timers[0].join()
    assert closes == [[]] and alive() == []


def test_primary_context_pinned_is_one_session_one_issuer(files, fakes):
    got = bound.measure(files, bound.shape_of(config(workers=5)), repeat=1)
    assert [(s["own_context"], s["nstreams"], s["mem"], s["max_bytes"]) for s in fakes.sessions] == \
        [(False, 5, "pinned", CHUNK)]
    assert {c["kind"] for c in fakes.copies} == {"copy"} and {c["nstreams"] for c in fakes.copies} == {5}
    assert (got["readers"], got["streams"], got["contexts"], got["issuers"]) == (5, 5, 0, 1)


def test_primary_context_pageable_has_each_worker_issue_on_its_stream(files, fakes):
    """Pageable staging: the pool's workers issue their own copies (a pageable copy call holds its thread)."""
    got = bound.measure(files, bound.shape_of(config(workers=4, staging="pageable")), repeat=1)
    assert [(s["own_context"], s["nstreams"], s["mem"]) for s in fakes.sessions] == [(False, 4, "pageable")]
    assert {c["kind"] for c in fakes.copies} == {"workers"}
    timed = fakes.copies[1]
    assert timed["streams"] == [0, 1, 2, 3] and {id(s) for s in timed["sessions"]} == {id(fakes.sessions[0]["session"])}
    assert timed["warmup"] == 0 and got["issuers"] == 4


def test_own_contexts_spread_the_workers_as_the_pool_does(files, fakes):
    """contexts k: k Sessions of their own contexts; worker i on context i % k (load.c's worker_init)."""
    got = bound.measure(files, bound.shape_of(config(workers=5, contexts=3)), repeat=1)
    assert [(s["own_context"], s["nstreams"], s["mem"]) for s in fakes.sessions] == [(True, 2, "pinned"),
                                                                                        (True, 2, "pinned"),
                                                                                        (True, 1, "pinned")]
    timed = fakes.copies[1]
    assert timed["kind"] == "workers" and timed["streams"] == [0, 0, 0, 1, 1]
    order = [s["session"] for s in fakes.sessions]
    assert [order.index(s) for s in timed["sessions"]] == [0, 1, 2, 0, 1]
    assert (got["contexts"], got["streams"], got["issuers"]) == (3, 5, 5)
    assert all(s["session"].closed for s in fakes.sessions)


def test_the_shape_follows_the_policy_and_refuses_what_it_cannot_bound():
    off = policy.choose(0, ("off", {})).config
    s = bound.shape_of(off)
    assert (s.readers, s.streams, s.contexts, s.chunk, s.mem, s.one_issuer) == \
        (off.workers, off.workers, 0, off.chunk_bytes, "pinned", True)
    emu = policy.choose(0, ("emulated", {"h2d_pinned_gbps": 11.26, "h2d_pageable_gbps": 15.0,
                                         "h2d_system_gbps": 34.18, "h2d_pinned_ratio": 0.203,
                                         "h2d_pageable_ratio": 0.78, "native_h2d_pageable_gbps": 5.8,
                                         "native_h2d_pinned_gbps": 55.0})).config
    s = bound.shape_of(emu)
    assert (s.contexts, s.streams, s.readers, s.one_issuer) == (emu.contexts, emu.workers, emu.workers, False)
    s = bound.shape_of(off, readers=7, streams=9, chunk=16 << 20)  # bench/load_bound.py's overrides
    assert (s.readers, s.buffers, s.streams, s.contexts, s.chunk, s.mem) == (7, off.buffers, 9, 0, 16 << 20, "pinned")
    with pytest.raises(UsageError, match="mapped staging has no read pass"):
        bound.shape_of(policy.choose(0, ("on", {})).config)
    with pytest.raises(UsageError, match="a load into host memory has none"):
        bound.shape_of(policy.choose(-1).config)
    with pytest.raises(UsageError, match="streams: expected 1..64"):
        bound.shape_of(off, streams=65)
    with pytest.raises(UsageError, match="chunk"):
        bound.shape_of(off, chunk=0)
    with pytest.raises(UsageError, match="^bound streams: 2 is fewer than the plan's 3 contexts$"):  # not lowered
        bound.shape_of(config(workers=5, contexts=3), streams=2)


def run_script(monkeypatch, args: list[str]):
    script = Path(__file__).resolve().parent.parent / "bench" / "load_bound.py"
    monkeypatch.setattr(sys, "argv", ["load_bound.py", *args])
    runpy.run_path(str(script), run_name="__main__")


def test_bench_script_is_a_command_line_over_the_module(files, fakes, monkeypatch, capsys):
    """bench/load_bound.py prints the module's measurement: its shape, each repeat (from 1, as the bench), the
    bytes and chunks it timed, the medians and the best repeats."""
    real, got = bound.measure, []
    monkeypatch.setattr(bound, "measure", lambda *a, **k: got.append(real(*a, **k)) or got[-1])
    run_script(monkeypatch, [str(Path(files[0]).parent), "--readers", "2", "--streams", "3", "--chunk-mib", "1",
                             "--repeat", "2", "--contexts", "0", "--staging", "pinned"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bound's shape: 2 readers; 3 streams on the primary context, one thread issuing")
    assert [line.split(":")[0] for line in out[1:]] == ["bound 1/2", "bound 2/2", out[3].split(":")[0],
                                                        "median GB/s", "best GB/s"]
    assert out[1].endswith(" GB/s") and "both at once" in out[-1] and not out[-1].endswith("GB/s")
    g = got[0]
    assert out[3] == (f"{g['bytes'] / 1e9:.2f} GB in {g['chunks']} chunks of 1 MiB (copies {g['copy_bytes'] / 1e9:.2f} "
                      f"GB); 2 readers, 3 streams; {os.cpu_count()} CPUs")
    assert out[-1] == "best GB/s: " + bound.figures_line(g["best"])[:-len(" GB/s")]
    assert [(s["nstreams"], s["max_bytes"]) for s in fakes.sessions] == [(3, 1 << 20)]


@pytest.mark.parametrize("args, line", [(["--streams", "1", "--contexts", "2"],
                                         "load_bound: bound streams: 1 is fewer than the plan's 2 contexts"),
                                        (["--repeat", "0"], "load_bound: bound repeat: expected at least 1, got 0")])
def test_bench_script_bad_input_is_one_line_and_exit_2(files, fakes, monkeypatch, capsys, args, line):
    with pytest.raises(SystemExit) as e:
        run_script(monkeypatch, [str(Path(files[0]).parent), *args])
    err = capsys.readouterr()
    assert e.value.code == 2 and err.err == line + "\n" and not fakes.sessions


def test_a_failed_copy_is_reported_by_the_bench_not_fatal(files, fakes, monkeypatch):
    from ccbridge.errors import GpuError

    def refused(*a, **k):
        raise GpuError("cuMemHostAlloc: CUDA_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(core, "Session", refused)
    logged = []
    got = bound.measured(files, bound.shape_of(config()), 1, logged.append)
    assert got["error"] == "GpuError: cuMemHostAlloc: CUDA_ERROR_OUT_OF_MEMORY" and got["readers"] == 3
    assert any("bound not measured" in m for m in logged)
    text = bench.render(report(bound=got))
    assert "bound: not measured (GpuError" in text and "/ bound" not in text


def report(bound=None, gbps=48.39):
    row = {"gbps": gbps, "seconds": [0.35], "error": None, "stages": {}}
    rep = {"files": 5, "bytes": 16_810_000_000, "gpu": "NVIDIA H200", "device": "cuda:0", "repeat": 3,
           "pool": {"workers": 14, "contexts": 0, "staging": "pinned", "chunk_bytes": 4 << 20, "buffers": 2,
                    "prewarm_s": 0.5, "teardown_s": 0.2},
           "why": "CC off: 14 workers on the primary context, pinned staging, direct to the tensors",
           "cold_pool": None, "verified": "bitwise equal",
           "loaders": {"ccbridge prewarmed": row, "ccbridge cold": {**row, "gbps": gbps * 0.88},
                       "fastsafetensors (nogds)": {"gbps": None, "seconds": [], "error": "not installed here",
                                                   "stages": {}, "skipped": True}}}
    if bound is not None:
        rep["bound"] = bound
    return rep


def measured_bound(both=50.09, big=False, best=51.56):
    f = 999.99 if big else None
    g = {"reads_alone": f or 64.37, "copies_alone": f or 53.25, "reads_at_once": f or 56.45,
         "copies_at_once": f or 50.18, "both_at_once": f or both}
    top = {**g, "both_at_once": f or best}
    return {"readers": 14, "buffers": 2, "streams": 14, "contexts": 0, "issuers": 1, "chunk_bytes": 4 << 20,
            "staging": "pinned", "bytes": 16_810_000_000, "chunks": 4010, "repeat": 3, "gbps": g, "best": top,
            "samples": {k: [v] * 3 for k, v in g.items()}, "overlap_warning": None}


@pytest.mark.parametrize("ceiling", [None, 55.12])
def test_render_shows_the_bound_and_its_column_within_120_columns(ceiling):
    """The CLI prints render() through fit(); the table's rows and the bound's lines fit as they are (not
    wrapped: the columns stay columns). The bound is the best repeat of both at once, its median beside it; its
    ratio is on the prewarmed row alone (the other rows are loaders of other shapes)."""
    plain = bench.render(report(), ceiling)
    assert "/ bound" not in plain and "bound:" not in plain
    assert all(len(line) <= 120 for line in fit(plain).splitlines())
    text = bench.render(report(measured_bound()), ceiling)
    lines = fit(text).splitlines()
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)
    assert lines[-3].startswith("bound: ") and lines[-1].startswith("bound's shape: ")
    hdr = next(line for line in lines if line.startswith("loader"))
    assert hdr.endswith("/ bound") and ("/ ceiling" in hdr) == bool(ceiling)
    row = next(line for line in lines if line.startswith("ccbridge prewarmed"))
    assert row.split()[-1] == f"{48.39 / 51.56:.3f}"
    cold = next(line for line in lines if line.startswith("ccbridge cold"))
    assert cold.split()[-1] == "-" and len(cold) == len(row)
    assert "bound: 51.56 GB/s (best of 3; median 50.09): reads and copies at once, nothing coupling them" in lines
    assert "bound's medians: reads 56.45 and copies 50.18 GB/s at once; alone 64.37 / 53.25" in lines
    assert "bound's shape: 14 readers; 14 streams on the primary context, one thread issuing; 4 MiB pinned chunks" \
        in lines
    assert not any("warning" in line for line in lines)
    wide = bench.render(report(measured_bound(big=True), gbps=999.99), ceiling).splitlines()
    assert all(len(line) <= 120 for line in wide if not line.startswith("pool:")), max(wide, key=len)
    ctx = {**measured_bound(), "contexts": 8, "streams": 16, "readers": 16, "issuers": 16}
    assert "16 streams over 8 contexts of their own, a thread each" in bench.render(report(ctx), ceiling)


def test_a_loader_above_its_bound_gets_one_warning_line():
    lines = fit(bench.render(report(measured_bound(both=47.0, best=48.0), gbps=48.39))).splitlines()
    row = next(line for line in lines if line.startswith("ccbridge prewarmed"))
    assert row.split()[-1] == f"{48.39 / 48.0:.3f}"
    warned = [line for line in lines if "understates" in line]
    assert warned == [f"warning: ccbridge prewarmed moved {48.39 / 48.0:.3f} of the bound: it understates this "
                      "host (repeat noise; its readers never wait)"]
    assert max(map(len, lines)) <= 120
    at = bench.render(report(measured_bound(best=48.39), gbps=48.39))  # at the bound: no warning
    assert "understates" not in at


def test_the_bound_is_the_best_repeat_and_the_median_is_kept(files, fakes, monkeypatch):
    got = bound.measure(files, bound.shape_of(config()), repeat=3)
    for k in bound.ROWS:
        assert got["best"][k] == max(got["samples"][k]) >= got["gbps"][k] == statistics.median(got["samples"][k])
    assert bound.render_lines(got)[0].startswith(f"bound: {max(got['samples']['both_at_once']):.2f} GB/s (best of 3; ")


def test_the_bench_refuses_a_bound_it_cannot_measure_before_any_load(files, monkeypatch):
    pytest.importorskip("torch")
    from ccbridge.load import loader

    monkeypatch.setattr(loader, "load_safetensors", lambda *a, **k: pytest.fail("a load ran"))
    with pytest.raises(UsageError, match="a load into host memory has none"):
        bench.run(files, "cpu", 1, log=lambda m: None, with_bound=True)


def test_the_bench_measures_the_bound_after_its_loaders(files, fakes, monkeypatch):
    """On the CPU (the loaders to host memory) with the bound's shape for a device and its copies faked: the
    bound runs once the loaders are done, on the same files, and the report carries it."""
    pytest.importorskip("torch")
    from ccbridge.load import loader

    order = []
    real_load = loader.load_safetensors
    monkeypatch.setattr(loader, "load_safetensors", lambda *a, **k: order.append("load") or real_load(*a, **k))
    real_measure = bound.measure
    monkeypatch.setattr(bound, "measure",
                        lambda f, *a, **k: order.append(("bound", tuple(f))) or real_measure(f, *a, **k))
    real_shape = bound.shape_of
    monkeypatch.setattr(bound, "shape_of", lambda c: real_shape(PoolConfig(0, *list(vars(c).values())[1:])))
    logged, early = [], []
    rep = bench.run(files, "cpu", 1, log=logged.append, with_bound=True,
                    before_bound=lambda r: early.append(json.loads(json.dumps(r))) or order.append("saved"))
    assert order[-1] == ("bound", tuple(files)) and "load" in order and ("bound", tuple(files)) not in order[:-1]
    assert order[-2] == "saved" and early[0]["loaders"] == json.loads(json.dumps(rep["loaders"]))
    assert early[0]["bound"]["error"] == "the run stopped before the bound finished"
    b = rep["bound"]
    assert "error" not in b and all(v > 0 for v in b["gbps"].values()) and b["bytes"] == total(files)
    assert any(m.startswith("bound 1/1: reads alone") for m in logged)
    assert "/ bound" in bench.render(rep)
    for got, name in ((early[0], "early.json"), (rep, "r.json")):  # as the CLI writes each: a Result of kind load
        path = Path(files[0]).parent / name
        benchresult.to_result({**got, "emulation": None, "ceiling_gbps": None}, env.stamp(with_torch=False)).save(path)
        back = benchresult.report_of(results.load(path))
        assert bench.render(back) == bench.render({**got, "emulation": None, "ceiling_gbps": None})


@pytest.mark.parametrize("exc, status", [(KeyboardInterrupt(), 130), (RuntimeError("a bug in the bound"), None)])
def test_the_cli_keeps_the_loaders_results_when_the_bound_does_not_finish(files, tmp_path, monkeypatch, capsys,
                                                                           exc, status):
    """--json is written with the loaders' results before the bound runs: a ^C or an unexpected error in the
    bound leaves them on disk, the bound marked not measured."""
    pytest.importorskip("torch")
    from ccbridge.cli import main

    def run(paths, device, repeat, overrides, log, with_bound, before_bound):
        rep = report(bound={**measured_bound(), "error": "the run stopped before the bound finished"})
        before_bound(rep)
        raise exc

    monkeypatch.setattr(bench, "run", run)
    out = tmp_path / "r.json"
    argv = ["load", files[0], "--bench", "--bound", "--json", str(out)]
    if status is None:
        with pytest.raises(RuntimeError, match="a bug in the bound"):
            main(argv)
    else:
        assert main(argv) == status
    res = results.load(out)  # a Result of kind load, as every bench writes
    assert res.kind == "load" and "ccbridge" in res.env and "emulation" in res.settings
    rep = benchresult.report_of(res)
    assert rep["loaders"]["ccbridge prewarmed"]["gbps"] == 48.39 and "ceiling_gbps" in rep
    assert rep["bound"]["error"] == "the run stopped before the bound finished"
    err = capsys.readouterr().err
    assert f"the loaders' results written to {out} before the bound runs" in " ".join(err.split())
    assert all(len(line) <= 120 for line in err.splitlines())


def summary_rows(tmp_path, b) -> list[str]:
    """scripts/device_summary.py's rows for a load-native.json holding bound b."""
    rep = {**report(bound=b), "emulation": None, "ceiling_gbps": 55.09}
    benchresult.to_result(rep, env.stamp(with_torch=False)).save(tmp_path / "load-native.json")
    script = Path(__file__).resolve().parent.parent / "scripts" / "device_summary.py"
    code = runpy.run_path(str(script))
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code["main"](tmp_path)
    return [line for line in buf.getvalue().splitlines() if "uncoupled bound" in line]


def test_device_summary_prints_the_best_bound_or_why_it_is_missing(tmp_path):
    assert summary_rows(tmp_path, measured_bound()) == [
        f"| load: uncoupled bound | 51.56 GB/s (best of 3); ccbridge prewarmed / bound {48.39 / 51.56:.3f} |"]
    failed = {**measured_bound(), "error": "GpuError: cuMemHostAlloc: CUDA_ERROR_OUT_OF_MEMORY"}
    assert summary_rows(tmp_path, failed) == [
        "| load: uncoupled bound | not measured: GpuError: cuMemHostAlloc: CUDA_ERROR_OUT_OF_MEMORY |"]


def test_the_cli_writes_one_document_to_a_stream_the_final_one(files, tmp_path, monkeypatch):
    """--json a pipe (or /dev/stdout) took the early save before the bound and then the final one: two JSON
    documents one after the other, which no script parses. A stream gets the final one only."""
    pytest.importorskip("torch")
    from ccbridge.cli import main

    def run(paths, device, repeat, overrides, log, with_bound, before_bound):
        before_bound(report(bound={**measured_bound(), "error": "the run stopped before the bound finished"}))
        return report(bound=measured_bound())

    monkeypatch.setattr(bench, "run", run)
    r, w = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.append(os.fdopen(r, "rb").read()))
    reader.start()
    try:
        assert main(["load", files[0], "--bench", "--bound", "--json", f"/dev/fd/{w}"]) == 0
    finally:
        os.close(w)
        reader.join(60)
    rep = benchresult.report_of(results.from_doc("pipe", json.loads(got[0])))  # one document
    assert "error" not in rep["bound"] and rep["bound"]["best"]["both_at_once"] == 51.56
