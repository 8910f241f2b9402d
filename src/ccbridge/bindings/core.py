"""The probe core (native/core/core.h) through ctypes: the timing loops that Python overhead would distort.

ccbridge._native is a plain C library (the probe core, the loader pool and the GPU AES-GCM host side); it
loads libcuda itself, so importing this module never touches the GPU. Failures raise GpuError with the
driver call and error name that the core recorded (ccb_error: the error slot the whole library shares).
"""

from __future__ import annotations

import ctypes
import importlib.util
from ctypes import POINTER, c_char_p, c_double, c_int, c_size_t, c_ulonglong, c_void_p
from functools import lru_cache

from ccbridge.bindings import declare
from ccbridge.errors import GpuError

HEADER = "core/core.h"
DRIVER_SONAME = "libcuda.so.1"  # the CUDA driver native/common/cudrv.c dlopens

H2D, D2H, D2D = 0, 1, 2
PINNED, PAGEABLE = 0, 1
SAME_STREAM, IDLE_STREAM, EVENT_WAIT = 0, 1, 2
LAUNCH_PIPELINED, LAUNCH_WAIT, LAUNCH_GRAPH = 0, 1, 2
MAX_STREAMS = 64
TIMER_EVENTS, TIMER_GLOBALTIMER = 0, 1
TIMERS = {"events": TIMER_EVENTS, "globaltimer": TIMER_GLOBALTIMER}
CONSTANTS = {"CCB_TIMER_EVENTS": TIMER_EVENTS, "CCB_TIMER_GLOBALTIMER": TIMER_GLOBALTIMER,"CCB_H2D": H2D, "CCB_D2H": D2H, "CCB_D2D": D2D, "CCB_PINNED": PINNED, "CCB_PAGEABLE": PAGEABLE,
             "CCB_SAME_STREAM": SAME_STREAM, "CCB_IDLE_STREAM": IDLE_STREAM, "CCB_EVENT_WAIT": EVENT_WAIT,
             "CCB_LAUNCH_PIPELINED": LAUNCH_PIPELINED, "CCB_LAUNCH_WAIT": LAUNCH_WAIT,
             "CCB_LAUNCH_GRAPH": LAUNCH_GRAPH, "CCB_MAX_STREAMS": MAX_STREAMS}

DIRS = {"h2d": H2D, "d2h": D2H, "d2d": D2D}
MEMS = {"pinned": PINNED, "pageable": PAGEABLE}


class CopyOut(ctypes.Structure):
    _fields_ = [("start_ns", c_double), ("end_ns", c_double), ("incall_ns", c_double), ("bytes", c_double)]

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class SemOut(ctypes.Structure):
    _fields_ = [("remaining_ns", c_double), ("call_ns", c_double), ("done_ns", c_double)]


STRUCTS = {"ccb_copy_out": CopyOut, "ccb_sem_out": SemOut}
_D = POINTER(c_double)
FUNCTIONS = {
    "ccb_error": (c_char_p, []),
    "ccb_now_ns": (c_double, []),
    "ccb_open": (c_int, []),
    "ccb_device_count": (c_int, [POINTER(c_int)]),
    "ccb_session_open": (c_void_p, [c_int, c_int, c_int, c_size_t, c_int]),
    "ccb_session_close": (None, [c_void_p]),
    "ccb_verify": (c_int, [c_void_p, c_size_t]),
    "ccb_copy": (c_int, [c_void_p, c_int, c_size_t, c_int, c_int, c_int, _D, POINTER(CopyOut)]),
    "ccb_workers": (c_int, [POINTER(c_void_p), POINTER(c_int), c_int, c_int, c_size_t, c_int, c_int, POINTER(CopyOut)]),
    "ccb_launch": (c_int, [c_void_p, c_int, c_int, _D]),
    "ccb_kernel_gap": (c_int, [c_void_p, c_int, c_int, _D]),
    "ccb_stamp": (c_int, [c_void_p, c_ulonglong]),
    "ccb_pinned_answers": (c_int, [c_void_p, POINTER(c_int), POINTER(c_int), POINTER(c_int)]),
    "ccb_semantics": (c_int, [c_void_p, c_int, c_int, c_size_t, c_double, POINTER(SemOut)]),
    "ccb_ctx_lifecycle": (c_int, [c_int, c_int, _D, _D]),
    "ccb_pinned_slots": (c_int, [c_void_p, c_size_t, c_int, _D, _D]),
    "ccb_peer_rate": (c_int, [c_int, c_int, c_size_t, c_int, _D]),
}


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """ccbridge._native with the probe core declared (loader.lib() and gcm.lib() add their parts)."""
    spec = importlib.util.find_spec("ccbridge._native")
    if spec is None or not spec.origin:
        raise GpuError("the native core is not built; reinstall with `pip install .` (needs a C compiler)")
    return declare(ctypes.CDLL(spec.origin), FUNCTIONS)


def error() -> str:
    """This thread's last error of the native core (any of its parts)."""
    return lib().ccb_error().decode(errors="replace")


def _check(rc: int) -> None:
    if rc != 0:
        raise GpuError(error())


def now_ns() -> float:
    return lib().ccb_now_ns()


def device_count() -> int:
    """Devices the driver sees; GpuError when there is no usable driver."""
    _check(lib().ccb_open())
    n = c_int(0)
    _check(lib().ccb_device_count(ctypes.byref(n)))
    return n.value


def peer_rate(src: int, dst: int, nbytes: int, iters: int) -> float:
    """GPU src -> GPU dst copy rate over peer access, bytes per second; GpuError where there is none."""
    _check(lib().ccb_open())
    out = ctypes.c_double(0)
    _check(lib().ccb_peer_rate(src, dst, nbytes, iters, ctypes.byref(out)))
    return out.value


class Session:
    """A context (primary, or one of its own) with streams and per-stream buffers."""

    def __init__(self, device: int, mem: str, max_bytes: int, nstreams: int = 1, own_context: bool = False):
        self.device, self.mem, self.max_bytes, self.nstreams = device, mem, max_bytes, nstreams
        h = lib().ccb_session_open(device, int(own_context), MEMS[mem], max_bytes, nstreams)
        if not h:
            raise GpuError(error())
        self.handle = c_void_p(h)

    def close(self) -> None:
        if self.handle:
            lib().ccb_session_close(self.handle)
            self.handle = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def verify(self, nbytes: int) -> None:
        _check(lib().ccb_verify(self.handle, nbytes))

    def copy(self, direction: str, nbytes: int, iters: int, nstreams: int = 1,
             sync_every: int = 0) -> tuple[CopyOut, list[float]]:
        """iters copies over nstreams streams; with sync_every=k, all streams are
        waited for after every k copies and each wait gives one sample (ns)."""
        groups = iters // sync_every if sync_every else 0
        samples = (c_double * max(groups, 1))()
        out = CopyOut()
        _check(lib().ccb_copy(self.handle, DIRS[direction], nbytes, nstreams, iters, sync_every, samples,
                              ctypes.byref(out)))
        return out, list(samples[:groups])

    def launch(self, mode: int, n: int) -> float:
        ns = c_double()
        _check(lib().ccb_launch(self.handle, mode, n, ctypes.byref(ns)))
        return ns.value

    def kernel_gap(self, reps: int, timer: str = "events") -> float:
        """ns of GPU time one more (empty) kernel adds to a busy stream, median of reps, timed by CUDA events or
        %globaltimer stamps."""
        ns = c_double()
        _check(lib().ccb_kernel_gap(self.handle, reps, TIMERS[timer], ctypes.byref(ns)))
        return ns.value

    def pinned_answers(self) -> tuple[int, bool, bool]:
        """(memory type: 1 host, 2 device; is managed; a device view sees a later host write) of this session's
        pinned memory, asked as a program asks."""
        t, m, v = c_int(), c_int(), c_int()
        _check(lib().ccb_pinned_answers(self.handle, ctypes.byref(t), ctypes.byref(m), ctypes.byref(v)))
        return t.value, bool(m.value), bool(v.value)

    def semantics(self, direction: str, relation: int, nbytes: int, spin_ns: float) -> SemOut:
        out = SemOut()
        _check(lib().ccb_semantics(self.handle, DIRS[direction], relation, nbytes, spin_ns, ctypes.byref(out)))
        return out

    def pinned_slots(self, nbytes: int, count: int) -> tuple[float, float]:
        a, f = c_double(), c_double()
        _check(lib().ccb_pinned_slots(self.handle, nbytes, count, ctypes.byref(a), ctypes.byref(f)))
        return a.value, f.value


def stamp(stream: int, at: int) -> None:
    """Queue a %globaltimer stamp (uint64 ns) at device address `at` on `stream` (a CUstream handle, 0 the legacy
    stream) of the calling thread's current context (a framework's)."""
    _check(lib().ccb_stamp(stream or None, at))


def run_workers(sessions: list[Session], direction: str, nbytes: int, iters: int, warmup: int = 2,
                streams: list[int] | None = None) -> list[CopyOut]:
    """One thread per session, released together; each copies on its own stream: stream 0 of its session, or
    streams[i] of sessions[i] (one session's streams may each have their thread)."""
    n = len(sessions)
    if streams is not None and len(streams) != n:  # (c_int * n) would zero-fill a short list: threads sharing stream 0
        raise ValueError(f"run_workers streams: {n} sessions, {len(streams)} streams")
    handles = (c_void_p * n)(*[s.handle for s in sessions])
    picked = None if streams is None else (c_int * n)(*streams)
    outs = (CopyOut * n)()
    _check(lib().ccb_workers(handles, picked, n, DIRS[direction], nbytes, iters, warmup, outs))
    return list(outs)


def context_lifecycle(device: int, n: int) -> tuple[float, float]:
    """Seconds to create n contexts, then to destroy them."""
    c, d = c_double(), c_double()
    _check(lib().ccb_ctx_lifecycle(device, n, ctypes.byref(c), ctypes.byref(d)))
    return c.value / 1e9, d.value / 1e9


def aggregate_gbps(outs: list[CopyOut]) -> float:
    """Total bytes over the union of the workers' windows (GB/s, 1e9 bytes)."""
    start = min(o.start_ns for o in outs)
    end = max(o.end_ns for o in outs)
    return sum(o.bytes for o in outs) / (end - start)


def driver_missing() -> str | None:
    """Why the CUDA driver cannot be loaded here (None: it can). Loaded only, not initialised: cuInit would cost
    the caller a driver start-up."""
    try:
        ctypes.CDLL(DRIVER_SONAME)
    except OSError:
        return f"cannot load the CUDA driver library {DRIVER_SONAME} (no NVIDIA driver here?)"
    return None
