"""Each fused GEMV shape's tile measured on the GPU that runs it, when the engine builds, and cached (issue 31).

serve/gemv.py's kernel takes a tile (BLOCK_N rows a program, BLOCK_K a step along K, warps), and the best one is
shape- and GPU-dependent: bench/gemv.py (HBM-cold weights, CUDA graphs) found rule()'s tile 4-39% slower than the
best at llama-8b's shapes on one H200, and another H200 preferred other tiles. So, as engines do, the engine times
a compact set of candidates per (N, K, prologue) on its own GPU at build, reading the weights cold as a step reads
them (its own per-layer weights of that shape in turn: 32 layers of one shape pass the L2 many times, no extra
memory), and keeps the fastest; rule()'s tile where it is within TIE of the fastest (a tile that timing noise alone
would not move). The choice is cached in the process (by GPU name and shape) and on disk, as JSON in
$XDG_CACHE_HOME (else ~/.cache; none without a home folder)/ccbridge/gemv-tiles.json, keyed by GPU name, torch and
triton versions and shape: a corrupt or unreadable file is ignored with a one-line warning and rewritten, a tile
there that is none of the shape's candidates is timed again, and it is written atomically (a temporary file
renamed over it), since the ranks of one job tune at once. CCBRIDGE_GEMV_TUNE=0 turns tuning off:
the rule's tiles (gemv.tile(), which also honours gemv.TUNED, bench/tp_step.py --tiles's override).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable

import torch

from ccbridge import gputimer, textfit
from ccbridge.emulate import interposer
from ccbridge.emulate import trace as emu_trace
from ccbridge.serve import gemv

ENV = "CCBRIDGE_GEMV_TUNE"  # "0": no tuning, the rule's tiles
TIE = 0.02  # rule()'s tile wins where within 2% of the fastest: the same choice from run to run where they tie
REPS = 64  # calls a timed CUDA graph holds at least (one per weight in turn)
COLD_BYTES = 256 << 20  # weights a timing cycles through at least (4x the L2 where that is more; an H200's: 50 MiB)
MAX_COPIES = 256  # clones a timing adds to a shape's weights to pass the L2 (a tiny shape stays partly warm)
FORMAT = 1  # the cache file's layout

Shape = tuple[int, int, str]  # (N, K, prologue: "norm", "silu" or "")
Tile = tuple[int, int, int]  # (BLOCK_N, BLOCK_K, warps)

# (BLOCK_N, BLOCK_K, warps), clamped to each shape by candidates(). bench/gemv.py's fastest on one H200 (weights
# cold, 2026-11-27), us against rule()'s: llama-8b TP4 qkv 1536x4096 8/2048/8 (6.73 vs 9.24), o 4096x1024 2/1024/4
# (4.35 vs 4.53), gate-up 7168x4096 32/512/4 (19.92 vs 22.89), down 4096x3584 4/512/8 (10.65 vs 14.84); TP1 qkv
# 6144x4096 16/1024/4 (16.40 vs 21.84), o 4096x4096 2/4096/4 (10.31 vs 15.56), gate-up 28672x4096 4/512/4 (64.30 vs
# 79.26), down 4096x14336 4/2048/4 (31.65 vs 51.76); another H200 (a grid of BLOCK_K <= 512): qkv 4/512/4, down
# 4/512/8. Those 8, rule()'s 2/512/4 and 8/512/4, and one neighbour between winners on each axis they spread along:
# 8/1024/4 (8/2048/8 - 16/1024/4), 16/512/4 (8/512/4 - 32/512/4), 2/2048/4 (2/1024/4 - 2/4096/4), 4/1024/4
# (4/512/4 - 4/2048/4). The whole step at the measured tiles: TP4 2.35x -> 2.09x its roofline, TP1 1.57x -> 1.49x.
CANDIDATES: tuple[Tile, ...] = (
    (2, 512, 4), (2, 1024, 4), (2, 2048, 4), (2, 4096, 4),
    (4, 512, 4), (4, 512, 8), (4, 1024, 4), (4, 2048, 4),
    (8, 512, 4), (8, 1024, 4), (8, 2048, 8),
    (16, 512, 4), (16, 1024, 4), (32, 512, 4))

CHOSEN: dict[tuple[str, int, int, str], Tile] = {}  # (GPU name, N, K, prologue) -> a tile chosen in this process


def tunes(dev) -> bool:
    """Whether the engine times its tiles on dev: a GPU (on a CPU the kernel runs under Triton's interpreter)."""
    return torch.device(dev).type == "cuda"


def enabled() -> bool:
    """Whether the engine tunes its GEMV tiles (CCBRIDGE_GEMV_TUNE unset or anything but 0)."""
    return os.environ.get(ENV, "1").strip() != "0"


def cache_path() -> Path | None:
    """The tile cache: $XDG_CACHE_HOME/ccbridge/gemv-tiles.json, ~/.cache's where that is unset or relative (as the
    XDG spec says); None without a home folder either (HOME unset and a uid with no passwd entry, as in some
    containers: expanduser() then answers '~' itself, a folder of that name under the working folder)."""
    xdg, home = os.environ.get("XDG_CACHE_HOME", ""), os.path.expanduser("~")
    base = xdg if os.path.isabs(xdg) else os.path.join(home, ".cache") if os.path.isabs(home) else None
    return Path(base) / "ccbridge" / "gemv-tiles.json" if base else None


def device_name(dev) -> str:
    """The GPU's name as the cache keys it (a CPU: 'cpu')."""
    dev = torch.device(dev)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type


def versions() -> str:
    """torch's and triton's versions: a tile measured with other kernels' code is not reused."""
    try:
        import triton  # deferred: triton (its import costs start-up only the GPU path needs)
        tv = triton.__version__
    except ImportError:
        tv = "none"
    return f"torch {torch.__version__}, triton {tv}"


def key(name: str, shape: Shape) -> str:
    """A shape's entry in the cache file: GPU name, versions, N x K, prologue."""
    n, k, prologue = shape
    return f"{name} | {versions()} | {n}x{k} | {prologue or '-'}"


def candidates(n: int, k: int) -> list[Tile]:
    """CANDIDATES and rule()'s tile for an (n, k) weight, each block clamped to the next power of two of n and of k
    (rows or a K step past the weight's end read nothing), without repeats, in order."""
    cap_n, cap_k = 1 << max(n - 1, 0).bit_length(), 1 << max(k - 1, 0).bit_length()
    out: list[Tile] = []
    for bn, bk, warps in CANDIDATES + (gemv.rule(n, k),):
        t = (min(bn, cap_n), min(bk, cap_k), warps)
        if t not in out:
            out.append(t)
    return out


def choose(times: dict[Tile, float], rule: Tile) -> Tile:
    """The fastest tile of times (us); rule's where it was timed and is within TIE of it."""
    best = min(times, key=times.__getitem__)
    return rule if rule in times and times[rule] <= times[best] * (1 + TIE) else best


def cold_us(ws: list[torch.Tensor], prologue: str, tile_nkw: Tile) -> float:
    """The fused GEMV's time per call (us) at a tile, each call on the next of the weights ws (one shape) as a
    decode step reads them, from HBM: ws (and clones of ws[0] where they are short of passing the L2 COLD_BYTES or
    4x over) in turn, max(REPS, their number) calls captured in one CUDA graph (gputimer.graphed), the median of 5
    replays by the run's GPU timer (bench/gemv.py's measure())."""
    n, k = ws[0].shape
    dev, dt, each = ws[0].device, ws[0].dtype, ws[0].numel() * ws[0].element_size()
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20)
    short = max(COLD_BYTES, 4 * l2) - each * len(ws)
    ws = list(ws) + [ws[0].clone() for _ in range(min(MAX_COPIES, math.ceil(short / each)) if short > 0 else 0)]
    g = torch.Generator(device=dev).manual_seed(n * 7 + k)
    x = torch.randn(2 * k if prologue == "silu" else k, device=dev, generator=g).to(dt)
    norm = prologue == "norm"
    res = torch.randn(k, device=dev, generator=g).to(dt) if norm else None
    nw = torch.rand(k, device=dev, generator=g).to(dt) if norm else None
    reps = max(REPS, len(ws))
    graph, _ = gputimer.graphed(torch, lambda: [
        gemv.gemv(ws[i % len(ws)], x, res=res, norm_w=nw, silu=prologue == "silu", tile_nkw=tile_nkw)
        for i in range(reps)])
    return statistics.median(gputimer.time_ms(torch, graph.replay, 5)) * 1e3 / reps


def _warn(text: str) -> None:
    print(textfit.cut(f"ccbridge: {text}", textfit.WIDTH), file=sys.stderr, flush=True)


def _tile_of(value) -> Tile:
    if not (isinstance(value, list) and len(value) == 3 and
            all(type(v) is int and v > 0 and not v & (v - 1) for v in value)):
        raise ValueError(f"{value!r} is not a tile of 3 powers of two")
    return tuple(value)


def load(path: Path, warn: bool = True) -> dict[str, Tile]:
    """The cache file's tiles by key(); {} where it is absent, and where it cannot be read or is not this cache's
    layout (with a one-line warning on stderr where warn: the file is rewritten after tuning)."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("tiles"), dict):
            raise ValueError(f"not format {FORMAT} of this cache")
        return {k: _tile_of(v) for k, v in data["tiles"].items()}
    except (FileNotFoundError, NotADirectoryError):  # none yet (save() says where it cannot be written)
        return {}
    except (OSError, ValueError, RecursionError) as e:  # a JSON or UTF-8 error is a ValueError
        if warn:
            _warn(f"GEMV tile cache ignored and rewritten ({textfit.json_why(e)}): {path}")
        return {}


def save(path: Path, tiles: dict[str, Tile]) -> None:
    """tiles merged into the cache file as it is now (another rank may have just written it), written atomically: a
    temporary file in its folder renamed over it. A folder that cannot be written: a warning (the tiles are still
    used)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**load(path, warn=False), **tiles}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump({"format": FORMAT, "tiles": {k: list(v) for k, v in sorted(merged.items())}}, fh, indent=1)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        _warn(f"GEMV tile cache not written ({e.strerror or e}): {path}")


def tune(shapes: Iterable[Shape], dev, weights: dict[Shape, list[torch.Tensor]] | None = None,
         dtype: torch.dtype = torch.bfloat16, timer: Callable[[list, str, Tile], float] | None = None,
         path: Path | None = None, progress: bool = True) -> dict[Shape, Tile]:
    """Each (N, K, prologue)'s tile on dev: gemv.TUNED's (an override) where it has one; else this process's or the
    cache file's (path: cache_path()) choice for this GPU and versions; else candidates() timed by timer(weights,
    prologue, tile) -> us (cold_us: CUDA graphs) on weights[shape] (the caller's weights of that shape, read in turn;
    a random weight of dtype where absent), the fastest, or rule()'s within TIE, cached. With CCBRIDGE_GEMV_TUNE=0,
    gemv.tile()'s. progress: a line on stderr once tuning has taken a second."""
    shapes = list(dict.fromkeys((int(n), int(k), p) for n, k, p in shapes))
    if not enabled():
        return {s: gemv.tile(s[0], s[1]) for s in shapes}
    name, path = device_name(dev), Path(path) if path else cache_path()  # None: no disk cache
    out: dict[Shape, Tile] = {}
    disk = None
    for s in shapes:
        if s[:2] in gemv.TUNED:
            out[s] = gemv.TUNED[s[:2]]
        elif (name, *s) in CHOSEN:
            out[s] = CHOSEN[(name, *s)]
        else:
            disk = (load(path) if path else {}) if disk is None else disk
            if disk.get(key(name, s)) in candidates(*s[:2]):  # an edited or stale file's other tile: timed again
                out[s] = CHOSEN[(name, *s)] = disk[key(name, s)]
    todo = [s for s in shapes if s not in out]
    if todo:
        _measure(todo, dev, name, path, out, weights or {}, dtype, timer or cold_us, progress)
    return {s: out[s] for s in shapes}


def adopt(tiles: dict[Shape, Tile], dev, path: Path | None = None) -> dict[Shape, Tile]:
    """tiles (another rank's choice, say) as this process's and the cache file's choice on dev, where tuning is on
    and no override (gemv.TUNED) holds the shape; returns tiles."""
    if not enabled():
        return tiles
    name, path = device_name(dev), Path(path) if path else cache_path()
    mine = {s: t for s, t in tiles.items() if s[:2] not in gemv.TUNED}
    CHOSEN.update({(name, *s): t for s, t in mine.items()})
    if path and mine:
        save(path, {key(name, s): t for s, t in mine.items()})
    return tiles


def _measure(todo: list[Shape], dev, name: str, path: Path | None, out: dict, weights: dict, dtype, timer,
             progress: bool) -> None:
    """tune()'s timing of the shapes no cache held, into out, CHOSEN and the cache file (where there is one). Under
    `ccbridge run`, with emulation and the trace paused: a timed replay's tolls would weigh on the choice (and be
    cached for native runs), and the tuning's launches are no part of the program's trace."""
    say = threading.Timer(1.0, _warn, (f"tuning {len(todo)} GEMV shape{'s' * (len(todo) > 1)} on {name} "
                                       f"({f'cached in {path}' if path else 'not cached: no home folder'})",))
    if progress:
        say.start()
    try:
        with torch.no_grad(), interposer.emulation_paused(required=False), emu_trace.paused(required=False):
            for s in todo:
                n, k, prologue = s
                ws = weights.get(s) or [(torch.randn(n, k, device=dev) * 0.02).to(dtype)]
                times = {t: timer(ws, prologue, t) for t in candidates(n, k)}
                out[s] = CHOSEN[(name, *s)] = choose(times, gemv.rule(n, k))
    finally:
        say.cancel()
    if path:
        save(path, {key(name, s): out[s] for s in todo})
