"""The peer family's one-rank job started ahead (EarlyRanks), on the CPU: rank 0's measurements come back as soon
as it sends them, while the ranks still leave their group and end (half a second or more on an H200: bench/
RESULTS.md 2026-11-28, session 24); close() waits for that end."""

import threading
import time

import pytest

from ccbridge.errors import GpuError
from ccbridge.probe import peer

PLAN = peer.Plan("all_reduce", (4096,), (), ops=2, reps=1)
PAYLOAD = {"small": {"eager": {4096: [0.01]}, "graph": {4096: [0.001]}}, "large": {}}


def fake_ranks(monkeypatch, ending_s: float, fail: str | None = None):
    """run_ranks as the ranks behave: they wait for the gate, rank 0 sends its measurements (unless it fails
    first), then they take ending_s to leave and end, and the job returns them (or raises after the end)."""
    ended = threading.Event()

    def run_ranks(devices, plan, gate=None, env=None, on_message=lambda rank, obj: None, **kw):
        import os
        while not os.path.exists(gate.path):
            time.sleep(0.005)
        if fail == "before":
            raise GpuError("all_reduce rank 0 of 1 failed: NCCL error")
        on_message(0, PAYLOAD)
        time.sleep(ending_s)
        ended.set()
        if fail == "after":
            raise GpuError("all_reduce rank 0 of 1 failed: destroy_process_group")
        return PAYLOAD

    monkeypatch.setattr(peer, "run_ranks", run_ranks)
    return ended


def test_measurements_arrive_before_the_ranks_end_and_close_waits_for_the_end(monkeypatch):
    ended = fake_ranks(monkeypatch, ending_s=1.0)
    early = peer.EarlyRanks([0], PLAN, "events")
    t0 = time.monotonic()
    assert early.result() == PAYLOAD
    assert time.monotonic() - t0 < 0.8 and not ended.is_set()
    early.close()
    assert ended.is_set()


def test_a_failure_before_the_measurements_is_raised(monkeypatch):
    fake_ranks(monkeypatch, ending_s=0, fail="before")
    early = peer.EarlyRanks([0], PLAN, "events")
    with pytest.raises(GpuError, match="NCCL error"):
        early.result()
    early.close()


def test_an_end_that_fails_after_the_measurements_keeps_them(monkeypatch):
    fake_ranks(monkeypatch, ending_s=0.05, fail="after")
    early = peer.EarlyRanks([0], PLAN, "events")
    assert early.result() == PAYLOAD
    early.close()


def test_a_rank_sends_its_measurements_before_it_leaves_its_group(monkeypatch):
    pytest.importorskip("torch", reason="a rank imports torch")
    sent = []
    monkeypatch.setattr(peer, "_measure", lambda torch, dist, plan, rank, world: PAYLOAD)
    assert peer._rank(0, 1, None, sent.append, PLAN) == PAYLOAD
    assert sent == [PAYLOAD]


def _send_then_hang(rank, n, dev, send):
    """A rank that sends its measurements and then never ends (a destroy_process_group that hangs)."""
    import os

    send({"pid": os.getpid()})
    time.sleep(120)


def _send_then_fail(rank, n, dev, send):
    send({"ok": True})
    raise RuntimeError("destroy_process_group: NCCL error")


@pytest.mark.parametrize("rank_fn", [_send_then_hang, _send_then_fail])
def test_a_rank_that_hangs_or_fails_after_its_measurements_is_stopped_and_said(monkeypatch, capsys, rank_fn):
    """close() waits ENDING_S for the rank to end, then stops it (before, a closed gate read as 'not yet open' and
    the rank outlived the probe); an error after the measurements is a note on stderr, the measurements stand."""
    import os

    from ccbridge import ranks

    monkeypatch.setattr(peer.EarlyRanks, "ENDING_S", 1.0)
    monkeypatch.setattr(peer, "run_ranks", lambda devices, plan, gate=None, env=None, on_message=None, **kw:
                        ranks.run(1, rank_fn, label="all_reduce", gate=gate, env=env, on_message=on_message)[0])
    early = peer.EarlyRanks([0], PLAN, "events")
    got = early.result()
    t0 = time.monotonic()
    early.close()
    assert time.monotonic() - t0 < 12 and not early._thread.is_alive()
    err = capsys.readouterr().err
    assert err.startswith("ccbridge probe: note: after its measurements") and max(map(len, err.splitlines())) <= 120
    if "pid" in got:
        with pytest.raises(ProcessLookupError):
            os.kill(got["pid"], 0)
        assert "stopped by their caller" in err
    else:
        assert got == {"ok": True} and "NCCL error" in " ".join(err.split())


def test_early_ranks_run_one_rank():
    with pytest.raises(ValueError, match="one-rank job"):
        peer.EarlyRanks([0, 1], PLAN, "events")
