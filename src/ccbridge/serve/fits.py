"""Whether a preset's weights fit the device before any process builds them: a GPU a rank holds its shard; on the
CPU every rank's shard is in this machine's memory at once."""

from __future__ import annotations

import torch

from ccbridge import hostmem
from ccbridge.choices import DECODE_PRESETS
from ccbridge.errors import UsageError

GPU_ROOM = 0.92  # of a GPU's memory for the weights: the rest for activations, the KV cache and the context
CPU_ROOM = 0.8  # of the memory available now: the ranks' interpreters, activations and the page cache


def shard_bytes(model: str, n: int, itemsize: int) -> float:
    """One of n ranks' weights: its 1/n of the layers (attention and MLP), and the embeddings and LM head whole
    (serve/engine.py replicates them)."""
    spec = DECODE_PRESETS[model]
    h, v, layers, inter = spec["hidden_size"], spec["vocab_size"], spec["num_hidden_layers"], spec["intermediate_size"]
    kv = h // spec["num_attention_heads"] * spec["num_key_value_heads"]
    layer = h * (h + 2 * kv) + h * h + 3 * h * inter
    return (layers * layer / n + (1 if spec["tie_word_embeddings"] else 2) * v * h) * itemsize


def check(model: str, degrees: list[int], dev: torch.device, dtype: torch.dtype, tp: bool = True) -> None:
    """A UsageError before anything is built where a degree's weights do not fit: on CUDA one rank's shard against
    its GPU, on the CPU every rank's together against the memory available."""
    itemsize = dtype.itemsize
    what = f"--tp {{n}}: {model}'s shard" if tp else f"{model}"
    for n in sorted(degrees):
        need = shard_bytes(model, n, itemsize)
        if dev.type == "cuda":
            total = torch.cuda.get_device_properties(dev).total_memory
            if need > GPU_ROOM * total:
                raise UsageError(f"{what.format(n=n)} is {need / 2**30:.0f} GiB, over {GPU_ROOM:.0%} of this GPU's "
                                 f"{total / 2**30:.0f} GiB" +
                                 (f": give degrees of {int(need / total / GPU_ROOM) + 1} or more" if tp else ""))
        elif (avail := hostmem.available_bytes()) is not None and n * need > CPU_ROOM * avail:
            ranks = f" x {n} ranks" if tp else ""
            raise UsageError(f"{what.format(n=n)}, {need / 2**30:.1f} GiB of {str(dtype).removeprefix('torch.')}"
                             f"{ranks} on the CPU; {avail / 2**30:.1f} GiB free")
