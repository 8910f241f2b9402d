"""The loader pool (native/loader/load.c, declared in ccbridge.bindings.loader).

A Pool is worker threads with their contexts and staging buffers. Making one starts the workers, which prewarm
in the background (context creation, staging allocation); `ready()` waits for them. One load at a time runs on a
pool; a load that failed or was cancelled leaves it ready for the next one (only a failed prewarm breaks it for
good). `close()` cancels the load under way, ends every wait on the pool (ready() and next() on other threads
raise LoadError), stops a prewarm at each worker's current step, joins the workers and destroys their contexts;
`close(background=True)` does that on a thread of its own so that the caller does not wait for context teardown.
After close() every call on the pool raises LoadError.
"""

from __future__ import annotations

import contextlib
import ctypes
import operator
import threading
from ctypes import c_int64, c_void_p
from dataclasses import dataclass

from ccbridge.bindings import core, loader
from ccbridge.bindings.loader import MAX_BUFS, MAX_WORKERS, STAGING, File, Item, Stats  # noqa: F401 - this module's API
from ccbridge.errors import LoadError

MAPPED = ("mapped",)
CLOSED = "the loader pool is closed: prewarm() a new one"


def plan_walk(files, items, chunk_bytes: int, ntensors: int) -> list[tuple[int, int, int, int]]:
    """How the pool cuts items into chunks: (chunk, item, file offset, length) per segment."""
    lib = loader.lib()
    n = lib.ccb_plan_walk(files, len(files), items, len(items), chunk_bytes, ntensors, None, 0)
    if n < 0:
        raise ValueError(core.error())
    rows = (c_int64 * (4 * n))()
    lib.ccb_plan_walk(files, len(files), items, len(items), chunk_bytes, ntensors, rows, n)
    return [tuple(rows[4 * i:4 * i + 4]) for i in range(n)]


def map_file(fd: int, size: int) -> int:
    """Address of the whole file mapped read-only; unmap_file when the load is over."""
    a = loader.lib().ccb_map_file(fd, size)
    if not a:
        raise LoadError(core.error())
    return a


def unmap_file(addr: int, size: int) -> None:
    loader.lib().ccb_unmap_file(addr, size)


@dataclass(frozen=True)
class PoolConfig:
    device: int  # CUDA device index, or -1 for host memory
    workers: int
    contexts: int  # 0: the device's primary context; N: N contexts of the pool's own
    staging: str  # "pinned" or "pageable"
    chunk_bytes: int
    buffers: int  # staging buffers per worker

    def check(self) -> None:
        """ValueError naming the first value the native pool cannot take (the loader raises it as UsageError)."""
        for name in ("device", "workers", "contexts", "chunk_bytes", "buffers"):
            try:  # an int or what stands for one (a numpy integer); "16MiB" failed the comparisons below
                operator.index(getattr(self, name))
            except TypeError:
                raise ValueError(f"{name} must be a whole number, got {getattr(self, name)!r}") from None
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {self.workers}")
        if not 0 <= self.contexts <= self.workers:
            raise ValueError(f"contexts must be 0..workers ({self.workers}), got {self.contexts}")
        if not isinstance(self.staging, str) or self.staging not in STAGING:
            raise ValueError(f"staging must be one of {sorted(STAGING)}, got {self.staging!r}")
        if self.chunk_bytes < 4096:
            raise ValueError(f"chunk_bytes must be at least 4096, got {self.chunk_bytes}")
        if not 1 <= self.buffers <= MAX_BUFS:
            raise ValueError(f"buffers must be 1..{MAX_BUFS}, got {self.buffers}")
        if self.staging in MAPPED and (self.device < 0 or self.chunk_bytes % 4096):
            raise ValueError(f"{self.staging} staging needs a CUDA device and a chunk size in whole 4 KiB pages")


class Pool:
    """A loader pool: worker threads, their contexts and staging, serving one load at a time (what prewarm()
    returns; pass it as pool= to load_safetensors or iter_safetensors). Making one starts the prewarm; close()
    frees it, and every later call raises LoadError. A context manager: leaving the block closes it and waits.

    Every native call goes through _native(), which counts it in flight; close() marks the pool closed, cancels
    the load under way and frees only once no call is in flight: the handle never reaches C after it is freed,
    and a load on another thread ends with LoadError rather than reading freed memory."""

    def __init__(self, config: PoolConfig):
        config.check()
        self.config = config
        self._closing: threading.Thread | None = None
        self._held = threading.Lock()
        self._calls = threading.Condition()  # guards _closed, _in_flight and the handle's freeing
        self._closed = False
        self._in_flight = 0
        self.teardown_s: float | None = None
        h = loader.lib().ccb_pool_new(config.device, config.workers, config.contexts, STAGING[config.staging],
                                      config.chunk_bytes, config.buffers)
        if not h:
            raise LoadError(f"cannot start the loader pool: {core.error()}")
        self.handle = c_void_p(h)

    @contextlib.contextmanager
    def _native(self, closed_waits: bool = False):
        """The handle for one native call: LoadError once the pool is closed (closed_waits: None, after the
        teardown, which cancels as it frees); counted until the call returns."""
        with self._calls:  # the closed check and the count under one lock: a close cannot slip between them
            closed = self._closed
            if closed and not closed_waits:
                raise LoadError(CLOSED)
            if closed:
                self._calls.wait_for(lambda: self.handle is None)
            else:
                self._in_flight += 1
        if closed:
            yield None
            return
        try:
            yield self.handle
        finally:
            with self._calls:
                self._in_flight -= 1
                self._calls.notify_all()

    def ensure_open(self) -> None:
        """LoadError once the pool is closed (a load that resumes after a close stops there)."""
        if self._closed:
            raise LoadError(CLOSED)

    def error(self) -> tuple[str, int]:
        """The load's first error, and the index of the item it concerns (-1: none)."""
        lib = loader.lib()
        with self._native() as h:
            return lib.ccb_pool_error(h).decode(errors="replace"), lib.ccb_pool_error_item(h)

    def ready(self, timeout_s: float = 600.0) -> float:
        """Wait until every worker is prewarmed; the prewarm time in seconds. LoadError where the pool is closed,
        before or during the wait (a close on another thread ends the wait at once)."""
        with self._native() as h:
            rc = loader.lib().ccb_pool_wait_ready(h, timeout_s)
        if rc == -2:
            raise LoadError(CLOSED)
        if rc == 1:
            raise LoadError(f"the loader pool was not ready after {timeout_s:.0f} s")
        if rc != 0:
            raise LoadError(f"the loader pool could not start: {self.error()[0]}")
        return self.stats().prewarm_ns / 1e9

    def take(self) -> None:
        """Hold the pool for one load (LoadError where another holds it, or the pool is closed), so that a load's
        cancel and publish never reach another's: one load at a time runs on a pool. `give` hands it back."""
        self.ensure_open()
        if not self._held.acquire(blocking=False):
            raise LoadError("the loader pool is serving another load: one load at a time runs on a pool")

    def give(self) -> None:
        """Hand back the hold that `take` got (no native call: it works on a closed pool too)."""
        self._held.release()

    def submit(self, files, items, remaining, doneq, ready: int | None = None) -> int:
        """Start a load of items (Item array) from files (File array); remaining and doneq are
        int32 arrays, one slot per tensor. The arrays must stay alive until it is over or cancelled.
        ready: how many items (a prefix) have their dst already (all by default); `publish` names more.
        The load's id, for publish."""
        n = len(items) if ready is None else ready
        with self._native() as h:
            load = loader.lib().ccb_pool_submit(h, files, len(files), items, len(items), n,
                                                remaining, doneq, len(remaining))
        if load < 0:
            raise LoadError(core.error())
        return load

    def publish(self, load: int, ready: int) -> None:
        """Items [0, ready) of load `load` (submit's id) have their dst now: the workers may copy into them.
        Ignored once that load is over."""
        with self._native() as h:
            loader.lib().ccb_pool_publish(h, load, ready)

    def is_ready(self) -> bool:
        """Whether every worker is prewarmed, without waiting (a failed prewarm reads as ready: ready() says why).
        LoadError once the pool is closed: a closing pool is not one to start a load on."""
        with self._native() as h:
            rc = loader.lib().ccb_pool_wait_ready(h, 0.0)
        if rc == -2:
            raise LoadError(CLOSED)
        return rc != 1

    def next(self, out, timeout_s: float) -> int:
        """Finished tensor indices into out: count, 0 on timeout, -1 error, -2 load over.
        LoadError where the pool was closed, before or during the wait (close ends the wait: its -2 is no end)."""
        with self._native() as h:
            n = loader.lib().ccb_pool_next(h, out, len(out), timeout_s)
            if self._closed:
                raise LoadError(CLOSED)
            return n

    def cancel(self) -> None:
        """Stop the load; returns once no worker can write anything more. On a closed pool it waits for the
        teardown instead, which cancels: a submit that slipped in before the close may still be writing."""
        with self._native(closed_waits=True) as h:
            if h is not None:
                loader.lib().ccb_pool_cancel(h)

    def stats(self) -> Stats:
        """The pool's figures (times in ns): prewarm_ns; read_ns and copy_ns since reset_stats(), summed over the
        workers; the last load's bytes and load_ns (submit to idle; 0 while it runs). LoadError once closed."""
        s = Stats()
        with self._native() as h:
            loader.lib().ccb_pool_stats(h, ctypes.byref(s))
        return s

    def reset_stats(self) -> None:
        """Zero the workers' read and copy times (stats()), so that they count one load. LoadError once closed."""
        with self._native() as h:
            loader.lib().ccb_pool_reset_stats(h)

    def _free(self) -> None:
        """Close the native pool, which cancels the load under way, ends the waits (a next() or ready() blocked
        on another thread returns) and stops the prewarm; wait for the calls in flight to return, then free.
        close() marked the pool closed: no call starts after."""
        t = core.now_ns()
        lib = loader.lib()
        lib.ccb_pool_close(self.handle)
        with self._calls:
            self._calls.wait_for(lambda: not self._in_flight)
        lib.ccb_pool_free(self.handle)
        with self._calls:
            self.handle = None
            self.teardown_s = (core.now_ns() - t) / 1e9
            self._calls.notify_all()

    def close(self, background: bool = False) -> None:
        """Cancel any load, join the workers and destroy the contexts; in the background if asked (join() waits).
        A second close is a no-op; after the first, every call but close, join, give and cancel raises LoadError."""
        with self._calls:
            if self._closed:
                return
            self._closed = True
        if background:
            # Not a daemon: interpreter exit waits for the contexts to go.
            self._closing = threading.Thread(target=self._free, name="ccbridge-pool-teardown")
            self._closing.start()
        else:
            self._free()

    def join(self) -> float | None:
        """Wait for a background close; the teardown time in seconds (None while the pool is open)."""
        if self._closing is not None:
            self._closing.join()
        return self.teardown_s

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self.join()
