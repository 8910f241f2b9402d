"""A trace says where it was recorded (<prefix>.env.json, emulate/recorded.py): an account made from traces on
another machine stamped its result with the machine that read them ('no GPU' for the H200 samples accounted on a
laptop). On CPU: the launcher's stamp beside what a program left, and account and its reports reading it."""

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from ccbridge import results
from ccbridge.bindings import core
from ccbridge.cli import main
from ccbridge.errors import EmulatorError
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


def _stamped(prefix: Path, gpu: str, host: str = "gpu-host-1", cc: str = "off") -> None:
    """A stamp as a GPU machine's launcher writes it: this machine's, with an H200's NVML and another host."""
    recorded.write(str(prefix), {})
    doc = json.loads(Path(f"{prefix}{recorded.SUFFIX}").read_text())
    doc["env"]["host"] = host
    doc["env"]["nvml"] = {"available": True, "driver": "580.95", "cc": {"mode": cc},
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


def _pair(tmp_path: Path, sample: str = "decode-h200") -> tuple[Path, Path]:
    tmp_path.mkdir(exist_ok=True)
    base, other = tmp_path / "native", tmp_path / "emulated"
    _copy_trace("native", base, TRACES / sample)
    _copy_trace("emulated", other, TRACES / sample)
    return base, other


@pytest.mark.parametrize("sample", ["decode-h200", "ddp-h200x2"])  # one process; a job's ranks (account_ranks)
def test_an_account_of_traces_carries_the_machine_that_recorded_them(tmp_path, capsys, sample):
    base, other = _pair(tmp_path, sample)
    _stamped(base, "NVIDIA H200")
    _stamped(other, "NVIDIA H200")
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 0 and "note:" not in err, err
    assert doc["env"]["host"] == "gpu-host-1" and doc["env"]["nvml"]["gpus"][0]["name"] == "NVIDIA H200"
    where = "host gpu-host-1 (NVIDIA H200)"
    assert doc["settings"]["recorded"] == [{"trace": t, "machine": where, "cc": "off", "driver": "580.95"}
                                           for t in ("BASE", "OTHER")]
    md = (tmp_path / "acc" / "report.md").read_text()
    assert md.startswith("# ccbridge account — NVIDIA H200 — "), md[:120]
    assert f"(BASE and OTHER recorded on {where}, CC off, driver 580.95; the machine below: OTHER's, else BASE's)" in md
    assert results.load(tmp_path / "acc" / "result.json").env == doc["env"]  # read back through its schema


def _said(err: str) -> str:
    """The notes on stderr, their wrapped lines joined."""
    return " ".join(line.strip() for line in err.splitlines())


def test_one_machine_with_cc_off_then_on_is_accounted_as_cc_on(tmp_path, capsys):
    """The real-hardware case: BASE recorded CC off, OTHER CC on, one host. The result (and advise) said 'CC off',
    BASE's state; the CC state of an account is OTHER's, as its stamp says, and the difference is noted."""
    base, other = _pair(tmp_path)
    _copy_trace("native", other.with_name("on"))  # a native trace recorded with CC on: its header says passthrough
    _stamped(base, "NVIDIA H200")
    _stamped(other.with_name("on"), "NVIDIA H200", cc="on")
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other.with_name("on")))
    assert rc == 0
    assert "note: the traces were not all recorded alike: BASE recorded on host gpu-host-1 (NVIDIA H200), CC off, " \
        "driver 580.95; OTHER recorded on host gpu-host-1 (NVIDIA H200), CC on, driver 580.95" in _said(err), err
    res = results.load(tmp_path / "acc" / "result.json")
    assert results.cc_state(res) == "on" and not res.emulated
    assert main(["advise", str(tmp_path / "acc" / "result.json")]) in (0, 1)
    head = capsys.readouterr().out.splitlines()[0]
    assert "NVIDIA H200, CC on (NVML)" in head and "do not apply" not in head, head


def test_traces_of_two_machines_or_none_are_said_and_kept(tmp_path, capsys):
    base, other = _pair(tmp_path)
    _stamped(base, "NVIDIA H100 80GB HBM3", host="cc-off")
    _stamped(other, "NVIDIA H200", host="cc-on")
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 0 and doc["env"]["host"] == "cc-on"  # OTHER's: the run whose cost it accounts
    assert "BASE recorded on host cc-off (NVIDIA H100 80GB HBM3), CC off, driver 580.95; OTHER recorded on host " \
        "cc-on (NVIDIA H200)" in _said(err), err
    assert all(len(line) <= 120 for line in err.splitlines())
    assert [x["machine"] for x in doc["settings"]["recorded"]] == ["host cc-off (NVIDIA H100 80GB HBM3)",
                                                                    "host cc-on (NVIDIA H200)"]
    shutil.rmtree(tmp_path / "acc")
    Path(f"{base}{recorded.SUFFIX}").unlink()  # BASE without its stamp: OTHER's machine is the result's, said so
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 0 and doc["env"]["host"] == "cc-on" and doc["settings"]["recorded"][0]["machine"] is None
    assert "the traces were not all recorded alike: BASE: no stamp; OTHER recorded on host cc-on (NVIDIA H200)" \
        in _said(err)
    shutil.rmtree(tmp_path / "acc")
    Path(f"{other}{recorded.SUFFIX}").unlink()  # neither: the machine that read them, and the reports say so
    rc, _, err, doc = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 0 and doc["env"]["host"] == socket.gethostname()
    res = results.load(tmp_path / "acc" / "result.json")
    assert results.machine_name(res) == "recorded where: unknown" and results.cc_state(res) == "unknown"
    assert "no trace says where it was recorded (no stamp beside any): the result's stamp is this machine's" in \
        _said(err)
    md = (tmp_path / "acc" / "report.md").read_text()
    assert md.startswith("# ccbridge account — recorded where: unknown — "), md[:120]
    assert "(no trace says where it was recorded: the machine below read them)" in md
    assert main(["advise", str(tmp_path / "acc" / "result.json")]) in (0, 1)
    assert "recorded where: unknown" in capsys.readouterr().out.splitlines()[0]


def test_a_job_whose_ranks_do_not_pair_up_keeps_its_own_refusal(tmp_path, capsys):
    """The machine note went first into the ranks' notes and took the place of the refusal's reason."""
    base, _ = _pair(tmp_path, "ddp-h200x2")
    _stamped(base, "NVIDIA H200")
    _, other = _pair(tmp_path / "d")  # the decode loop's trace: no rank of the DDP job in it
    rc, _, err, _ = _account(tmp_path, capsys, str(base), str(other))
    assert rc == 2 and "no rank of the job could be compared: rank 0 is only in the BASE trace" in err, err


@pytest.mark.parametrize("text, says", [
    ("{", "unreadable trace stamp"),
    ('{"created": "2026-11-28T10:00:00+00:00"}', "env"),
    ('{"created": "x", "env": {"host": 3}}', "created"),
    ('{"created": "2026-11-28T10:00:00+00:00", "env": {}}', "host"),
])
def test_a_broken_stamp_is_refused_in_one_line(tmp_path, capsys, text, says):
    base, other = _pair(tmp_path)
    Path(f"{base}{recorded.SUFFIX}").write_text(text)
    for argv in (["trace", str(base)], ["account", str(base), str(other), "--out", str(tmp_path / "acc")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and says in err[0] and "env.json" in err[0], err
    assert not (tmp_path / "acc").exists()


@pytest.mark.parametrize("make", ["fifo", "device", "folder", "big"])
def test_a_stamp_that_is_no_file_ccbridge_wrote_is_refused_at_once(tmp_path, capsys, make):
    """A FIFO hung the reader, /dev/zero ran it out of memory: a stamp is a regular file of a few KiB."""
    base, _ = _pair(tmp_path)
    at = Path(f"{base}{recorded.SUFFIX}")
    {"fifo": lambda: os.mkfifo(at), "device": lambda: at.symlink_to("/dev/zero"), "folder": at.mkdir,
     "big": lambda: at.write_text(" " * (recorded.MAX_BYTES + 1))}[make]()
    assert main(["trace", str(base)]) == 2
    err = capsys.readouterr().err.splitlines()
    says = "bytes (at most 1048576)" if make == "big" else "not a regular file"
    assert len(err) == 1 and "unreadable trace stamp" in err[0] and says in err[0] and len(err[0]) <= 120, err


def test_a_trace_summary_that_is_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    """The summary reader opened a FIFO and waited for a writer for ever (the stamp's reader, reviewed, did too)."""
    os.mkfifo(tmp_path / "t.7.summary.json")
    assert main(["trace", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err.endswith("t.7.summary.json: not a regular file\n")


def test_a_stamp_is_never_written_through_a_link_nor_left_half_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(core, "driver_missing", lambda: None)
    t, victim = tmp_path / "t", tmp_path / "victim"
    Path(f"{t}{recorded.SUFFIX}").symlink_to(victim)  # dangling: os.path.exists said no old file was there
    assert main(["run", "--record", str(t), "--"] + _leaver(tmp_path) + [str(t)]) == 2
    assert "1 file(s) of an earlier run (t.env.json)" in capsys.readouterr().err and not victim.exists()
    Path(f"{t}{recorded.SUFFIX}").unlink()

    class Full:  # the disk fills while the stamp is written
        def __init__(self, fd, *_, **__):
            self.fd = fd

        def __enter__(self):
            return self

        def __exit__(self, *_):
            os.close(self.fd)

        def write(self, _):
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fdopen", Full)
    with pytest.raises(EmulatorError, match="cannot write the trace's stamp .*No space left on device"):
        recorded.write(str(t), {})
    assert not Path(f"{t}{recorded.SUFFIX}").exists()  # nothing that would refuse the next run
    monkeypatch.setattr(Full, "write", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))  # Ctrl-C meanwhile
    with pytest.raises(KeyboardInterrupt):
        recorded.write(str(t), {})
    assert not Path(f"{t}{recorded.SUFFIX}").exists()


def test_a_python_program_that_made_no_driver_call_leaves_no_stamp_beside_its_sites(tmp_path, monkeypatch):
    """--sites: a Python process notes its call sites whether or not it calls the driver; sites alone are no trace,
    and the stamp beside them refused the prefix's next run."""
    monkeypatch.setattr(core, "driver_missing", lambda: None)
    t = tmp_path / "t"
    assert main(["run", "--record", str(t), "--sites", "--", sys.executable, "-c", "pass"]) == 0
    assert not Path(f"{t}{recorded.SUFFIX}").exists(), sorted(p.name for p in tmp_path.iterdir())


def test_a_stamp_given_as_the_prefix_names_the_prefix(capsys):
    assert main(["trace", str(TRACES / "decode-h200" / "native.env.json")]) == 2
    assert "give the trace's prefix" in capsys.readouterr().err


def test_a_stamp_alone_is_no_trace(tmp_path, capsys):
    """A prefix with only a stamp (a run whose stamp outlived it) is no trace: refused as a prefix without files."""
    _stamped(tmp_path / "t", "NVIDIA H200")
    assert main(["trace", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no trace has the prefix" in err[0], err


def test_the_report_of_an_emulated_account_says_only_other_was_emulated(tmp_path, capsys):
    """Its stamp is OTHER's, emulated: the banner said every GPU figure was the emulator's, BASE's native ones too."""
    base, other = _pair(tmp_path)
    _stamped(other, "NVIDIA H200")
    doc = json.loads(Path(f"{other}{recorded.SUFFIX}").read_text())
    doc["env"]["emulation"] = {"active": True, "profile": "b300"}
    Path(f"{other}{recorded.SUFFIX}").write_text(json.dumps(doc))
    assert _account(tmp_path, capsys, str(base), str(other))[0] == 0
    md = (tmp_path / "acc" / "report.md").read_text()
    assert "EMULATED: OTHER's figures here were produced by the ccbridge emulator (profile b300)" in md
    assert "BASE's are the machine's own" in md and "every GPU figure" not in md
    assert "| torch | not recorded (a trace's stamp names no torch) |" in md  # it read 'n/a'
