import datetime
import json
import subprocess
import sys

import pytest

from ccbridge import results
from ccbridge.bindings import core
from ccbridge.errors import GpuError
from ccbridge.report import markdown
from ccbridge.cli import main


def has_gpu() -> bool:
    try:
        return core.device_count() > 0
    except GpuError:
        return False


def test_probe_list(capsys):
    assert main(["probe", "--list"]) == 0
    out = capsys.readouterr().out
    assert "transfer.sweep" in out and "(needs gpu)" in out


def test_unknown_test_is_exit_2(capsys):
    assert main(["probe", "--tests", "nope"]) == 2
    assert "no probe test or family named 'nope'" in capsys.readouterr().err


def test_env_json(capsys):
    assert main(["env", "--json"]) == 0
    stamp = json.loads(capsys.readouterr().out)
    assert {"cpu", "tee", "nvml", "torch", "openssl", "emulation"} <= set(stamp)


@pytest.mark.skipif(has_gpu(), reason="checks the CPU-only behaviour")
def test_probe_without_gpu_exits_0_and_writes_reports(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ccbridge", "probe", "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # the answer on stdout, the progress and the files on stderr
    assert "rows in" in proc.stdout
    # one short line, said once: the skip and why in a few words (the driver's loader message ran to 150 columns,
    # wrapped mid-phrase into a file); the reason whole goes to result.json and report.md
    said = [line for line in proc.stdout.splitlines() if "GPU" in line]
    assert len(said) == 1 and said[0].startswith("GPU families skipped: ") and len(said[0]) <= 100, said
    assert "cannot open shared object file" not in proc.stdout + proc.stderr
    assert "ccbridge probe: " in proc.stderr and "wrote " in proc.stderr and str(tmp_path) not in proc.stdout
    res = results.load(tmp_path / "result.json")
    assert {r.test for r in res.rows} == {"hostcrypto.aes256gcm"}
    assert any(s["test"] == "transfer.sweep" and "GPU" in s["reason"] for s in res.skipped)
    md = (tmp_path / "report.md").read_text()
    assert "need a GPU" in md and res.no_gpu in md
    assert "on device" not in md  # there is no device 0 to name
    assert (tmp_path / "report.html").stat().st_size > 1000


def test_compare_cli(tmp_path, capsys):
    from conftest import DATA

    f = DATA / "h100-native-full.json"
    assert main(["compare", str(f), str(f)]) == 0  # one file twice: compared as asked, and nothing differs
    assert capsys.readouterr().out.splitlines()[1:] == ["BASE and OTHER are one result (a file and itself, or a "
                                                       "copy of it): nothing to compare"]
    doc = json.loads(f.read_text())  # another run: every figure 10% higher
    for r in doc["rows"]:
        r.update({k: r[k] * 1.1 for k in ("median", "p10", "p90", "min", "max")})
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    assert main(["compare", str(f), str(other), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out  # the terminal's table: every ratio, in 120 columns
    assert "\ncompute.parity " in out and all(len(line) <= 120 for line in out.splitlines())
    assert "| compute.parity |" in (tmp_path / "compare.md").read_text()  # the file keeps the full Markdown table
    assert (tmp_path / "compare.html").exists()
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["compare", str(f), str(bad)]) == 2
    assert "bad.json: not a JSON document" in capsys.readouterr().err


def test_report_rerenders(tmp_path, capsys):
    from conftest import DATA

    assert main(["report", str(DATA / "h100-native-full.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text().startswith("# ccbridge probe")


def test_native_core_is_built_and_refuses_cleanly_without_gpu():
    assert core.lib()  # built by the install
    if not has_gpu():
        with pytest.raises(GpuError, match="libcuda|CUDA|GPU|cuInit"):
            core.device_count()


def test_profiles_lists_and_explains(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "b300" in out and "passthrough" in out
    assert main(["profiles", "b300"]) == 0
    out = capsys.readouterr().out
    assert "h2d_pinned_gbps = 11.26 GB/s" in out and "Serialized Bridge paper" in out


def test_run_refuses_unknown_profile_and_empty_command(capsys):
    assert main(["run", "--profile", "b999", "--", "true"]) == 2
    assert capsys.readouterr().err.startswith("ccbridge run: unknown profile")  # not "ccbridge ['--', 'true']:"
    assert main(["run", "--profile", "b300"]) == 2
    assert capsys.readouterr().err.startswith("ccbridge run: no command given")


def test_run_starts_the_program_labelled_and_passes_its_status(capsys, tmp_path):
    import sys

    code = "import os, sys; print(os.environ['CCBRIDGE_EMULATION_PROFILE'], 'LD_PRELOAD' in os.environ); sys.exit(3)"
    assert main(["run", "--profile", "passthrough", "--", sys.executable, "-c", code]) == 3


def test_run_where_no_cuda_driver_loads_labels_nothing_emulated(tmp_path):
    """The interposer hooks the CUDA driver: where none loads, `run --profile b300` says the program runs natively,
    prints no EMULATED banner, and the program's own stamp is not emulated (a stranger's review, session 24:
    `load --bench` under it printed EMULATED and compare called run-to-run noise an emulated CC cost)."""
    from ccbridge.bindings import core

    if core.driver_missing() is None:
        pytest.skip("a CUDA driver loads here: the profile emulates")
    code = "from ccbridge import env; e = env.emulation_info(); print(e['active'], e['no_driver'][:6], env.emulated_banner(e))"
    r = subprocess.run([sys.executable, "-m", "ccbridge", "run", "--profile", "b300", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "cannot", "None"]
    assert "EMULATED CC" not in r.stderr and r.stderr.strip().endswith("runs natively, not EMULATED"), r.stderr


def test_run_with_set_stamps_the_what_if_in_the_program(tmp_path):
    """The overrides reach the interposer's configuration and the child's env stamp."""
    code = "import json; from ccbridge import env; print(json.dumps(env.emulation_info()))"
    r = subprocess.run([sys.executable, "-m", "ccbridge", "run", "--profile", "passthrough", "--set", "sync_toll_us=5",
                        "--set", "lanes=2", "--", sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["params"]["sync_toll_us"] == "5" and info["params"]["lanes"] == "2"
    assert info["overrides"] == {"sync_toll_us": {"value": 5.0, "was": 0.0}, "lanes": {"value": 2.0, "was": 1.0}}


def test_profiles_set_shows_the_overridden_profile(capsys):
    assert main(["profiles", "b300", "--set", "launch_toll_us=0"]) == 0
    out = capsys.readouterr().out
    assert "what-if: launch_toll_us set on the command line" in out
    assert "launch_toll_us = 0 us" in out and "source: overridden on the command line (was 18.6)" in out


def test_the_emulator_banner_names_the_what_if():
    from ccbridge.emulate import launcher, profiles

    b = launcher.banner(profiles.override(profiles.load("b300"), ["launch_toll_us=0", "h2d_pinned_gbps=20"]))
    assert "profile b300 with --set launch_toll_us=0 --set h2d_pinned_gbps=20 (" in b and "not CC hardware" in b
    assert " with --set" not in launcher.banner(profiles.load("b300"))
    # passthrough (`run --record` alone) adds no cost: what it records on a CC-on machine is CC hardware's own
    lines = launcher.banner(profiles.load("passthrough")).splitlines()
    b = " ".join(line.strip() for line in lines)
    assert "not CC hardware" not in b and "figures are this machine's own" in b and max(map(len, lines)) <= 120


def test_a_reader_that_stops_early_is_no_error(monkeypatch, capsys):
    """`ccbridge ... | head -1`: the pipe closes under the output; the command ends quietly, status 0."""
    import os

    r, w = os.pipe()

    class Closed:  # stdout whose reader has gone
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            return w

    with capsys.disabled():
        monkeypatch.setattr(sys, "stdout", Closed())
        assert main(["profiles", "b300"]) == 0
    os.close(r)


BENCH_OPTIONS = {  # each bench's own options, and only those: another bench's is refused by argparse
    "ddp": {"--models", "--ngpus", "--buckets", "--iters", "--warmup", "--net", "--wrap", "--json"},
    "cipher": {"-b", "--minbytes", "-e", "--maxbytes", "--iters", "--timer", "--json"},
    "net": {"--lanes", "--inflight", "--total", "-b", "--minbytes", "-e", "--maxbytes", "--iters", "--link", "--json"},
    "decode": {"--model", "--checkpoint", "--batch", "--prompt", "--output", "--modes", "--graphs", "--host-prep-us",
               "--tp", "--timer", "--device", "--seed", "--iters", "--warmup", "--json"},
    "kv": {"--model", "--prefixes", "--prefix-len", "--suffix-len", "--requests", "--churn", "--thresholds", "--modes",
           "--zipf", "--gpu-fraction", "--device-blocks", "--timer", "--device", "--seed", "--iters", "--warmup",
           "--json"},
}


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("bench", sorted(BENCH_OPTIONS))
def test_bench_help_lists_only_its_own_options(bench, capsys, monkeypatch):
    import re

    monkeypatch.setenv("COLUMNS", "300")  # a wide terminal: --help still fits 120 columns
    text = _help(["bench", bench], capsys)
    options = text[text.index("\noptions:"):]
    listed = set(re.findall(r"^ {2}(-[\w-]+)|, (-[\w-]+)", options, re.M))
    assert {o for pair in listed for o in pair if o} - {"-h", "--help"} == BENCH_OPTIONS[bench], text
    assert all(len(line) <= 120 for line in text.splitlines()), text
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", options)) - {"--help"}  # kv's said "with --tp only"
    assert named <= BENCH_OPTIONS[bench], (bench, named - BENCH_OPTIONS[bench])
    mine = {"decode": "--batch", "net": "--lanes", "kv": "--thresholds", "ddp": "--buckets", "cipher": "--minbytes"}
    for other, option in mine.items():
        assert (option in text) == (option in BENCH_OPTIONS[bench]), (bench, option)


def test_every_help_fits_120_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    for argv in [[], ["bench"], ["collectives"], ["load"], ["run"], ["account"], ["advise"], ["plan-tenants"]]:
        text = _help(argv, capsys)
        assert all(len(line) <= 120 for line in text.splitlines()), (argv, text)


def _commands(parser, path=()):
    """(argv, parser) of every subcommand under parser, nested ones (bench's) too."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield [*path, name], sub
                yield from _commands(sub, (*path, name))


def test_every_command_says_what_it_does_and_every_argument_what_it_takes(capsys, monkeypatch):
    """`trace --help` had no description and its prefix no help, as had compare's base and other, env, and five of
    collectives' options (a stranger's review): each --help opens with what the command does, every argument
    says what it takes, and the text fits 120 columns."""
    import argparse

    from ccbridge.cli import build_parser

    monkeypatch.setenv("COLUMNS", "300")
    for argv, sub in _commands(build_parser()):
        assert sub.description, argv
        bare = [a.dest for a in sub._actions if not a.help and not isinstance(a, argparse._SubParsersAction)]
        assert not bare, (argv, bare)
        text = _help(argv, capsys)
        assert all(len(line) <= 120 for line in text.splitlines()), (argv, text)


def test_bench_help_imports_no_torch():
    """`--help` answers from argparse and ccbridge.choices, without importing torch (seconds of start-up)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "ccbridge.cli", "bench", "decode", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--batch" in r.stdout, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "ccbridge.cli.bench" in imported


def test_report_leaves_a_folders_own_result_and_reports_alone(tmp_path, capsys):
    """`report X` beside another result.json would have replaced it with a copy of X (and its reports with X's):
    refused in one line; the folder's own result.json gets its reports again, the file byte for byte as it was."""
    from conftest import DATA

    d = tmp_path / "p"
    d.mkdir()
    own, other = d / "result.json", d / "peer.json"
    own.write_bytes((DATA / "h100-native-full.json").read_bytes())
    other.write_bytes((DATA / "h200x2-peer.json").read_bytes())
    before = own.read_bytes()
    assert main(["report", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is another result, whose reports these would replace" in err[0]
    assert own.read_bytes() == before and sorted(p.name for p in d.iterdir()) == ["peer.json", "result.json"]
    assert main(["report", str(own)]) == 0
    assert own.read_bytes() == before and (d / "report.md").exists() and (d / "report.html").exists()
    assert main(["report", str(other), "--out", str(tmp_path / "q")]) == 0  # a folder of its own: the reports only
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["report.html", "report.md"]
    (tmp_path / "q" / "result.json").write_bytes(other.read_bytes())  # a copy the old report made is still its own
    assert main(["report", str(other), "--out", str(tmp_path / "q")]) == 0
    assert main(["report", str(own), "--out", str(tmp_path / "q")]) == 2  # another result there: refused
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("is another result, whose reports these would replace")  # --out given: no advice to give it


def test_report_writes_the_two_reports_it_names_and_no_copy_of_the_result(tmp_path, capsys):
    """`report X.json` wrote report.md, report.html and, unsaid, a result.json copy of X beside X; a second
    `report Y.json` in that folder was then refused because of that copy (a stranger's review)."""
    from conftest import DATA

    first, second = tmp_path / "h100.json", tmp_path / "peer.json"
    first.write_bytes((DATA / "h100-native-full.json").read_bytes())
    second.write_bytes((DATA / "h200x2-peer.json").read_bytes())
    assert main(["report", str(first)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "report.md"), str(tmp_path / "report.html")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h100.json", "peer.json", "report.html", "report.md"]
    assert main(["report", str(second)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h100.json", "peer.json", "report.html", "report.md"]
    assert (tmp_path / "report.md").read_text() == markdown.render(results.load(second))  # the second's own


def test_recording_where_no_cuda_driver_loads_is_refused_before_the_program_runs(tmp_path, monkeypatch, capsys):
    """`run --record T` (or --coverage) where no CUDA driver loads printed the passthrough banner, ran the program,
    exited 0 and wrote no trace (a stranger's review): the interposer sees only driver calls, so nothing could be
    recorded. Refused now, in one line, before the program starts; where a driver loads, it runs as before."""
    marker = tmp_path / "ran"
    cmd = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    monkeypatch.setattr(core, "driver_missing", lambda: "cannot load the CUDA driver library libcuda.so.1 (no NVIDIA "
                                                        "driver here?)")
    for argv in (["run", "--record", str(tmp_path / "t")], ["run", "--coverage", str(tmp_path / "c.json")],
                 ["run", "--profile", "b300", "--record", str(tmp_path / "t")]):
        assert main(argv + cmd) == 2
        err = capsys.readouterr().err.splitlines()
        assert err == ["ccbridge run: cannot load the CUDA driver library libcuda.so.1 (no NVIDIA driver here?): "
                       "nothing to record"], err
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # not run, no coverage file
    assert main(["probe", "--record", str(tmp_path / "t"), "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err.startswith("ccbridge probe: cannot load the CUDA driver")  # its own name
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(core, "driver_missing", lambda: None)  # a driver loads: recorded as before
    assert main(["run", "--record", str(tmp_path / "t")] + cmd) == 0 and marker.exists()


def test_a_projection_where_no_cuda_driver_loads_says_it_runs_natively(tmp_path, monkeypatch, capsys):
    """Without a driver `run --project b300` asked for a datasheet ratio (--project-by R) that would not be applied,
    and with one given announced PROJECTED and ran natively (a stranger's review). Now it says, as for a profile,
    that the run is native: no ratio is needed for a projection that cannot be made; bad input is still refused."""
    from ccbridge import env

    monkeypatch.setattr(core, "driver_missing", lambda: "cannot load the CUDA driver library libcuda.so.1 (no NVIDIA "
                                                        "driver here?)")
    monkeypatch.setattr(env, "nvml_info", lambda: {"available": False})
    for extra, said in (([], "not PROJECTED"), (["--project-by", "2"], "not PROJECTED"),
                        (["--profile", "b300"], "not EMULATED or PROJECTED")):
        assert main(["run", "--project", "b300", *extra, "--", "true"]) == 0
        err = " ".join(capsys.readouterr().err.split())  # (wrapped at 120 columns)
        assert err.endswith(f"(no NVIDIA driver here?): runs natively, {said}") and "PROJECTED to" not in err, err
    assert main(["run", "--project", "b301", "--", "true"]) == 2  # an unknown target all the same
    assert "unknown GPU 'b301'" in capsys.readouterr().err
    monkeypatch.setattr(core, "driver_missing", lambda: None)  # a driver, no GPU named: the ratio is asked for
    assert main(["run", "--project", "b300", "--", "true"]) == 2
    assert "give the ratio: --project-by R" in capsys.readouterr().err


class _OneSecond(datetime.datetime):
    """A clock stopped within one second: every run it starts, started in the same second."""

    @classmethod
    def now(cls, tz=None):
        return cls(2026, 11, 28, 9, 26, 24, tzinfo=tz)


def test_two_probes_started_in_one_second_write_two_folders(tmp_path, monkeypatch, capsys):
    """`(ccbridge probe --quick &); ccbridge probe --quick` printed one folder twice and kept the last run's result:
    the default folder was a name checked, then written at the end. A second probe, run while the first runs, gets a
    folder of its own, and each keeps its result."""
    from ccbridge.probe import registry

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datetime, "datetime", _OneSecond)
    real, inner = registry.run, []

    def run(*args, **kwargs):  # the first probe's run: the second probe starts and ends inside it
        if not inner:
            inner.append("started")
            inner.append(main(["probe", "--quick", "--tests", "launch"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(registry, "run", run)
    assert main(["probe", "--quick", "--tests", "launch"]) == 0 and inner == ["started", 0]
    folders = sorted((tmp_path / "ccbridge-results").iterdir())
    assert [f.name for f in folders] == ["20261128-092624", "20261128-092624-2"]
    assert all((f / "result.json").is_file() for f in folders)


def test_default_folders_are_made_once_and_taken_away_unused(tmp_path, monkeypatch):
    """probe, account and calibrate share the default: each name is made once (os.mkdir), and a folder the command
    wrote nothing in (it failed) goes again, with ccbridge-results where the command made it."""
    from ccbridge import ui

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datetime, "datetime", _OneSecond)
    with ui.run_folders():
        made = [ui.run_folder("account-") for _ in range(3)] + [ui.run_folder()]
        assert [str(p) for p in made] == ["ccbridge-results/account-20261128-092624",
                                          "ccbridge-results/account-20261128-092624-2",
                                          "ccbridge-results/account-20261128-092624-3",
                                          "ccbridge-results/20261128-092624"]
        assert all(p.is_dir() for p in made)
        (made[1] / "result.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "ccbridge-results").iterdir()) == ["account-20261128-092624-2"]
    with ui.run_folders():
        ui.run_folder()
    assert len(list((tmp_path / "ccbridge-results").iterdir())) == 1  # ccbridge-results was there before: kept
    (made[1] / "result.json").unlink()
    made[1].rmdir()
    made[1].parent.rmdir()
    with ui.run_folders():
        ui.run_folder()
    assert list(tmp_path.iterdir()) == []


def test_a_result_file_given_again_is_refused_and_kept_and_a_stream_is_still_written(tmp_path):
    """`--json FILE` overwrote an earlier result silently (bench net twice: the first run gone), where an --out folder
    holding one is refused: now the file is refused in one line, exit 2, and kept. /dev/stdout is no file that holds
    a result: it is still written to."""
    argv = [sys.executable, "-m", "ccbridge", "plan-tenants", "--request", "4"]
    out = tmp_path / "p.json"
    assert subprocess.run(argv + ["--json", str(out)], capture_output=True, timeout=120).returncode == 0
    first = out.read_bytes()
    r = subprocess.run(argv + ["2", "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"ccbridge plan-tenants: --json {out} exists: remove it or name another file\n"
    assert out.read_bytes() == first
    r = subprocess.run(argv + ["--json", "/dev/stdout"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and '"placed": 1' in r.stdout, r.stderr


# `ccbridge run` with a stub launcher's insides: a CUDA driver that loads, a program that prints a line and exits 0,
# and the interposer's coverage of one process (no GPU, no interposer run)
_RUN_STUBBED = """
import sys
from ccbridge.bindings import core
from ccbridge.cli import main
from ccbridge.emulate import coverage, launcher

core.driver_missing = lambda: None
launcher.subprocess.call = lambda cmd, env=None: print("what the program printed", flush=True) or 0
coverage.merge = lambda prefix: {"schema": 1, "processes": 1,
                                 "symbols": {"cuInit": {"class": "hooked", "calls": 1, "via": ["dlsym"]}}}
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("tail", ["> '{out}'", "| cat > '{out}'"])
def test_run_coverage_to_a_stream_is_written_once_and_rendered_from_the_run(tmp_path, tail):
    """`run --coverage /dev/stdout > f` wrote the report through stdout, then read /dev/stdout back to print it:
    a JSONDecodeError traceback, exit 1; into a pipe (`| cat`) it read its own stdout pipe and hung. The launcher
    hands back the report it wrote, which run prints: FILE is never read."""
    out = tmp_path / "out.json"
    argv = [sys.executable, "-c", _RUN_STUBBED, "run", "--coverage", "/dev/stdout", "--", "true"]
    r = subprocess.run(" ".join(f"'{a}'" for a in argv) + " " + tail.format(out=out), shell=True,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    printed, _, report = out.read_text().partition("\n")
    assert printed == "what the program printed" and json.loads(report)["symbols"]["cuInit"]["class"] == "hooked"
    assert "driver coverage: 1 process(es), 1 symbols" in r.stderr and "cuInit" in r.stderr
