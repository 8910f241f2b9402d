"""load_safetensors / iter_safetensors: checkpoints to their final tensors through a pool.

Order of work, so that the expensive part (the pool's contexts and staging)
overlaps with the cheap part: open every file and validate every header
(nothing is allocated if one is bad), start the pool prewarming, plan the
reads, allocate the destination tensors and start the load as soon as the
pool is ready: its workers read ahead while the rest is allocated.
The tensors are allocated where they will live and the pool writes into them;
nothing is assembled afterwards. On any error, or when the caller stops
iterating, the load is cancelled and waited for before the tensors are
dropped: nothing half-loaded is returned and nothing writes afterwards.
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ccbridge.errors import UsageError
from ccbridge.load import checkpoint, header, policy
from ccbridge.load import engine
from ccbridge.load.engine import File, Item, LoadError, Pool


@dataclass
class LoadStats:
    """Where a load's time went (seconds; bytes in bytes)."""

    files: int = 0
    tensors: int = 0
    bytes: int = 0
    headers_s: float = 0.0    # open + validate every header
    alloc_s: float = 0.0      # destination tensors (the load runs beside them once the pool is ready)
    prewarm_s: float = 0.0    # the pool's own prewarm (contexts, staging), off the critical path when it overlaps
    prewarm_wait_s: float = 0.0  # how long the load waited for it
    load_s: float = 0.0       # submit to the last tensor done
    read_s: float = 0.0       # per worker, average time inside pread
    copy_s: float = 0.0       # per worker, average time inside copy calls, staging waits and waits for destinations
    teardown_s: float | None = None  # pool teardown (in the background unless the pool was the caller's)
    unmap_s: float | None = None     # releasing the files' mappings (mapped staging; in the background)
    total_s: float = 0.0      # call to return
    pool: dict = field(default_factory=dict)
    why: str = ""
    owned_pool: Pool | None = field(default=None, repr=False)  # closing in the background
    unmapping: threading.Thread | None = field(default=None, repr=False)

    def join_teardown(self) -> float | None:
        """Wait for the call's own pool to be torn down and its file mappings released; the pool's teardown time (s)."""
        if self.unmapping is not None:
            self.unmapping.join()
        if self.owned_pool is not None:
            self.teardown_s = self.owned_pool.join()
        return self.teardown_s

    @property
    def gbps(self) -> float:
        """Bytes over the whole call (GB/s, 1e9)."""
        return self.bytes / self.total_s / 1e9 if self.total_s else 0.0

    @property
    def load_gbps(self) -> float:
        """Bytes from the load's submit to its last tensor, the pool warm (the allocation it overlaps included)."""
        return self.bytes / self.load_s / 1e9 if self.load_s else 0.0


def _torch_dtype(torch, h: header.Header, t: header.TensorInfo):
    attr = header.DTYPES[t.dtype][1]
    dt = getattr(torch, attr, None) if attr else None
    if dt is None:
        why = "it has no torch dtype" if attr is None else f"this torch ({torch.__version__}) lacks torch.{attr}"
        raise header.HeaderError(h.path, "dtype", f"tensor {t.name!r} is {t.dtype}: {why}")
    shape = list(t.shape)
    if t.dtype == "F4":  # two values per byte: torch's float4_e2m1fn_x2 halves the last dimension
        if not shape or shape[-1] % 2:
            raise header.HeaderError(h.path, "shape", f"tensor {t.name!r} is F4 with shape {t.shape}: torch needs an even last dimension")
        shape[-1] //= 2
    if not t.nbytes:  # a reshape of nothing (_run): the shapes such a reshape refuses fail here, pool unstarted
        try:
            torch.empty(0, dtype=dt, device="meta").reshape(shape)
        except (RuntimeError, TypeError):  # torch's own words run to 200 columns: the cause in ours
            shown = f"{str(list(t.shape)):.60}"
            raise header.HeaderError(h.path, "shape", f"tensor {t.name!r} of shape {shown}: a dimension or a stride "
                                                      "past 63 bits, which torch cannot make") from None
    return dt, shape


def check_device(device: str) -> str:
    """A device spec the loader serves: cpu, cuda or cuda:N; UsageError otherwise."""
    kind, _, index = device.partition(":")
    if device in ("cpu", "cuda") or (kind == "cuda" and index.isdigit() and index.isascii()):
        return device
    raise UsageError(f"device must be cpu, cuda or cuda:N (N = 0, 1, ...), got {device!r}")


def device_name(index: int) -> str:
    """A pool's device (-1: host memory) as the caller writes it: cpu or cuda:N."""
    return "cpu" if index < 0 else f"cuda:{index}"


def resolve_device(torch, device) -> tuple[object, int]:
    """(torch.device, the pool's device index, -1 for host memory) for cpu, cuda, cuda:N, an index N (cuda:N, as
    torch reads it) or a torch.device of those; UsageError for any other, LoadError where that GPU is not there."""
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        device = f"cuda:{device}"  # torch.device(0) asks for an accelerator: without one, not our message
    try:  # a string is checked here; a torch.device by torch
        dev = torch.device(check_device(device) if isinstance(device, str) else device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise UsageError(f"device must be cpu, cuda, cuda:N or an index N, got {device!r}")
    if dev.type == "cpu":
        return dev, -1
    if not torch.cuda.is_available():
        raise LoadError(f"torch sees no GPU for {device!r}; device='cpu' (--device cpu) works in host memory")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise LoadError(f"no CUDA device {index}: torch sees {torch.cuda.device_count()}")
    return torch.device("cuda", index), index


def _unmap_all(maps, st: LoadStats | None = None) -> None:
    t = time.perf_counter()
    for addr, size in maps:
        engine.unmap_file(addr, size)
    if st is not None:
        st.unmap_s = time.perf_counter() - t


def _open_all(files: list[str]) -> tuple[list[int], list[header.Header]]:
    fds, headers = [], []
    try:
        for f in files:
            try:  # O_NONBLOCK: a FIFO or a device in a checkpoint's place must not block the open
                fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            except OSError as e:
                raise header.HeaderError(f, "unreadable", e.strerror or str(e)) from None
            fds.append(fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise header.HeaderError(f, "unreadable", "not a regular file (a pipe, device or socket)")
            os.set_blocking(fd, True)
            headers.append(header.parse(fd, f))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds, headers


def _tensor(torch, dev, nbytes: int, dt, shape):
    """One destination: nbytes of storage on dev, seen as its dtype and shape (_torch_dtype checked both)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=dev).view(dt).reshape(shape)


def _start(pool: Pool, load: tuple, items, ready: int, st: LoadStats) -> tuple[float, int]:
    """Wait for the pool (when it still prewarms) and submit the load: when it started, and its id."""
    t = time.perf_counter()
    st.prewarm_s = pool.ready()
    st.prewarm_wait_s = time.perf_counter() - t
    pool.reset_stats()
    t_load = time.perf_counter()
    files, remaining, doneq = load
    return t_load, pool.submit(files, items, remaining, doneq, ready=ready)


def _allocate(torch, dev, pool: Pool, infos, dtypes, tensors: list, items, load: tuple, st: LoadStats) -> float:
    """Make every destination tensor with bytes (into tensors), in file and offset order, and start the
    load as soon as the pool is ready: the workers read ahead while the rest is allocated (they copy into
    published items only).
    Publishing costs a lock and a wake-up, so it runs each time the unpublished bytes reach what is
    published (8 MiB first): a few dozen times however many tensors, while the readers wait only at
    the start. When the load started."""
    t = time.perf_counter()
    started = None  # (when, id)
    pos = pub_bytes = new_bytes = 0  # new_bytes: allocated, not yet published
    for i, ((_, _, info), (dt, shape)) in enumerate(zip(infos, dtypes)):
        if not info.nbytes:
            continue
        tensors[i] = tensor = _tensor(torch, dev, info.nbytes, dt, shape)
        items[pos].dst = tensor.data_ptr()
        pos += 1
        new_bytes += info.nbytes
        if started is None:
            if pool.is_ready():
                started, pub_bytes, new_bytes = _start(pool, load, items, pos, st), new_bytes, 0
        elif new_bytes >= max(8 << 20, pub_bytes):
            pool.publish(started[1], pos)
            pub_bytes, new_bytes = pub_bytes + new_bytes, 0
    st.alloc_s = time.perf_counter() - t
    if started is None:
        return _start(pool, load, items, pos, st)[0] if pos else time.perf_counter()
    if new_bytes:  # every item has bytes: some are not yet published
        pool.publish(started[1], pos)
    return started[0]


def iter_safetensors(paths, device="cuda:0", *, pool: Pool | None = None, workers: int | None = None,
                     contexts: int | None = None, staging: str | None = None, chunk_bytes: int | None = None,
                     buffers: int | None = None, progress: Callable[[int, int], None] | None = None,
                     stats: LoadStats | None = None) -> Iterator[tuple[str, object]]:
    """(name, tensor) pairs, each yielded as soon as all its bytes are on `device`.

    paths: a .safetensors file, a list of them, a directory (its index json if
    it has one, else every *.safetensors in it) or an index json.
    device: "cpu", "cuda", "cuda:N", an index N (cuda:N) or a torch.device.
    pool: a prewarmed Pool for that device to use and keep (a closed pool, or one
    closed mid-load, is a LoadError at the next step); without one, the call makes
    one chosen by policy.choose (CC state or emulation profile, and under
    emulated CC the checkpoint's size, its contexts' making being on this
    load's path; workers, contexts, staging, chunk_bytes, buffers override
    it) and tears it down in the background when it returns.
    progress(done_bytes, total_bytes) is called as tensors finish.
    stats: a LoadStats that the call fills in.
    """
    # the keywords spelt out (here and in load_safetensors): a misspelt one is a TypeError naming this function
    for _, name, tensor in _run(paths, device, pool=pool, workers=workers, contexts=contexts, staging=staging,
                                chunk_bytes=chunk_bytes, buffers=buffers, progress=progress, stats=stats):
        yield name, tensor


def load_safetensors(paths, device="cuda:0", *, pool: Pool | None = None, workers: int | None = None,
                     contexts: int | None = None, staging: str | None = None, chunk_bytes: int | None = None,
                     buffers: int | None = None, progress: Callable[[int, int], None] | None = None,
                     stats: LoadStats | None = None) -> dict[str, object]:
    """Every tensor of a checkpoint on `device`, in file and offset order.

    Bitwise what safetensors' own loader gives. Keyword arguments are those of
    iter_safetensors. Raises UsageError (an argument it cannot use: a path that
    is not there, a device, an override out of range, a pool for another
    device), HeaderError (a file breaks a format rule; nothing is read) or
    LoadError (the load could not run or failed: no such GPU, a closed or busy
    pool, a refused CUDA call, a file that changed; nothing is returned).
    """
    got = sorted(_run(paths, device, pool=pool, workers=workers, contexts=contexts, staging=staging,
                      chunk_bytes=chunk_bytes, buffers=buffers, progress=progress, stats=stats), key=lambda x: x[0])
    return {name: tensor for _, name, tensor in got}


def _run(paths, device, *, pool: Pool | None = None, workers: int | None = None, contexts: int | None = None,
         staging: str | None = None, chunk_bytes: int | None = None, buffers: int | None = None,
         progress: Callable[[int, int], None] | None = None, stats: LoadStats | None = None):
    """(index in file and offset order, name, tensor) as each tensor is done."""
    import torch  # deferred: torch, an optional dependency (seconds of import)

    t_call = time.perf_counter()
    st = stats if stats is not None else LoadStats()
    dev, index = resolve_device(torch, device)
    files, weight_map, idx = checkpoint.resolve(paths)
    fds, headers = _open_all(files)
    own_pool = pool is None
    maps: dict[int, tuple[int, int]] = {}  # fd -> (address, size) under mapped staging
    finished = held = False
    try:
        checkpoint.check_names(headers, weight_map, idx)
        st.headers_s = time.perf_counter() - t_call
        infos = [(fd, h, t) for fd, h in zip(fds, headers) for t in h.tensors]
        dtypes = [_torch_dtype(torch, h, t) for _, h, t in infos]
        if own_pool:
            plan = policy.for_device(index, nbytes=sum(t.nbytes for _, _, t in infos), workers=workers,
                                     contexts=contexts, staging=staging, chunk_bytes=chunk_bytes, buffers=buffers)
            st.why = plan.why
            pool = Pool(plan.config)  # prewarms while we allocate and plan
        elif pool.config.device != index:
            raise UsageError(f"the pool serves {device_name(pool.config.device)}, not {device_name(index)}: "
                             "prewarm() one for this device")
        pool.take()  # this load's cancel and publish are its own
        held = True
        st.pool = {k: getattr(pool.config, k) for k in ("workers", "contexts", "staging", "chunk_bytes", "buffers")}
        # One item per tensor with bytes, in file and offset order; the pool cuts them into chunks.
        file_of = {fd: k for k, fd in enumerate(fds)}
        moving = [i for i, (_, _, info) in enumerate(infos) if info.nbytes]
        items = (Item * len(moving))(*[
            Item(0, infos[i][1].data_start + infos[i][2].begin, infos[i][2].nbytes, file_of[infos[i][0]], i)
            for i in moving])
        nt = max(1, len(infos))
        remaining, doneq = (ctypes.c_int32 * nt)(), (ctypes.c_int32 * nt)()
        st.files, st.tensors, st.bytes = len(files), len(infos), sum(it.nbytes for it in items)
        if moving and pool.config.staging in engine.MAPPED:
            for fd, h in zip(fds, headers):
                maps[fd] = (engine.map_file(fd, h.file_bytes), h.file_bytes)
        file_arr = (File * len(fds))(*[File(fd, 0, maps[fd][0] if maps else 0) for fd in fds])
        tensors = [None] * len(infos)
        for i, ((_, _, info), (dt, shape)) in enumerate(zip(infos, dtypes)):  # nothing to move: done before any read
            if not info.nbytes:
                tensors[i] = _tensor(torch, dev, 0, dt, shape)
                yield i, info.name, tensors[i]
        t_load = _allocate(torch, dev, pool, infos, dtypes, tensors, items, (file_arr, remaining, doneq), st)
        done_bytes = 0
        if moving:
            out = (ctypes.c_int32 * 256)()
            while True:
                n = pool.next(out, 0.25)
                if n == -2:
                    break
                if n == -1:
                    msg, k = pool.error()
                    pool.cancel()
                    where = ""
                    if 0 <= k < len(items):
                        it = items[k]
                        where = f" (file {files[it.file]}, tensor {infos[it.tensor][2].name!r})"
                    raise LoadError(f"load failed{where}: {msg}")
                for j in out[:n]:
                    done_bytes += infos[j][2].nbytes
                    if progress:
                        progress(done_bytes, st.bytes)
                    yield j, infos[j][2].name, tensors[j]
                    pool.ensure_open()  # closed while the caller held this tensor: no more from this batch
            st.load_s = time.perf_counter() - t_load
            s = pool.stats()
            w = pool.config.workers
            st.read_s, st.copy_s = s.read_ns / 1e9 / w, s.copy_ns / 1e9 / w
        finished = True
    finally:
        try:
            if held and not finished:
                pool.cancel()  # before the tensors go: no worker writes after this
        finally:  # the hold, the mappings and the files go back whatever the cancel said
            if held:
                pool.give()
            if finished and maps:
                # Unmapping costs ~30 ns per page the load touched (60 ms for 8 GB): after
                # the last tensor is done nothing reads the mappings, so it is off the
                # critical path. Not a daemon: interpreter exit waits for it.
                st.unmapping = threading.Thread(target=_unmap_all, args=(list(maps.values()), st),
                                                name="ccbridge-unmap")
                st.unmapping.start()
            else:
                _unmap_all(maps.values())
            for fd in fds:
                os.close(fd)
            if own_pool and pool is not None:
                pool.close(background=True)
                st.owned_pool = pool
        st.total_s = time.perf_counter() - t_call
