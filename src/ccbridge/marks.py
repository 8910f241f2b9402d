"""Marks a program makes in its trace: ccbridge.mark("begin") / ccbridge.mark("end"), or `with ccbridge.window():`.

Under `ccbridge run --record T` (and so `ccbridge account`) each mark is a trace line (kind mark); account compares
each process of a job between its begin and end marks, its steady state (without marks: from its first collective
to its last). Outside `ccbridge run`, or with no trace being written, a mark does nothing: a program can keep its
marks in production. The benches mark their timed steps.
"""

from __future__ import annotations

import contextlib
import os

from ccbridge.bindings import emu
from ccbridge.errors import UsageError

MARKS = ("begin", "end")  # the names account reads


def mark(name: str) -> bool:
    """Name a point of the program in its trace: "begin" or "end" of a steady-state window. True when a mark line
    was written (inside `ccbridge run --record`), else False."""
    if name not in MARKS:
        raise UsageError(f"mark {name!r}: account reads the marks {' and '.join(MARKS)}")
    path = os.environ.get(emu.LIB_ENV)
    return bool(emu.function(path, "ccbemu_mark")(name.encode())) if path else False


def waited(name: str, t_enter_ns: int) -> bool:
    """A wait this process did by polling (time.monotonic_ns() when it began, until now), written into the trace as
    a synchronize named `name` would be: the driver calls a poll makes (an event queried between sleeps) are not
    traced, so without it account would read the wait as host work natively and find it in a call only where CC
    makes the wait block (issue 31: DDP's encrypted collectives). True when a line was written."""
    path = os.environ.get(emu.LIB_ENV)
    return bool(emu.function(path, "ccbemu_waited")(name.encode(), t_enter_ns)) if path else False


@contextlib.contextmanager
def window():
    """A steady-state window: mark("begin") on entry, mark("end") on exit (also when the body raises)."""
    mark("begin")
    try:
        yield
    finally:
        mark("end")
