"""One GPU timer for every GPU-time measurement ccbridge makes, with two backends.

Under CC, CUDA event timing is unreliable (TensorRT PR #4740 saw negative latencies on B200 in TDX); TensorRT-LLM
(PR #11657) and FlashInfer (PR #3870) time there with a one-thread kernel that writes the GPU's %globaltimer,
and check it against events within 5% with CC off. So here: `events` (CUDA events, elapsed_time) or
`globaltimer` (the stamp kernel of native/common/spin_ptx.h, queued on the measured stream, writing its ns to
device memory; read back after the work). The choice: --timer on probe, calibrate and the benches, else the
CCBRIDGE_TIMER environment variable, else auto: globaltimer where the machine's stamp reads CC on, events
elsewhere. A stamp is itself a kernel: its own cost (the time between two back-to-back stamps, measured once per
device) is its resolution, and is not taken off an interval: a pair of stamps around queued work pays the same
dispatch as a pair of events does (4x H200, 2026-11-26, both timers in alternation: with the cost taken off,
%globaltimer read 0.1-11.5% under events on a matmul, a 256 MiB copy, 100 small kernels and a 50-kernel graph
replay; the same rounds with the cost added back, within 2.2% natively and under b300 but one matmul's 5.5% there).
semantics.cc_answers, whose events bracket its two stamps, takes one stamp's cost off the events' side. Each
result says which timer made its GPU-time rows (settings["timer"]); compare says when it sets rows of two timers
side by side.
"""

from __future__ import annotations

import os
from functools import lru_cache

from ccbridge.bindings import core
from ccbridge.errors import UsageError

BACKENDS = ("events", "globaltimer")
CHOICES = ("auto",) + BACKENDS
ENV_VAR = "CCBRIDGE_TIMER"


def in_turn(round_: int) -> tuple[str, ...]:
    """Both backends in the order round `round_` times them when they are compared: events first in even rounds,
    %globaltimer first in odd ones, so that a difference the order makes (the first timer's warm-up, a cache) is
    not read as the timers parting."""
    return BACKENDS if round_ % 2 == 0 else BACKENDS[::-1]


def choose(asked: str | None = None, cc_mode: str | None = None) -> str:
    """The backend: asked (auto, events, globaltimer), else $CCBRIDGE_TIMER, else auto; auto: globaltimer where
    cc_mode (the stamp's, env.cc_mode) is on."""
    want = asked or os.environ.get(ENV_VAR) or "auto"
    if want not in CHOICES:
        where = "--timer" if asked else ENV_VAR
        raise UsageError(f"{where} {want[:20]!r}: expected one of {', '.join(CHOICES)}")
    if want != "auto":
        return want
    return "globaltimer" if (cc_mode if cc_mode is not None else _machine_cc()) == "on" else "events"


@lru_cache(maxsize=None)
def _machine_cc() -> str:
    """This machine's CC mode from NVML, asked once per process."""
    from ccbridge import env  # deferred: the stamp reads NVML, which choose() with an answer never needs

    return env.cc_mode({"nvml": env.nvml_info()})


class _Stamps:
    """Device memory for 2 x n stamps and their read-back (torch on the stream's device)."""

    def __init__(self, torch, n: int):
        self.torch = torch
        self.buf = torch.zeros(2 * n, dtype=torch.int64, device="cuda")
        self.base = self.buf.data_ptr()

    def at(self, stream, slot: int) -> None:
        core.stamp(stream.cuda_stream, self.base + 8 * slot)

    def intervals_ns(self, n: int) -> list[float]:
        t = self.buf.cpu().tolist()
        return [float(t[2 * i + 1] - t[2 * i]) for i in range(n)]


@lru_cache(maxsize=None)
def stamp_cost_ns(torch, device: int) -> float:
    """The time between two back-to-back stamps on an idle stream (median of 31): one stamp's own GPU time, the
    globaltimer backend's resolution (an interval nested inside events pays it; one bracketed by stamps does not
    pay it more than events do)."""
    st = _Stamps(torch, 31)
    s = torch.cuda.current_stream(device)
    for i in range(31):
        st.at(s, 2 * i)
        st.at(s, 2 * i + 1)
    s.synchronize()
    return sorted(st.intervals_ns(31))[15]


def graphed(torch, fn):
    """fn captured in a CUDA graph, after one warm-up call on a side stream (lazy set-ups, a JIT's first compile,
    stay out of the capture): (the graph, what fn returned in it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def time_ms(torch, fn, reps: int, inner: int = 1, backend: str | None = None, before=None) -> list[float]:
    """Per-call GPU time (ms) of fn on the current stream, `inner` calls per sample, reps samples, by the backend
    (None: choose()). before(): queued ahead of each sample's start mark, not timed (the peer family's ranks
    meet in one small collective there, so no rank's sample holds the others' late start)."""
    backend = backend or choose()
    if backend == "events":
        samples = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if before is not None:
                before()
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / inner)
        return samples
    s = torch.cuda.current_stream()
    st = _Stamps(torch, reps)
    for i in range(reps):
        if before is not None:
            before()
        st.at(s, 2 * i)
        for _ in range(inner):
            fn()
        st.at(s, 2 * i + 1)
        s.synchronize()
    return [ns / 1e6 / inner for ns in st.intervals_ns(reps)]


def device_copy_gbps(torch, dev, reps: int, inner: int = 1, nbytes: int = 1 << 30, generator=None) -> list[float]:
    """This GPU's device-to-device copy rate (GB/s per sample), read plus write: every byte crosses device memory
    twice, so it is the HBM roofline's rate. The copy is checked byte-exact first."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=dev, generator=generator)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if not torch.equal(dst, src):
        raise RuntimeError("device copy is not byte-exact")
    return [2 * nbytes / (ms * 1e-3) / 1e9 for ms in time_ms(torch, lambda: dst.copy_(src), reps, inner)]


class Intervals:
    """Many GPU intervals on one stream, read at the end (decode's GPU busy: a mark before and after each step):
    begin()/end() queue a mark; total_ms() reads them all back."""

    def __init__(self, torch, stream, capacity: int, backend: str | None = None):
        self.torch, self.stream, self.backend = torch, stream, backend or choose()
        self.n, self.events = 0, []
        self.stamps = _Stamps(torch, capacity) if self.backend == "globaltimer" else None
        self.capacity = capacity

    def begin(self) -> None:
        self._mark(0)

    def end(self) -> None:
        self._mark(1)
        self.n += 1

    def _mark(self, half: int) -> None:
        if self.stamps is not None:
            if self.n < self.capacity:
                self.stamps.at(self.stream, 2 * self.n + half)
            return
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(self.stream)
        self.events.append(e)

    def total_ms(self) -> float:
        if self.stamps is None:
            return sum(a.elapsed_time(b) for a, b in zip(self.events[::2], self.events[1::2]))
        n = min(self.n, self.capacity)
        return sum(self.stamps.intervals_ns(n)) / 1e6
