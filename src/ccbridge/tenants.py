"""Placing confidential tenants on the partitions of one multi-GPU node (`ccbridge plan-tenants`).

On an NVSwitch baseboard (B300 HGX, multi-GPU CC mode "nvle") a confidential tenant is a partition of the
shared fabric, and the partitions are aligned buddy blocks: a tenant of s GPUs takes GPUs o..o+s-1 with o a
multiple of s. On 8 GPUs that is 15 definitions: one of 8, two of 4, four of 2, eight of 1. Under Hopper's
protected PCIe ("protected-pcie") the whole GPU complex goes to one tenant: a request for fewer GPUs than the
node holds still gets all of them (they are passed to its VM together), and no second tenant fits.

Partition ids are ccbridge's own (the Fabric Manager numbers its partitions its own way): heap order over
the buddy tree, id = n/size - 1 + offset/size. On 8 GPUs: 0 = GPUs 0-7; 1-2 = the 4s (0-3, 4-7);
3-6 = the 2s; 7-14 = the single GPUs.

The plan (nvle) places requests largest first, each into the free aligned block of its size that sits in
the smallest wholly free aligned block (buddy best fit: it splits the least of the large free space), lowest
GPU first among equals. It maximises, in this order:
  1. the GPUs placed;
  2. then the larger tenants: the placed sizes, sorted largest first, compared as a sequence (one tenant
     of 4 before two of 2: small tenants find room later, a large one needs a whole aligned empty block);
  3. then the free space left whole: the count of wholly free aligned blocks of n GPUs, then of n/2, ...
     down to 1 (so the largest tenant still placeable is as large as it can be).
tests/test_tenants.py checks exactly this against a search over every placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ccbridge import results
from ccbridge.errors import ResultFileError, UsageError
from ccbridge.textfit import cut, wrap

GPU_COUNTS = (1, 2, 4, 8)  # an HGX baseboard holds 8; partitions halve it
SIZES = (1, 2, 4, 8)
MODES = ("nvle", "protected-pcie")
MAX_REQUESTS = 64
ACTIVATION = "activation by the host's Fabric Manager takes 10-20 s per tenant (Serialized Bridge paper)"


@dataclass(frozen=True)
class Partition:
    n: int       # GPUs of the node
    size: int
    offset: int  # its first GPU

    @property
    def id(self) -> int:
        return self.n // self.size - 1 + self.offset // self.size

    @property
    def gpus(self) -> frozenset[int]:
        return frozenset(range(self.offset, self.offset + self.size))


@lru_cache(maxsize=None)
def partitions(n: int, size: int | None = None) -> tuple[Partition, ...]:
    """The node's partition definitions (of one size, if given), in id order."""
    sizes = [s for s in SIZES if s <= n and (size is None or s == size)]
    return tuple(sorted((Partition(n, s, o) for s in sizes for o in range(0, n, s)), key=lambda p: p.id))


def free_blocks(n: int, taken: set[int] | frozenset[int]) -> tuple[int, ...]:
    """Wholly free aligned blocks per size, largest size first: the free space left whole."""
    return tuple(sum(not (p.gpus & taken) for p in partitions(n, s)) for s in reversed(SIZES) if s <= n)


def largest_free(n: int, taken: set[int] | frozenset[int]) -> int:
    """The largest tenant a free aligned block can still take (0: none)."""
    return max((p.size for p in partitions(n) if not (p.gpus & taken)), default=0)


@dataclass
class Tenant:
    request: int                  # its position in the request list, from 1
    size: int                     # GPUs asked for
    partition: Partition | None   # None: it does not fit
    why: str = ""                 # why not

    def as_dict(self) -> dict[str, Any]:
        p = self.partition
        return {"request": self.request, "size": self.size, "placed": p is not None,
                "gpus": sorted(p.gpus) if p else [], "partition_id": p.id if p else None, "why": self.why}


@dataclass
class Plan:
    n: int
    mode: str
    busy: frozenset[int]
    tenants: list[Tenant]         # in request order
    source: str | None = None     # the stamp the node's state came from
    notes: list[str] = field(default_factory=list)

    @property
    def placed(self) -> list[Tenant]:
        return [t for t in self.tenants if t.partition]

    @property
    def unplaced(self) -> list[Tenant]:
        """The tenants that did not fit: `ccbridge plan-tenants` exits 1 when there is one."""
        return [t for t in self.tenants if not t.partition]

    @property
    def taken(self) -> frozenset[int]:
        return self.busy.union(*(t.partition.gpus for t in self.placed))

    @property
    def free(self) -> list[int]:
        return [g for g in range(self.n) if g not in self.taken]

    @property
    def largest_placeable(self) -> int:
        if self.mode == "protected-pcie":
            return self.n if not self.taken else 0
        return largest_free(self.n, self.taken)

    def score(self) -> tuple:
        """The objective the module docstring defines (larger is better)."""
        sizes = sorted((t.size for t in self.placed), reverse=True)
        return sum(sizes), tuple(sizes), free_blocks(self.n, self.taken)

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": self.n, "mode": self.mode, "busy": sorted(self.busy), "source": self.source,
                "placed": len(self.placed), "unplaced": len(self.unplaced),  # the verdict: exit 1 when any is unplaced
                "tenants": [t.as_dict() for t in self.tenants], "free_gpus": self.free,
                "largest_placeable": self.largest_placeable, "partition_ids": _id_legend(self.n),
                "notes": self.notes + [ACTIVATION + ": context, not a measurement"]}


def check(n: int, requests: list[int], mode: str, busy) -> frozenset[int]:
    """Refuse what is not a node, a partition size, a mode or a GPU of the node; the busy GPUs as a set."""
    if n not in GPU_COUNTS:
        raise UsageError(f"{n} GPUs: a node is partitioned in aligned halves, so it has 1, 2, 4 or 8 GPUs")
    if mode not in MODES:
        raise UsageError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    if not requests:
        raise UsageError("no tenant requested: give the sizes, e.g. 4 2 2 1")
    if len(requests) > MAX_REQUESTS:
        raise UsageError(f"{len(requests)} tenants requested: at most {MAX_REQUESTS}")
    for s in requests:
        if s not in SIZES:
            raise UsageError(f"tenant size {s}: a fabric partition holds 1, 2, 4 or 8 GPUs")
    busy = list(busy)
    for g in busy:
        if not 0 <= g < n:
            raise UsageError(f"busy GPU {g}: the node's GPUs are 0..{n - 1}")
    if len(set(busy)) != len(busy):
        raise UsageError(f"busy GPUs {','.join(map(str, busy))}: a GPU is given twice")
    return frozenset(busy)


def _host(p: Partition, taken: frozenset[int]) -> int:
    """The size of the largest wholly free aligned block holding p."""
    size = p.size
    while size * 2 <= p.n and not (Partition(p.n, size * 2, p.offset // (size * 2) * size * 2).gpus & taken):
        size *= 2
    return size


def plan(n: int, requests: list[int], mode: str = "nvle", busy=(), source: str | None = None) -> Plan:
    """Place tenants of the requested sizes on the node's partitions (see the module docstring)."""
    busy = check(n, requests, mode, busy)
    tenants = [Tenant(i + 1, s, None) for i, s in enumerate(requests)]
    taken = busy
    for t in sorted(tenants, key=lambda t: -t.size):  # stable: request order among equal sizes
        if t.size > n:
            t.why = f"larger than the {n}-GPU node"
        elif mode == "protected-pcie":
            if taken:
                t.why = "protected PCIe gives the whole GPU complex to one tenant, and it is taken"
            else:
                t.partition = Partition(n, n, 0)
        else:
            free = [p for p in partitions(n, t.size) if not (p.gpus & taken)]
            if free:
                t.partition = min(free, key=lambda p: (_host(p, taken), p.offset))
            else:
                t.why = f"no wholly free aligned block of {t.size} GPU{'s' * (t.size > 1)}"
        if t.partition:
            taken = taken | t.partition.gpus
    out = Plan(n, mode, busy, tenants, source)
    out.notes += [f"request #{t.request} asked for {t.size} GPU{'s' * (t.size > 1)} and holds all {n}: "
                  "protected PCIe passes the whole complex" for t in out.placed if t.partition.size > t.size]
    return out


def from_stamp(path: str | Path) -> tuple[int, str, frozenset[int]]:
    """(GPUs, multi-GPU CC mode, GPUs held by active partitions) from `ccbridge env --json` or a result.json.

    Reads nvml.gpus (the visible GPUs: run it where the whole baseboard is visible), nvml.cc.multi_gpu_mode
    and nvml.fabric.cliques (each {"cluster_uuid", "clique_id", "gpus": [indices]}: an active partition,
    its GPUs held by a tenant).
    """
    env, _ = results.read_stamped(path, "pass a result.json or `ccbridge env --json` output")
    nv = env.get("nvml") or {}
    gpus = nv.get("gpus")
    if not nv.get("available") or not isinstance(gpus, list) or not gpus:
        raise ResultFileError(f"{path}: the stamp saw no GPU ({cut(nv.get('error') or 'nvml.gpus is empty', 50)})")
    n = len(gpus)
    if n not in GPU_COUNTS:
        raise ResultFileError(f"{path}: the stamp sees {n} GPUs; a partitioned node shows 1, 2, 4 or 8 "
                              "(run `ccbridge env --json` where the whole baseboard is visible)")
    cc = nv.get("cc") if isinstance(nv.get("cc"), dict) else {}
    mode = cc.get("multi_gpu_mode")
    if mode is None:
        stale = "returned 25" in str(cc.get("settings_error", ""))  # ccbridge before 2026-11-25 passed the struct wrong
        raise ResultFileError(f"{path}: the stamp has no multi-GPU CC mode" + (
            " (older ccbridge: take the stamp again)" if stale else
            f" (nvml.cc.multi_gpu_mode{': ' + str(cc['settings_error'])[:60] if cc.get('settings_error') else ''})"))
    if mode == "none":
        raise ResultFileError(f"{path}: multi-GPU CC mode is none: one GPU per tenant, nothing to plan")
    if mode not in MODES:
        raise ResultFileError(f"{path}: multi-GPU CC mode {mode!r:.40}: expected one of {', '.join(MODES)}")
    fabric = nv.get("fabric")
    cliques = fabric.get("cliques") if isinstance(fabric, dict) else None
    if cliques is None:
        raise ResultFileError(f"{path}: no fabric state (nvml.fabric.cliques): give --gpus, --mode and --busy")
    if not isinstance(cliques, list):
        raise ResultFileError(f"{path}: nvml.fabric.cliques must be a list, not {type(cliques).__name__}")
    busy: set[int] = set()
    for i, c in enumerate(cliques):
        held = c.get("gpus") if isinstance(c, dict) else None
        if not isinstance(held, list) or not all(type(g) is int and 0 <= g < n for g in held):
            raise ResultFileError(f"{path}: nvml.fabric.cliques[{i}].gpus must list GPU indices 0..{n - 1}")
        if busy & set(held) or len(set(held)) != len(held):
            raise ResultFileError(f"{path}: nvml.fabric.cliques[{i}] lists a GPU that another clique holds")
        if mode == "nvle" and held and set(held) not in [p.gpus for p in partitions(n)]:
            raise ResultFileError(f"{path}: nvml.fabric.cliques[{i}] holds GPUs {_gpus(held)}, not a fabric "
                                  f"partition of {n} (aligned 1, 2, 4 or 8)")
        busy |= set(held)
    return n, mode, frozenset(busy)


def _gpus(gpus) -> str:
    """GPU indices for people: 4-7, or 0,3."""
    g = sorted(gpus)
    if not g:
        return "-"
    return f"{g[0]}-{g[-1]}" if len(g) > 1 and g[-1] - g[0] == len(g) - 1 else ",".join(map(str, g))


def _id_legend(n: int) -> str:
    parts = []
    for s in reversed(SIZES):
        if s <= n:
            ids = [p.id for p in partitions(n, s)]
            parts.append(f"{_gpus(ids)} = {'all ' + str(n) if s == n else str(s) + 's'}")
    return "ids " + ", ".join(parts) + " (ccbridge's numbering, lowest GPU first)"


def render(p: Plan) -> str:
    mode = "NVLink encryption, fabric partitions (nvle)" if p.mode == "nvle" else "protected PCIe (whole complex)"
    lines = [f"# {p.n} GPU{'s' * (p.n > 1)}, {mode}; busy before: {_gpus(p.busy)}"
             + (f" (from {p.source})" if p.source else "")]
    lines.append(f"{'tenant':<7} {'size':>4}  {'GPUs':<7} {'partition':>9}")
    lines += [f"#{t.request:<6} {t.size:>4}  {_gpus(t.partition.gpus):<7} {t.partition.id:>9}" for t in p.placed]
    lines += [f"not placed: #{t.request} ({t.size} GPU{'s' * (t.size > 1)}): {t.why}" for t in p.unplaced]
    if p.unplaced and p.mode == "nvle":  # which tenants win, said where some lose
        lines.append("rule: most GPUs placed, then larger tenants, then most free space left whole (README: "
                     "Planning confidential tenants)")
    lines.append(f"free GPUs: {_gpus(p.free)} ({len(p.free)}); largest tenant still placeable: "
                 + (f"{p.largest_placeable} GPU{'s' * (p.largest_placeable > 1)}" if p.largest_placeable else "none"))
    lines += p.notes
    if p.source:  # what a stamp can and cannot see
        lines += wrap(["busy = GPUs the stamp saw in an active fabric partition (clique); a stamp sees only the GPUs "
                       "of the machine or tenant it ran in, never another tenant's: take it where the whole baseboard "
                       "is visible"])
    # the fabric's partitions (nvle); protected PCIe gives the whole complex to one tenant
    lines.append(f"partition {_id_legend(p.n)}" if p.mode == "nvle" else "partition 0 = the whole GPU complex")
    lines.append(f"{ACTIVATION}: context, not measured here")
    return "\n".join(lines)
