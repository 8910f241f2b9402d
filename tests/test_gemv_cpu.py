"""bench/gemv.py's fused GEMV kernel on the CPU (Triton's interpreter): the same results as the engine's torch ops
within bf16 rounding, for each prologue and for shapes that no tile divides. Its speed is measured on a GPU.

The interpreter must be on before triton is first imported (triton.language's own functions are made then), so the
kernel runs in a child process with TRITON_INTERPRET=1."""

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
BENCH = Path(__file__).resolve().parents[1] / "bench"

CHILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import gemv
out = []
for prologue in ("", "norm", "silu"):
    for n, k, tile in ((40, 300, (8, 128, 4)), (33, 64, (16, 64, 4)), (5, 700, (4, 512, 8))):
        g = torch.Generator().manual_seed(n * 1000 + k)
        w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
        x = torch.randn(2 * k if prologue == "silu" else k, generator=g).to(torch.bfloat16)
        res = torch.randn(k, generator=g).to(torch.bfloat16) if prologue == "norm" else None
        nw = torch.rand(k, generator=g).to(torch.bfloat16) if prologue == "norm" else None
        kw = dict(res=res, norm_w=nw, silu=prologue == "silu")
        ref = gemv.torch_way(w, x, **kw).float()
        rel = lambda y: float((y.float() - ref).abs().max() / ref.abs().max())
        got = gemv.gemv(w, x, tile=tile, **kw)
        swapped = gemv.gemv(w.flip(0).contiguous(), x, tile=tile, **kw)  # rows in another order: must differ
        out.append([prologue, n, k, list(got.shape), rel(got), rel(swapped)])
print(json.dumps(out))
"""


def test_the_fused_kernel_matches_the_engines_ops():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", CHILD, str(BENCH)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    cases = json.loads(run.stdout.splitlines()[-1])
    assert len(cases) == 9
    for prologue, n, k, shape, err, swapped in cases:
        assert shape == [n] and err < 0.02 and swapped > 0.02, (prologue, n, k, err, swapped)


def test_one_ranks_gemv_shapes():
    spec = importlib.util.spec_from_file_location("gemv", BENCH / "gemv.py")
    gemv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gemv)
    from ccbridge.serve import decode
    assert gemv.shapes(decode.PRESETS["llama-8b"], 4) == {"qkv": (1536, 4096, "norm"), "o": (4096, 1024, ""),
                                                          "gate_up": (7168, 4096, "norm"), "down": (4096, 3584, "silu")}
    assert gemv.shapes(decode.PRESETS["llama-70b"], 2)["down"] == (8192, 14336, "silu")
