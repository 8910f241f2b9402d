"""The transfer family's sweep logic on the CPU, over a stand-in for the native copy loop."""

import contextlib
from types import SimpleNamespace

import pytest

from ccbridge.probe import framework, registry, transfer


class FakeSession:
    """core.Session's copy loop: native (or paused) copies at 10 GB/s, emulated ones at 2."""

    def __init__(self, state, *args):
        self.state = state

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def copy(self, direction, nbytes, iters, nstreams=1, sync_every=0):
        gbps = 2.0 if self.state["emulating"] and not self.state["paused"] else 10.0
        ns = nbytes * iters / gbps
        self.state["log"].append((nbytes, iters, self.state["paused"]))
        out = SimpleNamespace(bytes=nbytes * iters, start_ns=0, end_ns=ns, incall_ns=ns / 2, seconds=ns / 1e9)
        groups = iters // sync_every if sync_every else 0
        return out, [ns / groups for _ in range(groups)]


@pytest.mark.parametrize("emulating", [True, False])
def test_sustained_sizes_take_paused_twins_in_the_same_process_under_emulation(monkeypatch, emulating):
    """From SUSTAINED_BYTES on, each bandwidth sample has a twin with emulation paused (which goes first alternates,
    each after one untimed copy in its state), so never-faster compares a copy with its own process's native
    one; smaller sizes, and every size outside emulation, keep one row."""
    state = {"emulating": emulating, "paused": False, "log": []}

    @contextlib.contextmanager
    def paused(required=True):
        was, state["paused"] = state["paused"], True
        try:
            yield emulating
        finally:
            state["paused"] = was

    monkeypatch.setattr(transfer, "emulating", lambda: emulating)
    monkeypatch.setattr(framework, "emulation_paused", paused)
    monkeypatch.setattr(transfer.core, "Session", lambda *a: FakeSession(state, *a))
    ctx = registry.ProbeContext(registry.Settings(quick=True), registry.Machine(gpu_count=1))
    rows = transfer.sweep(ctx)
    bw = {(r.metric, r.params["dir"], r.params["mem"], r.params["bytes"]): r for r in rows if r.metric.startswith("bandwidth")}
    twins = {k for k in bw if k[0].endswith(framework.PAUSED)}
    sustained = [b for b in transfer.SIZES_QUICK if b >= transfer.SUSTAINED_BYTES]
    assert twins == ({("bandwidth" + framework.PAUSED, d, m, b) for d in ("h2d", "d2h") for m in ("pinned", "pageable")
                      for b in sustained} if emulating else set())
    for (metric, d, m, b), row in bw.items():
        want = 10.0 if metric.endswith(framework.PAUSED) or not emulating else 2.0
        assert row.median == pytest.approx(want) and row.n == 3, (metric, d, m, b)
    if emulating:  # the timed copies of one sustained case: on/off, off/on, on/off, each after its untimed one
        big = max(transfer.SIZES_QUICK)
        timed = [p for n, k, p in state["log"] if n == big and k > 1][-6:]
        untimed = [p for n, k, p in state["log"] if n == big and k == 1][-6:]
        assert timed == untimed == [False, True, True, False, False, True]
