"""ccbridge.serve on the CPU: packing, staging, the drain worker's order, errors and shutdown."""

import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="ccbridge.serve needs torch")

from ccbridge.errors import GpuError, UsageError  # noqa: E402
from ccbridge.serve import DrainWorker, StagedH2D, cc_defaults, layout, pack_into, views  # noqa: E402
from ccbridge.serve import defaults as defaults_mod  # noqa: E402


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50000, (7,), generator=g, dtype=torch.int64),
            torch.randn(3, 5, generator=g),
            torch.randn(11, generator=g).to(torch.bfloat16),
            torch.randint(0, 2, (13,), generator=g).bool(),
            torch.empty(0, dtype=torch.float16),
            torch.randn(4, 4, generator=g).t()]  # not contiguous


def test_pack_and_views_round_trip_every_dtype_and_shape():
    ts = _inputs(1)
    offsets, total = layout(ts)
    assert all(o % 64 == 0 for o in offsets) and total % 64 == 0
    buf = torch.full((total,), 0xAB, dtype=torch.uint8)
    got_offsets, used = pack_into(buf, ts)
    assert (got_offsets, used) == (offsets, total)
    for a, b in zip(ts, views(buf, ts, offsets)):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    with pytest.raises(UsageError, match="staging holds"):
        pack_into(torch.empty(total - 1, dtype=torch.uint8), ts)


def test_staged_h2d_results_are_the_callers_own():
    stage = StagedH2D(capacity=4096, device="cpu", slots=2)
    for step in range(5):  # slots are reused
        ts = _inputs(step)
        out = stage.put(ts)
        keep = [t.clone() for t in ts]
        for t in ts:  # the caller reuses its host tensors at once
            t.zero_() if t.dtype != torch.bool else t.fill_(False)
        assert all(torch.equal(a, b) for a, b in zip(keep, out)), f"step {step}"
    with pytest.raises(UsageError, match="staging holds"):
        stage.put([torch.zeros(2000, dtype=torch.int64)])
    for bad in (0, -1, 1.5):
        with pytest.raises(UsageError):
            StagedH2D(capacity=bad, device="cpu")
    with pytest.raises(UsageError):
        StagedH2D(capacity=64, device="cpu", slots=0)


def test_drain_worker_returns_copies_in_submission_order():
    done = []
    with DrainWorker(max_pending=4) as drain:
        orig = drain._read

        def slow_read(t, event):
            time.sleep(0.002 * (3 - int(t[0]) % 3))  # uneven work per item
            done.append(int(t[0]))
            return orig(t, event)

        drain._read = slow_read
        xs = [torch.arange(i, i + 5) for i in range(20)]
        futs = [drain.submit(x) for x in xs]
        got = [f.result(timeout=10) for f in futs]
    assert done == list(range(20)), "readbacks ran out of order"
    assert all(torch.equal(g, x) and g is not x for g, x in zip(got, xs))


def test_drain_worker_result_is_a_copy_taken_when_its_turn_came():
    with DrainWorker() as drain:
        x = torch.arange(6)
        y = drain.submit(x).result(timeout=10)
        x.zero_()
        assert torch.equal(y, torch.arange(6))


def test_a_failed_readback_fails_its_future_and_the_worker_goes_on():
    with DrainWorker() as drain:
        bad = drain.submit(torch.zeros(1))
        drain._read_orig = drain._read

        def boom(t, event):
            if int(t.numel()) == 3:
                raise RuntimeError("device lost")
            return drain._read_orig(t, event)

        drain._read = boom
        f1 = drain.submit(torch.zeros(3))
        f2 = drain.submit(torch.ones(2))
        with pytest.raises(RuntimeError, match="device lost"):
            f1.result(timeout=10)
        assert torch.equal(f2.result(timeout=10), torch.ones(2))
        assert torch.equal(bad.result(timeout=10), torch.zeros(1))


def test_drain_worker_bounds_what_is_pending_and_shuts_down_cleanly():
    gate = threading.Event()
    drain = DrainWorker(max_pending=1, timeout=0.3)
    orig = drain._read
    drain._read = lambda t, e: (gate.wait(10), orig(t, e))[1]
    first = drain.submit(torch.ones(1))  # taken by the worker, blocked at the gate
    time.sleep(0.05)
    second = drain.submit(torch.ones(2))  # fills the queue
    with pytest.raises(GpuError, match="still pending"):  # not bad input: a worker that stopped
        drain.submit(torch.ones(3))
    with pytest.raises(UsageError, match="takes a tensor, not list"):
        drain.submit([1, 2])
    closer = threading.Thread(target=drain.close)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive(), "close() returned before the pending readbacks were done"
    gate.set()
    closer.join(10)
    assert not closer.is_alive() and not drain._thread.is_alive()
    assert first.result(0).numel() == 1 and second.result(0).numel() == 2  # every accepted readback completed
    with pytest.raises(UsageError, match="closed"):
        drain.submit(torch.ones(1))
    drain.close()  # idempotent
    for bad in (0, -2, 1.5):
        with pytest.raises(UsageError):
            DrainWorker(max_pending=bad)


@pytest.mark.parametrize("queued", [1, 0])
def test_closing_a_drain_worker_whose_worker_is_stuck_says_so_instead_of_hanging(queued):
    """A worker stuck in a readback (a GPU that stopped): close() raises GpuError after timeout seconds instead of
    waiting forever, whether the queue is full or has room; the readbacks still queued fail with it."""
    gate = threading.Event()
    drain = DrainWorker(max_pending=2 - queued, timeout=0.2)
    orig = drain._read
    drain._read = lambda t, e: (gate.wait(10), orig(t, e))[1]
    drain.submit(torch.ones(1))  # taken by the worker, blocked at the gate
    time.sleep(0.05)
    waiting = [drain.submit(torch.ones(2)) for _ in range(queued)]  # fills the queue
    t0 = time.monotonic()
    with pytest.raises(GpuError, match="at close"):
        drain.close()
    assert time.monotonic() - t0 < 3
    assert all(isinstance(f.exception(0), GpuError) for f in waiting)
    gate.set()
    drain._thread.join(5)
    assert not drain._thread.is_alive()  # it left once free


@pytest.mark.parametrize("state", ["on", "emulated", "off", "unknown"])
def test_cc_defaults_follow_the_cc_state(monkeypatch, state):
    from ccbridge.load import policy

    monkeypatch.setattr(policy, "cc_situation", lambda: (state, {}))
    d = cc_defaults()
    cc = state in ("on", "emulated")
    assert d.cc == state and d.drain is cc and d.staged_h2d is cc and d.cuda_graphs
    assert d.host_memory == ("pageable" if cc else "pinned") and d.why
    assert set(d.as_dict()) == set(defaults_mod.ServeDefaults.__dataclass_fields__)
    assert d.why.startswith({"unknown": "CC state unknown", "off": "CC off"}.get(state, "CC:"))  # not "CC off" unread


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here: the default device is there")
@pytest.mark.parametrize("make", ["staged", "kv", "kv-bad"])
def test_components_made_for_a_gpu_torch_cannot_see_say_so_in_one_line(make):
    """The README's StagedH2D(capacity=...) and a KVCache with no device, on a machine without a GPU: one line
    naming device='cpu', not torch's pin_memory RuntimeError or AssertionError (a stranger's review, session 24)."""
    from ccbridge.serve import KVCache

    with pytest.raises(UsageError) as e:
        if make == "staged":
            StagedH2D(capacity=1 << 20)
        elif make == "kv":
            KVCache([2, 4], torch.bfloat16, device_blocks=4, host_blocks=8, block_tokens=4)
        else:
            KVCache([2, 4], torch.bfloat16, device_blocks=4, host_blocks=8, block_tokens=4, device="gpu")
    assert "\n" not in str(e.value)
    assert ("device='cpu'" if make != "kv-bad" else "device must be cpu, cuda or cuda:N") in str(e.value)
