"""bench ddp's loss comparison (the training runs themselves need GPUs: tests/test_secure_gpu.py, device-check)."""

import pytest

pytest.importorskip("torch", reason="ccbridge.secure.bench imports torch")

from ccbridge.results import Result  # noqa: E402
from ccbridge.secure import bench, benchrows  # noqa: E402


def row(model, mode, losses):
    return {"model": model, "mode": mode, "losses": losses}


def test_each_row_is_compared_with_its_models_plaintext_run_step_by_step():
    rows = [row("gpt2-large", "nccl-sockets", [10.0, 9.5, 9.1]), row("gpt2-large", "nccl-ccbridge", [10.0, 9.5, 9.1]),
            row("resnet50", "plain", [7.0, 6.0]), row("resnet50", "secure", [7.0, 6.006]),
            row("bert-large", "secure", [3.0])]  # no plaintext row for it: nothing to compare
    bench.compare_losses(rows)
    assert rows[1]["loss_equal"] is True and rows[1]["loss_max_rel_diff"] == 0.0
    assert rows[0]["loss_equal"] is True  # the plaintext row against itself
    assert rows[3]["loss_equal"] is False and rows[3]["loss_max_rel_diff"] == pytest.approx(0.001)
    assert rows[4]["loss_equal"] is None and rows[4]["loss_max_rel_diff"] is None
    run = {"rows": [dict(r, nranks=2, wrap="ddp", bucket_cap_mb=25, params=1, iter_ms_all=[1.0], grads_agree=True)
                    for r in rows[2:4]]}
    assert "max rel diff 1.0e-03" in benchrows.render_ddp(Result(kind="ddp", env={}, settings={},
                                                                 rows=benchrows.ddp_rows(run)))


def test_a_run_that_stopped_early_is_not_called_equal():
    rows = [row("m", "plain", [1.0, 2.0, 3.0]), row("m", "secure", [1.0, 2.0])]
    bench.compare_losses(rows)
    assert rows[1]["loss_equal"] is None


def test_the_timed_steps_are_the_ranks_window_for_account(monkeypatch):
    """bench ddp marks its timed iterations (account's per-rank window: warm-up, the gradient check and the next
    mode's set-up apart), each between two synchronizes, zero_grad between steps but not after the last."""
    seen = []
    monkeypatch.setattr(bench.marks, "mark", lambda name: seen.append(name) or False)
    times, out = bench.timed_steps(lambda: seen.append("step") or len(seen), 2, 3, lambda: seen.append("zero"),
                                   lambda: seen.append("sync"))
    assert seen == ["sync", "step", "sync", "zero", "sync", "step", "sync", "zero",
                    "sync", "begin", "step", "sync", "zero", "sync", "step", "sync", "zero", "sync", "step", "sync",
                    "end"]
    assert len(times) == 3 and all(t >= 0 for t in times) and len(out) == 5
    seen.clear()
    assert bench.timed_steps(lambda: 1, 1, 0, sync=lambda: None) == ([], [1]) and seen == []  # nothing timed


def test_the_collectives_timing_loop_is_marked(monkeypatch):
    seen = []
    monkeypatch.setattr(bench.marks, "mark", lambda name: seen.append(name) or False)
    assert bench._time(lambda: seen.append("op"), 2, 1) >= 0
    assert seen == ["op", "begin", "op", "op", "end"]


@pytest.mark.parametrize("backend,named", [("nccl", [3]), ("gloo", None)])
def test_the_ranks_last_barrier_names_the_gpu_under_nccl(monkeypatch, backend, named):
    # torch 2.11 warned on every rank-0 barrier whose device it had to guess (seen in collectives' and ddp's output)
    calls = []
    monkeypatch.setattr(bench.dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(bench.torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(bench.dist, "barrier", lambda **kw: calls.append(kw))
    bench._barrier()
    assert calls == [{"device_ids": named}]
