"""ctypes binding of the native probe core (native/probe.c).

The core is a plain C library; it loads libcuda itself, so importing this
module never touches the GPU. Failures raise GpuError with the driver call
and error name that the core recorded.
"""

from __future__ import annotations

import ctypes
import importlib.util
from ctypes import POINTER, c_char_p, c_double, c_int, c_size_t, c_void_p
from functools import lru_cache

from ccbridge.errors import GpuError  # noqa: F401 - raised here, caught by callers as native.GpuError

H2D, D2H, D2D = 0, 1, 2
PINNED, PAGEABLE = 0, 1
SAME_STREAM, IDLE_STREAM, EVENT_WAIT = 0, 1, 2
LAUNCH_PIPELINED, LAUNCH_WAIT, LAUNCH_GRAPH = 0, 1, 2
MAX_STREAMS = 64

DIRS = {"h2d": H2D, "d2h": D2H, "d2d": D2D}
MEMS = {"pinned": PINNED, "pageable": PAGEABLE}


class CopyOut(ctypes.Structure):
    _fields_ = [("start_ns", c_double), ("end_ns", c_double), ("incall_ns", c_double), ("bytes", c_double)]

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class SemOut(ctypes.Structure):
    _fields_ = [("remaining_ns", c_double), ("call_ns", c_double), ("done_ns", c_double)]


@lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    spec = importlib.util.find_spec("ccbridge._native")
    if spec is None or not spec.origin:
        raise GpuError("the native core is not built; reinstall with `pip install .` (needs a C compiler)")
    so = ctypes.CDLL(spec.origin)
    so.ccb_error.restype = c_char_p
    so.ccb_now_ns.restype = c_double
    so.ccb_open.restype = c_int
    so.ccb_device_count.argtypes = [POINTER(c_int)]
    so.ccb_peer_rate.argtypes = [c_int, c_int, c_size_t, c_int, POINTER(ctypes.c_double)]
    so.ccb_session_open.restype = c_void_p
    so.ccb_session_open.argtypes = [c_int, c_int, c_int, c_size_t, c_int]
    so.ccb_session_close.argtypes = [c_void_p]
    so.ccb_verify.argtypes = [c_void_p, c_size_t]
    so.ccb_copy.argtypes = [c_void_p, c_int, c_size_t, c_int, c_int, c_int, POINTER(c_double), POINTER(CopyOut)]
    so.ccb_workers.argtypes = [POINTER(c_void_p), c_int, c_int, c_size_t, c_int, c_int, POINTER(CopyOut)]
    so.ccb_launch.argtypes = [c_void_p, c_int, c_int, POINTER(c_double)]
    so.ccb_kernel_gap.argtypes = [c_void_p, c_int, POINTER(c_double)]
    so.ccb_semantics.argtypes = [c_void_p, c_int, c_int, c_size_t, c_double, POINTER(SemOut)]
    so.ccb_ctx_lifecycle.argtypes = [c_int, c_int, POINTER(c_double), POINTER(c_double)]
    so.ccb_pinned_slots.argtypes = [c_void_p, c_size_t, c_int, POINTER(c_double), POINTER(c_double)]
    return so


def _check(rc: int) -> None:
    if rc != 0:
        raise GpuError(lib().ccb_error().decode(errors="replace"))


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
            raise GpuError(lib().ccb_error().decode(errors="replace"))
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

    def copy(self, direction: str, nbytes: int, iters: int, nstreams: int = 1, sync_every: int = 0) -> tuple[CopyOut, list[float]]:
        """iters copies over nstreams streams; with sync_every=k, all streams are
        waited for after every k copies and each wait gives one sample (ns)."""
        groups = iters // sync_every if sync_every else 0
        samples = (c_double * max(groups, 1))()
        out = CopyOut()
        _check(lib().ccb_copy(self.handle, DIRS[direction], nbytes, nstreams, iters, sync_every, samples, ctypes.byref(out)))
        return out, list(samples[:groups])

    def launch(self, mode: int, n: int) -> float:
        ns = c_double()
        _check(lib().ccb_launch(self.handle, mode, n, ctypes.byref(ns)))
        return ns.value

    def kernel_gap(self, reps: int) -> float:
        """ns of GPU time one more (empty) kernel adds to a busy stream, median of reps."""
        ns = c_double()
        _check(lib().ccb_kernel_gap(self.handle, reps, ctypes.byref(ns)))
        return ns.value

    def semantics(self, direction: str, relation: int, nbytes: int, spin_ns: float) -> SemOut:
        out = SemOut()
        _check(lib().ccb_semantics(self.handle, DIRS[direction], relation, nbytes, spin_ns, ctypes.byref(out)))
        return out

    def pinned_slots(self, nbytes: int, count: int) -> tuple[float, float]:
        a, f = c_double(), c_double()
        _check(lib().ccb_pinned_slots(self.handle, nbytes, count, ctypes.byref(a), ctypes.byref(f)))
        return a.value, f.value


def run_workers(sessions: list[Session], direction: str, nbytes: int, iters: int, warmup: int = 2) -> list[CopyOut]:
    """One thread per session, released together; each copies on its own stream."""
    n = len(sessions)
    handles = (c_void_p * n)(*[s.handle for s in sessions])
    outs = (CopyOut * n)()
    _check(lib().ccb_workers(handles, n, DIRS[direction], nbytes, iters, warmup, outs))
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
