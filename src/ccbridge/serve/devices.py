"""The device a serving component runs on, checked where the component is made."""

from __future__ import annotations

import torch

from ccbridge.errors import LoadError, UsageError
from ccbridge.load.loader import resolve_device


def resolve(device, who: str) -> torch.device:
    """device as the loader reads it (None: "cuda"; cpu, cuda, cuda:N, an index N or a torch.device of those): one
    UsageError naming who and the CPU alternative where torch cannot use it, not a failure inside torch
    (pin_memory, the first allocation)."""
    try:
        return resolve_device(torch, "cuda" if device is None else device)[0]
    except (LoadError, UsageError) as e:
        raise UsageError(f"{who}: {e}") from None
