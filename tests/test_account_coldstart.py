"""account --profile P -- CMD where the first run paid a cold start: an emulated run is never faster than the native
one, so an OTHER start-up markedly shorter than BASE's is noted (stderr and the start-up phase row); --warmup runs
CMD once, natively and untraced, before the traced runs."""

import json
from pathlib import Path

import pytest

from ccbridge import cli, results
from ccbridge.cli import emulation
from ccbridge.emulate import launcher
from test_account import decode_loop
from test_account_repeat import write_job

NOTE = "note: OTHER's start-up (launch to first driver call) took"


def fake_timed(monkeypatch, write, startup_s):
    """launcher.run_timed replaced by write(prefix, emulated, n), the run launched startup_s[emulated] before its
    trace's first call and ending 1 ms after its last. Returns the runs' prefixes in order."""
    done = []

    def run_timed(profile, cmd, trace=None, sites=False, **kw):
        emulated = profile.name != "passthrough"
        done.append(trace)
        write(Path(trace), emulated, len(done))
        ts = [int(v) for f in Path(trace).parent.glob(f"{Path(trace).name}.*.csv")
              for line in f.read_text().splitlines()[2:] for v in line.split(",")[:2]]
        return 0, (min(ts) - int(startup_s[emulated] * 1e9), max(ts) + 1_000_000)

    monkeypatch.setattr(launcher, "run_timed", run_timed)
    monkeypatch.setattr(launcher, "check", lambda *a, **k: None)
    return done


def one_process(prefix, emulated, n):
    decode_loop(prefix, d2h_us=1400 if emulated else 30, launch_us=5, profile="b300" if emulated else "passthrough",
                emulate=int(emulated))


def test_a_shorter_emulated_start_up_is_noted_on_stderr_and_on_the_start_up_row(tmp_path, monkeypatch, capsys):
    fake_timed(monkeypatch, one_process, {False: 2.5, True: 0.5})  # the native run read its libraries cold
    out = tmp_path / "o"
    assert cli.main(["account", "--profile", "b300", "--out", str(out), "--", "true"]) == 0
    err = capsys.readouterr().err
    assert all(len(line) <= 120 for line in err.splitlines()), err
    text = err.replace("\n  ", " ")
    assert f"{NOTE} 500.0 ms, BASE's 2500.0 ms: an emulated run is never faster than the native one" in text
    assert "cold page cache" in text and "--warmup (or a run of CMD before the account) evens the first" in text
    assert text.count("note: OTHER's start-up") == 1
    res = results.load(out / "result.json")
    start = next(r for r in res.rows if r.test == "account.phase" and r.params["phase"] == "start-up")
    assert abs(start.median + 2.0) < 1e-6 and "cold page cache" in start.extra["verdict"]
    assert "cold page cache" in (out / "report.md").read_text()

    fake_timed(monkeypatch, one_process, {False: 1.0, True: 0.9})  # within the noise: nothing said
    assert cli.main(["account", "--profile", "b300", "--out", str(tmp_path / "p"), "--", "true"]) == 0
    assert NOTE not in capsys.readouterr().err
    res = results.load(tmp_path / "p" / "result.json")
    assert not any("verdict" in r.extra for r in res.rows if r.test == "account.phase")


@pytest.mark.parametrize("base_s, other_s, noted", [
    (1.0, 0.79, True), (1.0, 0.81, False),  # 0.2 s: a short start-up's noise
    (3.0, 2.5, True), (3.0, 2.6, False),  # 15% of a long one's (0.45 s)
    (0.5, 2.5, False), (1.0, 1.0, False),  # OTHER's longer or the same: the emulator's cost, or none
])
def test_the_threshold_is_the_larger_of_its_seconds_and_its_share_of_bases_start_up(base_s, other_s, noted):
    assert emulation.COLD_START == (0.2, 0.15)
    assert (emulation._cold_start(base_s, other_s, 1, False) is not None) == noted


@pytest.mark.parametrize("k, base_s, other_s, noted", [
    (3, 1.5, 0.95, False), (3, 1.5, 0.85, True),  # 3 runs summed: 0.6 s of noise, not one run's 0.2 s
    (3, 6.0, 5.0, True), (3, 6.0, 5.2, False),  # 15% of a long summed start-up (0.9 s) is the larger
])
def test_the_threshold_scales_with_the_runs_summed(k, base_s, other_s, noted):
    assert (emulation._cold_start(base_s, other_s, k, False) is not None) == noted


def test_after_warmup_repeat_is_recommended_only_where_it_was_not_given():
    once, summed = emulation._cold_start(2.5, 0.5, 1, True), emulation._cold_start(5.0, 1.0, 2, True)
    assert once.endswith("the driver, the GPU or the host's speed; --repeat K averages it"), once
    assert "--repeat" not in summed and summed.endswith("the driver, the GPU or the host's speed"), summed


def test_a_jobs_runs_summed_are_noted_too_and_after_warmup_the_host_is_named(tmp_path, monkeypatch, capsys):
    fake_timed(monkeypatch, write_job, {False: 2.5, True: 0.5})
    out = tmp_path / "o"
    assert cli.main(["account", "--profile", "b300", "--repeat", "2", "--warmup", "--out", str(out), "--", "true"]) == 0
    err = capsys.readouterr().err
    assert all(len(line) <= 120 for line in err.splitlines()), err
    text = err.replace("\n  ", " ")
    assert f"{NOTE} 1000.0 ms, BASE's 5000.0 ms (the runs summed): an emulated run is never faster" in text
    assert "CMD ran once before them (--warmup), so not only the page cache" in text
    assert "--repeat K" not in text  # it ran with --repeat 2 already
    res = results.load(out / "result.json")
    assert res.settings["ranks"] == [0, 1]
    start = next(r for r in res.rows if r.test == "account.phase" and r.params["phase"] == "start-up")
    assert abs(start.median + 4.0) < 1e-6 and "CMD ran once before them (--warmup)" in start.extra["verdict"]


def test_warmup_runs_cmd_once_natively_untraced_before_the_traced_runs(tmp_path, monkeypatch, capsys):
    ran = tmp_path / "ran"
    seen = []  # the warm-up's lines, as each traced run found them
    done = fake_timed(monkeypatch, lambda p, e, n: seen.append(ran.read_text().splitlines()) or one_process(p, e, n),
                      {False: 0.5, True: 0.5})
    cmd = ["sh", "-c", f"echo \"warm ${{LD_PRELOAD:-none}} ${{CCBRIDGE_ACCOUNT_SINCE:+since}}\" >> {ran}"]
    out = tmp_path / "o"
    assert cli.main(["account", "--profile", "b300", "--warmup", "--out", str(out), "--", *cmd]) == 0
    assert len(done) == 2 and seen == [["warm none since"]] * 2  # once, before the first, with no interposer
    err = capsys.readouterr().err.splitlines()
    first = next(i for i, line in enumerate(err) if line.startswith("ccbridge account: run 1 of 2"))
    assert [i for i, line in enumerate(err) if line.startswith("ccbridge account: warm-up run: natively")] == [0]
    assert first > 0 and all(len(line) <= 120 for line in err)
    assert json.loads((out / "result.json").read_text())["settings"]["command"] == cmd


def test_a_failed_warmup_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    done = fake_timed(monkeypatch, one_process, {False: 0.5, True: 0.5})
    out = tmp_path / "o"
    assert cli.main(["account", "--profile", "b300", "--warmup", "--out", str(out), "--", "sh", "-c", "exit 3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "ccbridge account: sh -c exit 3 exited with status 3 in the warm-up run; nothing to compare"
    assert err == ["ccbridge account: warm-up run: natively, no interposer, untraced; it counts in no figure", err[-1]]
    assert done == [] and not out.exists()


def test_the_projected_second_pass_runs_no_second_warmup(tmp_path, monkeypatch, capsys):
    ran = tmp_path / "ran"
    done = fake_timed(monkeypatch, one_process, {False: 0.5, True: 0.5})
    argv = ["account", "--profile", "b300", "--warmup", "--project", "b300", "--project-by", "2", "--out",
            str(tmp_path / "o"), "--", "sh", "-c", f"echo warm >> {ran}"]
    assert cli.main(argv) == 0
    assert len(done) == 4 and ran.read_text() == "warm\n"  # two runs, two projected: CMD warmed once
    assert capsys.readouterr().err.count("warm-up run: natively") == 1
