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
from ccbridge.serve import decode, engine, tp  # noqa: E402

PROMPT, OUTPUT, BATCHES, MODES = 8, 5, [1, 3], ["sync", "drain"]
# Not imported here: the spawned ranks import this module for their targets, and a rank that needs no model
# should not pay for transformers.
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="the decode harness builds a Hugging Face transformers model")


def _in_step(n, fn):
    """fn(rank, all_reduce) on n threads, each a rank, their all-reduces summed in step (no process group)."""
    import threading

    bar, slots, out = threading.Barrier(n), [None] * n, [None] * n

    def reduce_for(rank):
        def all_reduce(t):
            slots[rank] = t.clone()
            bar.wait()
            total = sum(slots)
            bar.wait()
            t.copy_(total)
        return all_reduce

    def run(rank):
        out[rank] = fn(rank, reduce_for(rank))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@torch.no_grad()
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # Qwen2: q/k/v carry a bias, drawn with their heads
def test_every_degree_computes_the_same_function(arch):
    """Each rank draws only its own units; the ranks' all-reduced outputs are the one-rank model's."""
    spec = dict(decode.PRESETS["tiny"], arch=arch)
    ids = decode.prompts(spec["vocab_size"], 3, PROMPT)
    one = engine.build(spec, 0, 1, "cpu", torch.float32, seed=3)
    assert one.all_reduce is None  # world size 1: no collective at all
    want = one(input_ids=ids).logits
    got = _in_step(2, lambda r, ar: engine.build(spec, r, 2, "cpu", torch.float32, seed=3, all_reduce=ar)(
        input_ids=ids).logits)
    for g in got:
        assert (g - want).abs().max() <= 1e-5 * want.abs().max()
    other_seed = engine.build(spec, 0, 1, "cpu", torch.float32, seed=4)(input_ids=ids).logits
    assert not torch.allclose(other_seed, want)


@torch.no_grad()
def test_the_cache_gives_what_a_full_recompute_gives_and_grows_past_its_room():
    m = engine.build(decode.PRESETS["tiny"], 0, 1, "cpu", torch.float32, seed=1)
    ids = decode.prompts(512, 2, 10)
    out = m(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache, seq, tok = out.past_key_values, ids, out.logits[:, -1].argmax(-1)
    for _ in range(70):  # past the first cache's 64 positions
        seq = torch.cat([seq, tok[:, None]], 1)
        p = seq.shape[1] - 1
        o = m(input_ids=tok[:, None], position_ids=torch.full((2, 1), p), past_key_values=cache,
              cache_position=torch.tensor([p]), use_cache=True, logits_to_keep=1)
        cache = o.past_key_values
        assert torch.allclose(o.logits[:, -1], m(input_ids=seq).logits[:, -1], atol=1e-4)
        tok = o.logits[:, -1].argmax(-1)
    assert cache.capacity >= 80


def test_weight_bytes_are_this_ranks_shards_and_the_replicated_head():
    spec = decode.PRESETS["tiny"]
    one, half = (engine.build(spec, 0, n, "cpu", torch.float32) for n in (1, 2))
    h, v = spec["hidden_size"], spec["vocab_size"]
    head = v * h * 4 + 2 * h * 4  # lm_head (untied) and one embedding row per sequence, 2 sequences
    norms = spec["num_hidden_layers"] * 2 * h * 4  # each layer's two norms, replicated
    assert one.weight_bytes(2) - head == 2 * (half.weight_bytes(2) - head) - norms
    assert one.weight_bytes(2) > half.weight_bytes(2) > head


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
    with pytest.raises(UsageError, match="llama-70b does not fit one GPU"):
        decode.bench("llama-70b", [1], 4, 3, ["sync"], "cpu")



def test_weights_that_do_not_fit_are_refused_before_any_rank_builds_them(monkeypatch):
    """On the CPU every rank's shard is in host memory at once; on CUDA a rank's shard is on its GPU. Estimated
    from the preset's shape (fits.shard_bytes), which the built engine's weights match."""
    from ccbridge.serve import fits

    spec = decode.PRESETS["tiny"]
    h, v, layers = spec["hidden_size"], spec["vocab_size"], spec["num_hidden_layers"]
    for n in (1, 2):  # the engine reads one embedding row a sequence, where the shard holds the table; norms aside
        built = engine.build(spec, 0, n, "cpu", torch.float32)
        assert fits.shard_bytes("tiny", n, 4) == built.weight_bytes(1) - h * 4 + v * h * 4 - layers * 2 * h * 4
    gib = 2**30
    monkeypatch.setattr(fits.hostmem, "available_bytes", lambda: 20 * gib)
    with pytest.raises(UsageError, match=r"--tp 2: llama-70b's shard, 135.3 GiB of float32 x 2 ranks on the CPU; "
                                         r"20.0 GiB free"):
        tp.bench("llama-70b", [2], [1], 2, 2, ["sync"], "cpu")
    with pytest.raises(UsageError, match=r"^llama-8b, 29.9 GiB of float32 on the CPU; 20.0 GiB free"):
        decode.check("llama-8b", [1], 2, 2, ["sync"], "cpu", False)
    decode.check("llama-1b", [1], 2, 2, ["sync"], "cpu", False)  # 4.6 GiB: fits
    monkeypatch.setattr(fits.hostmem, "available_bytes", lambda: None)  # no /proc/meminfo: not judged
    decode.check("llama-8b", [1], 2, 2, ["sync"], "cpu", False)
    props = type("P", (), {"total_memory": 80 * gib})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: props)
    with pytest.raises(UsageError, match=r"--tp 1: llama-70b's shard is 131 GiB, over 92% of this GPU's 80 GiB: give "
                                         r"degrees of 2 or more"):
        fits.check("llama-70b", [2, 1], torch.device("cuda", 0), torch.bfloat16)
    fits.check("llama-70b", [2, 4], torch.device("cuda", 0), torch.bfloat16)


@pytest.fixture(scope="module")
def tp_result(tmp_path_factory):
    """TP=1 (no group: one process, no collective) and TP=2 (gloo ranks, float32)."""
    res = tp.bench("tiny", [2, 1], BATCHES, PROMPT, OUTPUT, MODES, "cpu", iters=2, warmup=0)
    path = tmp_path_factory.mktemp("tp") / "tp.json"
    res.save(path)
    return res, path


def test_tokens_agree_within_a_degree_and_logits_across_degrees(tp_result):
    res, _ = tp_result
    assert not res.errors, res.errors
    tok = [r for r in res.rows if r.metric == "tok_per_s"]
    assert [(r.params["tp"], r.params["batch"], r.params["mode"]) for r in tok] == [
        (n, b, mode) for n in (1, 2) for b in BATCHES for mode in MODES]  # degrees ascending, whatever the order given
    for r in tok:
        assert r.test == "decode_tp" and r.median > 0 and r.n == 2
        assert r.extra["tokens_match"] and r.extra["ranks_agree"]
        assert r.extra["reference"] == f"tp {r.params['tp']} sync"  # within a degree: its first mode
        assert r.extra["collectives_per_step"] == (0 if r.params["tp"] == 1 else 4)
        assert r.extra["logits_vs"] == 1 and r.extra["logits_within"] and r.extra["logits_tolerance"] == 1e-4
        assert r.extra["logits_rel_diff"] <= (0 if r.params["tp"] == 1 else 1e-5)
    s = res.settings["decode_tp"]
    assert s["backend"] == "gloo" and s["degrees"] == [1, 2] and s["all_reduces_per_step"] == 4
    assert s["dtype"] == "float32" and s["logits_tolerance"] == 1e-4


def test_tensor_parallel_logits_beyond_the_tolerance_are_an_error_not_silence():
    a = torch.tensor([[1.0, 2.0, 3.0]])
    got = tp._compare_degrees({(1, 4): a, (2, 4): a + torch.tensor([[0.0, 0.0, 0.1]])}, tp.LOGITS_TOL_F32)
    assert got[(1, 4)]["logits_within"] and not got[(2, 4)]["logits_within"]
    assert got[(2, 4)]["logits_rel_diff"] == pytest.approx(0.1 / 3)
    assert tp._first_parting([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == "sequence 1, token 1"


@torch.no_grad()
@pytest.mark.parametrize("layers", [2, 12])
def test_bf16_degrees_drift_within_the_tolerance_and_a_sharding_error_does_not(layers):
    """In bf16 another degree sums in another order at every layer: its logits drift (never exactly equal) within
    logits_tol; a rank whose partial sum goes missing in one all-reduce is far beyond it."""
    spec = dict(decode.PRESETS["tiny"], num_hidden_layers=layers, num_key_value_heads=4)
    ids = decode.prompts(spec["vocab_size"], 8, PROMPT)
    tol = tp.logits_tol(torch.bfloat16, layers)
    assert tol == pytest.approx(4 * 2 ** -8 * layers ** 0.5)

    def last(model):
        return model(input_ids=ids).logits[:, -1].float()

    ref = last(engine.build(spec, 0, 1, "cpu", torch.bfloat16, seed=3))
    drift = []
    for n in (2, 4):
        got = _in_step(n, lambda r, ar: last(engine.build(spec, r, n, "cpu", torch.bfloat16, seed=3, all_reduce=ar)))
        drift.append(float(tp._compare_degrees({(1, 8): ref, (n, 8): got[0]}, tol)[(n, 8)]["logits_rel_diff"]))
    assert all(0 < d <= tol for d in drift), (drift, tol)

    def lossy(r, ar):  # rank 0's first all-reduce keeps its own partial: rank 1's share never arrives
        calls = []

        def reduce(t):
            calls.append(1)
            mine = t.clone()
            ar(t)
            if r == 0 and len(calls) == 1:
                t.copy_(mine)
        return last(engine.build(spec, r, 2, "cpu", torch.bfloat16, seed=3, all_reduce=reduce))

    bad = tp._compare_degrees({(1, 8): ref, (2, 8): _in_step(2, lossy)[0]}, tol)[(2, 8)]
    assert not bad["logits_within"] and bad["logits_rel_diff"] > 2 * tol


def test_the_predicted_emulated_step_adds_each_toll_the_step_pays():
    params = {"nccl_toll_us": "12.5", "nvlink_kept": "0.89", "native_nvlink_gbps": "300", "launch_toll_us": "18.6",
              "mgpu_launch_factor": "2", "h2d_toll_us": "0.6", "d2h_toll_us": "0.6", "sync_toll_us": "22.4"}
    pred, tolls = tp.predicted_ms(params, 4, 1, 8192, 160, {"h2d": 3, "readback": 1}, True, 10.0)
    wire = 2 * 3 / 4 * 8192 * 2
    assert tolls["collectives"] == pytest.approx(160 * (12.5 + wire / 300e3 * (1 / 0.89 - 1)))
    assert tolls["launch"] == pytest.approx(37.2) and tolls["inputs"] == pytest.approx(1.8)
    assert tolls["readback"] == pytest.approx(23.0)
    assert pred == pytest.approx(10.0 + sum(tolls.values()) / 1e3)
    assert tp.predicted_ms(params, 4, 1, 8192, 160, {}, False, 10.0) == (None, {})  # eager: launches not counted
    capped = tp.predicted_ms(dict(params, nccl_toll_max_bytes="8192"), 4, 1, 8192, 160, {}, True, 10.0)[1]
    assert capped["collectives"] == pytest.approx(160 * wire / 300e3 * (1 / 0.89 - 1))  # 16 KiB ops: above the cap
    assert tp.predicted_ms(dict(params, dilation="2.39"), 4, 1, 8192, 160, {}, True, 10.0) == (None, {})


def test_the_hbm_share_is_the_roofline_over_the_steps_gpu_time():
    """hbm_share = weight bytes at the measured copy rate over the step's GPU busy ms (busy fraction x step): the
    F that --project-by hbm:F takes; capped at 1; absent without a GPU busy figure (CPU ranks)."""
    from ccbridge.results import Row

    def got(busy, step_ms):
        tok = Row.of(tp.TEST, "tok_per_s", "tok/s", [100.0], batch=1, mode="sync")
        tok.extra = {"gpu_busy": busy}
        return {"step": {"weight_bytes": 16e9, "copy_gbps": 3000.0, "outside_ms": None, "native_step_ms": None},
                "batch": 1, "mode": "sync", "rows": [tok, Row.of(tp.TEST, "step_ms", "ms", [step_ms])]}

    rows = {r.metric: r for r in tp._step_rows(got(0.8, 10.0), 1, "llama-8b", True, {})}
    assert rows["roofline_ms"].median == pytest.approx(16e9 / 3000e9 * 1e3)
    assert rows["hbm_share"].median == pytest.approx(16e9 / 3000e9 * 1e3 / 8.0)
    assert rows["hbm_share"].extra["gpu_busy_ms"] == pytest.approx(8.0)
    assert {r.metric: r for r in tp._step_rows(got(0.5, 4.0), 1, "llama-8b", True, {})}["hbm_share"].median == 1.0
    assert "hbm_share" not in {r.metric for r in tp._step_rows(got(None, 10.0), 1, "llama-8b", True, {})}


def test_the_step_outside_the_collectives_is_measured_not_subtracted(tp_result):
    """outside: the same decode with the all-reduces left out (each rank's kernels alone); collective_ms: the native
    step less that; at TP=1 the step is all outside. The live gloo bench measures it at TP=2."""
    from ccbridge.results import Row

    def got(outside, native):
        tok = Row.of(tp.TEST, "tok_per_s", "tok/s", [100.0], batch=1, mode="sync")
        return {"step": {"weight_bytes": 6e9, "copy_gbps": 3000.0, "outside_ms": outside, "native_step_ms": native},
                "batch": 1, "mode": "sync", "per_step": {}, "rows": [tok, Row.of(tp.TEST, "step_ms", "ms", [9.0])]}

    rows = {r.metric: r for r in tp._step_rows(got(2.5, [3.0, 3.4, 3.5]), 4, "llama-8b", True, {})}
    assert rows["collective_ms"].median == pytest.approx(0.9) and rows["collective_ms"].extra[
        "outside_collectives_ms"] == 2.5
    assert rows["outside_over_roofline"].median == pytest.approx(2.5 / 2.0)
    one = {r.metric: r for r in tp._step_rows(got(None, None), 1, "llama-8b", True, {})}
    assert one["collective_ms"].median == 0 and one["outside_over_roofline"].median == pytest.approx(9.0 / 2.0)
    res, _ = tp_result
    for r in (r for r in res.rows if r.metric == "collective_ms"):
        outside = r.extra["outside_collectives_ms"]
        assert outside > 0 and (r.median == 0) == (r.params["tp"] == 1), r.key()


def test_the_result_file_and_table(tp_result):
    res, path = tp_result
    back = results.load(path)
    assert [r.key() for r in back.rows] == [r.key() for r in res.rows]
    table = tp.render(back)
    assert all(len(line) <= 120 for line in table.splitlines()), table
    lines = [line.split() for line in table.splitlines() if not line.startswith("#")]
    assert lines[0][:4] == ["tp", "batch", "mode", "tok/s"] and "x" in lines[0] and "TP=1" in lines[0]
    assert len(lines) == 1 + 2 * len(BATCHES) * len(MODES)
    assert all(any(w.startswith("same") for w in line) for line in lines[1:])
    assert "gloo" in table and "4 all-reduces per step (none at TP=1)" in table
    assert {r.metric for r in res.rows} >= {"tok_per_s", "step_ms", "token_gap_ms", "collective_ms"}
    # every verdict stays in its row at 120 columns; where tokens parted and the near ties go under the table
    row = next(r for r in back.rows if r.metric == "tok_per_s" and r.params["tp"] == 2)
    row.extra.update(ranks_agree=False, near_ties=12, logits_rel_diff=0.123, logits_within=False,
                     first_parting="sequence 10, token 4")
    table = tp.render(back)
    assert all(len(line) <= 120 for line in table.splitlines()), table
    assert any(line.endswith("RANKS DIFFER; 1.2e-01 BEYOND") for line in table.splitlines()), table
    assert "tokens part from tp 1's at sequence 10, token 4" in table and "at 12 near ties" in table


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
    assert rc == 2 and err == ["ccbridge bench decode: tensor-parallel rank 0 of 1 failed: RuntimeError: rank 0 cannot "
                               "build tiny"], err
    assert not (tmp_path / "t.json").exists()


def _oom_at_batch_2(rank, n, dev, send, job):
    from ccbridge.results import Row

    row = Row.of(tp.TEST, "step_ms", "ms", [1.0], tp=n, batch=1, mode="sync")
    send(("rows", {"batch": 1, "mode": "sync", "errors": [], "tokens": [[1]], "rows": [row, row], "per_step": {},
                   "step": {"weight_bytes": 1, "copy_gbps": None, "outside_ms": None, "native_step_ms": None}}))
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


def test_the_compiled_decode_step_takes_every_batch_and_cache_size_of_a_bench(monkeypatch):
    """On a GPU the engine compiles a decode step's halves (fullgraph: past dynamo's 8 entries per function a run
    fails rather than falling back). A bench's batches and modes (graphs over a fixed cache, eager decodes growing
    theirs) must stay under that, and give the uncompiled engine's tokens. The eager backend: dynamo's entries and
    guards without inductor's compile time."""
    import torch._dynamo

    monkeypatch.setattr(engine, "BACKEND", "eager")
    torch._dynamo.reset()
    spec = decode.PRESETS["tiny"]
    plain = engine.build(spec, 0, 1, "cpu", torch.float32, seed=2, compiled=False)
    compiled = engine.build(spec, 0, 1, "cpu", torch.float32, seed=2, compiled=True)
    for batch in (1, 8, 32, 3, 128, 5):
        ids = decode.prompts(spec["vocab_size"], batch, 12, seed=batch)
        for graphs in (True, False):
            want = decode.decode(plain, ids, 6, "sync", graphs=graphs).tokens
            got = decode.decode(compiled, ids, 6, "sync", graphs=graphs).tokens
            assert torch.equal(got, want), (batch, graphs)
    torch._dynamo.reset()


def test_where_the_engine_fuses_its_gemvs_by_default(monkeypatch):
    """One rule (engine.fuses), read by the engine and by the bench's fused_gemv setting: compiled, on a GPU, with
    triton; the device need not exist to be judged."""
    from ccbridge.serve import gemv

    monkeypatch.setattr(gemv, "available", lambda: True)
    assert engine.fuses("cuda") and engine.fuses("cuda", True)
    assert not engine.fuses("cuda", False) and not engine.fuses("cpu") and not engine.fuses("cpu", True)
    monkeypatch.setattr(gemv, "available", lambda: False)
    assert not engine.fuses("cuda")
    assert engine.build(decode.PRESETS["tiny"], 0, 1, "cpu", torch.float32).fused is False


def _no_rows(rank, n, dev, send, job):
    """A rank that measures nothing: the bench's settings alone are in question."""


@needs_transformers
def test_the_fused_gemv_setting_says_pdl_only_where_the_ranks_launch_with_it(monkeypatch):
    """REVIEW rev37: CCBRIDGE_GEMV_PDL=1 on a GPU without griddepcontrol runs the PDL layout launched plainly (its
    launch_pdl only where the GPU has it), so the result must not say 'launched with PDL' there."""
    from ccbridge.serve import gemv

    monkeypatch.setattr(tp, "_bench_rank", _no_rows)
    monkeypatch.setattr(engine, "fuses", lambda dev, compiled=None: True)  # as a GPU rank's engine would
    said = {}
    for env, has_gdc in (("1", False), ("1", True), ("0", True), ("", True), ("", False)):
        monkeypatch.setenv(gemv.ENV, env)
        monkeypatch.setattr(gemv, "hopper", lambda dev, has_gdc=has_gdc: has_gdc)
        res = tp.bench("tiny", [1], [1], 4, 3, ["sync"], "cpu", iters=1, warmup=0)
        said[(env, has_gdc)] = res.settings["decode_tp"]["fused_gemv"].endswith(", launched with PDL")
    # unset: PDL only where the steps replay as CUDA graphs (this CPU bench runs none)
    assert said == {("1", False): False, ("1", True): True, ("0", True): False, ("", True): False,
                    ("", False): False}
    monkeypatch.setenv(gemv.ENV, "")
    monkeypatch.setattr(gemv, "hopper", lambda dev: True)
    assert tp.fused_gemv_setting("cpu", graphs=True).endswith(", launched with PDL")
    assert tp.fused_gemv_setting("cpu", graphs=False).endswith(", launched without PDL")
