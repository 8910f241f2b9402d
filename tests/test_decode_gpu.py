"""`ccbridge bench decode` on a GPU: every mode gives the same tokens, and each schedules as named."""

import pytest

torch = pytest.importorskip("torch", reason="the decode harness needs torch")
pytest.importorskip("transformers", reason="the decode harness builds a Hugging Face transformers model")

from ccbridge import cli, results  # noqa: E402
from ccbridge.serve import decode, stepper  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]


@pytest.fixture(scope="module")
def tiny():
    return decode.build("tiny", "cuda", seed=0)


@pytest.mark.parametrize("batch", [1, 8])
def test_modes_agree_on_cuda(tiny, batch):
    assert next(tiny.parameters()).dtype == torch.bfloat16
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], batch, 32, seed=3)
    runs = {m: decode.decode(tiny, ids, 24, m) for m in decode.MODES}
    for mode, r in runs.items():
        assert torch.equal(r.tokens, runs["sync"].tokens), mode
        assert r.gpu_busy is not None and 0 < r.gpu_busy <= 1


def test_async_launches_the_next_step_before_reading(tiny, monkeypatch):
    """async: step N+1 is enqueued before N's readback is issued; no Tensor.cpu() (a compute-stream sync)
    happens in the loop; the readback waits on a side stream. sync: one .cpu() per token."""
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 4, 16)
    calls = {"cpu": 0}
    real_cpu = torch.Tensor.cpu

    def counting_cpu(self, *a, **k):
        calls["cpu"] += 1
        return real_cpu(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    for mode, want in (("sync", 16), ("async", 0), ("staged", 0)):
        calls["cpu"] = 0
        trace = []
        r = decode.decode(tiny, ids, 16, mode, trace=trace)
        assert calls["cpu"] == want, mode
        pos = {ev: i for i, ev in enumerate(trace)}
        if mode != "sync":
            assert all(pos[("launch", n + 1)] < pos[("read", n)] for n in range(1, 15)), mode
        assert r.stats["readback"] == 16


def test_drain_keeps_the_scheduler_ahead(tiny):
    """drain: the host has launched step n + DRAIN_LAG - 1 before it takes token n - 1; the GPU is still
    working when the scheduler thread launches (it never waited for the stream)."""
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 4, 16)
    trace = []
    r = decode.decode(tiny, ids, 32, "drain", trace=trace)
    pos = {ev: i for i, ev in enumerate(trace)}
    assert all(pos[("launch", n + decode.DRAIN_LAG - 1)] < pos[("read", n - 1)] for n in range(1, 30))
    assert r.stats["drained"] == 32 and r.stats["h2d"] == 0


def test_bench_llama_shape_small_batch(tmp_path, capsys):
    """A real preset (llama-1b shapes) through the CLI, two batch sizes, every mode, tokens checked."""
    rc = cli.main(["bench", "decode", "--model", "llama-1b", "--batch", "1", "8", "--prompt", "64", "--output", "16",
                   "--iters", "2", "--json", str(tmp_path / "d.json")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = results.load(tmp_path / "d.json")
    assert not res.errors and sum(r.metric == "tok_per_s" for r in res.rows) == 2 * len(decode.MODES)
    assert all(r.extra["gpu_busy"] is not None for r in res.rows if r.metric == "tok_per_s")


@pytest.mark.parametrize("batch", [1, 8])
def test_graph_decode_agrees_with_eager_and_replays(tiny, batch):
    """--graphs: every mode replays one captured CUDA graph per step and gives the eager sync tokens
    (bf16: the same kernels in a graph give the same bits)."""
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], batch, 32, seed=3)
    want = decode.decode(tiny, ids, 24, "sync").tokens
    for mode in decode.MODES:
        r = decode.decode(tiny, ids, 24, mode, graphs=True)
        assert torch.equal(r.tokens, want), mode
        assert r.gpu_busy is not None and 0 < r.gpu_busy <= 1


def test_graph_step_is_one_replay(tiny, monkeypatch):
    """The timed loop replays the captured graph once per step and launches the model's forward never."""
    replays, forwards = [], []
    real_replay, real_forward = torch.cuda.CUDAGraph.replay, stepper.GraphStepper._forward
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: (replays.append(1), real_replay(self))[1])
    monkeypatch.setattr(stepper.GraphStepper, "_forward", lambda self: (forwards.append(1), real_forward(self))[1])
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 2, 16)
    decode.decode(tiny, ids, 12, "async", graphs=True)
    assert len(replays) == 11 and len(forwards) == 3  # 2 warm-up forwards + the capture, then replays only


def test_bench_graphs_through_the_cli(tmp_path, capsys):
    rc = cli.main(["bench", "decode", "--model", "tiny", "--graphs", "--batch", "4", "--prompt", "32", "--output",
                   "16", "--iters", "2", "--json", str(tmp_path / "g.json")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = results.load(tmp_path / "g.json")
    assert not res.errors and res.settings["decode"]["graphs"] is True and "CUDA graphs" in out.out
    assert all(r.params["graphs"] is True for r in res.rows)
