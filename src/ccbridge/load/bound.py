"""The loader's uncoupled bound: its reads and its copies, alone and then at once, with nothing tying one to the other.

The loader reads every byte of the checkpoint from the page cache into staging and copies the staging to the
GPU; both share the host's memory (the page cache is read from DRAM while the DMA reads staging). Here the same
work runs in the pool's shape without the loader's coupling (no reader waits for a copy, no copy for a read):

  reads   as many threads as the pool has workers pread the files in chunk pieces, claimed in order, each into
          `buffers` buffers of its own (the pool's staging per worker), made and faulted in once before any
          pass as the pool's staging is at its prewarm; a pass's clock starts once every reader is running
  copies  chunk-sized host buffers copied to the GPU in the pool's shape: contexts 0 and pinned staging, one
          Session on the primary context and one thread issuing over a stream per worker (the pool's submitter);
          otherwise a thread per worker issuing its own copies on its own stream (pageable staging on the
          primary context: one Session; contexts k: k Sessions of their own contexts, worker i on context
          i % k, as the pool spreads them). Whole chunks, at least the checkpoint's bytes in all (each worker
          copies as many): `copy_bytes`, a little over the checkpoint's; each copy figure is the copies' own
          bytes over their span, and both at once scales their span to the checkpoint's bytes before taking
          its union with the reads'

The slower of the two when run at once is the loader's reference on this host: a loader does both jobs no faster
than they go with no waits between them, but for one thing: the bound's readers never wait, so they read faster
than a loader needs and take more of the memory from the DMA (run 7 of bench/RESULTS.md 2026-11-27 session 20:
the loader at 1.030 of it once). An upper bound is the best the host did: the bound is the best repeat of both
at once (`best`), its median beside it (`gbps`, as every figure's).

Not reproduced:
  - the footprint: the loader's DMA reads the staging its pread has just written (still in the caches), while
    the bound's copies read each Session's own per-stream buffers and its readers write buffers never copied;
    both stay within a large LLC (the measured host's 300 MiB of L3), so the difference is small there
  - the readers: Python threads calling os.preadv (a 4 MiB call releases the GIL for ~0.7 ms), where the
    pool's workers are native threads
  - per-call costs: on the primary context the loader issues one copy per tensor segment, the bound one per
    chunk; and under contexts k the pool moves each chunk from its context's device buffer to the tensors
    device-locally (no bridge crossing), which the bound leaves out

Mapped staging (copies straight from the page-cache mapping) has no read pass to set beside its copies, and a
Session has no mapping to copy from: the bound refuses it rather than time another loader's work.
"""

from __future__ import annotations

import itertools
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ccbridge.bindings import core
from ccbridge.errors import CCBridgeError, LoadError, UsageError
from ccbridge.load.engine import PoolConfig
from ccbridge.ui import human_bytes

ROWS = ("reads_alone", "copies_alone", "reads_at_once", "copies_at_once", "both_at_once")
EVIDENCE = ("reads_span_ns", "copies_span_ns", "copy_bytes", "overlap")  # per repeat, of the run at once
MIN_OVERLAP = 0.9  # of the shorter span: under it, a repeat's two jobs did not run at once
PAGE = 4096  # the smallest page: a write to each touches every page of a buffer
# shape_of's refusal, and the load command's (before it imports torch): one wording for both
HOST_NO_BOUND = "--bound times copies to a GPU: a load into host memory has none; give a CUDA --device"
WARM_COPIES = 64  # untimed copies first: the streams' and the DMA's first-use costs stay out of the figures


@dataclass(frozen=True)
class Shape:
    """The bound's work, from the pool's plan (or the bench script's overrides)."""
    device: int
    readers: int
    buffers: int  # read buffers per reader
    streams: int  # one per copying worker
    contexts: int  # 0: the primary context
    chunk: int
    mem: str  # the copies' host memory: pinned or pageable (core.MEMS)

    @property
    def one_issuer(self) -> bool:
        """One thread issues every copy, as the pool's submitter does (contexts 0, pinned staging)."""
        return self.contexts == 0 and self.mem == "pinned"

    def describe(self) -> dict:
        return {"readers": self.readers, "buffers": self.buffers, "streams": self.streams,
                "contexts": self.contexts, "issuers": 1 if self.one_issuer else self.streams,
                "chunk_bytes": self.chunk, "staging": self.mem}


def shape_of(config: PoolConfig, readers: int | None = None, streams: int | None = None,
             chunk: int | None = None) -> Shape:
    """The pool's work as the bound runs it; UsageError where the bound has no equivalent of the plan."""
    if config.device < 0:
        raise UsageError(HOST_NO_BOUND)
    if config.staging not in core.MEMS:
        raise UsageError(f"--bound: {config.staging} staging has no read pass to time beside its copies; "
                         "give --staging pinned or pageable")
    readers = config.workers if readers is None else readers
    streams = config.workers if streams is None else streams
    for name, n in (("readers", readers), ("streams", streams)):
        if not 1 <= n <= core.MAX_STREAMS:  # run_workers' native threads and a Session's streams stop there
            raise UsageError(f"bound {name}: expected 1..{core.MAX_STREAMS}, got {n}")
    if streams < config.contexts:  # each of the pool's contexts has a worker at least
        raise UsageError(f"bound streams: {streams} is fewer than the plan's {config.contexts} contexts")
    chunk = config.chunk_bytes if chunk is None else chunk
    if chunk < 4096:
        raise UsageError(f"bound chunk: expected at least 4096 bytes, got {chunk}")
    return Shape(config.device, readers, config.buffers, streams, config.contexts, chunk, config.staging)


class Span(NamedTuple):
    start_ns: float
    end_ns: float
    bytes: float

    @property
    def gbps(self) -> float:
        return self.bytes / max(self.end_ns - self.start_ns, 1.0)  # bytes per ns: GB/s


def chunks(files: list[str], chunk: int) -> list[tuple[str, int, int]]:
    """(file, offset, length) of every chunk, in file order, as the pool's grid cuts them."""
    out = []
    for path in files:
        size = os.path.getsize(path)
        out += [(path, o, min(chunk, size - o)) for o in range(0, size, chunk)]
    return out


def _read_chunk(fd: int, buf: bytearray, off: int, n: int) -> int:
    view, got = memoryview(buf)[:n], 0
    while got < n:
        r = os.preadv(fd, [view[got:]], off + got)
        if r == 0:  # the file is shorter than when the chunks were listed
            return got
        got += r
    return got


def buffers(shape: Shape) -> list[list[bytearray]]:
    """Every reader's `buffers` chunk buffers, made and touched once before any pass (the loader's staging is
    faulted in at its prewarm, not while it loads)."""
    def touched() -> bytearray:
        b = bytearray(shape.chunk)
        b[::PAGE] = b"\1" * len(range(0, shape.chunk, PAGE))  # a write to every page: each one faulted in now
        return b

    return [[touched() for _ in range(shape.buffers)] for _ in range(shape.readers)]


class _Worker(threading.Thread):
    """A thread whose end is waited for through an Event: a Thread.join that a ^C interrupts marks a thread
    still running as stopped (CPython 3.11's _wait_for_tstate_lock), while an interrupted Event.wait leaves
    the Event as it was, to be waited for again."""

    def __init__(self, target, name: str, args: tuple = ()):
        super().__init__(target=target, name=name, args=args)
        self.ended = threading.Event()

    def run(self):
        try:
            super().run()
        finally:
            self.ended.set()


def _join(threads: list[_Worker]) -> None:
    """Every (started) thread waited for to its end; a KeyboardInterrupt meanwhile is held until then, then
    raised. A reader ends at its next chunk, a copy once its native call returns."""
    held = None
    for t in threads:
        while True:
            try:
                t.ended.wait()
                t.join()  # the thread's last steps after its run
                break
            except KeyboardInterrupt as e:
                held = e
    if held is not None:
        raise held


def _failed(e: BaseException) -> BaseException:
    """What a reader's exception is raised as on the timing thread: KeyboardInterrupt as is, else a LoadError."""
    if isinstance(e, KeyboardInterrupt):
        return e
    return LoadError(f"the bound's reads failed: {type(e).__name__}: {e}")


def read_pass(work: list[tuple[str, int, int]], fds: dict[str, int], bufs: list[list[bytearray]],
              gate: threading.Barrier | None = None, go: threading.Event | None = None) -> Span:
    """A thread per entry of `bufs` preads every chunk once (claimed in order) into its own buffers. The clock
    starts once every reader is running: `gate` holds the readers and this thread (and any party the caller
    adds, released with them), and past it they wait for `go` where one is given (the copies at once set it as
    they start, so that no reader takes the GIL from them first). Whatever ends the pass early (a reader's
    error, an interrupt here), the readers stop at their next chunk and are joined before it returns: the
    caller may close `fds` then."""
    gate = gate or threading.Barrier(len(bufs) + 1)
    if go is None:  # nothing to wait for past the gate
        go = threading.Event()
        go.set()
    stop = threading.Event()
    claim = itertools.count()  # next() on it is atomic under the GIL: each chunk is claimed once
    done: list[int] = []
    failed: list[BaseException] = []

    def run(mine: list[bytearray]):
        k = total = 0
        try:
            gate.wait()
            go.wait()
            while not stop.is_set() and (i := next(claim)) < len(work):
                path, off, n = work[i]
                total += _read_chunk(fds[path], mine[k], off, n)
                k = (k + 1) % len(mine)
        except threading.BrokenBarrierError:  # the pass was called off before it started
            return
        except BaseException as e:  # OSError, MemoryError, ...: raised on the timing thread, the others stopped
            failed.append(e)
            stop.set()
        done.append(total)  # list.append is atomic: no lock needed

    ts = [_Worker(run, f"ccbridge-bound-read-{i}", (b,)) for i, b in enumerate(bufs)]
    started: list[_Worker] = []
    ok = False
    try:
        for t in ts:
            t.start()
            started.append(t)
        gate.wait()
        go.wait()
        t0 = time.monotonic_ns()  # CLOCK_MONOTONIC, the native core's clock: spans compare with the copies'
        for t in ts:
            t.join()
        t1 = time.monotonic_ns()
        ok = True
    finally:
        if not ok:
            stop.set()
            gate.abort()  # whoever still waits at the gate is let go, and past it
            go.set()
        _join(started)
    if failed:
        raise _failed(failed[0])
    want = sum(w[2] for w in work)
    if sum(done) != want:
        raise LoadError(f"the bound read {sum(done)} of {want} bytes: a checkpoint file changed while it ran")
    return Span(t0, t1, sum(done))


class Copies:
    """The pool's copies in its shape, on Sessions opened once (their contexts' making is not timed)."""

    def __init__(self, shape: Shape):
        self.shape = shape
        self.sessions: list[core.Session] = []
        self.thread: _Worker | None = None  # the thread copying at once with the reads
        try:
            if shape.contexts == 0:
                self.sessions.append(core.Session(shape.device, shape.mem, shape.chunk, nstreams=shape.streams))
            for c in range(shape.contexts):
                n = len(range(c, shape.streams, shape.contexts))  # workers c, c + k, ...: the pool's spread
                self.sessions.append(core.Session(shape.device, shape.mem, shape.chunk, nstreams=n,
                                                  own_context=True))
        except BaseException:
            self.close()
            raise
        k = max(shape.contexts, 1)
        # worker i: session i % k, its stream i // k (on the primary context, k = 1: stream i of the one session)
        self.worker_sessions = [self.sessions[i % k] for i in range(shape.streams)]
        self.worker_streams = [i // k for i in range(shape.streams)]

    def run(self, nbytes: int) -> Span:
        """Whole chunks, at least nbytes of them in all (in the pool's shape with a thread per worker, each worker
        copies as many): their span and bytes."""
        s = self.shape
        n = -(-nbytes // s.chunk)  # ceil: the copies move no fewer bytes than the reads
        if s.one_issuer:
            out, _ = self.sessions[0].copy("h2d", s.chunk, n, nstreams=s.streams)
            outs = [out]
        else:  # warmup 0: the timed call is what a read pass at once overlaps
            outs = core.run_workers(self.worker_sessions, "h2d", s.chunk, -(-n // s.streams), warmup=0,
                                    streams=self.worker_streams)
        return Span(min(o.start_ns for o in outs), max(o.end_ns for o in outs), sum(o.bytes for o in outs))

    def close(self) -> None:
        """The Sessions closed, never under a copy still in flight (its thread is waited for first)."""
        if self.thread is not None:
            _join([self.thread])
            self.thread = None
        for s in self.sessions:
            s.close()
        self.sessions = []


def _at_once(work, fds, bufs, copies: Copies, nbytes: int) -> tuple[Span, Span]:
    """Both jobs released together (the copy thread waits at the readers' gate), nothing coupling them after:
    the reads' span and the copies'."""
    gate = threading.Barrier(len(bufs) + 2)  # the readers, the timing thread and the copy thread
    go = threading.Event()  # set by the copy thread as it starts: it holds the GIL into the native call
    got: dict = {}

    def copy():
        try:
            gate.wait()
            go.set()
            got["copies"] = copies.run(nbytes)
        except threading.BrokenBarrierError:  # the reads were called off before they started: theirs is the error
            pass
        except BaseException as e:  # re-raised on the caller's thread
            got["error"] = e
        finally:
            go.set()  # no reader waits on a copy thread that is gone

    t = copies.thread = _Worker(copy, "ccbridge-bound-copies")
    t.start()
    try:
        reads = read_pass(work, fds, bufs, gate, go)
    finally:
        _join([t])  # an interrupt waits for the copies' native call: the Sessions are not closed under it
    if "error" in got:
        raise got["error"]
    return reads, got["copies"]


def both_span(reads: Span, copies: Span, nbytes: int) -> Span:
    """The checkpoint's bytes over the union of the reads' span and the copies' scaled to those bytes (the copies
    move whole chunks, a little more than the reads: their span ends where nbytes of them would have)."""
    end = copies.start_ns + (copies.end_ns - copies.start_ns) * nbytes / copies.bytes
    return Span(min(reads.start_ns, copies.start_ns), max(reads.end_ns, end), nbytes)


def evidence(reads: Span, copies: Span) -> dict:
    """That the run at once ran at once: its reads' and copies' spans (ns from the earlier start), the copies'
    bytes, and the spans' overlap over the shorter one (1.0: the shorter ran wholly inside the longer)."""
    t0 = min(reads.start_ns, copies.start_ns)
    overlap = max(0.0, min(reads.end_ns, copies.end_ns) - max(reads.start_ns, copies.start_ns))
    shorter = max(min(reads.end_ns - reads.start_ns, copies.end_ns - copies.start_ns), 1.0)
    return {"reads_span_ns": [round(reads.start_ns - t0), round(reads.end_ns - t0)],
            "copies_span_ns": [round(copies.start_ns - t0), round(copies.end_ns - t0)],
            "copy_bytes": int(copies.bytes), "overlap": overlap / shorter}


def _repeat_once(work, fds, bufs, copies: Copies, nbytes: int) -> dict:
    """One repeat's GB/s (each job's own bytes over its own span): reads alone, copies alone, then both at once;
    and the run at once's evidence."""
    alone = read_pass(work, fds, bufs).gbps
    copies_alone = copies.run(nbytes).gbps
    reads, span = _at_once(work, fds, bufs, copies, nbytes)
    return {"reads_alone": alone, "copies_alone": copies_alone, "reads_at_once": reads.gbps,
            "copies_at_once": span.gbps, "both_at_once": both_span(reads, span, nbytes).gbps,
            **evidence(reads, span)}


def overlap_warning(overlaps: list[float]) -> str | None:
    """A line where a repeat's jobs at once overlapped under MIN_OVERLAP of the shorter span, else None."""
    low = [f for f in overlaps if f < MIN_OVERLAP]
    if not low:
        return None
    return (f"{len(low)} of {len(overlaps)} repeats overlapped under {MIN_OVERLAP} (lowest {min(low):.2f}): "
            "their reads and copies did not all run at once")


def figures_line(figures: dict[str, float]) -> str:
    """'reads alone 64.37, ..., both at once 50.09 GB/s' (bench/RESULTS.md's words for the figures)."""
    return ", ".join(f"{k.replace('_', ' ')} {figures[k]:.2f}" for k in ROWS) + " GB/s"


def measure(files: list[str], shape: Shape, repeat: int, log: Callable[[str], None] | None = None,
            each: Callable[[int, dict[str, float]], None] | None = None) -> dict:
    """The bound over `files`, `repeat` times: the shape's inputs, GB/s medians (`gbps`), each figure's best
    repeat (`best`: best["both_at_once"] is the bound, an upper bound being the best the host did), per repeat
    (`samples`: the figures and the run at once's evidence, EVIDENCE), and `overlap_warning` (None, or a line
    where a repeat's two jobs at once overlapped under MIN_OVERLAP of the shorter span, also logged).
    each(r, figures) is called after every repeat; log gets progress. GpuError or LoadError where a copy or a
    read fails."""
    if repeat < 1:
        raise UsageError(f"bound repeat: expected at least 1, got {repeat}")
    work = chunks(files, shape.chunk)
    nbytes = sum(w[2] for w in work)
    if not nbytes:
        raise UsageError("the bound needs bytes to move: the checkpoint's files are empty")
    say = log or (lambda m: None)
    samples: dict[str, list] = {k: [] for k in ROWS + EVIDENCE}
    fds: dict[str, int] = {}
    copies = None
    try:
        for p in dict.fromkeys(w[0] for w in work):
            fds[p] = os.open(p, os.O_RDONLY)
        say(shape_line(shape.describe()))
        bufs = buffers(shape)
        copies = Copies(shape)
        read_pass(work, fds, bufs)  # the page cache warm, as the loader found it
        copies.run(WARM_COPIES * shape.chunk)
        for r in range(repeat):
            got = _repeat_once(work, fds, bufs, copies, nbytes)
            for k in samples:
                samples[k].append(got[k])
            if each:
                each(r, got)
    except OSError as e:
        raise LoadError(f"the bound cannot read the checkpoint: {e}") from None
    finally:  # every reader has been joined (read_pass returns or raises only then): the fds can close
        try:
            if copies is not None:
                copies.close()
        finally:
            for fd in fds.values():
                os.close(fd)
    warning = overlap_warning(samples["overlap"])
    if warning:
        say(f"bound: warning: {warning}")
    return {**shape.describe(), "bytes": nbytes, "copy_bytes": samples["copy_bytes"][0], "chunks": len(work),
            "repeat": repeat, "gbps": {k: statistics.median(samples[k]) for k in ROWS},
            "best": {k: max(samples[k]) for k in ROWS}, "samples": samples, "overlap_warning": warning}


def measured(files: list[str], shape: Shape, repeat: int, log: Callable[[str], None]) -> dict:
    """measure() for the load bench, whose loaders have already run: a failure is reported, not fatal."""
    try:
        return measure(files, shape, repeat, log,
                       each=lambda r, f: log(f"bound {r + 1}/{repeat}: {figures_line(f)}"))
    except CCBridgeError as e:
        log(f"bound not measured: {e}")
        return {**shape.describe(), "error": f"{type(e).__name__}: {e}"}


def shape_line(b: dict) -> str:
    """The bound's shape in words, from its inputs (Shape.describe)."""
    where = f"over {b['contexts']} contexts of their own" if b["contexts"] else "on the primary context"
    who = "one thread issuing" if b["issuers"] == 1 else "a thread each"
    return (f"bound's shape: {b['readers']} readers; {b['streams']} streams {where}, {who}; "
            f"{human_bytes(b['chunk_bytes'])} {b['staging']} chunks")


def render_lines(bound: dict) -> list[str]:
    """The bound's lines of the load bench's report: the bound (the best repeat of both at once) beside its
    median, the other figures' medians, the shape (each line within 120 columns for figures under 1000 GB/s)."""
    shape = shape_line(bound)
    if bound.get("error"):
        return [f"bound: not measured ({bound['error']})", shape]
    g, best = bound["gbps"], bound["best"]
    lines = [f"bound: {best['both_at_once']:.2f} GB/s (best of {bound['repeat']}; median {g['both_at_once']:.2f}): "
             "reads and copies at once, nothing coupling them",
             f"bound's medians: reads {g['reads_at_once']:.2f} and copies {g['copies_at_once']:.2f} GB/s at once; "
             f"alone {g['reads_alone']:.2f} / {g['copies_alone']:.2f}", shape]
    if bound.get("overlap_warning"):
        lines.append(f"bound: warning: {bound['overlap_warning']}")
    return lines
