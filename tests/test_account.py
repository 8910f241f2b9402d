"""ccbridge account: two traces in the trace schema, attributed call by call."""

import subprocess
from pathlib import Path
import sys

from ccbridge import account, results
from ccbridge.emulate import trace


def write_trace(prefix, lines, pid=1, profile="passthrough", emulate=0):
    """A trace file as the interposer writes it; lines: (t_enter_us, dur_us, api, kind, dir, mem, bytes, stream_us, toll_us)."""
    rows = [f"# ccbridge trace schema {trace.SCHEMA}, profile {profile}, emulate {emulate}", ",".join(trace.COLUMNS)]
    for t, dur, api, kind, d, m, n, sw, tl in lines:
        rows.append(f"{int(t * 1e3)},{int((t + dur) * 1e3)},7,,,{api},{kind},{d},{m},{n},0,{int(sw * 1e3)},{int(tl * 1e3)},0,")
    (prefix.parent / f"{prefix.name}.{pid}.csv").write_text("\n".join(rows) + "\n")


def decode_loop(prefix, d2h_us, launch_us, steps=100, **kw):
    """A decode loop's calls: 20 launches and one 8-byte token readback per step."""
    lines, t = [], 0.0
    for _ in range(steps):
        for _ in range(20):
            lines.append((t, launch_us, "cuLaunchKernel", "launch", "", "", 0, 0, 0))
            t += launch_us + 1
        lines.append((t, d2h_us, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, d2h_us * 0.7, 23))
        t += d2h_us + 1
    write_trace(prefix, lines, **kw)


def test_the_readback_that_waits_for_the_stream_is_the_top_cause(tmp_path):
    decode_loop(tmp_path / "native", d2h_us=30, launch_us=5)
    decode_loop(tmp_path / "cc", d2h_us=1400, launch_us=24, profile="b300", emulate=1)
    base, other = trace.summarize(str(tmp_path / "native")), trace.summarize(str(tmp_path / "cc"))
    lines, wall = account.attribute(base, other)
    top = lines[0]
    assert (top.api, top.kind, top.dir) == ("cuMemcpyDtoHAsync_v2", "crossing", "d2h")
    assert top.calls == (100, 100) and abs(top.per_call_us(1) - 1400) < 1 and abs(top.per_call_us(0) - 30) < 1
    assert "DrainWorker" in top.recovery  # it waited for the stream
    assert lines[1].kind == "launch" and "CUDA graphs" in lines[1].recovery
    explained = sum(x.delta_ms for x in lines) / 1e3
    assert abs(explained / wall - 1) < 0.01  # every microsecond of this synthetic slowdown is inside a call
    assert abs(top.share - 137 / (137 + 38)) < 0.01  # 137 ms of 175 ms


def test_recovery_follows_the_dominant_cost():
    r = account.recovery
    assert "StagedH2D" in r("crossing", "h2d", 10, 10 << 20, stream_ms=5, channel_ms=1, toll_ms=1)
    assert "pack small crossings" in r("crossing", "h2d", 1000, 1000 * 512, stream_ms=0, channel_ms=1, toll_ms=5)
    small_d2h = r("crossing", "d2h", 1000, 1000 * 8, stream_ms=0, channel_ms=1, toll_ms=5)
    assert "small readbacks" in small_d2h and "StagedH2D" not in small_d2h  # an H2D tool does nothing for a D2H
    assert "contexts" in r("crossing", "h2d", 10, 10 << 24, stream_ms=0, channel_ms=9, toll_ms=1)
    assert "fewer crossings" in r("crossing", "d2h", 10, 10 << 24, stream_ms=0, channel_ms=1, toll_ms=9)
    assert "synchronizes" in r("sync", "-", 10, 0, 0, 0, 5)
    assert "contexts once" in r("context", "-", 1, 0, 0, 0, 600) and "pinned buffers once" in r("alloc", "-", 9, 0, 0, 0, 5)


def test_the_cli_writes_a_result_that_compare_can_read(tmp_path):
    decode_loop(tmp_path / "native", d2h_us=30, launch_us=5)
    decode_loop(tmp_path / "cc", d2h_us=1400, launch_us=24, profile="b300", emulate=1)
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "account", str(tmp_path / "native"), str(tmp_path / "cc"),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "cuMemcpyDtoHAsync_v2" in p.stdout.splitlines()[2] and "DrainWorker" in p.stdout
    res = results.load(out / "result.json")
    share = [r for r in res.rows if r.metric == "share_of_slowdown" and r.params["api"] == "cuMemcpyDtoHAsync_v2"]
    assert len(share) == 1 and share[0].extra["recovery"].startswith("drain on a worker")
    assert (out / "report.md").exists() and (out / "report.html").exists()
    # the OTHER trace's header says it was emulated (b300): the result and its report say so
    assert res.settings["profile"] == "b300"
    md = (out / "report.md").read_text()
    assert md.startswith("# ccbridge account") and "OTHER ran under the emulator, profile b300" in md
    assert "the shares below are of the traces' spans' slowdown" in md and "(the machine below read the traces)" in md
    assert "Findings" not in md  # a probe's section, not an account's


def test_swapped_traces_are_flagged_and_nothing_that_did_not_grow_gets_a_recovery(tmp_path):
    decode_loop(tmp_path / "native", d2h_us=30, launch_us=5)
    decode_loop(tmp_path / "cc", d2h_us=1400, launch_us=24, profile="b300", emulate=1)
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "account", str(tmp_path / "cc"), str(tmp_path / "native"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "BASE ran under the emulator and OTHER did not" in p.stderr and "OTHER was not slower" in p.stderr
    res = results.load(tmp_path / "out" / "result.json")
    assert res.settings["profile"] is None  # OTHER is the native trace
    assert all(not r.extra.get("recovery") for r in res.rows if r.metric == "share_of_slowdown")


def test_a_wait_that_moved_counts_once_and_the_phases_say_where_the_rest_fell(tmp_path):
    """Head-of-line: natively each step's synchronize waits 5 ms; under CC the H2D before it waits 6 ms and the
    synchronize nothing. The H2D grew 600 ms, the synchronizes shrank 500: 100 ms net, all of the driver-call
    span's slowdown; 2 s more at start-up lie outside any call, and the phases say so."""
    def run(prefix, h2d_us, sync_us, **kw):
        lines, t = [], 1000.0
        for _ in range(100):
            lines.append((t, h2d_us, "cuMemcpyHtoDAsync_v2", "crossing", "h2d", "pinned", 4096, h2d_us - 5, 0))
            t += h2d_us
            lines.append((t, sync_us, "cuStreamSynchronize", "sync", "", "", 0, 0, 0))
            t += sync_us
        write_trace(prefix, lines, **kw)
        return t
    end_n = run(tmp_path / "n", 5, 5000)
    end_c = run(tmp_path / "c", 6000, 0.001, profile="b300", emulate=1)
    base, other = trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c"))
    # launched at 0 (native) and at -2 s (CC: 2 s longer before its first call), each ending 0.5 ms after its last
    base_run, other_run = (0, int((end_n + 500) * 1e3)), (-2_000_000_000, int((end_c + 500) * 1e3))
    walls = [(r[1] - r[0]) / 1e9 for r in (base_run, other_run)]
    lines, wall = account.attribute(base, other, *walls)
    where = account.phases(base, other, base_run, other_run)
    assert abs(wall - 2.1) < 0.002
    assert abs(account.net_in_calls_s(lines) - 0.1) < 0.001
    assert abs(where["start-up"] - 2.0) < 1e-6 and abs(where["driver calls"] - 0.1) < 0.001
    assert abs(where["teardown"]) < 1e-6
    assert lines[0].api == "cuMemcpyHtoDAsync_v2" and "StagedH2D" in lines[0].recovery
    text = account.render(lines, wall, where=where)
    assert "start-up +2000.0 ms" in text and "the calls hold 99.5 ms (100%)" in text, text
    assert "cuStreamSynchronize shrank 500.0 ms: natively it waited for the GPU" in text, text
    rows = {(r.test, r.metric, r.params.get("phase")): r.median for r in account.rows(lines, wall, where=where)}
    assert abs(rows[("account.total", "net_in_calls", None)] - 0.1) < 0.001
    assert abs(rows[("account.phase", "slowdown", "start-up")] - 2.0) < 1e-6
    assert account.phases(base, other, None, None) == {}  # two traces given: no launch times


def test_account_of_a_command_gives_shares_of_the_driver_call_span(tmp_path, monkeypatch, capsys):
    """`account --profile P -- CMD`: the runs' launch and end times split the slowdown into phases, and each
    row's share is of the driver-call span's slowdown (a cold start of one process, 2 s here, is no call's)."""
    from ccbridge import cli
    from ccbridge.emulate import launcher

    ends = {}

    def run_timed(profile, cmd, trace=None, sites=False, **kw):
        emulated = profile.name != "passthrough"
        decode_loop(Path(trace), d2h_us=1400 if emulated else 30, launch_us=5, profile=profile.name, emulate=int(emulated))
        last = max(int(l.split(",")[1]) for l in Path(f"{trace}.1.csv").read_text().splitlines()[2:])
        ends[emulated] = last
        return 0, (0 if emulated else -2_000_000_000, last + 1000)  # the native run started 2 s before its first call

    monkeypatch.setattr(launcher, "run_timed", run_timed)
    monkeypatch.setattr(launcher, "check", lambda *a, **k: None)
    assert cli.main(["account", "--profile", "b300", "--out", str(tmp_path / "o"), "--", "true"]) == 0
    out = capsys.readouterr().out
    assert "start-up -2000.0 ms" in out and "shares below are of the driver-call span's slowdown" in out
    res = results.load(tmp_path / "o" / "result.json")
    share = next(r.median for r in res.rows if r.metric == "share_of_slowdown" and r.params["api"] == "cuMemcpyDtoHAsync_v2")
    assert abs(share - 1.0) < 0.01  # all of the span's slowdown, where the wall time's share would be ~6%
    base = next(r for r in res.rows if r.test == "account.total" and r.metric == "share_base")
    assert abs(base.median - 0.137) < 0.001 and base.extra["of"] == "the driver-call span's slowdown"
    assert any(r.test == "account.phase" and r.params["phase"] == "start-up" for r in res.rows)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "start-up -2000.0 ms" in md and "the shares below are of the driver-call span's slowdown (+137.0 ms)" in md
