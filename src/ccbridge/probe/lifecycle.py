"""Context lifecycle: driver-API context create/destroy, pinned staging slot allocation."""

from __future__ import annotations

from ccbridge.bindings import core
from ccbridge.probe.registry import test
from ccbridge.results import Row
from ccbridge.stats import settle_after, settled

SLOT_BYTES = 64 << 20
SLOTS = 8


@test("lifecycle.contexts", "context create/destroy for 1 and 8 contexts; pinned slot allocation", needs=("gpu",))
def contexts(ctx):
    # quick: one round. Making 8 contexts varied by 2-4% (destroying them by up to 20%) from round to round in full
    # runs (H200, bench/RESULTS.md 2026-11-26 session 10): a single round lands within that of the full median.
    # Full: the third round only where the first two differ by more than 2% in making or in destroying
    # (stats.settled: two agreeing of three leave the median within 1% of where the third would put it).
    reps = ctx.pick(3, 1)
    rows = []
    for n in ctx.pick((1, 8), (8,)):  # quick: the headline's 8 only
        ctx.step(f"{n} context(s)")
        runs = settled(lambda: core.context_lifecycle(ctx.device, n), settle_after(reps), reps, value=tuple)
        for i, phase in enumerate(("create", "destroy")):
            row = Row.of("lifecycle.contexts", f"{phase}_time", "s", [r[i] for r in runs], contexts=n)
            row.extra["headline"] = n == 8
            rows.append(row)
    ctx.step(f"{SLOTS} pinned slots of {SLOT_BYTES >> 20} MiB")
    with core.Session(ctx.device, "pinned", 64) as s:
        runs = settled(lambda: s.pinned_slots(SLOT_BYTES, SLOTS), settle_after(reps), reps, value=lambda r: r[0])
    row = Row.of("lifecycle.contexts", "pinned_slot_alloc_time", "s", [a / 1e9 for a, _ in runs], slots=SLOTS, bytes=SLOT_BYTES)
    row.extra["headline"] = True
    rows.append(row)
    return rows
