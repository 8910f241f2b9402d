"""`ccbridge bench decode --tp` on GPUs: --tp 1 is the single-GPU case (no collective), its modes agree eager and
with CUDA graphs; under the b300 emulator it pays no collective toll and the run says EMULATED, with the native
step and the predicted emulated step beside the measured one; with 2+ GPUs every degree's tokens agree across
modes and ranks, and its first-step logits agree with the smallest degree's within the recorded tolerance.

Run through scripts/device-check (or `python -m pytest -m gpu tests/test_tp_gpu.py`)."""

import glob
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the tensor-parallel bench needs torch")

from ccbridge import cli, results  # noqa: E402
from ccbridge.emulate import trace  # noqa: E402
from ccbridge.serve import decode, tp  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]
PROMPT, OUTPUT = 32, 16


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_tp1_modes_agree_and_the_step_is_measured_against_its_roofline(graphs):
    batches = [1, 8]
    res = tp.bench("llama-1b", [1], batches, PROMPT, OUTPUT, list(decode.MODES), "cuda", iters=2, warmup=1,
                   graphs=graphs)
    assert not res.errors, res.errors
    tok = [r for r in res.rows if r.metric == "tok_per_s"]
    assert len(tok) == len(batches) * len(decode.MODES)
    for r in tok:
        assert r.extra["tokens_match"] and r.extra["ranks_agree"] and r.extra["collectives_per_step"] == 0, r.key()
        assert r.params["graphs"] is graphs and 0 < r.extra["gpu_busy"] <= 1
    roof = [r for r in res.rows if r.metric == "roofline_ms"]
    assert roof and all(r.median > 0 and r.extra["copy_gbps"] > 100 for r in roof)
    assert all(r.median == 0 for r in res.rows if r.metric == "collective_ms")  # TP=1: none
    assert res.settings["decode_tp"]["backend"] == "nccl" and res.settings["decode_tp"]["dtype"] == "bfloat16"


def test_tp1_under_the_b300_emulator_pays_no_collective_and_predicts_its_step(tmp_path):
    """The ranks inherit the interposer through the environment: the result is EMULATED, the tokens agree, no
    collective line is in the trace (world size 1), the marks bound each timed run, and the predicted step is
    beside the measured one."""
    prefix = tmp_path / "t"
    p = subprocess.run([sys.executable, "-m", "ccbridge", "run", "--profile", "b300", "--record", str(prefix), "--",
                        sys.executable, "-m", "ccbridge.cli", "bench", "decode", "--tp", "1", "--model", "tiny",
                        "--batch", "4", "--prompt", "16", "--output", "12", "--iters", "2", "--graphs",
                        "--json", str(tmp_path / "e.json")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "EMULATED CC bridge (profile b300)" in p.stdout
    res = results.load(tmp_path / "e.json")
    assert res.emulated and not res.errors
    s = trace.summarize(str(prefix))
    assert s.total("collective") == 0
    ranked = [q for q in s.procs if q.window == "marks"]
    assert ranked, "the rank's timed runs are between marks"
    pred = [r for r in res.rows if r.metric == "predicted_step_ms"]
    native = [r for r in res.rows if r.metric == "native_step_ms"]
    assert pred and native and all(r.median > 0 for r in pred + native)
    assert glob.glob(f"{prefix}.*.csv")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2+ GPUs (one rank per GPU)")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_every_degree_agrees_within_itself_and_in_logits_across(graphs, tmp_path, capsys):
    """One command for the multi-GPU runs: every degree the GPUs allow, every mode."""
    degrees = [n for n in (1, 2, 4, 8) if n <= torch.cuda.device_count()]
    rc = cli.main(["bench", "decode", "--tp", *map(str, degrees), "--model", "llama-1b", "--batch", "1", "8",
                   "--prompt", "64", "--output", "32", "--iters", "2", *(["--graphs"] if graphs else []),
                   "--json", str(tmp_path / "tp.json")])
    out = capsys.readouterr()
    print(out.out)
    assert rc == 0, out.err
    res = results.load(tmp_path / "tp.json")
    tok = [r for r in res.rows if r.metric == "tok_per_s"]
    assert sorted({r.params["tp"] for r in tok}) == degrees
    assert all(r.extra["tokens_match"] and r.extra["ranks_agree"] for r in tok)
    assert all(r.extra["logits_within"] and r.extra["logits_vs"] == 1 for r in tok)
    assert all(r.extra["collectives_per_step"] == (0 if r.params["tp"] == 1 else 32) for r in tok)
    assert all(r.median > 0 for r in res.rows if r.metric == "collective_ms" and r.params["tp"] > 1)
