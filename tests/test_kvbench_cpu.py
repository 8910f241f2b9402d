"""`ccbridge bench kv` on the CPU: the tiny model through a KVCache with a host tier; every first token equals a
full prefill's, the store threshold cuts spills of one-off blocks, the counters add up, the Result's rows."""

import json

import pytest

torch = pytest.importorskip("torch", reason="the kv bench needs torch")
pytest.importorskip("transformers", reason="the kv bench builds a Hugging Face transformers model "
                                           "(pip install transformers)")

from ccbridge import choices, cli, results  # noqa: E402
from ccbridge.errors import UsageError  # noqa: E402
from ccbridge.serve import KVCache, decode, kvbench  # noqa: E402

BT = kvbench.BLOCK_TOKENS
SMALL = dict(prefixes=6, prefix_len=64, suffix_len=16, requests=20, device="cpu", check_every=1, churn=0, warmup=1)


@pytest.fixture(scope="module")
def tiny():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the drain thread's copies beside a multi-threaded forward make OpenMP spin (slow)
    yield decode.build("tiny", "cpu", seed=0)
    torch.set_num_threads(threads)


def _rows(res):
    return {(r.params["threshold"], r.params["mode"], r.metric): r for r in res.rows}


def test_cli_modes_cover_the_bench():
    assert set(kvbench.MODES) <= set(choices.DECODE_MODES)  # bench kv's --modes offers decode's


@pytest.mark.parametrize("suffix", [16, 8, 21])  # whole blocks, less than a block, a partial last block
def test_every_first_token_equals_a_full_prefill(tiny, suffix):
    res = kvbench.bench("tiny", **{**SMALL, "suffix_len": suffix}, thresholds=[1, 2], _model=tiny)
    assert not res.errors
    rows = _rows(res)
    for th in (1, 2):
        for mode in kvbench.MODES:
            e = rows[(th, mode, "ttft_ms")].extra
            assert e["checked"] == SMALL["requests"] and e["mismatches"] == 0 and e["near_ties"] == 0
    # the cached paths ran: blocks came from the device and from the host tier
    assert rows[(1, "async", "device_hit_rate")].median > 0 and rows[(1, "async", "host_hit_rate")].median > 0
    assert rows[(1, "async", "restore_bytes")].median > 0


def test_server_matches_reference_per_request_including_a_fully_cached_prompt(tiny):
    cfg = tiny.config
    shape = (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, BT, cfg.hidden_size // cfg.num_attention_heads)
    wl = kvbench.workload(cfg.vocab_size, 3, 48, 16, 12, 1.0, seed=3)
    with KVCache(shape, torch.float32, device_blocks=5, host_blocks=64, block_tokens=BT, device="cpu",
                 threshold=1) as kv:
        srv = kvbench.Server(tiny, kv, "async")
        for toks in wl.warm + [t for _, t in wl.stream] + wl.warm:  # the warm-ups again: fully cached now
            tok, ttft, total = srv.serve(toks)
            assert tok == int(kvbench.reference(tiny, toks).argmax())
            assert 0 < ttft <= total
        kv.flush()
        s = kv.stats()
    assert s["host_hits"] > 0 and s["restore_bytes"] > 0 and s["spill_bytes"] > 0


def test_threshold_2_spills_far_less_with_one_off_prefixes(tiny):
    # 16 prefixes, skewed reuse, no warm-up pass: many prefixes (and every suffix) are seen once
    res = kvbench.bench("tiny", prefixes=16, prefix_len=64, suffix_len=32, requests=24, zipf=1.2, warmup=0,
                        churn=0, thresholds=[1, 2], modes=["async"], device="cpu", check_every=4, _model=tiny)
    assert not res.errors
    rows = _rows(res)
    s1, s2 = rows[(1, "async", "spill_bytes")].median, rows[(2, "async", "spill_bytes")].median
    assert s1 > 0 and s2 * 4 < s1, (s1, s2)
    assert rows[(2, "async", "ttft_ms")].extra["dropped_threshold"] > 0
    # what threshold 1 spilled but nobody asked for again is what threshold 2 saved: the same host hits or fewer
    assert rows[(2, "async", "host_hit_rate")].median <= rows[(1, "async", "host_hit_rate")].median


def test_under_churn_threshold_2_keeps_the_shared_prefixes_and_spills_almost_nothing(tiny):
    """The default workload's shape (churn 3, two warm-up passes): in the steady state threshold 1 spills every
    evicted one-off block, threshold 2 spills none of them; the shared prefixes come back from the host."""
    res = kvbench.bench("tiny", prefixes=4, prefix_len=64, suffix_len=16, requests=16, thresholds=[1, 2],
                        modes=["async"], device="cpu", check_every=2, _model=tiny)
    assert not res.errors and res.settings["kv"]["churn"] == 3 and res.settings["kv"]["warmup"] == 2
    rows = _rows(res)
    s1, s2 = rows[(1, "async", "spill_bytes")].median, rows[(2, "async", "spill_bytes")].median
    one_off = 16 * 3 * (64 + 16) // BT * res.settings["kv"]["block_bytes"]  # the churn's blocks in the window
    assert s1 >= one_off and s2 * 100 <= s1, (s1, s2)
    e1, e2 = rows[(1, "async", "ttft_ms")].extra, rows[(2, "async", "ttft_ms")].extra
    assert e2["dropped_threshold"] >= 16 * 3 * (64 + 16) // BT  # every one-off block dropped, none spilled
    assert e1["blocks_looked_up"] == e2["blocks_looked_up"] == 16 * (64 + 16) // BT  # the measured requests only
    assert rows[(2, "async", "host_hit_rate")].median >= rows[(1, "async", "host_hit_rate")].median
    assert rows[(2, "async", "host_hit_rate")].median > 0.5  # the prefixes came back from the host tier
    assert rows[(1, "async", "ttft_ms")].n == 16  # churn requests are not timed


def test_counters_add_up_to_the_requests_blocks(tiny):
    res = kvbench.bench("tiny", **{**SMALL, "suffix_len": 21, "check_every": 0}, iters=2, _model=tiny)
    per_request = (64 + 21) // BT
    for (th, mode, metric), r in _rows(res).items():
        if metric != "ttft_ms":
            continue
        e = r.extra
        assert e["blocks_looked_up"] == 2 * SMALL["requests"] * per_request
        assert e["device_hits"] + e["host_hits"] + e["misses"] == e["blocks_looked_up"]
        assert e["restore_bytes"] == e["restored_blocks"] * res.settings["kv"]["block_bytes"]
        assert e["p50"] == r.median and e["p99"] >= r.median and r.n == 2 * SMALL["requests"]
        rates = sum(_rows(res)[(th, mode, m)].median for m in ("device_hit_rate", "host_hit_rate", "miss_rate"))
        assert rates == pytest.approx(1.0)


def test_sync_and_async_move_the_same_bytes(tiny):
    res = kvbench.bench("tiny", **{**SMALL, "check_every": 0}, thresholds=[1, 3], _model=tiny)
    rows = _rows(res)
    for th in (1, 3):
        for m in ("spill_bytes", "restore_bytes", "device_hit_rate", "host_hit_rate", "miss_rate"):
            assert rows[(th, "sync", m)].median == rows[(th, "async", m)].median


def test_bench_kv_cli_writes_a_result(tmp_path, capsys):
    rc = cli.main(["bench", "kv", "--model", "tiny", "--device", "cpu", "--prefixes", "4", "--prefix-len", "32",
                   "--suffix-len", "16", "--requests", "8", "--thresholds", "1", "2", "--json", str(tmp_path / "k.json")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "EMULATED" not in out.out and "DIFFER" not in out.out
    assert len([l for l in out.out.splitlines() if l.split()[:2] in (["1", "sync"], ["1", "async"], ["2", "sync"],
                                                                      ["2", "async"])]) == 4
    res = results.load(tmp_path / "k.json")
    assert not res.errors and not res.emulated and res.settings["kv"]["model"] == "tiny"
    metrics = ("ttft_ms", "request_ms", "spill_bytes", "restore_bytes", "device_hit_rate", "host_hit_rate", "miss_rate")
    assert set(_rows(res)) == {(th, mode, m) for th in (1, 2) for mode in ("sync", "async") for m in metrics}
    for r in res.rows:
        assert r.test == "kv" and r.params["model"] == "tiny" and set(r.params) == {"model", "threshold", "mode"}
    assert res.settings["kv"]["device_blocks"] == 3  # 1/3 of 4 prefixes x 2 blocks, rounded up: one request's 3
    assert cli.main(["compare", str(tmp_path / "k.json"), str(tmp_path / "k.json")]) == 0


def test_emulated_runs_say_so(tmp_path, monkeypatch, capsys, driver_here):
    monkeypatch.setenv("CCBRIDGE_EMULATION_PROFILE", "b300")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(tmp_path / "none.conf"))
    rc = cli.main(["bench", "kv", "--model", "tiny", "--device", "cpu", "--prefixes", "2", "--prefix-len", "16",
                   "--suffix-len", "4", "--requests", "2", "--thresholds", "2", "--modes", "async",
                   "--json", str(tmp_path / "k.json")])
    assert rc == 0
    assert "EMULATED CC bridge (profile b300)" in capsys.readouterr().out
    assert results.load(tmp_path / "k.json").emulated


def test_a_wrong_first_token_fails_the_run(tmp_path, monkeypatch, capsys):
    real = kvbench.Server.serve

    def off_by_one(self, tokens):
        tok, a, b = real(self, tokens)
        return (tok + 1 if self.mode == "sync" else tok), a, b

    monkeypatch.setattr(kvbench.Server, "serve", off_by_one)
    rc = cli.main(["bench", "kv", "--model", "tiny", "--device", "cpu", "--prefixes", "2", "--prefix-len", "16",
                   "--suffix-len", "4", "--requests", "9", "--thresholds", "2", "--json", str(tmp_path / "k.json")])
    out = capsys.readouterr()
    assert rc == 1
    assert "threshold 2, sync: the first token differs from a full prefill's in 2 of 2 checked requests" in out.err
    assert "2 DIFFER" in out.out
    doc = json.loads((tmp_path / "k.json").read_text())
    assert doc["errors"] and doc["errors"][0]["test"] == "kv"


def test_api_checks():
    ok = dict(model="tiny", prefixes=2, prefix_len=32, suffix_len=4, requests=2, thresholds=[1], modes=["sync"],
              device="cpu")
    for change, msg in ((dict(model="gpt5"), "unknown model 'gpt5'"), (dict(modes=["drain"]), "schedules sync or async"),
                        (dict(thresholds=[0]), "thresholds of at least 1"), (dict(prefix_len=8), "shorter than one KV block"),
                        (dict(zipf=float("nan")), "--zipf nan"), (dict(gpu_fraction=1.5), "--gpu-fraction 1.5"),
                        (dict(gpu_fraction=0.5, device_blocks=9), "not both"),
                        (dict(device_blocks=1), "one request holds 2 blocks"),
                        (dict(prefix_len=4000, suffix_len=100), "tiny holds 4096")):
        with pytest.raises(UsageError, match=msg):
            kvbench.check(**{**ok, **change})
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="torch sees no GPU"):
            kvbench.check(**{**ok, "device": "cuda"})
    assert kvbench.device_budget(8, 1024, 32, 1 / 3, None) == 171  # defaults: a third of 8 x 64 prefix blocks


def test_a_huge_zipf_exponent_draws_prefix_0_only():
    # 1/(i+1)^s overflowed (OverflowError traceback from `bench kv --zipf 1e308`); the weights now underflow to 0
    wl = kvbench.workload(512, 3, 16, 1, 8, 1e308)
    assert [i for i, _ in wl.stream] == [0] * 8
    assert len({i for i, _ in kvbench.workload(512, 3, 16, 1, 64, 0.0).stream}) > 1  # 0: uniform still


def test_a_long_pass_says_where_it_is(tiny, monkeypatch):
    monkeypatch.setattr(kvbench, "PROGRESS_S", 0.0)  # every request is "long enough" for a line
    lines = []
    kvbench.bench("tiny", **{**SMALL, "check_every": 0}, thresholds=[2], modes=["async"], _model=tiny,
                  log=lines.append)
    assert any(f"served {SMALL['requests']}/{SMALL['requests']}" in x for x in lines)
    assert any("warm-up 1/" in x for x in lines)


def test_the_cuda_default_is_the_published_shape():
    """bench kv's CUDA default is the published setup's: Qwen2.5-3B and a 1.1 GiB prefix per request (bf16 K and V
    of 36 layers x 2 KV heads x 128 dims = 36 KiB a token), within the model's context with the suffix."""
    d = kvbench.DEVICE_DEFAULTS["cuda"]
    cfg = decode.PRESETS[d["model"]]
    per_token = cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["hidden_size"] // cfg["num_attention_heads"] * 2 * 2
    assert d["model"] == "qwen2.5-3b" and per_token == 36 << 10
    assert abs(d["prefix_len"] * per_token / 2**30 - 1.1) < 0.05
    assert d["prefix_len"] + kvbench.DEFAULTS["suffix_len"] <= cfg["max_position_embeddings"]
    assert kvbench.DEFAULTS["churn"] == 3
