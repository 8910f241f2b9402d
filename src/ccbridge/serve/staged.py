"""Host inputs to the device without waiting for the compute stream.

Under GPU-CC an H2D copy issued on a busy stream holds the calling thread
until the stream reaches it; on an idle stream it pays only its own transfer
(bridge law, property 2). StagedH2D therefore copies host inputs into
persistent device staging on a prep stream of its own, which is idle, and
makes the compute stream wait for that copy with an event before a
device-to-device move into place: the scheduler thread never waits for the
forward pass. Packing sends many small per-step tensors (positions, slot
mappings, sampling parameters) as one crossing: each crossing pays a toll.
"""

from __future__ import annotations

import torch

from ccbridge.errors import UsageError
from ccbridge.serve import devices

ALIGN = 64  # bytes: every packed tensor starts on a boundary any dtype accepts


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Byte offsets of each tensor in one packed buffer, and its total size."""
    offsets, end = [], 0
    for t in tensors:
        offsets.append(end)
        end = -(-(end + _nbytes(t)) // ALIGN) * ALIGN
    return offsets, end


def pack_into(buf: torch.Tensor, tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Copy host tensors into the uint8 host buffer buf; their offsets and the bytes used."""
    offsets, total = layout(tensors)
    if total > buf.numel():
        raise UsageError(f"packed inputs need {total} bytes, the staging holds {buf.numel()}")
    for t, o in zip(tensors, offsets):
        if t.is_cuda:
            raise UsageError("pack: inputs must be host tensors")
        buf[o:o + _nbytes(t)].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return offsets, total


def views(buf: torch.Tensor, like: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    """Tensors of like's shapes and dtypes over the packed bytes of buf."""
    return [buf[o:o + _nbytes(t)].view(t.dtype).view(t.shape) for t, o in zip(like, offsets)]


class StagedH2D:
    """Host tensors to the device through persistent staging on an idle prep stream.

        stage = StagedH2D(capacity=1 << 20, device="cuda:0")
        ids, pos = stage.put([input_ids, positions])   # device tensors, ready on the current stream

    capacity: bytes per step (all tensors of one put, packed). slots: steps in
    flight before a slot is reused (the slot's previous move must have left
    it, which the prep stream waits for, not the host). The returned tensors
    are fresh device tensors owned by the caller, ordered after the copy on
    the stream that was current when put() was called.
    """

    def __init__(self, capacity: int, device=None, slots: int = 2, pin: bool = True):
        if not isinstance(capacity, int) or capacity < 1:
            raise UsageError(f"capacity must be a positive number of bytes, not {capacity!r}")
        if not isinstance(slots, int) or slots < 1:
            raise UsageError(f"slots must be a whole number >= 1, not {slots!r}")
        self.device = devices.resolve(device, "StagedH2D")
        cuda = self.device.type == "cuda"
        self.capacity = -(-capacity // ALIGN) * ALIGN
        self._host = [torch.empty(self.capacity, dtype=torch.uint8, pin_memory=pin and cuda) for _ in range(slots)]
        self._dev = [torch.empty(self.capacity, dtype=torch.uint8, device=self.device) for _ in range(slots)]
        self._prep = torch.cuda.Stream(self.device) if cuda else None
        self._copied = [torch.cuda.Event() if cuda else None for _ in range(slots)]
        self._moved = [None] * slots  # event: the compute stream has moved the slot's bytes out
        self._next = 0

    def put(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        k = self._next
        self._next = (k + 1) % len(self._dev)
        done = self._copied[k]
        if done is not None and self._moved[k] is not None and not done.query():
            done.synchronize()  # host slot k is rewritten now: its last crossing must have read it
        offsets, n = pack_into(self._host[k], tensors)
        if self._prep is None:  # CPU: the same packing, no streams
            return views(self._host[k][:n].clone(), tensors, offsets)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._prep):
            if self._moved[k] is not None:
                self._prep.wait_event(self._moved[k])  # device slot k: its last move has left it
            self._dev[k][:n].copy_(self._host[k][:n], non_blocking=True)  # one crossing, on an idle stream
            done.record(self._prep)
        compute.wait_event(done)
        out = self._dev[k][:n].clone()  # one device-to-device copy on the compute stream, owned by the caller
        moved = torch.cuda.Event()
        moved.record(compute)
        self._moved[k] = moved
        return views(out, tensors, offsets)
