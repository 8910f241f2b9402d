"""ccbridge account --repeat K: BASE and OTHER run alternately K times, each rank accounted over the K runs summed
(emulate/runs.py), each run's own share beside the sums; K=1 is the account of one pair, unchanged."""

import json
from pathlib import Path

from ccbridge import account_ranks, cli, results
from ccbridge.emulate import launcher, runs, trace
from test_account import decode_loop, eager_job, two_ranks


def host_moved_runs(tmp_path):
    """Two pairs of a 2-rank job whose tolls are the same (4 replayed all-reduces of 12.5 us a step): in run 1
    rank 1's host work grew 20 us a step in OTHER (rank 0 waited for it), in run 2 it shrank 20 us a step."""
    two_ranks(tmp_path / "n1", 0, 100, 1000)
    two_ranks(tmp_path / "c1", 12.5, 153, 1000, slow_rank_us=20, profile="b300", emulate=1)
    two_ranks(tmp_path / "n2", 0, 100, 1000, slow_rank_us=20)
    two_ranks(tmp_path / "c2", 12.5, 153, 1000, profile="b300", emulate=1)
    return [[trace.summarize(str(tmp_path / f"{side}{j}")) for side in "nc"] for j in (1, 2)]


def test_summed_runs_average_a_host_that_moved_each_way(tmp_path):
    pairs = host_moved_runs(tmp_path)
    each = [{a.rank: a for a in account_ranks.per_rank(b, o)[0]} for b, o in pairs]
    (base, bnotes), (other, onotes) = runs.merge([p[0] for p in pairs]), runs.merge([p[1] for p in pairs])
    assert bnotes == onotes == [] and account_ranks.multi_process(base, other)
    ranks, notes = account_ranks.per_rank(base, other)
    assert [a.rank for a in ranks] == [0, 1] and {a.window for a in ranks} == {"marks"}
    share = {a.rank: a.explained_ms / a.slowdown_ms for a in ranks}
    one, two = (each[i][1].explained_ms / each[i][1].slowdown_ms for i in (0, 1))
    assert one < 0.8 and two > 1.5  # 53 of 73 us a step, 53 of 33
    assert one < share[1] < two and abs(share[1] - 1) < 0.01  # the host work's change cancels in the sums
    assert abs(each[0][1].host_delta_ms - 50 * 0.02) < 1e-6 and abs(each[1][1].host_delta_ms + 50 * 0.02) < 1e-6
    for a in ranks:
        assert abs(a.explained_ms + a.peers_delta_ms + a.host_delta_ms - a.slowdown_ms) < 1e-9
        assert abs(a.base_ms - sum(e[a.rank].base_ms for e in each)) < 1e-9  # the windows summed
        assert abs(a.other_ms - sum(e[a.rank].other_ms for e in each)) < 1e-9
        ar = next(x for x in a.lines if x.api == "ncclAllReduce")
        assert ar.calls == (400, 400) and ar.replays == 400  # 2 runs x 50 steps x 4 replays
    whole = account_ranks.overall(base, other, ranks)
    assert abs(whole.slowdown_ms - sum(a.slowdown_ms for a in ranks)) < 1e-9 and abs(whole.host_delta_ms) < 0.01
    assert not any(account_ranks.host_moved(a) for a in ranks)  # each run alone names rank 1
    assert [account_ranks.host_moved(e[1]) for e in each] == [True, True]


def test_a_rank_missing_from_a_run_and_peers_one_run_measured_are_not_summed(tmp_path):
    pairs = host_moved_runs(tmp_path)
    b1 = pairs[0][0]
    b1.procs = [p for p in b1.procs if p.rank != 1]
    b2 = pairs[1][0]
    next(p for p in b1.procs if p.rank == 0).peers_ns = None  # measured in run 2 only
    base, notes = runs.merge([b1, b2])
    assert [p.rank for p in base.procs] == [0] and base.procs[0].peers_ns is None
    assert notes == ["rank 0 of the job of 2: peers measured in 1 of the 2 runs: not summed ('-'); its waits for "
                     "them stay in its calls", "rank 1 of the job of 2: in 1 of the 2 runs: not summed, not compared"]
    assert runs.merge([b1]) == (b1, [])  # one run: itself


def test_an_eager_jobs_matched_peers_are_summed_over_the_runs(tmp_path):
    for j in (1, 2):
        eager_job(tmp_path / f"n{j}", 0, steps=10 * j)
        eager_job(tmp_path / f"c{j}", 1, steps=10 * j)
    sides = [[trace.summarize(str(tmp_path / f"{side}{j}")) for j in (1, 2)] for side in "nc"]
    (base, _), (other, _) = runs.merge(sides[0]), runs.merge(sides[1])
    assert [p.peers_how for p in base.procs + other.procs] == ["waits"] * 4
    assert [p.peers_ns for p in base.procs] == [sum(t.procs[r].peers_ns for t in sides[0]) for r in (0, 1)]
    ranks, notes = account_ranks.per_rank(base, other)
    assert notes[0].startswith("peers of the 2-rank job, eager collectives: matched by collective")
    for a in ranks:  # 30 steps of 85 us of tolls each
        assert abs(a.explained_ms - 30 * 85 / 1e3) < 1e-3 and abs(a.slowdown_ms - 30 * 95 / 1e3) < 1e-3


def fake_runs(monkeypatch, write):
    """launcher.run_timed replaced by write(prefix, emulated, n): the n-th run of its side; the launch 1 ms
    before the trace's first call, the end 1 ms after its last. Returns the runs' (side, prefix) in order."""
    done = []

    def run_timed(profile, cmd, trace=None, sites=False, **kw):
        emulated = profile.name != "passthrough"
        done.append((emulated, trace))
        write(Path(trace), emulated, sum(e == emulated for e, _ in done))
        ts = [int(v) for f in Path(trace).parent.glob(f"{Path(trace).name}.*.csv")
              for line in f.read_text().splitlines()[2:] for v in line.split(",")[:2]]
        return 0, (min(ts) - 1_000_000, max(ts) + 1_000_000)

    monkeypatch.setattr(launcher, "run_timed", run_timed)
    monkeypatch.setattr(launcher, "check", lambda *a, **k: None)
    return done


def write_job(prefix, emulated, n):
    """host_moved_runs' traces, the n-th run of each side."""
    if emulated:
        two_ranks(prefix, 12.5, 153, 1000, slow_rank_us=20 if n == 1 else 0, profile="b300", emulate=1)
    else:
        two_ranks(prefix, 0, 100, 1000, slow_rank_us=20 if n == 2 else 0)


def test_repeat_runs_each_side_alternately_into_its_own_folder_and_sums_them(tmp_path, monkeypatch, capsys):
    done = fake_runs(monkeypatch, write_job)
    out = tmp_path / "o"
    assert cli.main(["account", "--profile", "b300", "--repeat", "2", "--out", str(out), "--", "true"]) == 0
    assert done == [(False, str(out / "run1" / "native")), (True, str(out / "run1" / "emulated")),
                    (False, str(out / "run2" / "native")), (True, str(out / "run2" / "emulated"))]
    got = capsys.readouterr()
    progress = [line.split(": ")[1] for line in got.err.splitlines() if line.startswith("ccbridge account: run")]
    assert progress == ["run 1 of 2", "run 1 of 2", "run 2 of 2", "run 2 of 2"]
    assert "ccbridge account: run 2 of 2: native: interposer on" in got.err
    assert all(len(line) <= 120 for line in got.out.splitlines()), got.out
    text = got.out.replace("\n  ", " ")
    assert f"summed over 2 runs, BASE and OTHER alternately (traces in {out}/run1 .. run2)" in text
    assert "each run's own share explained: rank 0 100% 100%; rank 1 73% 161%; all 86% 130%" in text
    assert "changed between the runs" not in text  # the sums' host work did not move
    res = results.load(out / "result.json")
    assert res.settings["runs"] == [[str(out / f"run{j}" / s) for s in ("native", "emulated")] for j in (1, 2)]
    assert res.settings["base"] == str(out / "run1" / "native")
    per_run = {(r.params["rank"], r.params["run"]): r.median for r in res.rows if r.test == "account.run"}
    assert set(per_run) == {(k, j) for k in ("0", "1", "all") for j in (1, 2)}
    rows = {(r.metric, r.params.get("rank")): r.median for r in res.rows if r.test == "account.rank"}
    assert per_run[("1", 1)] < rows[("explained", 1)] / rows[("slowdown", 1)] < per_run[("1", 2)]
    assert abs(rows[("explained", 1)] + rows[("host", 1)] - rows[("slowdown", 1)]) < 1e-9  # no peers: eager
    assert abs(rows[("slowdown", 1)] - 2 * 50 * 0.053) < 0.01
    phase = {r.params["phase"]: r.median for r in res.rows if r.test == "account.phase"}
    assert abs(phase["start-up"]) < 1e-9 and set(phase) == {"start-up", "driver calls", "teardown"}


def test_a_failed_run_of_several_names_it_and_leaves_no_empty_folder(tmp_path, monkeypatch):
    import pytest
    from ccbridge.errors import UsageError

    monkeypatch.setattr(launcher, "check", lambda *a, **k: None)
    calls = []
    monkeypatch.setattr(launcher, "run_timed", lambda p, c, trace=None, **kw: calls.append(1) or
                        (0 if len(calls) < 3 else 1, (0, 1)))
    with pytest.raises(UsageError, match=r"^true exited with status 1 in run 2 of 3 \(native\); nothing to compare$"):
        cli.emulation.cmd_account(cli.build_parser().parse_args(
            ["account", "--profile", "b300", "--repeat", "3", "--out", str(tmp_path / "o"), "--", "true"]))
    assert not (tmp_path / "o").exists()


def repeat_one_matches_today(tmp_path, monkeypatch, capsys, write):
    """The account without --repeat and with --repeat 1: the same stdout, rows, settings and files."""
    done = fake_runs(monkeypatch, write)
    seen = []
    for name, extra in (("a", []), ("b", ["--repeat", "1"])):
        done.clear()
        out = tmp_path / name
        assert cli.main(["account", "--profile", "b300", "--out", str(out), *extra, "--", "true"]) == 0
        got = capsys.readouterr()
        res = json.loads((out / "result.json").read_text())
        seen.append(tuple(x.replace(str(out), "OUT") for x in (got.out, got.err, json.dumps(res["rows"]),
                                                                json.dumps(res["settings"])))
                    + (sorted({p.name.split(".")[0] + "." + p.suffix[1:] for p in out.iterdir()}),))
    assert seen[0] == seen[1] and "alternately" not in seen[0][0] and "native.csv" in seen[0][4]
    return seen[0]


def test_repeat_one_is_todays_account_of_a_job(tmp_path, monkeypatch, capsys):
    out, err, *_ = repeat_one_matches_today(tmp_path, monkeypatch, capsys, write_job)
    assert "straggler: rank 1" in out and "ccbridge account: run 2 of 2: EMULATED" in err


def test_repeat_one_is_todays_account_of_one_process(tmp_path, monkeypatch, capsys):
    def write(prefix, emulated, n):
        decode_loop(prefix, d2h_us=1400 if emulated else 30, launch_us=5, profile="b300" if emulated else "passthrough",
                    emulate=int(emulated))

    out, *_ = repeat_one_matches_today(tmp_path, monkeypatch, capsys, write)
    assert "the driver-call span (first to last driver call" in out and "which the shares below are of" in out


def test_a_command_of_one_process_repeated_is_summed_too(tmp_path, monkeypatch, capsys):
    def write(prefix, emulated, n):  # the second emulated run's readbacks are slower: 1400 then 2000 us
        decode_loop(prefix, d2h_us=(1400 if n == 1 else 2000) if emulated else 30, launch_us=5,
                    profile="b300" if emulated else "passthrough", emulate=int(emulated))

    fake_runs(monkeypatch, write)
    out = tmp_path / "o"
    assert cli.main(["account", "--profile", "b300", "--repeat", "2", "--out", str(out), "--", "true"]) == 0
    text = capsys.readouterr().out.replace("\n  ", " ")
    assert "summed over 2 runs" in text and "each run's own share held by the driver calls: all 100% 100%" in text
    res = results.load(out / "result.json")
    rd = next(r for r in res.rows if r.test == "account.api" and r.metric == "in_call_delta"
              and r.params["api"] == "cuMemcpyDtoHAsync_v2")
    assert abs(rd.median - 100 * (1400 + 2000 - 2 * 30) / 1e3) < 0.5  # both runs' readbacks
    assert {r.params["run"] for r in res.rows if r.test == "account.run"} == {1, 2}


def test_several_trace_pairs_given_are_summed_as_runs(tmp_path, capsys):
    host_moved_runs(tmp_path)
    out = tmp_path / "o"
    argv = ["account", *(str(tmp_path / f"{s}{j}") for j in (1, 2) for s in "nc"), "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out.replace("\n  ", " ")
    assert "summed over 2 trace pairs" in text and "rank 1 73% 161%" in text
    assert results.load(out / "result.json").settings["runs"][1] == [str(tmp_path / "n2"), str(tmp_path / "c2")]
