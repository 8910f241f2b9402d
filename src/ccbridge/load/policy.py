"""How many workers and contexts, which staging: from the CC state or the emulation profile.

CC off: one context carries the whole link, so every worker shares the
primary context and copies straight into the tensors; the host side (reading
the page cache into pinned staging) is what needs threads, and small chunks:
two 4 MiB staging buffers per worker stay in the CPU's caches, so only the
page cache is read from DRAM (on a 16-core H100 host, 16 workers reached
48-50 GB/s with 4 MiB chunks, 41 with 16 MiB; bench/RESULTS.md). The pool
then has one thread issue every copy (load.c says why), so the readers
leave it a core, and the caller one.

CC on: each context's secure channel serializes its crossings and caps them
at a fraction of the link, so the pool takes several contexts, and two
workers per context (under CC a copy call holds its thread, so one worker
prepares while the other copies). When pageable is the faster path of one
context (the bridge law: the pinned fast path collapses under CC) there is no
staging at all: the copy reads the file's page-cache mapping, so the CPU
encrypts straight from the page cache; 64 MiB chunks, each crossing paying a
toll. Otherwise pinned staging in 4 MiB chunks: a chunk read into staging is
still in the CPU's caches when its channel seals it.

Under the emulator the rates come from the profile, each capped as the
emulator paces it (emulated_rates): on a host whose one pageable call is slow
the pinned path wins. Contexts: twice what the profile's per-context rate
needs to fill the machine-wide bridge, because a channel sealing on the host
while the readers share its cores moves about half its rate. Emulated b300 on
one 16-core H200 host (bench/RESULTS.md, 2026-11-27, session 18), GB/s over
the data movement: pinned 8 contexts x 4 MiB 28.5-29.8, x 64 MiB 23.5-24.1,
5 contexts x 4 MiB 25.6, 7 x 4 MiB 29.8; mapped 8 contexts 22.4 at 4 and 64
MiB, 4 contexts 14.3 (the old plan's, which took the profile's 15 GB/s).
A pool made for one load (not prewarmed) pays its contexts' making on that
load's critical path: under emulated CC, where the profile gives the making's
cost, cold_contexts weighs it (4.19 GB cold under b300: the primary context
1.08-1.11 s, 8 contexts 5.97 s; on that host the primary up to ~58 GB). Real
CC (NVML) keeps the throughput plan: no making cost to weigh is at hand.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ccbridge import env
from ccbridge.errors import UsageError
from ccbridge.load.engine import PoolConfig

MiB = 1 << 20
# Real CC hardware with no measurement at hand: the bridge law's 8 worker
# contexts (RTX Pro 6000 scales to ~35 GB/s by 24; B300 tops at ~34 GB/s).
CC_ON_CONTEXTS = 8
# One context made natively: our H100 with CC off, 0.131 s (the b300 profile's ctx_create_s is the CC-on rest)
NATIVE_CONTEXT_S = 0.131
# CC off, cores the readers leave to the thread that issues every copy and to the caller: on a 16-core H200 host
# 14 and 12 readers moved 52.6 and 52.5 GB/s where 16 moved 51.9 (bench/load_sweep.py, bench/RESULTS.md)
SPARE_CORES = 2


@dataclass(frozen=True)
class Plan:
    config: PoolConfig
    why: str
    cc: bool = False  # planned for CC's channels: the chunk goes with the staging (override), even on 0 contexts


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 4


def cc_situation() -> tuple[str, dict[str, float]]:
    """('emulated', profile params) | ('on', {}) | ('off', {}) | ('unknown', {})."""
    emu = env.emulation_info()
    if emu.get("active"):
        params = {}
        for k, v in (emu.get("params") or {}).items():
            try:
                params[k] = float(v)
            except ValueError:
                pass
        if params.get("emulate", 1.0):
            return "emulated", {**params, **(emu.get("host") or {})}
        return "off", {}  # passthrough: the interposer adds no cost
    return env.nvml_info().get("cc", {}).get("mode", "unknown"), {}


def _cc_chunk(staging: str) -> int:
    """A crossing under CC: pinned staging's chunk is still in cache when sealed; a copy from the mapping has none
    to keep warm, and each crossing pays a toll."""
    return 4 * MiB if staging == "pinned" else 64 * MiB


def _cc_plan(device: int, contexts: int, staging: str, why: str) -> Plan:
    workers = min(2 * max(contexts, 1), 64)  # contexts 0: the primary context's one channel, two workers on it
    return Plan(PoolConfig(device, workers, contexts, staging, _cc_chunk(staging), 2), why, cc=True)


def emulated_rates(params: dict[str, float]) -> tuple[float, float]:
    """(pinned, pageable) GB/s that one context moves under the emulator: the profile's rates, each no more than
    this host's own copy times the published CC ratio, as the emulator paces them (native/emu/pace.c, channel.c).
    A host whose one pageable call is slow (5.6-6.5 GB/s on an H200 host, bench/RESULTS.md 2026-11-27 session 18)
    moves pageable crossings at ratio x that, not at the profile's 15 GB/s: there pinned staging is the faster path."""
    rates = []
    for mem in ("pinned", "pageable"):
        rate, native, ratio = (params.get(k, 0) for k in (f"h2d_{mem}_gbps", f"native_h2d_{mem}_gbps",
                                                           f"h2d_{mem}_ratio"))
        cap = native * ratio if native > 0 and ratio > 0 else 0.0
        # 0: the profile leaves the channel unpaced, and the emulator's floor (this host x the ratio) alone holds it
        rates.append(min(rate, cap) if rate > 0 and cap > 0 else rate or cap)
    return rates[0], rates[1]


def cold_contexts(nbytes: int, per_ctx: float, system: float, create_s: float, most: int) -> int:
    """Contexts for a pool made for one load of nbytes, whose making is on that load's critical path: 0 (the
    primary context, which the load's tensors need anyway) or 2..most, whichever makes and moves soonest. The
    driver makes contexts one after another (8 in 5.5 s under the emulated b300 bridge, session 18), so n cost
    n x create_s; n channels move min(system, n x per_ctx / 2) GB/s, half a channel's rate as the pool's
    channels moved with the readers sharing their cores. The primary's one channel, with two readers and the
    one thread that issues its copies, moved its whole rate (10.85-10.93 GB/s of b300's 11.26, session 18 run
    8): counted at half, it lost to 2 contexts past 15 GB, which then move no more than it does."""
    def seconds(n: int) -> float:
        rate = min(system, n * per_ctx / 2 if n else per_ctx)
        if not nbytes:  # nothing to move takes no time at any rate
            return n * create_s
        # per_ctx the least denormal (5e-324, which the profile ranges accept) halves to 0: nothing ever moves
        return n * create_s + (nbytes / 1e9 / rate if rate > 0 else math.inf)
    return min([0] + list(range(2, most + 1)), key=seconds)


def choose(device: int, situation: tuple[str, dict[str, float]] | None = None, nbytes: int | None = None) -> Plan:
    """The default pool for a load to `device` (-1: host memory). nbytes: the pool is made for one load of that
    many bytes (not prewarmed): under emulated CC its contexts' making then counts against the load."""
    if device < 0:
        n = max(2, min(8, _cpus()))
        return Plan(PoolConfig(-1, n, 0, "pageable", 64 * MiB, 1), f"host memory: {n} reader threads")
    mode, params = situation or cc_situation()
    if mode == "emulated":
        pinned, pageable = emulated_rates(params)
        staging, per_ctx = ("mapped", pageable) if pageable >= pinned else ("pinned", pinned)
        system = params.get("h2d_system_gbps", 0)
        if per_ctx > 0 and system > 0:
            need = system / per_ctx  # inf where per_ctx is a denormal (--set h2d_pinned_gbps=1e-320): ceil refuses it
            n = 16 if need > 8 else max(2, 2 * math.ceil(need))
            why = (f"emulated CC: {per_ctx:.3g} GB/s per context {staging} (pinned {pinned:.3g}, pageable "
                   f"{pageable:.3g}), {system:g} GB/s machine-wide: {n} contexts")
            create = params.get("ctx_create_s", 0) + NATIVE_CONTEXT_S
            # nbytes 0 (only zero-size tensors) is a load too: nothing to move, so no context is worth making
            if nbytes is not None and (cold := cold_contexts(nbytes, per_ctx, system, create, n)) < n:
                n, why = cold, why + (f"; made for one load of {nbytes / 1e9:.2f} GB, {create:.3g} s a context: "
                                      f"{cold or 'the primary'} context{'s' if cold else ''}")
            return _cc_plan(device, n, staging, why)
        return _cc_plan(device, CC_ON_CONTEXTS, staging, "emulated CC without bandwidth figures: "
                                                         f"{CC_ON_CONTEXTS} contexts")
    if mode == "on":
        return _cc_plan(device, CC_ON_CONTEXTS, "mapped", f"CC on (NVML): {CC_ON_CONTEXTS} contexts, "
                                                          "copies from the page-cache mapping")
    n = max(2, min(16, _cpus() - SPARE_CORES))
    return Plan(PoolConfig(device, n, 0, "pinned", 4 * MiB, 2),
                f"CC {mode}: {n} workers on the primary context, pinned staging, direct to the tensors")


def for_device(device: int, nbytes: int | None = None, **overrides) -> Plan:
    """The plan for a load to `device`: the default (for one load of nbytes, where given), with the caller's
    overrides in place. The plan for one load only chooses how many contexts to make: a caller who gives
    contexts= gets the pool a prewarmed load gets with them (under b300, --contexts 8: 16 workers, not the
    primary context's plan's 2 raised to 8, one a context, whose copies then hold the reads up)."""
    if overrides.get("contexts") is not None:
        nbytes = None
    return override(choose(device, nbytes=nbytes), **overrides)


def override(plan: Plan, workers: int | None = None, contexts: int | None = None, staging: str | None = None,
             chunk_bytes: int | None = None, buffers: int | None = None) -> Plan:
    """The plan with the caller's choices in place of the defaults."""
    c = plan.config
    given = {k: v for k, v in dict(workers=workers, contexts=contexts, staging=staging,
                                   chunk_bytes=chunk_bytes, buffers=buffers).items() if v is not None}
    if not given:
        return plan
    if c.device < 0 and (given.get("contexts") or given.get("staging", c.staging) != c.staging):
        raise UsageError("contexts and staging choose how a load crosses to a GPU: a load into host memory has "
                         "neither")
    if contexts is not None and workers is None:
        given["workers"] = max(c.workers, contexts)
    if workers is not None and contexts is None and c.contexts > workers:
        given["contexts"] = workers
    if staging is not None and chunk_bytes is None and plan.cc:  # under CC the chunk goes with the staging
        given["chunk_bytes"] = _cc_chunk(staging)
    cfg = PoolConfig(c.device, given.get("workers", c.workers), given.get("contexts", c.contexts),
                     given.get("staging", c.staging), given.get("chunk_bytes", c.chunk_bytes),
                     given.get("buffers", c.buffers))
    try:  # the caller's values, refused here before the native pool sees them
        cfg.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return Plan(cfg, plan.why + "; overridden: " + ", ".join(f"{k}={v}" for k, v in given.items()), plan.cc)
