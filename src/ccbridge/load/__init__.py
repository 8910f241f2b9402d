"""CC-aware safetensors loading: checkpoints to the GPU at the bridge's ceiling.

    from ccbridge import load_safetensors
    state = load_safetensors("ckpt/", device="cuda:0")

See loader.py for the order of work, policy.py for how the pool is sized,
engine.py for the pool, header.py for the format rules.
"""

from ccbridge.load import loader, policy
from ccbridge.load.engine import LoadError, Pool, PoolConfig
from ccbridge.load.header import Header, HeaderError, TensorInfo, read_header
from ccbridge.load.loader import LoadStats, iter_safetensors, load_safetensors
from ccbridge.load.policy import choose as choose_pool


def prewarm(device="cuda:0", *, workers: int | None = None, contexts: int | None = None, staging: str | None = None,
            chunk_bytes: int | None = None, buffers: int | None = None) -> Pool:
    """A pool for `device`, sized by policy (overrides as in iter_safetensors), already
    prewarming: make it early (while the model is built) and pass it as pool=. One load at a
    time runs on it: a load started while another holds it raises LoadError, and leaves that one be."""
    import torch  # deferred: torch, an optional dependency (seconds of import)

    _, index = loader.resolve_device(torch, device)
    return Pool(policy.for_device(index, workers=workers, contexts=contexts, staging=staging, chunk_bytes=chunk_bytes,
                                  buffers=buffers).config)


__all__ = ["Header", "HeaderError", "LoadError", "LoadStats", "Pool", "PoolConfig", "TensorInfo",
           "choose_pool", "iter_safetensors", "load_safetensors", "prewarm", "read_header"]
