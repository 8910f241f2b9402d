"""The loader pool (native/loader/load.c, declared in ccbridge.bindings.loader).

A Pool is worker threads with their contexts and staging buffers. Making one
starts the workers, which prewarm in the background (context creation,
staging allocation); `ready()` waits for them. One load at a time runs on a
pool; a load that failed or was cancelled leaves it ready for the next one
(only a failed prewarm breaks it for good); `close()` joins the workers and destroys their contexts, and
`close(background=True)` does that on a thread of its own so that the caller
does not wait for context teardown.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import c_int64, c_void_p
from dataclasses import dataclass

from ccbridge.bindings import core, loader
from ccbridge.bindings.loader import MAX_BUFS, MAX_WORKERS, STAGING, File, Item, Stats  # noqa: F401 - this module's API
from ccbridge.errors import LoadError

MAPPED = ("mapped",)


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
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {self.workers}")
        if not 0 <= self.contexts <= self.workers:
            raise ValueError(f"contexts must be 0..workers ({self.workers}), got {self.contexts}")
        if self.staging not in STAGING:
            raise ValueError(f"staging must be one of {sorted(STAGING)}, got {self.staging!r}")
        if self.chunk_bytes < 4096:
            raise ValueError(f"chunk_bytes must be at least 4096, got {self.chunk_bytes}")
        if not 1 <= self.buffers <= MAX_BUFS:
            raise ValueError(f"buffers must be 1..{MAX_BUFS}, got {self.buffers}")
        if self.staging in MAPPED and (self.device < 0 or self.chunk_bytes % 4096):
            raise ValueError(f"{self.staging} staging needs a CUDA device and a chunk size in whole 4 KiB pages")


class Pool:
    def __init__(self, config: PoolConfig):
        config.check()
        self.config = config
        self._closing: threading.Thread | None = None
        self._held = threading.Lock()
        self.teardown_s: float | None = None
        h = loader.lib().ccb_pool_new(config.device, config.workers, config.contexts, STAGING[config.staging],
                                      config.chunk_bytes, config.buffers)
        if not h:
            raise LoadError(f"cannot start the loader pool: {core.error()}")
        self.handle = c_void_p(h)

    def error(self) -> tuple[str, int]:
        """The load's first error, and the index of the item it concerns (-1: none)."""
        lib = loader.lib()
        return lib.ccb_pool_error(self.handle).decode(errors="replace"), lib.ccb_pool_error_item(self.handle)

    def ready(self, timeout_s: float = 600.0) -> float:
        """Wait until every worker is prewarmed; the prewarm time in seconds."""
        rc = loader.lib().ccb_pool_wait_ready(self.handle, timeout_s)
        if rc == 1:
            raise LoadError(f"the loader pool was not ready after {timeout_s:.0f} s")
        if rc != 0:
            raise LoadError(f"the loader pool could not start: {self.error()[0]}")
        return self.stats().prewarm_ns / 1e9

    def take(self) -> None:
        """Hold the pool for one load (LoadError where another holds it), so that a load's cancel and publish
        never reach another's: one load at a time runs on a pool. `give` hands it back."""
        if not self._held.acquire(blocking=False):
            raise LoadError("the loader pool is serving another load: one load at a time runs on a pool")

    def give(self) -> None:
        self._held.release()

    def submit(self, files, items, remaining, doneq, ready: int | None = None) -> int:
        """Start a load of items (Item array) from files (File array); remaining and doneq are
        int32 arrays, one slot per tensor. The arrays must stay alive until it is over or cancelled.
        ready: how many items (a prefix) have their dst already (all by default); `publish` names more.
        The load's id, for publish."""
        n = len(items) if ready is None else ready
        load = loader.lib().ccb_pool_submit(self.handle, files, len(files), items, len(items), n,
                                            remaining, doneq, len(remaining))
        if load < 0:
            raise LoadError(core.error())
        return load

    def publish(self, load: int, ready: int) -> None:
        """Items [0, ready) of load `load` (submit's id) have their dst now: the workers may copy into them.
        Ignored once that load is over."""
        loader.lib().ccb_pool_publish(self.handle, load, ready)

    def is_ready(self) -> bool:
        """Whether every worker is prewarmed, without waiting (a failed prewarm reads as ready: ready() says why)."""
        return loader.lib().ccb_pool_wait_ready(self.handle, 0.0) != 1

    def next(self, out, timeout_s: float) -> int:
        """Finished tensor indices into out: count, 0 on timeout, -1 error, -2 load over."""
        return loader.lib().ccb_pool_next(self.handle, out, len(out), timeout_s)

    def cancel(self) -> None:
        """Stop the load; returns once no worker can write anything more."""
        loader.lib().ccb_pool_cancel(self.handle)

    def stats(self) -> Stats:
        s = Stats()
        loader.lib().ccb_pool_stats(self.handle, ctypes.byref(s))
        return s

    def reset_stats(self) -> None:
        loader.lib().ccb_pool_reset_stats(self.handle)

    def _free(self) -> None:
        t = core.now_ns()
        loader.lib().ccb_pool_free(self.handle)
        self.teardown_s = (core.now_ns() - t) / 1e9

    def close(self, background: bool = False) -> None:
        """Join the workers and destroy the contexts; in the background if asked."""
        if self.handle is None or self._closing is not None:
            return
        if background:
            # Not a daemon: interpreter exit waits for the contexts to go.
            self._closing = threading.Thread(target=self._free, name="ccbridge-pool-teardown")
            self._closing.start()
        else:
            self._free()
            self.handle = None

    def join(self) -> float | None:
        """Wait for a background close; the teardown time in seconds."""
        if self._closing is not None:
            self._closing.join()
            self.handle = None
        return self.teardown_s

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self.join()
