"""The semantics family's repetitions on the CPU, over a stand-in for the native copy-against-busy-stream call."""

from types import SimpleNamespace

import pytest

from ccbridge.probe import registry, semantics


def _run(monkeypatch, fractions):
    """semantics.nonblocking where the n-th call of every case waits for fractions[n] of the queued work."""
    calls = []

    class Session:
        def __init__(self, *args, **kwargs):
            pass

        def close(self):
            pass

        def semantics(self, direction, relation, nbytes, spin_ns):
            case = (id(self), direction, relation)
            i = calls.count(case)
            calls.append(case)
            return SimpleNamespace(call_ns=fractions[i] * 20e6, remaining_ns=20e6)

    monkeypatch.setattr(semantics.core, "Session", Session)
    ctx = registry.ProbeContext(registry.Settings(quick=True), registry.Machine(gpu_count=1))
    return semantics.nonblocking(ctx)


@pytest.mark.parametrize("fractions, n", [((0.001, 0.004, 0.9), 2),  # async twice: a third changes nothing
                                          ((1.02, 1.01, 0.0), 2),  # blocks twice
                                          ((0.0, 0.05, 0.01), 3),  # 5% of the queued work apart: a third
                                          ((0.1, 0.9, 0.5), 3)])
def test_a_third_repetition_only_where_the_first_two_disagree(monkeypatch, fractions, n):
    rows = _run(monkeypatch, fractions)
    assert len(rows) == len(list(semantics.cases()))
    assert {r.n for r in rows} == {n}
    assert {(r.metric, r.unit) for r in rows} == {("return_fraction", "fraction")}
    want = semantics.verdict(sorted(fractions[:n])[n // 2] if n == 3 else sum(fractions[:2]) / 2)
    assert {r.extra["verdict"] for r in rows} == {want}


def test_work_over_before_the_call_is_refused(monkeypatch):
    monkeypatch.setattr(semantics, "_fraction", lambda out: float("inf"))
    with pytest.raises(RuntimeError, match="host too slow to test"):
        _run(monkeypatch, (0.0, 0.0, 0.0))
