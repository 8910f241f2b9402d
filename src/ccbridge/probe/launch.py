"""Launch: pipelined launch cost, launch + wait, per-kernel cost in a replayed graph."""

from __future__ import annotations

from ccbridge.bindings import core
from ccbridge.probe.registry import test
from ccbridge.results import Row

MODES = {"pipelined": core.LAUNCH_PIPELINED, "launch+wait": core.LAUNCH_WAIT, "graph": core.LAUNCH_GRAPH}


@test("launch.cost", "empty-kernel launch cost: pipelined, launch+wait, graph replay", needs=("gpu",))
def cost(ctx):
    reps = ctx.pick(9, 5)
    counts = {"pipelined": 2000, "launch+wait": 500, "graph": 1000}
    rows = []
    with core.Session(ctx.device, "pinned", 64) as s:
        for mode, code in MODES.items():
            ctx.step(mode)
            s.launch(code, 100)  # warm: module load, first launch
            samples = [s.launch(code, counts[mode]) / 1e3 for _ in range(reps)]
            row = Row.of("launch.cost", "time_per_kernel", "us", samples, mode=mode)
            row.extra["headline"] = True
            rows.append(row)
    return rows
