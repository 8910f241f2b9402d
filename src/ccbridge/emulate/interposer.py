"""Switches of the interposer a program runs under (`ccbridge run`), reached from inside that program.

`ccbridge run` puts the interposer's path in the program's environment (LIB_ENV); its switches are
exported functions of that library (EMU_API in native/emu/emu.h), each taking 1 (off) or 0 (on again)
and answering whether it was on:

- ccbemu_trace_pause: the trace stops writing lines (trace.paused());
- ccbemu_emulate_pause: the hooks pass calls through without the bridge's costs, as under the passthrough
  profile (emulation_paused()): the same process with and without CC, for measurements paired within one
  process, free of the few-us differences between processes.
"""

from __future__ import annotations

import contextlib
import os

from ccbridge.bindings import emu
from ccbridge.emulate import sites
from ccbridge.errors import EmulatorError

LIB_ENV = sites.recorder.LIB_ENV  # set by `ccbridge run` in the program's environment: the interposer's path


def switch(name: str, required: bool, needs: str):
    """The interposer's function `name` (int -> int), or None outside `ccbridge run` when not required.
    needs: what a caller outside `ccbridge run` is told it takes."""
    path = os.environ.get(LIB_ENV)
    if not path:
        if not required:
            return None
        raise EmulatorError(f"{needs}; no interposer here")
    try:
        return emu.function(path, name)
    except (OSError, AttributeError) as e:
        raise EmulatorError(f"cannot reach the interposer's {name} in {path}: {e}") from e


def _emulation(required: bool):
    return switch("ccbemu_emulate_pause", required, "emulation_paused() works inside `ccbridge run --profile P`")


@contextlib.contextmanager
def emulation_paused(required: bool = True):
    """Inside, the interposer adds none of the bridge's costs; emulation resumes when the last of nested or
    concurrent regions ends. Meant for regions between CUDA calls: a call in flight on another thread may see
    either state. Yields whether it was emulating. The trace, if any, goes on recording."""
    fn = _emulation(required)
    was = bool(fn(1)) if fn else False
    try:
        yield was
    finally:
        if fn:
            fn(0)


def emulating() -> bool:
    """Whether the interposer adds the bridge's costs now (False outside `ccbridge run --profile P`)."""
    with emulation_paused(required=False) as was:
        return was
