"""bench ddp, bench cipher and collectives write Results (kinds ddp, cipher, collectives), built from the dicts
their ranks return: built here from recorded dicts (the benches themselves need GPUs), their tables the ones
the benches printed before they wrote Results, and compare, report and advise read them."""

import subprocess
import sys

import pytest

from ccbridge import advise, results
from ccbridge.compare import compare
from ccbridge.errors import ResultFileError
from ccbridge.report import markdown
from ccbridge.results import Result
from ccbridge.secure import benchrows


def _ddp_row(model, mode, wrap, cap, ms, agree, eq, rel, params):
    return {"model": model, "params": params, "nranks": 2, "mode": mode, "wrap": wrap, "bucket_cap_mb": cap,
            "batch_per_gpu": 64 if model == "resnet50" else 8, "iter_ms": ms, "iter_ms_min": ms - 2, "iter_ms_max": ms + 2,
            "iter_ms_all": [ms - 2, ms, ms + 2], "grads_agree": agree, "losses": [6.9, 6.8], "loss_equal": eq,
            "loss_max_rel_diff": rel}


DDP_RUN = {"nranks": 2, "rows": [  # secure.bench._ddp's shape (one world size), iter_ms_all: each timed iteration
    _ddp_row("resnet50", "plain", "ddp", 25, 101.5, True, True, 0.0, 25557032),
    _ddp_row("resnet50", "secure", "ddp", 100, 180.25, False, False, 0.00147, 25557032),
    _ddp_row("gpt2-large", "nccl-ccbridge", "fsdp", None, 950.0, None, None, None, 774030080),
    _ddp_row("gpt2-large", "nccl-sockets", "fsdp", None, 900.0, None, None, None, 774030080)]}
DDP_TABLE = """\
      model GPUs wrap          mode bucket MB   ms/iter vs plain  grads  losses vs plain
   resnet50    2  ddp         plain        25     101.5     1.00x  agree  equal
   resnet50    2  ddp        secure       100     180.2     1.78x DIFFER  max rel diff 1.5e-03
 gpt2-large    2 fsdp nccl-ccbridge         -     950.0     1.06x      -  -
 gpt2-large    2 fsdp  nccl-sockets         -     900.0     1.00x      -  -"""

COLLECTIVES = {"op": "all_reduce", "nranks": 2, "backend": "nccl", "transport": "sockets vs ccbridge net plugin",
               "encrypted": "NCCL + ccbridge net plugin", "nets": {"sockets": ["Socket"], "ccbridge": ["ccbridge"]},
               "env": {"NCCL_NET": "ccbridge"}, "rows": [
                   {"size": 8, "count": 2, "type": "float", "plain_us": 12.34, "plain_algbw": 0.0006,
                    "plain_busbw": 0.0009, "wrong_plain": 0, "secure_us": 80.5, "secure_algbw": 0.0001,
                    "secure_busbw": 0.00015, "wrong": 0},
                   {"size": 268435456, "count": 67108864, "type": "float", "plain_us": 2100.0, "plain_algbw": 127.8,
                    "plain_busbw": 191.7, "wrong_plain": 0, "secure_us": 35000.0, "secure_algbw": 7.67,
                    "secure_busbw": 11.5, "wrong": 3}]}
COLLECTIVES_TABLE = """\
                                                 plaintext                NCCL + ccbridge net plugin (AES-256-GCM)
        size        count     type       time   algbw   busbw  #wrong       time   algbw   busbw  #wrong   busbw
         (B)   (elements)                (us)  (GB/s)  (GB/s)               (us)  (GB/s)  (GB/s)           ratio
           8            2    float       12.3    0.00    0.00       0       80.5    0.00    0.00       0   0.167
   268435456     67108864    float     2100.0  127.80  191.70       0    35000.0    7.67   11.50       3   0.060"""

CIPHER = {"device": "NVIDIA H100 80GB HBM3", "rows": [
    {"size": 1048576, "chunk": 65536, "encrypt": 152.25, "decrypt": 148.0, "reduce_hop": 71.5},
    {"size": 1073741824, "chunk": 1048576, "encrypt": 410.0, "decrypt": 398.5, "reduce_hop": 190.25}]}
CIPHER_TABLE = """\
AES-256-GCM kernels on NVIDIA H100 80GB HBM3 (GB/s of plaintext)
        size    chunk   encrypt   decrypt reduce hop
     1048576    65536     152.2     148.0       71.5
  1073741824  1048576     410.0     398.5      190.2"""

ENV = {"ccbridge": "test", "nvml": {"available": False, "error": "no NVML"}, "emulation": {"active": False}}


def _round_trip(res: Result, tmp_path) -> Result:
    res.save(tmp_path / f"{res.kind}.json")
    return results.load(tmp_path / f"{res.kind}.json")


def test_ddp_rows_keep_the_table_and_the_verdicts(tmp_path):
    res = Result(kind="ddp", env=ENV, settings={"models": ["resnet50", "gpt2-large"], "ngpus": [2]},
                 rows=benchrows.ddp_rows(DDP_RUN))
    back = _round_trip(res, tmp_path)
    assert benchrows.render_ddp(back, 2) == benchrows.render_ddp(res) == DDP_TABLE
    assert benchrows.render_ddp(back, 4).count("\n") == 0  # no rows at that world size: the header alone
    assert benchrows.grads_differ(back)
    r = back.rows[1]
    assert r.key() == "ddp:iter_ms[bucket_cap_mb=100,mode=secure,model=resnet50,nranks=2,wrap=ddp]"
    assert (r.median, r.min, r.max, r.n, r.unit) == (180.25, 178.25, 182.25, 3, "ms")
    assert r.extra["parameters"] == 25557032 and r.extra["loss_max_rel_diff"] == 0.00147


def test_collectives_rows_keep_the_table_the_settings_and_the_wrong_counts(tmp_path):
    res = benchrows.collectives_result(COLLECTIVES, ENV, {"dtype": "float", "iters": 20, "net": "ccbridge"})
    back = _round_trip(res, tmp_path)
    assert benchrows.render_collectives(benchrows.collectives_rows(back), encrypted=back.settings["encrypted"]) == \
        COLLECTIVES_TABLE
    assert back.settings["nets"] == COLLECTIVES["nets"] and back.settings["iters"] == 20 and back.kind == "collectives"
    assert benchrows.wrong_elements(back) and len(back.rows) == 2 * 2 * 3
    keys = {r.key() for r in back.rows}
    assert "collectives:busbw[bytes=268435456,dtype=float,nranks=2,op=all_reduce,side=encrypted]" in keys
    assert all(r.n == 1 and "mean of the timed iterations" in r.extra["note"] for r in back.rows)  # n=1, said
    fine = benchrows.collectives_result({**COLLECTIVES, "rows": COLLECTIVES["rows"][:1]}, ENV, {})
    assert not benchrows.wrong_elements(fine)


def test_cipher_rows_keep_the_table(tmp_path):
    back = _round_trip(benchrows.cipher_result(CIPHER, ENV, iters=10), tmp_path)
    assert benchrows.render_cipher(back) == CIPHER_TABLE
    assert {r.key() for r in back.rows} >= {"cipher:throughput[bytes=1048576,op=encrypt]",
                                            "cipher:throughput[bytes=1073741824,op=reduce_hop]"}


@pytest.mark.parametrize("make", [
    lambda: Result(kind="ddp", env=ENV, settings={}, rows=benchrows.ddp_rows(DDP_RUN)),
    lambda: benchrows.collectives_result(COLLECTIVES, ENV, {}),
    lambda: benchrows.cipher_result(CIPHER, ENV, iters=10),
])
def test_compare_report_and_advise_read_them(tmp_path, make):
    res = _round_trip(make(), tmp_path)
    c = compare(res, res)
    assert len(c.ratios) == len(res.rows) and all(r.ratio == 1.0 for r in c.ratios)
    md = markdown.render(res)
    assert md.startswith(f"# {results.KINDS[res.kind]} — ") and "## Findings" not in md
    with pytest.raises(ResultFileError, match=f"a {res.kind} result: advise reads env stamps and probe, account, "
                                              "decode, decode_tp and kv results"):
        advise.read(tmp_path / f"{res.kind}.json")
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "advise", str(tmp_path / f"{res.kind}.json")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and p.stdout == ""
