"""The exit status a script can trust, command by command, from the README's table.

0: did what was asked; 1: ran, and the answer is no; 2: bad input or a requirement missing (test_cli_fuzz.py
holds the bad inputs, one or more per command of the README). Each command the README's exit table names gets
its "no" here, on a CPU-only machine: for real where the CPU can give it (plan-tenants, attest, compare,
calibrate, run), else with the measurement that would say no replaced (a GPU bench, a failed probe test), so that
what is checked is the command's reading of its own answer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ccbridge import cli, results
from conftest import DATA

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_no_answers() -> dict[str, str]:
    """The exit table of the README: command -> when it exits 1."""
    text = README.read_text()
    table = text[text.index("| command | exits 1 when |"):].split("\n\n")[0].splitlines()[2:]
    return {m.group(1): line.split(" | ", 1)[1] for line in table for m in re.finditer(r"`([\w -]+)`", line.split(" | ")[0])}


def _cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccbridge.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _doc(**change) -> dict:
    doc = json.loads((DATA / "h100-native-full.json").read_text())
    doc.update(change)
    return doc


def no_probe(tmp_path, monkeypatch):
    """A test that fails: the run goes on, records it, and the command says no."""
    from ccbridge.probe import registry

    registry.select(None)  # the families registered
    t = registry.REGISTRY["hostcrypto.aes256gcm"]

    def broken(ctx):
        raise RuntimeError("a refused call")

    monkeypatch.setitem(registry.REGISTRY, t.name, registry.Test(t.name, t.title, t.needs, broken))
    rc = cli.main(["probe", "--quick", "--tests", "hostcrypto", "--out", str(tmp_path / "p")])
    assert results.load(tmp_path / "p" / "result.json").errors[0]["test"] == t.name
    return rc


def no_compare(tmp_path, monkeypatch):
    other = _doc()
    for r in other["rows"]:
        r["test"] = "other_" + r["test"]  # a probe's test names (family.test), none the same
    (tmp_path / "other.json").write_text(json.dumps(other))
    r = _cli(["compare", str(DATA / "h100-native-full.json"), str(tmp_path / "other.json")], tmp_path)
    assert "share no rows" in r.stderr, r.stderr
    return r.returncode


def no_attest(tmp_path, monkeypatch):
    """Outside a CVM with GPU CC on (every machine that runs this suite): not protected."""
    r = _cli(["attest", "--nonce", bytes(range(32)).hex(), "--out", str(tmp_path / "b.json")], tmp_path)
    assert json.loads((tmp_path / "b.json").read_text())["protection"]["protected"] is False
    assert "ccbridge attest: not protected" in r.stderr, r.stderr
    assert _cli(["attest", "--nonce", bytes(range(32)).hex(), "--out", str(tmp_path / "c.json"), "--allow-unprotected"],
                tmp_path).returncode == 0
    return r.returncode


def no_calibrate(tmp_path, monkeypatch):
    """A native result given as the emulated one too (stamped emulated): no tax, so the targets are missed."""
    emu = _doc()
    emu["env"]["emulation"] = {"active": True, "profile": "b300"}
    (tmp_path / "emu.json").write_text(json.dumps(emu))
    r = _cli(["calibrate", "--profile", "b300", "--native", str(DATA / "h100-native-full.json"), "--emulated",
              str(tmp_path / "emu.json"), "--out", str(tmp_path / "cal")], tmp_path)
    checks = json.loads((tmp_path / "cal" / "calibration.json").read_text())
    assert any(c["ok"] is False for c in checks)
    return r.returncode


def no_plan_tenants(tmp_path, monkeypatch):
    r = _cli(["plan-tenants", "--request", "8", "--gpus", "4", "--json", str(tmp_path / "p.json")], tmp_path)
    doc = json.loads((tmp_path / "p.json").read_text())
    assert (doc["placed"], doc["unplaced"]) == (0, 1) and "not placed: #1 (8 GPUs)" in r.stdout
    return r.returncode


def no_load_bench(tmp_path, monkeypatch):
    from ccbridge.load import bench, synth

    synth.make_checkpoint(tmp_path / "ckpt", 1 << 20, 1 << 20)
    monkeypatch.setattr(bench, "run", lambda *a, **k: {"error": "ccbridge's tensors differ from safetensors': x"})
    monkeypatch.setattr(bench, "render", lambda rep, ceiling=None: "the table")
    return cli.main(["load", str(tmp_path / "ckpt"), "--device", "cpu", "--bench"])


def no_collectives(tmp_path, monkeypatch):
    from ccbridge import env
    from ccbridge.secure import bench, benchrows

    row = {"size": 8, "count": 2, "type": "float", "plain_us": 1.0, "plain_algbw": 0.0, "plain_busbw": 0.1,
           "wrong_plain": 0, "secure_us": 1.0, "secure_algbw": 0.0, "secure_busbw": 0.1, "wrong": 1}
    got = {"op": "all_reduce", "nranks": 2, "backend": "gloo", "transport": "default", "encrypted": "ccbridge.secure",
           "rows": [row]}
    monkeypatch.setattr(bench, "collectives", lambda *a, **k: benchrows.collectives_result(got, env.stamp(), {}))
    return cli.main(["collectives", "--backend", "gloo", "-e", "8"])


def _gpus_ready(monkeypatch):
    from ccbridge.cli import bench as cli_bench

    monkeypatch.setattr(cli_bench, "gpus_ready", lambda *a, **k: True)


def no_bench_ddp(tmp_path, monkeypatch):
    from ccbridge import env
    from ccbridge.secure import bench

    _gpus_ready(monkeypatch)
    res = results.Result(kind="ddp", env=env.stamp(), settings={})
    res.rows = [results.Row.of("ddp", "iter_ms", "ms", [1.0], model="resnet50", ngpus=2)]
    res.rows[0].extra["grads_agree"] = False
    monkeypatch.setattr(bench, "ddp", lambda *a, **k: res)
    return cli.main(["bench", "ddp", "--ngpus", "2"])


def _result_with_error(test: str, kind: str):
    return results.Result(kind=kind, env={}, settings={}, errors=[{"test": test, "error": f"{test}: not the same"}])


def no_bench_net(tmp_path, monkeypatch):
    from ccbridge.secure import netbench

    monkeypatch.setattr(netbench, "loopback", lambda *a, **k: _result_with_error("net_loopback", "net"))
    return cli.main(["bench", "net", "--lanes", "1"])


def no_bench_decode(tmp_path, monkeypatch):
    from ccbridge.serve import decode

    monkeypatch.setattr(decode, "bench", lambda *a, **k: _result_with_error("decode", "decode"))
    monkeypatch.setattr(decode, "render", lambda res: "the table")
    return cli.main(["bench", "decode", "--device", "cpu", "--model", "tiny"])


def no_bench_kv(tmp_path, monkeypatch):
    from ccbridge.serve import kvbench

    monkeypatch.setattr(kvbench, "bench", lambda *a, **k: _result_with_error("kv", "kv"))
    monkeypatch.setattr(kvbench, "render", lambda res: "the table")
    return cli.main(["bench", "kv", "--device", "cpu", "--model", "tiny"])


def no_run(tmp_path, monkeypatch):
    """run's status is the program's: its no, 1, passes through."""
    return _cli(["run", "--profile", "passthrough", "--", sys.executable, "-c", "import sys; sys.exit(1)"],
                tmp_path).returncode


NO = {"probe": no_probe, "compare": no_compare, "attest": no_attest, "calibrate": no_calibrate,
      "plan-tenants": no_plan_tenants, "load --bench": no_load_bench, "collectives": no_collectives,
      "bench ddp": no_bench_ddp, "bench net": no_bench_net, "bench decode": no_bench_decode, "bench kv": no_bench_kv,
      "run": no_run}


def test_the_readme_table_is_the_one_tested():
    assert set(readme_no_answers()) == set(NO)


@pytest.mark.parametrize("command", sorted(NO))
def test_a_no_answer_exits_1(command, tmp_path, monkeypatch, capsys):
    assert NO[command](tmp_path, monkeypatch) == 1


def test_a_yes_answer_exits_0(tmp_path):
    """The same commands where the answer is yes."""
    assert _cli(["plan-tenants", "--request", "4", "2", "2"], tmp_path).returncode == 0
    good = str(DATA / "h100-native-full.json")
    assert _cli(["compare", good, good], tmp_path).returncode == 0
    assert _cli(["run", "--profile", "passthrough", "--", "true"], tmp_path).returncode == 0


def _tagged(tag: str) -> list[int]:
    """Live processes (zombies left out) whose environment carries CCBRIDGE_TEST_RUN=tag: a run's and its children's,
    whatever session or parent they have now."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"CCBRIDGE_TEST_RUN={tag}".encode() not in open(f"/proc/{entry}/environ", "rb").read().split(b"\0"):
                continue
            if open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(entry))
        except OSError:  # ended, or another user's
            continue
    return out


@pytest.mark.parametrize("closed", ["stdout and stderr", "stderr"])
def test_a_reader_that_stops_early_loses_no_probe_run(closed, tmp_path):
    """`ccbridge probe --quick 2>&1 | head -2` exited 1 with nothing written (rich's exit on a broken pipe) and at
    times left the report renderer's chart workers behind for ever; so did stderr alone to `head -1`. The run goes
    on quietly: its status is the run's, its result and reports are written, and nothing it started outlives it."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc to find leftover processes in")
    tag = f"{os.getpid()}-{closed.replace(' ', '')}"
    argv = [sys.executable, "-m", "ccbridge", "probe", "--quick", "--tests", "hostcrypto", "--out", str(tmp_path / "p")]
    with open(tmp_path / "stdout", "w") as out:
        p = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE if closed != "stderr" else out,
                             stderr=subprocess.PIPE if closed == "stderr" else subprocess.STDOUT, text=True,
                             env={**os.environ, "CCBRIDGE_TEST_RUN": tag})
    reader = p.stdout or p.stderr
    try:
        assert reader.readline().startswith("ccbridge probe: 1 of")
        reader.close()  # the reader is gone: every later write meets a closed pipe
        assert p.wait(timeout=240) == 0
        assert results.load(tmp_path / "p" / "result.json").by_test("hostcrypto.aes256gcm")
        assert (tmp_path / "p" / "report.html").stat().st_size > 0
        deadline = time.monotonic() + 10  # a killed process takes a moment to go
        while _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _tagged(tag), "processes of the probe outlived it"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in _tagged(tag):
            os.kill(pid, signal.SIGKILL)
    if closed == "stderr":
        assert "CPU AES-256-GCM" in (tmp_path / "stdout").read_text()  # the answer, where the reader still reads
