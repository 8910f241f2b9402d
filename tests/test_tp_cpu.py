"""`ccbridge bench decode --tp` on the CPU: the split computes the same function, TP=1 and TP=2 gloo ranks give
the tokens of the one-process decode, and a failing, dying or silent rank is one line, not a hang."""

import importlib.util
import json
import multiprocessing
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="the tensor-parallel bench needs torch")

from ccbridge import cli, ranks, results  # noqa: E402
from ccbridge.errors import GpuError, UsageError  # noqa: E402
from ccbridge.serve import decode, tp  # noqa: E402

PROMPT, OUTPUT, BATCHES, MODES = 8, 5, [1, 3], ["sync", "drain"]
# Not imported here: the spawned ranks import this module for their targets, and a rank that needs no model
# should not pay for transformers.
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="the decode harness builds a Hugging Face transformers model")


@pytest.fixture
def no_reduce(monkeypatch):
    """dist.all_reduce counted and left out: a rank's partial sums, in one process and without a group."""
    calls = []
    monkeypatch.setattr(tp.dist, "all_reduce", lambda t, *a, **k: calls.append(tuple(t.shape)))
    return calls


def _tiny_qwen2():
    import transformers

    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, bos_token_id=None, eos_token_id=None,
                                   pad_token_id=None)
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(cfg).eval()


@needs_transformers
def test_shard_keeps_each_ranks_block_of_whole_heads():
    full, m = _tiny_qwen2(), _tiny_qwen2()  # Qwen2: q/k/v carry a bias, sliced with their rows
    tp.shard(m, 1, 2)
    fa, a = full.model.layers[0].self_attn, m.model.layers[0].self_attn
    fm, p = full.model.layers[0].mlp, m.model.layers[0].mlp
    hd = fa.head_dim
    assert a.head_dim == hd and m.config.head_dim == hd
    assert a.q_proj.weight.shape == (2 * hd, 64) and torch.equal(a.q_proj.weight, fa.q_proj.weight[2 * hd:])
    assert a.k_proj.weight.shape == (hd, 64) and torch.equal(a.k_proj.weight, fa.k_proj.weight[hd:])
    assert torch.equal(a.v_proj.bias, fa.v_proj.bias[hd:]) and a.q_proj.out_features == 2 * hd
    assert isinstance(a.o_proj, tp.RowParallel) and torch.equal(a.o_proj.weight, fa.o_proj.weight[:, 2 * hd:])
    assert a.o_proj.bias is None
    assert p.gate_proj.weight.shape == p.up_proj.weight.shape == (64, 64)
    assert torch.equal(p.up_proj.weight, fm.up_proj.weight[64:])
    assert isinstance(p.down_proj, tp.RowParallel) and torch.equal(p.down_proj.weight, fm.down_proj.weight[:, 64:])
    assert (m.config.num_attention_heads, m.config.num_key_value_heads, m.config.intermediate_size) == (2, 1, 64)
    assert m.model.embed_tokens.weight.shape == full.model.embed_tokens.weight.shape  # replicated
    assert m.lm_head.weight.shape == full.lm_head.weight.shape


@needs_transformers
@torch.no_grad()
def test_the_ranks_partial_outputs_sum_to_the_whole_layer(no_reduce):
    """Column- then row-parallel: each rank's attention and MLP output, summed over the ranks (what the
    all-reduce does), is the unsplit layer's output; one all-reduce after each."""
    full = _tiny_qwen2()
    parts = [tp.shard(_tiny_qwen2(), r, 2) for r in range(2)]
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(5)[None].expand(2, 5)
    cos_sin = full.model.rotary_emb(x, pos)

    def attn(m):
        return m.model.layers[1].self_attn(x, position_embeddings=cos_sin, attention_mask=None)[0]

    mlp_sum = sum(m.model.layers[1].mlp(x) for m in parts)
    assert no_reduce == [(2, 5, 64)] * 2
    assert torch.allclose(mlp_sum, full.model.layers[1].mlp(x), atol=1e-5)
    assert torch.allclose(sum(attn(m) for m in parts), attn(full), atol=1e-5)
    assert len(no_reduce) == 4


@needs_transformers
@torch.no_grad()
def test_one_rank_is_the_whole_model_with_two_all_reduces_per_layer(no_reduce):
    full, m = decode.build("tiny", "cpu", 0), tp.shard(decode.build("tiny", "cpu", 0), 0, 1)
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 2, PROMPT)
    assert torch.equal(m(input_ids=ids).logits, full(input_ids=ids).logits)
    assert len(no_reduce) == 2 * decode.PRESETS["tiny"]["num_hidden_layers"]


def test_degrees_are_checked_before_any_rank_starts():
    with pytest.raises(UsageError, match="--tp 4: tiny has 2 key-value heads, which 4 ranks cannot split evenly"):
        tp.check("tiny", [1, 4], "cpu")
    with pytest.raises(UsageError, match="--tp 3: tiny has 4 attention heads"):
        tp.check("tiny", [3], "cpu")
    with pytest.raises(UsageError, match="--tp 8: at most 4 ranks on --device cpu"):
        tp.check("llama-1b", [8], "cpu")
    with pytest.raises(UsageError, match="--device cuda:1: --tp puts rank r on cuda:r"):
        tp.check("llama-1b", [2], "cuda:1")
    with pytest.raises(UsageError, match="at least 1"):
        tp.check("tiny", [0], "cpu")
    with pytest.raises(UsageError, match="--graphs captures CUDA graphs: it needs a CUDA device"):
        tp.bench("tiny", [1], [1], 4, 3, ["sync"], "cpu", graphs=True)
    with pytest.raises(UsageError, match="unknown model 'gpt5'"):
        tp.bench("gpt5", [1], [1], 4, 3, ["sync"], "cpu")
    with pytest.raises(UsageError, match="Llama/Qwen2-shaped layers"):
        tp.shard(torch.nn.Linear(2, 2), 0, 1)


@pytest.fixture(scope="module")
def tp_result(tmp_path_factory):
    """TP=1 and TP=2 (gloo ranks, float32). The last batch is judged against decode.decode's tokens in this
    process, the others against the smallest degree's first mode."""
    m = decode.build("tiny", "cpu", 0)
    b = BATCHES[-1]
    want = {b: decode.decode(m, decode.prompts(decode.PRESETS["tiny"]["vocab_size"], b, PROMPT, 0), OUTPUT,
                             "sync").tokens}
    res = tp.bench("tiny", [2, 1], BATCHES, PROMPT, OUTPUT, MODES, "cpu", iters=2, warmup=0, reference=want)
    path = tmp_path_factory.mktemp("tp") / "tp.json"
    res.save(path)
    return res, path


@needs_transformers
def test_tp1_and_tp2_give_the_one_process_tokens(tp_result):
    res, _ = tp_result
    assert not res.errors, res.errors
    tok = [r for r in res.rows if r.metric == "tok_per_s"]
    assert [(r.params["tp"], r.params["batch"], r.params["mode"]) for r in tok] == [
        (n, b, mode) for n in (1, 2) for b in BATCHES for mode in MODES]  # degrees ascending, whatever the order given
    for r in tok:
        assert r.test == "decode_tp" and r.median > 0 and r.n == 2
        assert r.extra["tokens_match"] and r.extra["ranks_agree"]
        assert r.extra["reference"] == ("the given reference" if r.params["batch"] == BATCHES[-1] else "tp 1 sync")
        if r.params["tp"] == 1:  # a one-rank group computes exactly the one-process model
            assert r.extra["near_ties"] == 0
    s = res.settings["decode_tp"]
    assert s["backend"] == "gloo" and s["degrees"] == [1, 2] and s["all_reduces_per_step"] == 4
    assert s["dtype"] == "float32"


@needs_transformers
def test_the_result_file_and_table(tp_result):
    res, path = tp_result
    back = results.load(path)
    assert [r.key() for r in back.rows] == [r.key() for r in res.rows]
    table = tp.render(back)
    assert all(len(line) <= 120 for line in table.splitlines()), table
    lines = [line.split() for line in table.splitlines() if not line.startswith("#")]
    assert lines[0] == ["tp", "batch", "mode", "tok/s", "step", "ms", "gap", "p50", "gap", "p90", "gpu", "busy",
                        "x", "TP=1", "tokens"]
    assert len(lines) == 1 + 2 * len(BATCHES) * len(MODES)
    assert all(line[8] == "1.00" and line[9] == "same" for line in lines[1:] if line[0] == "1")
    assert "gloo" in table and "4 per step" in table


# Rank targets: module level, so that the spawned ranks can import them.
def _raise_in_rank_1(rank, n, dev, send, exc):
    torch.distributed.barrier()
    if rank == 1:
        raise exc
    torch.distributed.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that is gone
    return rank


def _die_in_rank_1(rank, n, dev, send):
    send(("hello", rank))
    if rank == 1:
        os._exit(3)
    torch.distributed.all_reduce(torch.ones(1))
    return rank


def _silent(rank, n, dev, send):
    time.sleep(60)


def _answer(rank, n, dev, send):
    t = torch.tensor([rank + 1.0])
    torch.distributed.all_reduce(t)
    send(("threads", torch.get_num_threads()))
    return (rank, float(t), os.environ.get("NCCL_NVLS_ENABLE"))


def test_ranks_answer_in_one_group(monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    seen = []
    got = tp.run_ranks(2, _answer, device="cpu", on_message=lambda r, obj: seen.append((r, obj)))
    assert got == [(0, 3.0, "0"), (1, 3.0, "0")]  # NVLink multicast off in the ranks
    assert sorted(r for r, _ in seen) == [0, 1]
    assert all(obj[1] == max(1, (os.cpu_count() or 1) // 2) for _, obj in seen)


def test_a_rank_that_raises_is_one_line_and_no_hang():
    """Rank 1 raises while rank 0 waits for it in a collective: rank 1's error, one line, the group stopped."""
    t0 = time.monotonic()
    with pytest.raises(GpuError) as e:
        tp.run_ranks(2, _raise_in_rank_1, ValueError("boom\nsecond line"), device="cpu")
    assert str(e.value) == "tensor-parallel rank 1 of 2 failed: ValueError: boom"
    assert time.monotonic() - t0 < 45 and not multiprocessing.active_children()


def test_a_ccbridge_error_in_a_rank_keeps_its_class():
    e = ranks.rank_error("tensor-parallel", 1, 2, "UsageError", "--tp 2: no")
    assert type(e) is UsageError and str(e) == "tensor-parallel rank 1 of 2: --tp 2: no"
    e = ranks.rank_error("tensor-parallel", 0, 2, "OSError", "disk full")
    assert type(e) is GpuError and str(e) == "tensor-parallel rank 0 of 2 failed: OSError: disk full"


def test_a_rank_that_dies_fails_the_group():
    with pytest.raises(GpuError, match=r"tensor-parallel rank 1 of 2 died \(exit status 3\) without a word"):
        tp.run_ranks(2, _die_in_rank_1, device="cpu")
    assert not multiprocessing.active_children()


def test_a_silent_group_is_stopped():
    t0 = time.monotonic()
    with pytest.raises(GpuError, match="tensor-parallel ranks: none spoke for 3 s"):
        tp.run_ranks(2, _silent, device="cpu", stall_s=3)
    assert time.monotonic() - t0 < 40 and not multiprocessing.active_children()


def _fail_at_build(rank, n, dev, send, job):
    raise RuntimeError(f"rank {rank} cannot build {job['model']}")


@needs_transformers
def test_a_failing_rank_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tp, "_bench_rank", _fail_at_build)
    rc = cli.main(["bench", "decode", "--tp", "1", "--model", "tiny", "--device", "cpu", "--batch", "1",
                   "--json", str(tmp_path / "t.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["ccbridge bench: tensor-parallel rank 0 of 1 failed: RuntimeError: rank 0 cannot "
                               "build tiny"], err
    assert not (tmp_path / "t.json").exists()


def _oom_at_batch_2(rank, n, dev, send, job):
    send(("rows", {"batch": 1, "mode": "sync", "errors": [], "tokens": [[1]], "rows": []}))
    send(("oom", f"tp {n}, batch 2, mode sync: CUDA out of memory"))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")


@needs_transformers
def test_out_of_memory_in_a_degree_keeps_its_rows_and_runs_the_next(monkeypatch):
    monkeypatch.setattr(tp, "_bench_rank", _oom_at_batch_2)
    res = tp.bench("tiny", [1, 2], [1, 2], 4, 3, ["sync"], "cpu", iters=1, warmup=0)
    assert [e["error"] for e in res.errors] == [
        f"tp {n}, batch 2, mode sync: CUDA out of memory; the larger batches and later modes did not run at tp {n}"
        for n in (1, 2)]
    assert json.dumps(res.settings)  # a result file can hold it
