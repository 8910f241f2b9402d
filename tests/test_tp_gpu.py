"""`ccbridge bench decode --tp` on GPUs: --tp 1 (a one-rank NCCL group) gives the single-GPU decode's tokens, eager
and with CUDA graphs (the all-reduces captured); natively and under the b300 emulator; with 2+ GPUs, every degree
agrees with TP=1 (near ties apart) and the ranks sample the same tokens.

Run through scripts/device-check (or `python -m pytest -m gpu tests/test_tp_gpu.py`)."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the tensor-parallel bench needs torch")
pytest.importorskip("transformers", reason="the decode harness builds a Hugging Face transformers model")

from ccbridge import cli, results  # noqa: E402
from ccbridge.serve import decode, tp  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")]
PROMPT, OUTPUT = 32, 16


def _single_gpu_tokens(model: str, batches: list[int], graphs: bool) -> dict[int, torch.Tensor]:
    """decode.decode's tokens on cuda in this process, as the existing bench makes them (sync is every mode's)."""
    m = decode.build(model, "cuda", seed=0)
    with decode.deterministic_attention():
        out = {b: decode.decode(m, decode.prompts(decode.PRESETS[model]["vocab_size"], b, PROMPT, 0), OUTPUT, "sync",
                                graphs=graphs).tokens for b in batches}
    del m
    torch.cuda.empty_cache()
    return out


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("model", ["tiny", "llama-1b"])
def test_tp1_gives_the_single_gpu_tokens_bit_for_bit(model, graphs):
    """Acceptance: `bench decode --tp 1` decodes what `bench decode` does, in every mode, with no near tie."""
    batches = [1, 8]
    want = _single_gpu_tokens(model, batches, graphs)
    res = tp.bench(model, [1], batches, PROMPT, OUTPUT, list(decode.MODES), "cuda", iters=2, warmup=1,
                   graphs=graphs, reference=want)
    assert not res.errors, res.errors
    tok = [r for r in res.rows if r.metric == "tok_per_s"]
    assert len(tok) == len(batches) * len(decode.MODES)
    for r in tok:
        assert r.extra["tokens_match"] and r.extra["near_ties"] == 0 and r.extra["ranks_agree"], r.key()
        assert r.params["graphs"] is graphs and 0 < r.extra["gpu_busy"] <= 1
    assert res.settings["decode_tp"]["backend"] == "nccl" and res.settings["decode_tp"]["dtype"] == "bfloat16"


def test_tp1_through_the_cli_next_to_the_single_gpu_bench(tmp_path, capsys):
    """The same figures within noise is for a person to read (tests assert no timings): both tables are printed
    for the log; both runs must be clean."""
    common = ["--model", "llama-1b", "--batch", "1", "8", "--prompt", "64", "--output", "32", "--iters", "3"]
    assert cli.main(["bench", "decode", *common, "--json", str(tmp_path / "one.json")]) == 0
    assert cli.main(["bench", "decode", "--tp", "1", *common, "--json", str(tmp_path / "tp1.json")]) == 0
    out = capsys.readouterr().out
    print(out)
    one, tp1 = results.load(tmp_path / "one.json"), results.load(tmp_path / "tp1.json")
    assert not one.errors and not tp1.errors
    assert {(r.params["batch"], r.params["mode"]) for r in one.rows} == {
        (r.params["batch"], r.params["mode"]) for r in tp1.rows}
    assert "one process per GPU, NCCL" in out


def test_tp1_under_the_b300_emulator_says_so_and_agrees(tmp_path):
    """The ranks inherit the interposer through the environment: the result is EMULATED and the tokens agree."""
    p = subprocess.run([sys.executable, "-m", "ccbridge", "run", "--profile", "b300", "--", sys.executable, "-m",
                        "ccbridge.cli", "bench", "decode", "--tp", "1", "--model", "tiny", "--batch", "4",
                        "--prompt", "16", "--output", "12", "--iters", "1", "--graphs",
                        "--json", str(tmp_path / "e.json")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "EMULATED CC bridge (profile b300)" in p.stdout
    res = results.load(tmp_path / "e.json")
    assert res.emulated and not res.errors


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2+ GPUs (one rank per GPU)")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_every_degree_agrees_with_tp1(graphs, tmp_path, capsys):
    """One command for the multi-GPU runs: every degree the GPUs allow, every mode; tokens against TP=1's."""
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
    assert all(r.extra["reference"] in ("tp 1 sync",) for r in tok)
