"""The fused GEMV (serve/gemv.py) and the engine's one-sequence decode step that uses it, on the CPU under Triton's
interpreter: the same results as the engine's torch ops, for each prologue and for shapes that no tile divides; the
engine calls it only where it should. Its speed is measured on a GPU (bench/gemv.py, bench/tp_step.py).

The interpreter must be on before triton is first imported (triton.language's own functions are made then), so the
kernel runs in a child process with TRITON_INTERPRET=1. The interpreter rounds float32 to bfloat16 toward zero where a
GPU rounds to nearest even, so bf16 cases are judged within bf16 rounding, float32 cases tightly."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (the GPU machines have it with torch)", allow_module_level=True)
from ccbridge.serve import gemv as fused  # noqa: E402 - after torch's skip

if not fused.available():
    pytest.skip("this torch has no torch.library.triton_op (2.6 on)", allow_module_level=True)
BENCH = Path(__file__).resolve().parents[1] / "bench"

CHILD = r"""
import json, torch
import torch.nn.functional as F
from ccbridge.serve import decode, engine, gemv

def ref(w, x, res, nw, b, silu):
    k = w.shape[1]
    if silu:
        x = F.silu(x[:k]) * x[k:]
    elif nw is not None:
        x = F.rms_norm(x if res is None else x + res, (k,), nw, gemv.EPS)
    return F.linear(x, w, b)

out = {"ops": [], "errors": [], "engine": []}
cases = [(torch.float32, n, k, t) for n, k, t in ((40, 300, (8, 128, 4)), (33, 64, (16, 64, 4)), (5, 700, (4, 512, 8)))]
cases.append((torch.bfloat16, 40, 300, (8, 128, 4)))
for dt, n, k, tile in cases:
    for pro in ("", "norm", "norm+res", "silu", "bias"):
        g = torch.Generator().manual_seed(n * 1000 + k)
        w = (torch.randn(n, k, generator=g) * 0.05).to(dt)
        x = torch.randn(2 * k if pro == "silu" else k, generator=g).to(dt)
        res = torch.randn(k, generator=g).to(dt) if pro == "norm+res" else None
        nw = torch.rand(k, generator=g).to(dt) if pro.startswith("norm") else None
        b = torch.randn(n, generator=g).to(dt) if pro == "bias" else None
        want = ref(w, x, res, nw, b, pro == "silu").float()
        rel = lambda y: float((y.float() - want).abs().max() / want.abs().max())
        y, s = gemv.gemv(w, x, res=res, norm_w=nw, bias=b, silu=pro == "silu", tile_nkw=tile)
        swapped, _ = gemv.gemv(w.flip(0).contiguous(), x, res=res, norm_w=nw, bias=b, silu=pro == "silu", tile_nkw=tile)
        s_err = None if s is None else float((s.float() - (x + res).float()).abs().max())
        out["ops"].append([str(dt), pro, n, k, list(y.shape), rel(y), rel(swapped), s_err])
w = torch.randn(8, 16)
for kw in (dict(x=torch.randn(32), silu=True, norm_w=torch.ones(16)), dict(x=torch.randn(15)),
           dict(x=torch.randn(16), w=torch.randn(16, 8).t()), dict(x=torch.randn(16), res=torch.randn(16)),
           dict(x=torch.randn(16), bias=torch.randn(3)), dict(x=torch.randn(16), norm_w=torch.ones(16).double()),
           dict(x=torch.randn(16), tile_nkw=(8, 96, 4))):
    try:
        gemv.gemv(kw.pop("w", w), **kw)
        out["errors"].append(None)
    except ValueError as e:
        out["errors"].append(str(e))
# vectors given strided are read as they are, not as if contiguous
nw, b, x = torch.rand(32)[::2] + 0.5, torch.randn(16)[::2], torch.randn(16)
got, _ = gemv.gemv(w, x, norm_w=nw, bias=b, tile_nkw=(4, 16, 4))
out["strided"] = float((got - ref(w, x, None, nw, b, False)).abs().max())

# every tile the engine's tuning may choose (serve/gemv_tune.py) computes the rule's tile's result within rounding
from ccbridge.serve import gemv_tune
out["candidates"] = []
for pro in ("", "norm+res", "silu"):
    n, k = 40, 300
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(2 * k if pro == "silu" else k, generator=g).to(torch.bfloat16)
    kw = dict(res=torch.randn(k, generator=g).to(torch.bfloat16), norm_w=torch.rand(k, generator=g).to(torch.bfloat16))
    kw = kw if pro == "norm+res" else dict(silu=pro == "silu")
    base = gemv.gemv(w, x, tile_nkw=gemv.rule(n, k), **kw)[0].float()
    for t in gemv_tune.candidates(n, k):
        y = gemv.gemv(w, x, tile_nkw=t, **kw)[0].float()
        out["candidates"].append([pro, list(t), float((y - base).abs().max() / base.abs().max())])

calls = [0]
real = gemv.gemv
def counted(*a, **k):
    calls[0] += 1
    return real(*a, **k)
gemv.gemv = counted
engine.BACKEND = "eager"  # torch.compile traces the custom op without inductor's C++ toolchain
for arch in ("llama", "qwen2"):
    spec = dict(decode.PRESETS["tiny"], arch=arch)
    ids = decode.prompts(spec["vocab_size"], 2, 8, 0)
    got = {}
    for name, compiled, fused in (("plain", False, False), ("fused", False, True), ("fused-compiled", True, True)):
        gemv.gemv = real if compiled else counted  # dynamo would trace the counter (counted at tracing alone)
        m = engine.build(spec, 0, 1, "cpu", torch.float32, seed=3, compiled=compiled, fused=fused)
        per = {}
        for batch in (2, 1):
            cache = m.static_cache(batch, 32)
            calls[0] = 0
            o = m(input_ids=ids[:batch], past_key_values=cache, cache_position=torch.arange(8), use_cache=True,
                  logits_to_keep=1)
            per[f"prefill b{batch}"] = calls[0]
            tok, logits = o.logits[:, -1].argmax(-1, keepdim=True), []
            calls[0] = 0
            for i in range(3):
                o = m(input_ids=tok, position_ids=torch.full((batch, 1), 8 + i), past_key_values=cache,
                      cache_position=torch.tensor([8 + i]), use_cache=True, logits_to_keep=1)
                logits.append(o.logits[:, -1])
                tok = o.logits[:, -1].argmax(-1, keepdim=True)
            per[f"steps b{batch}"] = calls[0]
            got[(name, batch)] = torch.stack(logits)
        if not compiled:
            out["engine"].append([arch, name, spec["num_hidden_layers"], per])
    for name in ("fused", "fused-compiled"):
        for batch in (1, 2):
            a, b = got[("plain", batch)], got[(name, batch)]
            out["engine"].append([arch, name, batch, float((a - b).abs().max() / a.abs().max()),
                                  torch.equal(a.argmax(-1), b.argmax(-1))])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def child():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_the_fused_kernel_matches_the_engines_ops(child):
    assert len(child["ops"]) == 20
    for dt, pro, n, k, shape, err, swapped, s_err in child["ops"]:
        tol = 1e-5 if dt == "torch.float32" else 0.02
        assert shape == [n] and err < tol and swapped > 0.02, (dt, pro, n, k, err, swapped)
        if pro == "norm+res":  # the new residual stream, written by program 0: x + res, rounded as torch rounds
            assert s_err == 0.0 if dt == "torch.float32" else s_err < 0.02, (dt, n, k, s_err)
        else:
            assert s_err is None


def test_the_fused_gemv_refuses_what_does_not_fit(child):
    both, short, strided, bare_res, short_bias, other_dtype, odd_tile = child["errors"]
    assert "norm or SiLU x up, not both" in both
    assert "takes x of 16 values" in short and "not 15 torch.float32" in short
    assert "must be contiguous (it is: False)" in strided
    assert "res needs norm_w" in bare_res
    assert "takes bias of 8 values" in short_bias and "not 3" in short_bias
    assert "takes norm_w of 16 values" in other_dtype and "torch.float64" in other_dtype
    assert "tile 8/96/4: each a power of 2" in odd_tile
    assert child["strided"] < 1e-5


def test_every_candidate_tile_computes_the_rules_result(child):
    assert len(child["candidates"]) >= 3 * 6
    for pro, tile, rel in child["candidates"]:
        assert rel < 0.02, (pro, tile, rel)  # bf16 rounding: the sums run in another order


def test_the_engine_fuses_one_sequences_decode_steps_only(child):
    counts = [e for e in child["engine"] if isinstance(e[3], dict)]
    assert len(counts) == 4
    for arch, name, layers, per in counts:
        fused = 4 * layers * 3 if name != "plain" else 0  # qkv, o, gate-up, down per layer, 3 steps
        assert per == {"prefill b2": 0, "steps b2": 0, "prefill b1": 0, "steps b1": fused}, (arch, name, per)


def test_the_fused_step_computes_the_plain_steps_logits(child):
    compared = [e for e in child["engine"] if not isinstance(e[3], dict)]
    assert len(compared) == 8
    for arch, name, batch, rel, same_tokens in compared:
        assert rel < 1e-5 and same_tokens, (arch, name, batch, rel)


def test_one_ranks_gemv_shapes():
    spec = importlib.util.spec_from_file_location("gemv_bench", BENCH / "gemv.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from ccbridge.serve import decode
    assert bench.shapes(decode.PRESETS["llama-8b"], 4) == {"qkv": (1536, 4096, "norm"), "o": (4096, 1024, ""),
                                                           "gate_up": (7168, 4096, "norm"),
                                                           "down": (4096, 3584, "silu")}
    assert bench.shapes(decode.PRESETS["llama-70b"], 2)["down"] == (8192, 14336, "silu")


def test_the_engines_tiles_cover_every_presets_shapes():
    from ccbridge.serve import decode, gemv
    spec = importlib.util.spec_from_file_location("gemv_bench", BENCH / "gemv.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # bench/gemv.py's fastest tiles with HBM-cold weights at llama-8b's TP4 shapes (one H200, 2026-11-27)
    assert gemv.tile(1536, 4096) == (4, 512, 4) and gemv.tile(4096, 1024) == (2, 512, 4)
    assert gemv.tile(7168, 4096) == (8, 512, 4) and gemv.tile(4096, 3584)[:2] == (8, 512)
    for name, p in decode.PRESETS.items():
        for n in (1, 2, 4):
            for rows, k, _ in bench.shapes(p, n).values():
                bn, bk, warps = gemv.tile(rows, k)
                assert bn in (2, 4, 8) and bk in (128, 512) and warps in (4, 8), (name, n, rows, k)
    gemv.TUNED[(1536, 4096)] = (32, 256, 8)  # bench/tp_step.py --tiles: a measured tile wins over the rule
    try:
        assert gemv.tile(1536, 4096) == (32, 256, 8) and gemv.tile(4096, 1024) == (2, 512, 4)
    finally:
        gemv.TUNED.clear()


def test_the_pdl_switch_parses(monkeypatch):
    monkeypatch.delenv(fused.ENV, raising=False)
    assert fused.pdl_from_env() is False and fused.pdl_from_env("cpu") is False
    monkeypatch.setattr(fused, "hopper", lambda dev: str(dev) == "cuda:0")  # unset: on in graphs where the GPU has PDL
    assert fused.pdl_from_env("cuda:0", graphs=True) is True and fused.pdl_from_env("cuda:1", graphs=True) is False
    assert fused.pdl_from_env("cuda:0") is False  # not by default outside CUDA graphs (each call's host cost)
    for value, want in (("", False), ("0", False), ("1", True), (" 1 ", True)):
        monkeypatch.setenv(fused.ENV, value)
        assert fused.pdl_from_env() is want, value
    monkeypatch.setenv(fused.ENV, "0")
    assert fused.pdl_from_env("cuda:0", graphs=True) is False
    monkeypatch.setenv(fused.ENV, "1")
    assert fused.pdl_from_env("cuda:0") is True  # forced, graphs or not
    monkeypatch.setenv(fused.ENV, "yes")
    with pytest.raises(ValueError, match="CCBRIDGE_GEMV_PDL='yes': 0 .*, 1 .* or unset"):
        fused.pdl_from_env()


# The PDL layout (the first weight tile read before the wait) under the interpreter, CCBRIDGE_GEMV_PDL=1: no
# griddepcontrol there (a CPU), so the kernel runs its PDL layout without the wait and trigger, launched plainly.
CHILD_PDL = r"""
import json, torch
from ccbridge.serve import decode, engine, gemv

out = {"ops": []}
for dt in (torch.float32, torch.bfloat16):
    # K past one step, K one step, K short of one (the loop after the first step empty)
    for n, k, tile in ((40, 300, (8, 128, 4)), (33, 64, (16, 64, 4)), (7, 50, (4, 64, 4))):
        for pro in ("", "norm", "norm+res", "silu", "bias"):
            g = torch.Generator().manual_seed(n + k)
            w = torch.randn(n, k, generator=g).to(dt)
            x = torch.randn(2 * k if pro == "silu" else k, generator=g).to(dt)
            res = torch.randn(k, generator=g).to(dt) if pro == "norm+res" else None
            nw = torch.rand(k, generator=g).to(dt) if pro.startswith("norm") else None
            b = torch.randn(n, generator=g).to(dt) if pro == "bias" else None
            kw = dict(res=res, norm_w=nw, bias=b, silu=pro == "silu", tile_nkw=tile)
            y1, s1 = gemv.gemv(w, x, **kw)  # the first call takes PDL from the environment
            out["resolved"] = gemv.PDL
            gemv.PDL = False
            y0, s0 = gemv.gemv(w, x, **kw)
            gemv.PDL = True
            out["ops"].append([str(dt), pro, n, k, torch.equal(y0, y1), s0 is None or torch.equal(s0, s1)])
engine.BACKEND = "eager"  # torch.compile traces the custom op without inductor's C++ toolchain
spec = decode.PRESETS["tiny"]
ids = decode.prompts(spec["vocab_size"], 1, 8, 0)
got = []
for compiled, fused in ((False, False), (True, True)):
    m = engine.build(spec, 0, 1, "cpu", torch.float32, seed=3, compiled=compiled, fused=fused)
    cache = m.static_cache(1, 32)
    o = m(input_ids=ids, past_key_values=cache, cache_position=torch.arange(8), use_cache=True, logits_to_keep=1)
    tok, logits = o.logits[:, -1].argmax(-1, keepdim=True), []
    for i in range(2):
        o = m(input_ids=tok, position_ids=torch.full((1, 1), 8 + i), past_key_values=cache,
              cache_position=torch.tensor([8 + i]), use_cache=True, logits_to_keep=1)
        logits.append(o.logits[:, -1])
        tok = o.logits[:, -1].argmax(-1, keepdim=True)
    got.append(torch.stack(logits))
out["engine"] = float((got[0] - got[1]).abs().max() / got[0].abs().max())
print(json.dumps(out))
"""


def test_the_pdl_layout_computes_the_same_bits_and_the_compiled_engine_runs_it():
    env = dict(os.environ, TRITON_INTERPRET="1", CCBRIDGE_GEMV_PDL="1")
    run = subprocess.run([sys.executable, "-c", CHILD_PDL], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["resolved"] is True and len(out["ops"]) == 30
    for dt, pro, n, k, same_y, same_s in out["ops"]:
        assert same_y and same_s, (dt, pro, n, k)
    assert out["engine"] < 1e-5


def test_pdl_is_on_by_default_only_where_triton_can_emit_it(monkeypatch):
    """REVIEW rev37: a Hopper with a triton older than PDL's (no tl.extra.cuda.gdc_wait: torch 2.6 and 2.7's
    tritons) must not take the PDL launch by default: its kernel, calling gdc_wait, would not compile and the fused
    engine would fail as it builds. CCBRIDGE_GEMV_PDL=1 there runs the PDL layout without the wait."""
    import triton.language.extra.cuda as tl_cuda

    monkeypatch.delenv(fused.ENV, raising=False)
    monkeypatch.setattr(fused, "hopper", lambda dev: True)
    assert fused.pdl_from_env("cuda:0", graphs=True) is True  # this triton has it
    monkeypatch.delattr(tl_cuda, "gdc_wait")
    assert fused.pdl_from_env("cuda:0", graphs=True) is False
    monkeypatch.setenv(fused.ENV, "1")
    assert fused.pdl_from_env("cuda:0") is True and not fused.launches_pdl("cuda:0")
