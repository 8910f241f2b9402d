"""The device a serving component runs on, checked where the component is made."""

from __future__ import annotations

import torch

from ccbridge.errors import UsageError


def resolve(device, who: str) -> torch.device:
    """device as torch names it (None: "cuda"); a CUDA device torch cannot use is refused in one line that names
    the CPU alternative, not left to fail inside torch (pin_memory, the first allocation)."""
    try:
        dev = torch.device(device if device is not None else "cuda")
    except (RuntimeError, TypeError):
        raise UsageError(f"{who}: {device!r} is not a device torch knows ('cuda', 'cuda:1', 'cpu')") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"{who}: torch sees no GPU for {str(dev)!r}; device='cpu' runs it on the CPU")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"{who}: {dev} is not there (torch sees {torch.cuda.device_count()} GPU(s))")
    return dev
