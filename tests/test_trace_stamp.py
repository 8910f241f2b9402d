"""A trace says where it was recorded (<prefix>.env.json, emulate/recorded.py): an account made from traces on
another machine stamped its result with the machine that read them ('no GPU' for the H200 samples accounted on a
laptop). On CPU: the launcher's stamp beside what a program left, and account and its reports reading it."""

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest

from ccbridge import results
from ccbridge.bindings import core
from ccbridge.cli import main
from ccbridge.emulate import recorded

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
SAMPLE = TRACES / "decode-h200"


def _copy_trace(side: str, prefix: Path, sample: Path = SAMPLE) -> None:
    """A sample's native or emulated trace under another prefix (its files as the interposer wrote them)."""
    for f in sample.glob(f"{side}.[0-9]*.*"):
        shutil.copy(f, f"{prefix}{f.name[len(side):]}")


def _leaver(tmp_path: Path) -> list[str]:
    """A program that leaves the decode sample's native trace at the prefix its launcher recorded to (the
    interposer's part, on a machine without a GPU)."""
    script = tmp_path / "leave.py"
    script.write_text(f"import shutil, sys\nfrom pathlib import Path\nprefix = sys.argv[1]\n"
                      f"for f in Path({str(SAMPLE)!r}).glob('native.[0-9]*.*'):\n"
                      f"    shutil.copy(f, prefix + f.name[len('native'):])\n")
    return [sys.executable, str(script)]


def _stamped(prefix: Path, gpu: str, host: str = "gpu-host-1") -> None:
    """A stamp as a GPU machine's launcher writes it: this machine's, with an H200's NVML and another host."""
    recorded.write(str(prefix), {})
    doc = json.loads(Path(f"{prefix}{recorded.SUFFIX}").read_text())
    doc["env"]["host"] = host
    doc["env"]["nvml"] = {"available": True, "driver": "580.95",
                          "gpus": [{"index": 0, "name": gpu, "uuid": f"GPU-{host}"}]}
    Path(f"{prefix}{recorded.SUFFIX}").write_text(json.dumps(doc))


def test_a_recording_run_stamps_its_trace_with_this_machine(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(core, "driver_missing", lambda: None)  # a driver loads (the program stands in for it)
    t = tmp_path / "t"
    assert main(["run", "--record", str(t), "--"] + _leaver(tmp_path) + [str(t)]) == 0
    doc = json.loads(Path(f"{t}{recorded.SUFFIX}").read_text())
    assert doc["env"]["host"] == socket.gethostname() and doc["created"].endswith("+00:00")
    assert doc["env"]["emulation"]["profile"] == "passthrough" and doc["env"]["emulation"]["active"] is False
    assert doc["env"]["emulation"]["interposer_loaded"] is None  # the launcher cannot see its child's maps
    assert doc["env"]["torch"] == {}  # only the child's interpreter could name its torch
    assert "recorded on" in capsys.readouterr().err  # run --record prints the trace, where it was recorded with it
    assert main(["trace", str(t)]) == 0
    said = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("recorded on"))
    assert said == f"recorded on {recorded.machine(doc)}"
    assert said.startswith(f"recorded on host {socket.gethostname()} (")


def test_a_run_that_leaves_no_trace_leaves_no_stamp(tmp_path, monkeypatch):
    monkeypatch.setattr(core, "driver_missing", lambda: None)
    t = tmp_path / "t"
    assert main(["run", "--record", str(t), "--", sys.executable, "-c", "pass"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no driver call: nothing recorded, nothing said


def test_a_stamp_of_an_earlier_run_refuses_a_new_one_at_its_prefix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(core, "driver_missing", lambda: None)
    t = tmp_path / "t"
    _stamped(t, "NVIDIA H200")
    assert main(["run", "--record", str(t), "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "1 file(s) of an earlier run (t.env.json)" in err[0], err


def _account(tmp_path: Path, capsys, *argv: str) -> tuple[int, str, str, dict | None]:
    out = tmp_path / "acc"
    rc = main(["account", *argv, "--out", str(out)])
    got = capsys.readouterr()
    doc = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else None
    return rc, got.out, got.err, doc


@pytest.mark.parametrize("sample", ["decode-h200", "ddp-h200x2"])  # one process; a job's ranks (account_ranks)
def test_an_account_of_traces_carries_the_machine_that_recorded_them(tmp_path, capsys, sample):
    base, other = tmp_path / "native", tmp_path / "emulated"
    _copy_trace("native", base, TRACES / sample)
    _copy_trace("emulated", other, TRACES / sample)
    _stamped(base, "NVIDIA H200")
    _stamped(other, "NVIDIA H200")
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 0 and "note:" not in err, err
    assert doc["env"]["host"] == "gpu-host-1" and doc["env"]["nvml"]["gpus"][0]["name"] == "NVIDIA H200"
    stamp = recorded.read(str(base))
    assert doc["settings"]["recorded_on"] == recorded.machine(stamp)
    md = (tmp_path / "acc" / "report.md").read_text()
    assert md.startswith("# ccbridge account — NVIDIA H200 — "), md[:120]
    assert f"(BASE recorded on {recorded.machine(stamp)}: the machine below)" in md
    assert results.load(tmp_path / "acc" / "result.json").env == doc["env"]  # read back through its schema


def test_traces_of_two_machines_or_none_are_said(tmp_path, capsys):
    base, other = tmp_path / "native", tmp_path / "emulated"
    _copy_trace("native", base)
    _copy_trace("emulated", other)
    _stamped(base, "NVIDIA H100 80GB HBM3", host="cc-off")
    _stamped(other, "NVIDIA H200", host="cc-on")
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 0 and doc["env"]["host"] == "cc-off"
    note = " ".join(line.strip() for line in err.split("note: ", 1)[1].splitlines())
    assert note.startswith("BASE was recorded on host cc-off (NVIDIA H100 80GB HBM3)") and "other traces on host " \
        "cc-on (NVIDIA H200)" in note and note.split(" UTC: ")[-1].startswith("the result carries BASE's machine"), note
    assert all(len(line) <= 120 for line in err.splitlines())
    shutil.rmtree(tmp_path / "acc")
    Path(f"{base}{recorded.SUFFIX}").unlink()  # BASE as recorded before stamps: the result is this machine's, said so
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 0 and doc["env"]["host"] == socket.gethostname() and doc["settings"]["recorded_on"] == "unknown"
    assert "BASE's trace does not say where it was recorded" in err
    md = (tmp_path / "acc" / "report.md").read_text()
    assert md.startswith("# ccbridge account — recorded where: unknown — "), md[:120]


@pytest.mark.parametrize("text, says", [
    ("{", "unreadable trace stamp"),
    ('{"created": "2026-11-28T10:00:00+00:00"}', "env"),
    ('{"created": "x", "env": {"host": 3}}', "host"),
])
def test_a_broken_stamp_is_refused_in_one_line(tmp_path, capsys, text, says):
    base, other = tmp_path / "native", tmp_path / "emulated"
    _copy_trace("native", base)
    _copy_trace("emulated", other)
    Path(f"{base}{recorded.SUFFIX}").write_text(text)
    for argv in (["trace", str(base)], ["account", str(base), str(other), "--out", str(tmp_path / "acc")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and says in err[0] and "env.json" in err[0], err
    assert not (tmp_path / "acc").exists()


def test_a_stamp_alone_is_no_trace(tmp_path, capsys):
    """A prefix with only a stamp (a run whose stamp outlived it) is no trace: refused as a prefix without files."""
    _stamped(tmp_path / "t", "NVIDIA H200")
    assert main(["trace", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no trace has the prefix" in err[0], err
