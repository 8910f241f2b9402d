"""The transfer family's sweep logic on the CPU, over a stand-in for the native copy loop."""

import contextlib
from types import SimpleNamespace

import pytest

from ccbridge.probe import framework, registry, sessions, transfer


class FakeSession:
    """core.Session's copy loop: native (or paused) copies at 10 GB/s, emulated ones at 2."""

    def __init__(self, state, *args, **kwargs):
        self.state = state

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        self.state.setdefault("closed_after", []).append(len(self.state["log"]))  # copies made before it closed

    def copy(self, direction, nbytes, iters, nstreams=1, sync_every=0):
        gbps = 2.0 if self.state["emulating"] and not self.state["paused"] else 10.0
        if self.state.get("noisy"):  # every copy 5% off the one before, up and down
            self.state["noisy"] = -self.state["noisy"]
            gbps *= 1 + self.state["noisy"]
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
    monkeypatch.setattr(sessions.core, "Session", lambda *a, **kw: FakeSession(state, *a, **kw))
    ctx = registry.ProbeContext(registry.Settings(quick=True), registry.Machine(gpu_count=1))
    rows = transfer.sweep(ctx)
    bw = {(r.metric, r.params["dir"], r.params["mem"], r.params["bytes"]): r for r in rows if r.metric.startswith("bandwidth")}
    twins = {k for k in bw if k[0].endswith(framework.PAUSED)}
    sustained = [b for b in transfer.SIZES_QUICK if b >= transfer.SUSTAINED_BYTES]
    assert twins == ({("bandwidth" + framework.PAUSED, d, m, b) for d in ("h2d", "d2h") for m in ("pinned", "pageable")
                      for b in sustained} if emulating else set())
    for (metric, d, m, b), row in bw.items():
        want = 10.0 if metric.endswith(framework.PAUSED) or not emulating else 2.0
        # alternating pairs: every repetition; settled samples (a steady 10 GB/s): stopped after two of the three
        n = 3 if emulating and b >= transfer.SUSTAINED_BYTES else 2
        assert row.median == pytest.approx(want) and row.n == n, (metric, d, m, b)
    if emulating:  # the timed copies of one sustained case: on/off, off/on, on/off, each after its untimed one
        big = max(transfer.SIZES_QUICK)
        timed = [p for n, k, p in state["log"] if n == big and k > 1][-6:]
        untimed = [p for n, k, p in state["log"] if n == big and k == 1][-6:]
        assert timed == untimed == [False, True, True, False, False, True]


@pytest.mark.parametrize("noisy", [False, True])
def test_bandwidth_stops_early_only_when_the_samples_agree(monkeypatch, noisy):
    """More than half the allowed samples within 2% of their median stop a case's bandwidth samples (two of the
    quick run's three, three of the full run's five: stats.settle_after); samples 10% apart get every repetition.
    Both sessions are open before the first copy and closed after the last."""
    state = {"emulating": False, "paused": False, "log": [], "noisy": 0.05 if noisy else 0}
    monkeypatch.setattr(transfer, "emulating", lambda: False)
    monkeypatch.setattr(sessions.core, "Session", lambda *a, **kw: FakeSession(state, *a, **kw))
    for quick, reps in ((True, 3), (False, 5)):
        state["log"].clear()
        state["closed_after"] = []
        ctx = registry.ProbeContext(registry.Settings(quick=quick), registry.Machine(gpu_count=1))
        rows = transfer.sweep(ctx)
        counts = {r.n for r in rows if r.metric in ("bandwidth", "in_call_fraction")}
        assert counts == ({reps} if noisy else {{3: 2, 5: 3}[reps]})
        assert state["closed_after"] == [len(state["log"])] * 2


def test_latency_takes_the_pilots_second_copy_and_as_many_samples_as_planned(monkeypatch):
    """Each case's latency row: the pilot's second copy (timed alone, after one of its size) and n - 1 more timed
    alone, n as planned from the pilot; the copies timed alone are the pilot's two and those n - 1."""
    state = {"emulating": False, "paused": False, "log": []}
    monkeypatch.setattr(transfer, "emulating", lambda: False)
    monkeypatch.setattr(sessions.core, "Session", lambda *a, **kw: FakeSession(state, *a, **kw))
    calls = []
    real = FakeSession.copy

    def copy(self, direction, nbytes, iters, nstreams=1, sync_every=0):
        calls.append((nbytes, iters, sync_every))
        return real(self, direction, nbytes, iters, nstreams, sync_every)

    monkeypatch.setattr(FakeSession, "copy", copy)
    ctx = registry.ProbeContext(registry.Settings(quick=True), registry.Machine(gpu_count=1))
    rows = transfer.sweep(ctx)
    for r in (r for r in rows if r.metric == "latency"):
        alone = [k for b, k, every in calls if b == r.params["bytes"] and every == 1]
        size = r.params["bytes"]
        want = transfer.plan_iters(size / 10.0 / 1e9, 0.03, 3, 200)  # the fake copies at 10 GB/s
        assert r.n == want and r.median == pytest.approx(size / 10.0 / 1e3)
        assert alone.count(2) >= 1 and sum(alone) == 4 * (want + 1)  # 2 directions x 2 kinds, each 2 + want - 1
