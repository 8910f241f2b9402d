"""`ccbridge bench decode` on the CPU: the tiny model, every mode, the same tokens as a plain greedy loop."""

import json
import sys

import pytest

torch = pytest.importorskip("torch", reason="the decode harness needs torch")
pytest.importorskip("transformers", reason="the decode harness builds a Hugging Face transformers model "
                                           "(pip install transformers)")

from ccbridge import cli, results  # noqa: E402
from ccbridge.errors import UsageError  # noqa: E402
from ccbridge.serve import decode, judge  # noqa: E402

PROMPT, OUTPUT = 12, 9


@pytest.fixture(scope="module")
def tiny():
    return decode.build("tiny", "cpu", seed=0)


@torch.no_grad()
def _greedy_without_cache(model, ids, n):
    """Each token from a full forward over everything so far: no KV cache, no positions passed."""
    out = []
    for _ in range(n):
        nxt = model(input_ids=ids).logits[:, -1].argmax(-1)
        out.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("batch", [1, 3])
def test_every_mode_gives_the_reference_tokens(tiny, batch):
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], batch, PROMPT, seed=5)
    want = _greedy_without_cache(tiny, ids, OUTPUT)
    for mode in decode.MODES:
        r = decode.decode(tiny, ids, OUTPUT, mode)
        assert r.tokens.shape == (batch, OUTPUT) and r.tokens.dtype == torch.int64
        assert torch.equal(r.tokens, want), mode
        assert len(r.step_s) == OUTPUT - 1 and r.wall_s > 0 and r.gpu_busy is None


@pytest.mark.parametrize("batch", [1, 3])
def test_the_static_cache_path_of_graphs_gives_the_reference_tokens(tiny, batch):
    """--graphs decodes over a StaticCache through persistent input buffers (on the CPU without the capture,
    which needs CUDA): every mode, the same tokens as the dynamic cache's."""
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], batch, PROMPT, seed=7)
    want = _greedy_without_cache(tiny, ids, OUTPUT)
    for mode in decode.MODES:
        assert torch.equal(decode.decode(tiny, ids, OUTPUT, mode, graphs=True).tokens, want), mode


def test_any_hf_causal_lm_decodes_as_generate_does():
    """decode() is a generate loop for any Hugging Face causal LM, not only the presets: a tiny GPT-2 (no
    cache_position, learned positions) gives generate()'s greedy tokens in every mode, static cache too."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=128,
                                  bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(1))
    try:
        want = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                          do_sample=False, pad_token_id=0)[:, 10:]
    except (TypeError, ValueError) as e:  # generation API drift across transformers versions
        pytest.skip(f"generate() refused the arguments here: {e}")
    for mode in decode.MODES:
        for graphs in (False, True):
            assert torch.equal(decode.decode(m, ids, 8, mode, graphs=graphs).tokens, want), (mode, graphs)


def test_a_checkpoint_folder_is_decoded_with_its_own_weights(tiny, tmp_path, capsys):
    """--checkpoint DIR: a Hugging Face folder (config.json, model.safetensors) whose weights ccbridge's loader
    reads; the tokens are those of the model that was saved, and the result names the checkpoint."""
    tiny.save_pretrained(tmp_path / "ck", safe_serialization=True)
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 2, PROMPT, seed=0)
    want = decode.decode(tiny, ids, OUTPUT, "sync").tokens
    m, label, vocab = decode.from_checkpoint(str(tmp_path / "ck"), "cpu", PROMPT + OUTPUT)
    assert label == "checkpoint ck" and vocab == decode.PRESETS["tiny"]["vocab_size"]
    assert torch.equal(decode.decode(m, ids, OUTPUT, "drain").tokens, want)
    rc = cli.main(["bench", "decode", "--checkpoint", str(tmp_path / "ck"), "--device", "cpu", "--batch", "2",
                   "--prompt", str(PROMPT), "--output", str(OUTPUT), "--iters", "1", "--warmup", "0",
                   "--modes", "sync", "async", "--json", str(tmp_path / "d.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "checkpoint ck (its weights)" in out
    res = results.load(tmp_path / "d.json")
    assert res.settings["decode"]["checkpoint"] == str((tmp_path / "ck").resolve()) and not res.errors


def test_a_checkpoint_whose_weights_do_not_fit_is_refused(tiny, tmp_path):
    from safetensors.torch import save_file

    tiny.save_pretrained(tmp_path / "ck", safe_serialization=True)
    state = {k: v.contiguous() for k, v in tiny.state_dict().items() if "layers.1." not in k}
    save_file(state, str(tmp_path / "ck" / "model.safetensors"))  # a layer's weights missing
    with pytest.raises(UsageError, match="its weights do not fit its config.json: missing model.layers.1"):
        decode.from_checkpoint(str(tmp_path / "ck"), "cpu", 16)
    with pytest.raises(UsageError, match="holds 4096"):
        decode.from_checkpoint(str(tmp_path / "ck"), "cpu", 5000)
    state = {k: v.contiguous() for k, v in tiny.state_dict().items()}
    name = next(k for k in state if k.endswith("mlp.up_proj.weight"))
    state[name] = state[name][: state[name].shape[0] // 2].contiguous()
    save_file(state, str(tmp_path / "ck" / "model.safetensors"))  # a tensor of the wrong shape
    with pytest.raises(UsageError, match=rf"{name} is \(64, 64\), its config makes it \(128, 64\)"):
        decode.from_checkpoint(str(tmp_path / "ck"), "cpu", 16)


def test_a_checkpoint_that_is_not_a_causal_lm_is_refused(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100)
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path / "bert", safe_serialization=True)
    with pytest.raises(UsageError, match="a BertForMaskedLM model, not a causal LM"):
        decode.from_checkpoint(str(tmp_path / "bert"), "cpu", 16)
    with pytest.raises(UsageError, match="--checkpoint : not a folder"):
        decode.bench("tiny", [1], 4, 2, ["sync"], "cpu", checkpoint="")  # an empty path is not "no checkpoint"


def test_graphs_on_the_cpu_are_refused():
    with pytest.raises(UsageError, match="--graphs captures CUDA graphs: it needs a CUDA device"):
        decode.check("tiny", [1], 4, 4, ["sync"], "cpu", True)


def test_tokens_equal_generate(tiny):
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 2, PROMPT, seed=1)
    try:
        got = tiny.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT, do_sample=False,
                            min_new_tokens=OUTPUT)
    except (TypeError, ValueError) as e:  # generation API drift across transformers versions
        pytest.skip(f"generate() refused the arguments here: {e}")
    assert torch.equal(decode.decode(tiny, ids, OUTPUT, "drain").tokens, got[:, PROMPT:])


def test_each_mode_schedules_as_named(tiny):
    """sync reads N before launching N+1; async/staged launch N+1 first; drain launches N+2 first."""
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 2, PROMPT)
    order = {}
    for mode in decode.MODES:
        trace = []
        r = decode.decode(tiny, ids, OUTPUT, mode, trace=trace)
        order[mode] = {ev: i for i, ev in enumerate(trace)}
        assert sorted(e for e in trace if e[0] == "read") == [("read", n) for n in range(OUTPUT)]
        assert sorted(e for e in trace if e[0] == "launch") == [("launch", n) for n in range(1, OUTPUT)]
        if mode in ("staged", "drain"):
            assert r.stats["staged"] == OUTPUT - 1 and r.stats["h2d"] == 0
        else:
            assert r.stats["staged"] == 0 and r.stats["h2d"] >= OUTPUT - 1
        assert r.stats["drained"] == (OUTPUT if mode == "drain" else 0)
    lag = {"sync": 0, "async": 1, "staged": 1, "drain": decode.DRAIN_LAG}
    for mode, pos in order.items():
        for n in range(1, OUTPUT - lag[mode]):
            # step n + lag is launched before token n - 1 ... read; sync reads token n - 1 before launching n
            if lag[mode]:
                assert pos[("launch", n + lag[mode] - 1)] < pos[("read", n - 1)], (mode, n)
            else:
                assert pos[("read", n - 1)] < pos[("launch", n)], (mode, n)
        if lag[mode] > 1:  # and no later: the thread takes each token once it is lag steps behind
            assert pos[("read", 0)] < pos[("launch", lag[mode] + 1)]


@pytest.mark.parametrize("mode", decode.MODES)
def test_host_prep_runs_before_each_launch_and_changes_no_token(tiny, mode):
    """host_prep_us: that much CPU time per step, after the step's inputs exist and before its launch."""
    ids = decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 2, PROMPT)
    plain = decode.decode(tiny, ids, OUTPUT, mode)
    calls = []
    real = decode._busy
    try:
        decode._busy = lambda s: (calls.append(s), real(s))
        r = decode.decode(tiny, ids, OUTPUT, mode, host_prep_us=20_000)
    finally:
        decode._busy = real
    assert torch.equal(r.tokens, plain.tokens)
    assert calls == [0.02] * (OUTPUT - 1)  # one per decode step
    assert r.wall_s >= 0.02 * (OUTPUT - 1)


def test_bench_result_rows_and_compare(tmp_path, capsys):
    rc = cli.main(["bench", "decode", "--model", "tiny", "--device", "cpu", "--batch", "1", "2", "--prompt", "8",
                   "--output", "5", "--iters", "2", "--warmup", "0", "--modes", "sync", "drain",
                   "--json", str(tmp_path / "d.json")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "EMULATED" not in out.out and "DIFFER" not in out.out
    assert len([l for l in out.out.splitlines() if l.split()[:1] in (["1"], ["2"])]) == 4
    res = results.load(tmp_path / "d.json")
    assert not res.errors and not res.emulated and res.settings["decode"]["model"] == "tiny"
    keys = {(r.metric, r.params["batch"], r.params["mode"]) for r in res.rows}
    assert keys == {(m, b, mode) for m in ("tok_per_s", "step_ms", "token_gap_ms") for b in (1, 2)
                    for mode in ("sync", "drain")}
    for r in res.rows:
        assert r.test == "decode" and r.params["model"] == "tiny" and r.params["graphs"] is False
        assert r.unit == {"tok_per_s": "tok/s", "step_ms": "ms", "token_gap_ms": "ms"}[r.metric] and r.median > 0
        assert r.n == (2 * 4 if r.metric == "token_gap_ms" else 2)  # one per run, or one per step
    by = {(r.metric, r.params["batch"], r.params["mode"]): r for r in res.rows}
    for b in (1, 2):  # a step is the run's wall time over its steps: tok/s and step ms say the same thing, run
        tok, step = by[("tok_per_s", b, "sync")], by[("step_ms", b, "sync")]  # by run (the fastest is both)
        assert tok.max == pytest.approx(b * 1e3 / step.min, rel=1e-9)
    assert cli.main(["compare", str(tmp_path / "d.json"), str(tmp_path / "d.json")]) == 0


def test_emulated_runs_say_so(tmp_path, monkeypatch, capsys, driver_here):
    monkeypatch.setenv("CCBRIDGE_EMULATION_PROFILE", "b300")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(tmp_path / "none.conf"))
    rc = cli.main(["bench", "decode", "--model", "tiny", "--device", "cpu", "--batch", "1", "--prompt", "4",
                   "--output", "3", "--iters", "1", "--warmup", "0", "--modes", "async",
                   "--json", str(tmp_path / "d.json")])
    assert rc == 0
    assert "EMULATED CC bridge (profile b300)" in capsys.readouterr().out
    assert results.load(tmp_path / "d.json").emulated


def test_mismatched_tokens_fail_the_run(tmp_path, monkeypatch, capsys):
    real = decode.decode

    def flipped(model, ids, output, mode, **kw):
        r = real(model, ids, output, mode, **kw)
        if mode == "staged":
            r.tokens[0, -1] += 1
        return r

    monkeypatch.setattr(decode, "decode", flipped)
    rc = cli.main(["bench", "decode", "--model", "tiny", "--device", "cpu", "--batch", "2", "--prompt", "4",
                   "--output", "3", "--iters", "1", "--warmup", "0", "--json", str(tmp_path / "d.json")])
    out = capsys.readouterr()
    assert rc == 1
    assert "batch 2, mode staged: tokens differ from sync's in 1 of 6 tokens (first: sequence 0, token 2)" in out.err
    assert "DIFFER" in out.out
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["errors"] and doc["errors"][0]["test"] == "decode"


def test_a_sequence_parting_at_a_near_tie_is_not_a_mismatch():
    """The judge reads the reference's logits where a sequence first parts: a near tie counts apart,
    any other token is wrong (later steps of a parted sequence are not compared)."""
    import types

    class Flat(torch.nn.Module):  # every position: tokens 3 and 5 tie (within 1e-6), 2 is far below
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, use_cache=False, **kw):
            lg = torch.zeros(1, input_ids.shape[1], 8)
            lg[..., 3], lg[..., 5] = 1.0, 1.0 - 1e-6
            return types.SimpleNamespace(logits=lg)

    same = judge.Judge(Flat(), torch.tensor([[1, 2], [1, 2]]))
    want = torch.tensor([[3, 3, 3], [3, 3, 3]])
    assert same(want, want.clone()) == (False, set())
    assert same(want, torch.tensor([[3, 5, 0], [3, 3, 3]])) == (False, {(0, 1)})
    assert same(want, torch.tensor([[3, 3, 3], [2, 3, 3]])) == (True, set())


def test_the_benches_run_without_cudnn_attention_and_restore_it(tiny, monkeypatch):
    """cuDNN's attention kernels parted bf16 runs on an H100; both benches switch them off while they run."""
    from ccbridge.serve import kvbench

    seen, real = [], decode.decode

    def spy(*a, **kw):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*a, **kw)

    monkeypatch.setattr(decode, "decode", spy)
    torch.backends.cuda.enable_cudnn_sdp(True)
    res = decode.bench("tiny", [1], 4, 3, ["sync"], "cpu", iters=1, warmup=0)
    assert seen == [False] and torch.backends.cuda.cudnn_sdp_enabled()
    assert res.settings["decode"]["cudnn_attention"] is False
    served = []

    def serve(self, tokens):
        served.append(torch.backends.cuda.cudnn_sdp_enabled())
        self.split = (0, 0, 1)
        return 0, 1e-3, 1e-3

    monkeypatch.setattr(kvbench.Server, "serve", serve)
    kvbench.bench("tiny", prefixes=1, prefix_len=16, suffix_len=4, requests=1, thresholds=[1], modes=["sync"],
                  device="cpu", churn=0, warmup=0, check_every=0, _model=tiny)
    assert served and not any(served) and torch.backends.cuda.cudnn_sdp_enabled()


def test_out_of_memory_keeps_the_rows_so_far_and_says_where(tmp_path, monkeypatch, capsys):
    real = decode.decode

    def oom_at_batch_2(model, ids, output, mode, **kw):
        if ids.shape[0] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 MiB. GPU 0 has ...")
        return real(model, ids, output, mode, **kw)

    monkeypatch.setattr(decode, "decode", oom_at_batch_2)
    rc = cli.main(["bench", "decode", "--model", "tiny", "--device", "cpu", "--batch", "1", "2", "4", "--prompt", "4",
                   "--output", "3", "--iters", "1", "--warmup", "0", "--modes", "sync", "async",
                   "--json", str(tmp_path / "d.json")])
    out = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out.err
    assert "batch 2, mode sync: CUDA out of memory; the larger batches and later modes did not run" in out.err
    res = results.load(tmp_path / "d.json")
    assert {(r.params["batch"], r.params["mode"]) for r in res.rows} == {(1, "sync"), (1, "async")}


def test_decode_runs_without_autograd(tiny):
    """Every forward of decode() runs with autograd off (d97fad8 slid a helper between decode and its
    torch.no_grad(): each step's activations then stayed alive through the KV cache, and the H100's eager
    batch 128 ran out of memory)."""
    modes = []
    hook = tiny.register_forward_pre_hook(lambda mod, args: modes.append(torch.is_grad_enabled()))
    try:
        with torch.enable_grad():
            decode.decode(tiny, decode.prompts(decode.PRESETS["tiny"]["vocab_size"], 2, PROMPT), 4, "sync")
    finally:
        hook.remove()
    assert modes and not any(modes)


def test_api_checks():
    with pytest.raises(UsageError, match="unknown model 'gpt5'"):
        decode.check("gpt5", [1], 4, 4, ["sync"], "cpu", False)
    with pytest.raises(UsageError, match="unknown mode 'eager'"):
        decode.check("tiny", [1], 4, 4, ["eager"], "cpu", False)
    with pytest.raises(UsageError, match="batch sizes must be 1 to 4096"):
        decode.check("tiny", [0], 4, 4, ["sync"], "cpu", False)
    with pytest.raises(UsageError, match="batch sizes must be 1 to 4096"):
        decode.check("tiny", [4097], 4, 4, ["sync"], "cpu", False)
    with pytest.raises(UsageError, match="output at least 2"):
        decode.check("tiny", [1], 4, 1, ["sync"], "cpu", False)
    with pytest.raises(UsageError, match="tiny holds 4096"):
        decode.check("tiny", [1], 4000, 100, ["sync"], "cpu", False)
    with pytest.raises(UsageError, match="needs a CUDA device"):
        decode.check("tiny", [1], 4, 4, ["sync"], "cpu", True)
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="torch sees no GPU"):
            decode.check("tiny", [1], 4, 4, ["sync"], "cuda", False)
    with pytest.raises(UsageError, match="unknown mode"):
        decode.decode(None, torch.zeros(1, 1, dtype=torch.int64), 2, "nosuch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_default_device_without_gpu_is_one_line(capsys):
    assert cli.main(["bench", "decode", "--model", "tiny", "--batch", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "ccbridge bench decode: --device cuda: torch sees no GPU (give --device cpu)", err
    assert sys.modules.get("ccbridge.serve.decode") is decode


def test_bench_traces_only_its_timed_runs(tiny, monkeypatch):
    """Under `ccbridge run --record` (ccbridge account) the model build, references and warm-up runs write no
    trace lines: recording is paused from the start, resumed for each (batch, mode)'s timed runs, paused
    after them (an error inside too), and given back as it was at the end."""
    events, real = [], decode.decode
    state = {"on": True}

    def pause(required=True):
        was, state["on"] = state["on"], False
        events.append("pause")
        return was

    def resume(was):
        if was:
            state["on"] = True
        events.append("resume" if was else "resume(no)")

    def spy(*a, **kw):
        events.append("timed" if state["on"] else "untraced")
        return real(*a, **kw)

    monkeypatch.setattr(decode.emu_trace, "pause", pause)
    monkeypatch.setattr(decode.emu_trace, "resume", resume)
    monkeypatch.setattr(decode, "decode", spy)
    decode.bench("tiny", [1, 2], 4, 3, ["sync", "async"], "cpu", iters=2, warmup=1)
    group = ["untraced", "resume", "timed", "timed", "pause"]
    assert events == ["pause"] + group * 4 + ["resume"] and state["on"]
