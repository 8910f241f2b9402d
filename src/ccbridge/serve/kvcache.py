"""A paged KV cache with a host tier that moves bytes on evidence, not speculation.

Under GPU-CC every byte that crosses the bridge costs more and every crossing
pays a toll (bridge law, section 2). A host tier that spills every evicted
block (what offloading connectors do by default) pays multi-GiB device-to-host
traffic for blocks that are never used again. Here a block is spilled on
device eviction only if requests have looked it up at least `threshold`
times (issue 15: threshold 2 cut spill from 2.3 GiB to 2.3 MB); below that it
is dropped. Restores and spills are batched into one crossing per
`staging_blocks` blocks: restores on an idle prep stream that the compute
stream waits for (as StagedH2D), spills on a DrainWorker so the thread that
evicts never waits for a device-to-host copy.

Blocks are identified by hashes chained over the token prefix, so a request's
prompt is a chain of block hashes and prefix reuse across requests falls out.

    cache = KVCache((layers, 2, heads, 16, head_dim), torch.bfloat16, device_blocks=4096,
                    host_blocks=16384, block_tokens=16, threshold=2)
    lk = cache.lookup(prompt_ids)        # pins the hits: lk.device, lk.host, lk.misses (block hashes)
    table = cache.restore(lk.hits)       # device ids of every hit; host hits cross once, batched
    table += cache.allocate(lk)          # fresh device blocks for the misses: write their KV there...
    cache.commit(lk)                     # ...then publish them to other requests
    ...decode...
    cache.release(lk)                    # unpinned blocks become evictable (LRU)

Block states (changed under one lock; waiters use its condition):
PENDING (allocated, being written, not yet visible) -> ON_DEVICE -> SPILLING
(device slot already reused; the copy to the host is in flight: not readable)
-> ON_HOST -> RESTORING (device slot reserved, copy in flight) -> ON_DEVICE.
An ON_DEVICE block may keep its host copy: evicting it again costs nothing.
A pinned block (held by a request) is never evicted from either tier.
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ccbridge.errors import KVCacheError, UsageError
from ccbridge.serve import devices
from ccbridge.serve.defaults import cc_defaults
from ccbridge.serve.drain import DrainWorker

PENDING, ON_DEVICE, SPILLING, ON_HOST, RESTORING = "pending", "on_device", "spilling", "on_host", "restoring"
LOST = "lost"  # its spill failed: pinned holders get an error, not stale bytes
ROOT = b"ccbridge-kv-1"


def block_hashes(tokens, block_tokens: int, root: bytes = ROOT) -> list[bytes]:
    """Chained block hashes of a token sequence: block i's hash covers tokens[:(i+1)*block_tokens].

    SHA-256 (truncated to 16 bytes) of the parent hash and the block's token
    ids as little-endian int64: the same on every process and machine. A last
    partial block has no hash (it is not cacheable until it is full)."""
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    out, h = [], hashlib.sha256(root).digest()[:16]
    for i in range(0, len(tokens) - block_tokens + 1, block_tokens):
        h = hashlib.sha256(h + struct.pack(f"<{block_tokens}q", *tokens[i:i + block_tokens])).digest()[:16]
        out.append(h)
    return out


class _Block:
    __slots__ = ("hash", "state", "dev", "host", "pins", "ready", "indexed")

    def __init__(self, h, state, dev=None, pins=0):
        self.hash, self.state, self.dev, self.host, self.pins = h, state, dev, None, pins
        self.ready = None     # CUDA event: the block's bytes are in place on the device (other streams wait for it)
        self.indexed = False  # visible to lookups; a duplicate computed concurrently stays private and is freed on release


@dataclass
class Lookup:
    """One request's view of the cache: its block hashes, split by where the hits are."""
    hashes: list[bytes]
    device: list[bytes]   # hits on the device (or arriving there)
    host: list[bytes]     # hits in the host tier (or on their way there)
    misses: list[bytes]   # the rest of the chain: to be computed
    _held: list = field(default_factory=list, repr=False)  # blocks this request pins
    _new: list = field(default_factory=list, repr=False)   # blocks allocate() made for the misses

    @property
    def hits(self) -> list[bytes]:
        return self.hashes[:len(self.hashes) - len(self.misses)]


COUNTERS = ("lookups", "blocks_looked_up", "device_hits", "host_hits", "misses",
            "spill_bytes", "spill_crossings", "spilled_blocks", "restore_bytes", "restore_crossings",
            "restored_blocks", "dropped_threshold", "dropped_host_full", "host_evictions", "spill_failures")


class KVCache:
    """Fixed-size KV blocks in a preallocated device pool, with an LRU host tier.

    block_shape: one block's tensor shape (e.g. [layers, 2, heads, block_tokens,
    head_dim]); dtype: its dtype. threshold: spill a block on device eviction
    only if it was looked up at least this often (1: spill everything).
    host_memory: "pinned" or "pageable" for the host tier and its staging
    (default: cc_defaults().host_memory on CUDA). staging_blocks: the most
    blocks one crossing carries. timeout: seconds to wait for a block in flight.
    device_blocks / host_blocks: blocks in the device pool and the host tier; block_tokens: tokens per block;
    device: the pool's device (default "cuda"; "cpu" runs it without a GPU). KVCacheError when the cache cannot
    serve a request (full, or a block in flight late); UsageError for arguments it cannot use.
    """

    def __init__(self, block_shape, dtype, device_blocks: int, host_blocks: int, block_tokens: int,
                 device=None, threshold: int = 1, host_memory: str | None = None, staging_blocks: int = 32,
                 timeout: float = 60.0, root: bytes = ROOT):
        for name, v, lo in (("device_blocks", device_blocks, 1), ("host_blocks", host_blocks, 0),
                            ("block_tokens", block_tokens, 1), ("threshold", threshold, 1),
                            ("staging_blocks", staging_blocks, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise UsageError(f"{name} must be a whole number >= {lo}, not {v!r}")
        if not block_shape or not all(isinstance(d, int) and d >= 1 for d in block_shape):
            raise UsageError(f"block_shape must be one or more positive sizes, not {block_shape!r}")
        self.device = devices.resolve(device, "KVCache")
        self.cuda = self.device.type == "cuda"
        if host_memory is None:
            host_memory = cc_defaults().host_memory if self.cuda else "pageable"
        if host_memory not in ("pinned", "pageable"):
            raise UsageError(f"host_memory must be 'pinned' or 'pageable', not {host_memory!r}")
        pin = self.cuda and host_memory == "pinned"
        self.block_shape, self.dtype, self.block_tokens = tuple(block_shape), dtype, block_tokens
        self.threshold, self.host_memory, self.timeout, self.root = threshold, host_memory, timeout, root
        self.block_bytes = math.prod(self.block_shape) * torch.empty(0, dtype=dtype).element_size()
        self.staging_blocks = min(staging_blocks, device_blocks)
        self.device_pool = torch.empty((device_blocks, *self.block_shape), dtype=dtype, device=self.device)
        self.host_pool = torch.empty((host_blocks, *self.block_shape), dtype=dtype, pin_memory=pin)
        # copies move bytes, not values: gather, scatter and index_copy_ lack kernels for some dtypes (float8)
        self._dev_bytes, self._host_bytes = self.device_pool.view(torch.uint8), self.host_pool.view(torch.uint8)
        # two staging slots, as StagedH2D: the prep stream waits only for the scatter two restores back,
        # so it stays idle (an H2D queued behind a busy stream would hold the thread under CC)
        stage = (self.staging_blocks, *self._dev_bytes.shape[1:])
        self._host_stage = [torch.empty(stage, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self._dev_stage = [torch.empty(stage, dtype=torch.uint8, device=self.device) for _ in range(2)]
        self._prep = torch.cuda.Stream(self.device) if self.cuda else None
        self._h2d_done = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self._moved = [None, None]     # events: the compute stream has scattered a device staging slot out
        self._slot = 0
        self._stage_lock = threading.Lock()  # one restore crossing at a time picks and fills a slot
        self._free_dev = list(range(device_blocks - 1, -1, -1))
        self._free_host = list(range(host_blocks - 1, -1, -1))
        self._index: dict[bytes, _Block] = {}
        self._lru: OrderedDict[_Block, None] = OrderedDict()  # indexed blocks, least recently used first
        self._seen: OrderedDict[bytes, int] = OrderedDict()    # lookups per hash; outlives the blocks
        self._seen_cap = max(4096, 4 * (device_blocks + host_blocks))
        self._spilling = 0
        self.spill_error: BaseException | None = None  # the last failed spill's error (its blocks are lost)
        self._cond = threading.Condition()
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._drain = DrainWorker(max_pending=4, pin=pin, timeout=timeout)
        if self.cuda:
            self._load_kernels()

    # -- requests -------------------------------------------------------------------

    def lookup(self, tokens) -> Lookup:
        """Hash tokens into blocks, count each as seen, and pin the cached prefix of the chain."""
        hashes = block_hashes(tokens, self.block_tokens, self.root)
        lk = Lookup(hashes, [], [], [])
        with self._cond:
            for h in hashes:
                self._seen[h] = self._seen.get(h, 0) + 1
                self._seen.move_to_end(h)
            while len(self._seen) > self._seen_cap:
                self._seen.popitem(last=False)
            for h in hashes:
                b = self._index.get(h)
                if b is None:
                    break  # a chain: nothing after a missing block can be used
                (lk.device if b.state in (ON_DEVICE, RESTORING) else lk.host).append(h)
                b.pins += 1
                lk._held.append(b)
                self._lru.move_to_end(b)
            lk.misses = hashes[len(lk.device) + len(lk.host):]
            c = self.counters
            c["lookups"] += 1
            c["blocks_looked_up"] += len(hashes)
            c["device_hits"] += len(lk.device)
            c["host_hits"] += len(lk.host)
            c["misses"] += len(lk.misses)
        return lk

    def restore(self, hashes: list[bytes]) -> list[int]:
        """Device block ids of pinned blocks (a lookup's hits), in order.

        Host-resident ones are copied in, batched: gathered into one host
        staging region, one host-to-device crossing per staging_blocks blocks
        on an idle prep stream, scattered device-to-device on the current
        stream, which waits for the crossing. Blocks still being spilled or
        restored by another request are waited for."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            blocks = [self._pinned(h) for h in hashes]
        while True:
            with self._cond:
                self._wait(lambda: not any(b.state in (SPILLING, RESTORING) for b in blocks), deadline)
                if any(b.state == LOST for b in blocks):
                    raise KVCacheError("a KV block was lost: its spill to the host failed; recompute it")
                todo = [b for b in blocks if b.state == ON_HOST]
                if not todo:
                    ids, events = [b.dev for b in blocks], {id(b.ready): b.ready for b in blocks if b.ready}
                    break
                slots, spill = self._take_device(len(todo))
                for b, s in zip(todo, slots):
                    b.dev, b.state = s, RESTORING
            try:
                self._spill(spill)  # reads the evicted slots before the restore below overwrites them
                for i in range(0, len(todo), self.staging_blocks):
                    self._copy_in(todo[i:i + self.staging_blocks])
            except BaseException:
                with self._cond:
                    for b in todo:
                        self._free_dev.append(b.dev)
                        b.dev, b.state = None, ON_HOST
                    self._cond.notify_all()
                raise
            with self._cond:
                for b in todo:
                    b.state = ON_DEVICE
                self._cond.notify_all()
        if self.cuda:
            stream = torch.cuda.current_stream(self.device)
            for e in events.values():
                stream.wait_event(e)
        return ids

    def allocate(self, lk: Lookup) -> list[int]:
        """Fresh device blocks for lk's misses, pinned and not yet visible: write their KV, then commit(lk)."""
        with self._cond:
            if lk._new:
                raise UsageError("allocate: this lookup's misses already have blocks")
            slots, spill = self._take_device(len(lk.misses))
            lk._new = [_Block(h, PENDING, dev=s, pins=1) for h, s in zip(lk.misses, slots)]
            lk._held += lk._new
        self._spill(spill)
        return slots

    def commit(self, lk: Lookup) -> None:
        """Publish the blocks allocate() made once their KV is written (on the current stream)."""
        ready = None
        if self.cuda and lk._new:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        with self._cond:
            for b in lk._new:
                if b.state != PENDING:
                    continue
                b.state, b.ready = ON_DEVICE, ready
                if b.hash not in self._index:  # else another request computed it meanwhile: ours stays private
                    b.indexed = True
                    self._index[b.hash] = b
                    self._lru[b] = None
            self._cond.notify_all()

    def release(self, lk: Lookup) -> None:
        """Unpin everything lk holds (idempotent); blocks never committed or kept private are freed."""
        with self._cond:
            for b in lk._held:
                b.pins -= 1
                if b.pins == 0 and not b.indexed and b.dev is not None:
                    self._free_dev.append(b.dev)
                    b.dev = None
                elif b.indexed:
                    self._lru.move_to_end(b)
            lk._held, lk._new = [], []
            self._cond.notify_all()

    # -- counters and shutdown ------------------------------------------------------------

    def stats(self) -> dict:
        """Counters, hit rates per tier (of blocks looked up), and the tiers' occupancy."""
        with self._cond:
            s = dict(self.counters)
            n = max(1, s["blocks_looked_up"])
            s.update(device_hit_rate=s["device_hits"] / n, host_hit_rate=s["host_hits"] / n,
                     device_free=len(self._free_dev), host_free=len(self._free_host), cached_blocks=len(self._index))
        return s

    def flush(self) -> None:
        """Wait until every spill in flight has landed in the host tier."""
        with self._cond:
            self._wait(lambda: self._spilling == 0, time.monotonic() + self.timeout)

    def close(self) -> None:
        self._drain.close()

    def __enter__(self) -> "KVCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals (the lock is held where a name says so) ------------------------------------

    def _load_kernels(self) -> None:
        """Launch the device kernels of spills (the gather) and restores (the scatter) once, now.

        CUDA loads a kernel on its first launch (lazy loading, the default since
        CUDA 12.2), and loading one may synchronize the context: the first spill
        or restore of a process would then wait for everything the compute
        stream has queued, holding the calling thread (seen on an H100: the
        first restore under a busy compute stream did). Scratch rows of one
        block's bytes, gathered at the alignments pool rows have (rows 0 and 1,
        0 and 2, one alone), so the kernel variants the real copies pick are
        the ones loaded here."""
        w = torch.empty((3, *self._dev_bytes.shape[1:]), dtype=torch.uint8, device=self.device)
        g = torch.stack([w[0], w[1]])
        torch.stack([w[0], w[2]])
        torch.stack([w[1]])
        torch._foreach_copy_([w[0], w[2]], list(g.unbind(0)))

    def _pinned(self, h: bytes) -> _Block:
        b = self._index.get(h)
        if b is None or b.pins < 1:
            raise UsageError("restore: only blocks a lookup has pinned (its hits) can be restored")
        return b

    def _wait(self, pred, deadline: float) -> None:
        if not self._cond.wait_for(pred, max(0.0, deadline - time.monotonic())):
            raise KVCacheError(f"a KV block in flight did not arrive within {self.timeout:g} s; "
                               "is a copy stuck on a GPU that stopped?")

    def _take_device(self, k: int) -> tuple[list[int], list[tuple[_Block, int]]]:
        """(lock held) k device slots, evicting least recently used unpinned blocks; the spills to issue."""
        evictable = (b for b in list(self._lru) if b.state == ON_DEVICE and b.pins == 0)
        n_evictable = sum(1 for b in self._lru if b.state == ON_DEVICE and b.pins == 0)
        if len(self._free_dev) + n_evictable < k:
            raise KVCacheError(f"KV cache full: {k} device blocks needed, {len(self._free_dev)} free and "
                               f"{n_evictable} evictable of {self.device_pool.shape[0]}; the rest are pinned by "
                               "requests or in flight: release finished requests or give the cache more blocks")
        slots, spill = [], []
        while len(slots) < k:
            if self._free_dev:
                slots.append(self._free_dev.pop())
                continue
            b = next(evictable)
            slot, b.dev = b.dev, None
            if b.host is not None:
                b.state = ON_HOST  # a clean host copy already exists: nothing crosses
            elif self._seen.get(b.hash, 0) < self.threshold:
                self.counters["dropped_threshold"] += 1
                self._forget(b)
            elif (host := self._take_host()) is None:
                self.counters["dropped_host_full"] += 1
                self._forget(b)
            else:
                b.host, b.state = host, SPILLING
                spill.append((b, slot))
            slots.append(slot)
        return slots, spill

    def _take_host(self) -> int | None:
        """(lock held) A host slot: a free one, or the least recently used unpinned host copy's."""
        if self._free_host:
            return self._free_host.pop()
        for b in self._lru:
            if b.host is not None and b.pins == 0 and b.state in (ON_HOST, ON_DEVICE):
                slot, b.host = b.host, None
                self.counters["host_evictions"] += 1
                if b.state == ON_HOST:
                    self._forget(b)
                return slot
        return None

    def _forget(self, b: _Block) -> None:
        """(lock held) b leaves the cache: its host slot is freed; its device slot was taken already."""
        del self._index[b.hash]
        self._lru.pop(b)
        b.indexed = False
        if b.host is not None:
            self._free_host.append(b.host)
            b.host = None

    def _spill(self, spill: list[tuple[_Block, int]]) -> None:
        """Gather evicted slots on the current stream (before anyone reuses them) and read them back on the drain."""
        for i in range(0, len(spill), self.staging_blocks):
            part = spill[i:i + self.staging_blocks]
            blocks = [b for b, _ in part]
            staged = torch.stack([self._dev_bytes[s] for _, s in part])  # one device-side gather, no crossing
            with self._cond:
                self._spilling += len(blocks)
                c = self.counters
                c["spill_crossings"] += 1
                c["spilled_blocks"] += len(blocks)
                c["spill_bytes"] += len(blocks) * self.block_bytes
            fut = self._drain.submit(staged)  # one crossing, waited for on the drain's thread
            fut.add_done_callback(lambda f, blocks=blocks: self._spilled(blocks, f))

    def _spilled(self, blocks: list[_Block], fut) -> None:
        """(drain thread) Scatter a landed spill into its host slots; only then can it be read."""
        try:
            self._host_bytes.index_copy_(0, torch.tensor([b.host for b in blocks]), fut.result())
            ok = True
        except BaseException as e:  # noqa: BLE001 - the blocks are lost, not half-written; kept for the caller
            ok, self.spill_error = False, e
        with self._cond:
            for b in blocks:
                if ok:
                    b.state = ON_HOST
                else:
                    self.counters["spill_failures"] += 1
                    self._forget(b)
                    b.state = LOST
            self._spilling -= len(blocks)
            self._cond.notify_all()

    def _copy_in(self, chunk: list[_Block]) -> None:
        """One restore crossing: host gather -> one H2D on the prep stream -> device scatter on the current stream."""
        n = len(chunk)
        with self._cond:
            self.counters["restore_crossings"] += 1
            self.counters["restored_blocks"] += n
            self.counters["restore_bytes"] += n * self.block_bytes
        with self._stage_lock:
            k, self._slot = self._slot, self._slot ^ 1
            hs, ds = self._host_stage[k][:n], self._dev_stage[k][:n]
            if self.cuda and self._moved[k] is not None:
                self._h2d_done[k].synchronize()  # host slot k is rewritten now: its last crossing must have read it
            torch.index_select(self._host_bytes, 0, torch.tensor([b.host for b in chunk]), out=hs)
            dst = [self._dev_bytes[b.dev] for b in chunk]
            if not self.cuda:
                ds.copy_(hs)
                torch._foreach_copy_(dst, list(ds.unbind(0)))
                return
            compute = torch.cuda.current_stream(self.device)
            with torch.cuda.stream(self._prep):
                if self._moved[k] is not None:
                    self._prep.wait_event(self._moved[k])  # device slot k: its last scatter has left it
                ds.copy_(hs, non_blocking=True)  # the one crossing, on an idle stream
                self._h2d_done[k].record(self._prep)
            compute.wait_event(self._h2d_done[k])
            torch._foreach_copy_(dst, list(ds.unbind(0)))  # device-side scatter, no crossing
            self._moved[k] = ready = torch.cuda.Event()
            ready.record(compute)
        for b in chunk:
            b.ready = ready
