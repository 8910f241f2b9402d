"""Synthetic checkpoints shaped like a large model, full of random bytes.

A decoder-only transformer's tensor mix (embedding, per layer attention with
grouped KV heads, a gated MLP, norms; an LM head), scaled to the size asked
for: bf16 weights, f32 norms, every fourth layer's MLP in fp8 (F8_E4M3) with
f32 scales, plus a few odd ones (a 0-dim step counter, an empty tensor, a
bool mask, u8, f16, F8_E5M2), sharded into files of about shard_bytes with
a model.safetensors.index.json, as Hugging Face writes them.

The bytes are random (never zeros, which hide misplaced writes): a seeded
block per shard, each 1 MiB block of the data section multiplied by its own
odd constant, so any byte landing at the wrong offset differs. Files are
written by streaming (no tensor is held in memory), the format by
header.py's rules; tests read them back with safetensors itself.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from ccbridge import ui
from ccbridge.errors import UsageError
from ccbridge.load.header import DTYPES
from ccbridge.textfit import cut

BLOCK = 1 << 20
GiB = 1 << 30
# Bare letters and KiB-style units are binary (as nccl-tests reads -b 8M); kB/MB/GB/TB are decimal.
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": GiB, "gib": GiB,
          "t": 1 << 40, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
KEEP_FREE = 256 << 20  # left free on the disk after a checkpoint is written
SIZE_FORMS = "e.g. 4096, 512K, 16MiB, 1.5G; 2GB is decimal"  # short: an option's name and the value go before it


def parse_size(text: str) -> int:
    """'32GiB', '512M', '2GB', '4096' -> bytes, at least 1; UsageError naming the accepted forms."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"not a size: {cut(text, 16)!r} ({SIZE_FORMS})")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value >= 2**63:  # a digit string too long for any file or buffer
        raise UsageError(f"size {cut(text, 16)!r} is too large (the limit is 2^63 bytes)")
    if int(value) < 1:
        raise UsageError(f"size {cut(text, 16)!r} is under one byte")
    if value != int(value):  # 1.5 or 1.1K (1126.4 B): which byte was meant is a guess
        raise UsageError(f"size {cut(text, 16)!r} is not a whole number of bytes ({value:g})")
    return int(value)


def _nbytes(dtype: str, shape) -> int:
    return math.prod(shape) * DTYPES[dtype][0] // 8


def layout(total_bytes: int, hidden: int | None = None) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of a model of about total_bytes."""
    if hidden is None:  # about 20 layers; 25.5 H^2 bytes per bf16 layer
        hidden = int(math.sqrt(total_bytes / 20 / 25.5)) // 64 * 64
        hidden = max(64, min(8192, hidden))
    h, kv, inter, vocab = hidden, max(64, hidden // 8), hidden * 7 // 2 // 64 * 64, min(128256, 16 * hidden)
    out = [
        ("meta.step", "I64", []),
        ("meta.empty", "F32", [0]),
        ("meta.mask", "BOOL", [1024]),
        ("meta.bytes", "U8", [1000]),
        ("meta.f16", "F16", [7, 33]),
        ("meta.e5m2", "F8_E5M2", [64, 3]),
        ("model.embed_tokens.weight", "BF16", [vocab, h]),
    ]
    used = sum(_nbytes(d, s) for _, d, s in out) + _nbytes("BF16", [vocab, h]) + _nbytes("F32", [h])
    layer = 0
    while True:
        p = f"model.layers.{layer}."
        fp8 = layer % 4 == 3
        mlp = "F8_E4M3" if fp8 else "BF16"
        ts = [(p + "input_layernorm.weight", "F32", [h]),
              (p + "self_attn.q_proj.weight", "BF16", [h, h]),
              (p + "self_attn.k_proj.weight", "BF16", [kv, h]),
              (p + "self_attn.v_proj.weight", "BF16", [kv, h]),
              (p + "self_attn.o_proj.weight", "BF16", [h, h]),
              (p + "post_attention_layernorm.weight", "F32", [h]),
              (p + "mlp.gate_proj.weight", mlp, [inter, h]),
              (p + "mlp.up_proj.weight", mlp, [inter, h]),
              (p + "mlp.down_proj.weight", mlp, [h, inter])]
        if fp8:
            ts += [(p + f"mlp.{n}_proj.weight_scale", "F32", []) for n in ("gate", "up", "down")]
        size = sum(_nbytes(d, s) for _, d, s in ts)
        if layer and used + size > total_bytes:
            break
        out += ts
        used += size
        layer += 1
    out += [("model.norm.weight", "F32", [h]), ("lm_head.weight", "BF16", [vocab, h])]
    return out


def shard(tensors, shard_bytes: int) -> list[list[tuple[str, str, list[int]]]]:
    """Consecutive tensors into shards of at most shard_bytes (a bigger tensor gets its own)."""
    shards, cur, size = [], [], 0
    for t in tensors:
        n = _nbytes(t[1], t[2])
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    if cur:
        shards.append(cur)
    return shards


def header_bytes(tensors) -> tuple[bytes, int]:
    """The 8-byte length + JSON header (space-padded to 8 bytes, as safetensors does), and the data length."""
    hdr, pos = {}, 0
    for name, dtype, shape in tensors:
        n = _nbytes(dtype, shape)
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, pos


def _write_shard(path: str, tensors, seed: int) -> int:
    """Write one shard under a .partial name, renamed when complete; its size."""
    tmp = path + ".partial"
    try:
        size = _stream(tmp, tensors, seed)
    except BaseException:  # interrupted or failed (disk full): no .partial left behind
        Path(tmp).unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return size


def _stream(tmp: str, tensors, seed: int) -> int:
    import numpy as np  # deferred: numpy, only for writing a synthetic checkpoint (100 ms of import)

    head, data_len = header_bytes(tensors)
    base = np.random.default_rng(seed).integers(1, 2**63, size=BLOCK // 8, dtype=np.uint64)
    block = np.empty_like(base)
    with open(tmp, "wb") as f:
        f.write(head)
        written, k = 0, 0
        bool_ranges = []
        pos = 0
        for _, dtype, shape in tensors:
            n = _nbytes(dtype, shape)
            if dtype == "BOOL":
                bool_ranges.append((pos, pos + n))
            pos += n
        while written < data_len:
            np.multiply(base, np.uint64((2 * k + 1) * 0x9E3779B97F4A7C15 % 2**64), out=block)
            np.bitwise_xor(block, np.uint64(k + 1), out=block)
            raw = block.view(np.uint8)
            n = min(BLOCK, data_len - written)
            for b, e in bool_ranges:  # bools are 0 or 1, as torch expects
                lo, hi = max(b, written), min(e, written + n)
                if lo < hi:
                    raw[lo - written:hi - written] &= 1
            f.write(memoryview(raw)[:n])
            written += n
            k += 1
    return len(head) + data_len


def _check_space(out: Path, need: int, replaced: list[Path]) -> None:
    """need bytes fit, counting as free the files this call writes over (a rerun into the same folder)."""
    free = shutil.disk_usage(ui.nearest_existing(out)).free + sum(f.stat().st_size for f in replaced if f.is_file())
    if need + KEEP_FREE > free:
        raise UsageError(f"not enough free space in {out}: needs {need / GiB:.2f} GiB (+{KEEP_FREE / GiB:.2f} kept "
                         f"free), {free / GiB:.2f} GiB free")


def make_checkpoint(out_dir: str | os.PathLike, total_bytes: int, shard_bytes: int = 4 * GiB, seed: int = 0,
                    hidden: int | None = None, jobs: int | None = None, progress=None) -> list[str]:
    """Write the shards and the index; the shard paths. progress(i, n) after each shard.

    Checked before the first byte: sizes positive, the folder writable (made, its parent not), the
    disk holding the checkpoint plus KEEP_FREE. On any failure or interrupt
    the shards of this call are removed: a folder of shards without its index
    would load as a smaller checkpoint.
    """
    if total_bytes < 1 or shard_bytes < 1:
        raise UsageError(f"sizes must be positive: total {total_bytes}, shard {shard_bytes} bytes")
    # a used folder is refused: new shards beside an old layout's would load as one checkpoint of both
    out = ui.writable_folder(out_dir, "output folder", fresh=("model.safetensors.index.json", "model-*.safetensors"))
    # the folder is made, not its parents, as every output file's folder must exist: a mistyped path
    # (/nonexist/ck) is one line, not a tree of new folders
    if not out.exists() and not out.parent.exists():
        raise UsageError(f"output folder {out_dir}: the folder {out.parent} does not exist")
    # The size asked first, before a layout of a size that will not fit is built; then the size it has.
    _check_space(out, total_bytes, list(out.glob("model-*.safetensors")))
    shards = shard(layout(total_bytes, hidden), shard_bytes)
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    heads = [header_bytes(s) for s in shards]  # (header, data length) per shard
    _check_space(out, sum(len(h) + d for h, d in heads), [out / nm for nm in names])
    made = not out.exists()
    out.mkdir(exist_ok=True)
    weight_map = {t[0]: names[i] for i, s in enumerate(shards) for t in s}
    jobs = jobs or max(1, min(n, (os.cpu_count() or 2) // 2))
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as ex:
            futs = [ex.submit(_write_shard, str(out / names[i]), s, seed * 1000003 + i) for i, s in enumerate(shards)]
            try:
                for i, f in enumerate(futs):
                    f.result()
                    if progress:
                        progress(i + 1, n)
            except BaseException:
                ex.shutdown(cancel_futures=True)  # shards not started never start; running ones end
                raise
    except BaseException:
        for name in names:
            (out / name).unlink(missing_ok=True)
            (out / (name + ".partial")).unlink(missing_ok=True)
        if made and not any(out.iterdir()):
            out.rmdir()
        raise
    # Hugging Face's total_size: the tensors' bytes, without the shards' headers
    index = {"metadata": {"total_size": sum(d for _, d in heads), "generator": "ccbridge make-checkpoint", "seed": seed},
             "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return [str(out / nm) for nm in names]
