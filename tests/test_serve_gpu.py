"""ccbridge.serve on real streams: readbacks and staged inputs are ordered by events, not by luck."""

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from ccbridge.serve import DrainWorker, StagedH2D  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU (runs through scripts/device-check)")]


def test_drain_reads_what_the_compute_stream_wrote_before_submit():
    with DrainWorker(max_pending=4) as drain:
        futs, want = [], []
        for step in range(30):
            y = torch.empty(1 << 16, device="cuda", dtype=torch.int64)
            torch.cuda._sleep(200_000)  # the stream is busy: a wrong order would read stale bytes
            y.fill_(step)
            futs.append(drain.submit(y))
            want.append(step)
        for f, w in zip(futs, want):
            r = f.result(timeout=60)
            assert r.device.type == "cpu" and r.is_pinned() and bool((r == w).all())


def test_staged_h2d_inputs_arrive_ordered_on_the_compute_stream():
    stage = StagedH2D(capacity=1 << 20, device="cuda", slots=2)
    g = torch.Generator().manual_seed(0)
    acc = torch.zeros(4096, device="cuda", dtype=torch.float64)
    ref = torch.zeros(4096, dtype=torch.float64)
    for step in range(50):
        a = torch.randn(4096, generator=g, dtype=torch.float64)
        ids = torch.randint(0, 1000, (333,), generator=g)
        torch.cuda._sleep(100_000)  # a busy compute stream: the staged copy must not wait for it, nor overtake it
        da, dids = stage.put([a, ids])
        acc += da
        ref += a
        assert torch.equal(dids.cpu(), ids)
        a.zero_()  # the caller reuses its host tensors at once
    torch.cuda.synchronize()
    assert torch.equal(acc.cpu(), ref)
