"""The lifecycle family's rounds on the CPU, over stand-ins for the native core."""

import pytest

from ccbridge.probe import lifecycle, registry


class Core:
    """context_lifecycle and a session's pinned_slots, each round's figures from the lists given (s)."""

    def __init__(self, rounds, slots):
        self.rounds, self.slots, self.asked = rounds, slots, []

    def context_lifecycle(self, device, n):
        self.asked.append(n)
        return self.rounds[n][sum(1 for k in self.asked if k == n) - 1]

    def Session(self, device, mem, nbytes):  # noqa: N802 - core.Session's name
        core = self

        class Session:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def pinned_slots(self, nbytes, count):
                core.asked.append("slots")
                return core.slots[core.asked.count("slots") - 1]

        return Session()


@pytest.mark.parametrize("quick", [True, False])
def test_rounds_stop_once_making_and_destroying_agree(monkeypatch, quick):
    """Full: a third round only where the first two differ by over 2% in making or in destroying (1 context: its
    destroys 10% apart; 8: both within 1%); the slots' third only where their allocation times differ. Quick: one
    round of 8. The rows are those of before: names, units, parameters, headlines."""
    fake = Core({1: [(0.12, 0.06), (0.121, 0.066), (0.119, 0.063)], 8: [(1.0, 0.5), (1.005, 0.502), (9.0, 9.0)]},
                [(0.2e9, 0.05e9), (0.25e9, 0.05e9), (0.21e9, 0.05e9)])
    monkeypatch.setattr(lifecycle, "core", fake)
    ctx = registry.ProbeContext(registry.Settings(quick=quick), registry.Machine(gpu_count=1))
    rows = lifecycle.contexts(ctx)
    got = [(r.metric, r.unit, r.params, r.n, bool(r.extra.get("headline"))) for r in rows]
    slots = ("pinned_slot_alloc_time", "s", {"slots": 8, "bytes": 64 << 20})
    if quick:
        assert fake.asked == [8, "slots"]
        assert got == [("create_time", "s", {"contexts": 8}, 1, True), ("destroy_time", "s", {"contexts": 8}, 1, True),
                       (*slots, 1, True)]
        return
    assert fake.asked == [1, 1, 1, 8, 8, "slots", "slots", "slots"]
    assert got == [("create_time", "s", {"contexts": 1}, 3, False), ("destroy_time", "s", {"contexts": 1}, 3, False),
                   ("create_time", "s", {"contexts": 8}, 2, True), ("destroy_time", "s", {"contexts": 8}, 2, True),
                   (*slots, 3, True)]
    assert rows[2].median == pytest.approx(1.0025) and rows[4].median == pytest.approx(0.21)
