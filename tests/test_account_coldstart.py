"""account --profile P -- CMD where the first run would pay a cold start: --warmup runs CMD once, natively and
untraced, before the traced runs."""

import json
from pathlib import Path

from ccbridge import cli
from ccbridge.emulate import launcher
from test_account import decode_loop


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
