"""The CC-aware serving settings for this process."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ccbridge.load import policy


@dataclass(frozen=True)
class ServeDefaults:
    cc: str                # "on", "emulated", "off" or "unknown" (NVML's CC state, or the emulator's)
    scheduling: str        # "sync": read step N, then prepare N+1; "async": launch N+1 before reading N
    drain: bool            # read back on a DrainWorker, off the scheduler thread
    staged_h2d: bool       # host inputs through StagedH2D (idle prep stream, packed)
    cuda_graphs: bool      # decode steps as CUDA graphs: one launch toll per step, not one per kernel
    host_memory: str       # "pinned" or "pageable" for host buffers that cross
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def cc_defaults() -> ServeDefaults:
    """CC on or emulated: async scheduling buys nothing (a readback holds the
    thread that issues it), so schedule synchronously unless a DrainWorker
    takes the readbacks; stage inputs on an idle stream; graphs; pinned host
    buffers only where the crossing API needs them (under CC pinned memory no
    longer has a fast path: bridge law, section 4). CC off: today's defaults; CC state unknown: the same,
    and `why` says the state is unknown."""
    state, _ = policy.cc_situation()  # one reading of the CC state for loader and server
    if state in ("on", "emulated"):
        return ServeDefaults(state, "async", True, True, True, "pageable",
                             "CC: every readback holds its thread until the stream reaches it, so readbacks go to a "
                             "DrainWorker (async scheduling then overlaps again), inputs cross once per step on an "
                             "idle stream, and CUDA graphs pay one launch toll per step")
    if state == "off":
        return ServeDefaults(state, "async", False, False, True, "pinned",
                             "CC off: copies are asynchronous DMA; async scheduling overlaps as designed")
    # unknown (NVML gave no CC mode): today's defaults, said as such, not as a CC-off reading
    return ServeDefaults(state, "async", False, False, True, "pinned",
                         "CC state unknown (NVML gave no CC mode; `ccbridge env` shows what it said): the CC-off "
                         "defaults; under CC every readback would hold the scheduler thread")
