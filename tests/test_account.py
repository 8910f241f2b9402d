"""ccbridge account: two traces in the trace schema, attributed call by call."""

import subprocess
from pathlib import Path
import sys

from ccbridge import account, account_ranks, cli, results
from ccbridge.emulate import launcher, trace, windows


def write_trace(prefix, lines, pid=1, profile="passthrough", emulate=0, ranks=8):
    """A trace file as the interposer writes it; lines: (t_enter_us, dur_us, api, kind, dir, mem, bytes, stream_us, toll_us).
    Collective lines carry the communicator's size and an all-reduce's ring bus bytes, 2(n-1)/n x bytes."""
    rows = [f"# ccbridge trace schema {trace.SCHEMA}, profile {profile}, emulate {emulate}", ",".join(trace.COLUMNS)]
    for t, dur, api, kind, d, m, n, sw, tl, *graph in lines:  # graph: capture or replay (collectives)
        mgpu = f"{ranks},{2 * (ranks - 1) * n // ranks}" if kind == "collective" else ","
        rows.append(f"{int(t * 1e3)},{int((t + dur) * 1e3)},7,,,{api},{kind},{d},{m},{n},0,{int(sw * 1e3)},"
                    f"{int(tl * 1e3)},0,,{mgpu},{graph[0] if graph else ''}")
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
    # an event read or a pointer query is no copy: no staging (it fell through to the crossings' StagedH2D)
    assert r("timing", "-", 32, 0, 0, 0, 0).startswith("time GPU work with %globaltimer stamps where CC is on")
    assert "is_pinned()" in r("query", "-", 7, 0, 0, 0, 0)
    assert account.recovery_name(r("timing", "-", 32, 0, 0, 0, 0)) == "%globaltimer"


def test_the_cli_writes_a_result_that_compare_can_read(tmp_path):
    decode_loop(tmp_path / "native", d2h_us=30, launch_us=5)
    decode_loop(tmp_path / "cc", d2h_us=1400, launch_us=24, profile="b300", emulate=1)
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "account", str(tmp_path / "native"), str(tmp_path / "cc"),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("EMULATED: OTHER ran under the emulator (profile b300)")  # the trace's header says so
    table = next(i for i, l in enumerate(lines) if l.startswith("api "))
    assert lines[table + 1].startswith("cuMemcpyDtoHAsync_v2") and lines[table + 1].endswith("DrainWorker")
    assert all(len(l) <= 120 for l in lines), max(lines, key=len)
    res = results.load(out / "result.json")
    share = [r for r in res.rows if r.metric == "share_of_slowdown" and r.params["api"] == "cuMemcpyDtoHAsync_v2"]
    assert len(share) == 1 and share[0].extra["recovery"].startswith("drain on a worker")
    assert (out / "report.md").exists() and (out / "report.html").exists()
    # the OTHER trace's header says it was emulated (b300): the result and its report say so
    assert res.settings["profile"] == "b300"
    md = (out / "report.md").read_text()
    assert md.startswith("# ccbridge account") and "OTHER ran under the emulator, profile b300" in md
    assert "the shares below are of the traces' spans' slowdown" in md
    assert "(no trace says where it was recorded: the machine below read them)" in md
    assert "Findings" not in md  # a probe's section, not an account's


def test_swapped_traces_are_refused_before_any_work(tmp_path):
    """BASE emulated and OTHER not: every figure would be backwards (the native side printed as emulated), so the
    account refuses in one line before it writes anything."""
    decode_loop(tmp_path / "native", d2h_us=30, launch_us=5)
    decode_loop(tmp_path / "cc", d2h_us=1400, launch_us=24, profile="b300", emulate=1)
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "account", str(tmp_path / "cc"), str(tmp_path / "native"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [f"ccbridge account: BASE {tmp_path}/cc ran emulated, OTHER {tmp_path}/native "
                                     "did not: give the native (CC-off or record-only) trace first"]
    assert not (tmp_path / "out").exists()


def test_a_faster_other_gets_no_shares_and_nothing_that_did_not_grow_gets_a_recovery(tmp_path):
    decode_loop(tmp_path / "slow", d2h_us=1400, launch_us=24)  # two record-only traces, OTHER the faster
    decode_loop(tmp_path / "fast", d2h_us=30, launch_us=5)
    p = subprocess.run([sys.executable, "-m", "ccbridge.cli", "account", str(tmp_path / "slow"), str(tmp_path / "fast"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "OTHER was not measurably slower" in p.stderr and "no shares" in p.stderr
    head, table = p.stdout.replace("\n  ", " ").split("\napi ")
    assert "-175.0 ms (-92.1%): no measurable slowdown, no shares; the driver calls' net change -175.0 ms" in head
    assert "%" not in table  # a negative slowdown: no shares of it
    res = results.load(tmp_path / "out" / "result.json")
    assert res.settings["profile"] is None and "EMULATED" not in p.stdout
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
    base_s = (base.last_ns - base.first_ns) / 1e9
    text = account.render(lines, wall, where=where, base_s=base_s).replace("\n  ", " ")
    assert "wall time (launch to exit) +2099.5 ms: start-up +2000.0 ms, driver calls +99.5 ms, teardown +0.0 ms" in text
    # the shares are of the driver-call span's slowdown, base -> other; the synchronizes' shrinking is netted
    assert (f"the driver-call span (first to last driver call; a start-up or a teardown is no call's) "
            f"{base_s * 1e3:.1f} -> {base_s * 1e3 + 99.5:.1f} ms, +99.5 ms (+19.9%), which the shares below are of: "
            "calls that grew explain 599.5 ms (603%), net of the calls that shrank 99.5 ms (100%); the rest, +0.0 ms "
            "(0%), is time between calls") in text, text
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
    assert "start-up -2000.0 ms" in out and "the driver-call span (first to last driver call" in out
    assert "which the shares below are of" in out
    res = results.load(tmp_path / "o" / "result.json")
    share = next(r.median for r in res.rows if r.metric == "share_of_slowdown" and r.params["api"] == "cuMemcpyDtoHAsync_v2")
    assert abs(share - 1.0) < 0.01  # all of the span's slowdown, where the wall time's share would be ~6%
    base = next(r for r in res.rows if r.test == "account.total" and r.metric == "share_base")
    assert abs(base.median - 0.137) < 0.001 and base.extra["of"] == "the driver-call span's slowdown"
    assert any(r.test == "account.phase" and r.params["phase"] == "start-up" for r in res.rows)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "start-up -2000.0 ms" in md and "the shares below are of the driver-call span's slowdown (+137.0 ms)" in md


def test_account_with_project_runs_again_projected_into_its_own_folder(tmp_path, monkeypatch, capsys):
    """`account --profile b300 --project b300 -- CMD`: the account on this GPU, then the same two runs in
    dilated time (out/projected), the projection made once, before the first run."""
    from ccbridge import cli
    from ccbridge.cli import emulation
    from ccbridge.emulate import launcher

    made, runs = [], []
    real = emulation.projection
    monkeypatch.setattr(emulation, "projection", lambda args: made.append(1) or real(args))

    def run_timed(profile, cmd, trace=None, sites=False, projection=None, **kw):
        emulated = profile.name != "passthrough"
        runs.append(projection.r if projection else None)
        decode_loop(Path(trace), d2h_us=1400 if emulated else 30, launch_us=5, profile=profile.name,
                    emulate=int(emulated))
        return 0, (0, max(int(l.split(",")[1]) for l in Path(f"{trace}.1.csv").read_text().splitlines()[2:]) + 1000)

    monkeypatch.setattr(launcher, "run_timed", run_timed)
    monkeypatch.setattr(launcher, "check", lambda *a, **k: None)
    argv = ["account", "--profile", "b300", "--project", "b300", "--project-by", "2", "--out", str(tmp_path / "o")]
    assert cli.main(argv + ["--", "true"]) == 0
    assert runs == [None, None, 2.0, 2.0] and made == [1]
    assert "same account as the target would pay it" in capsys.readouterr().out
    first, projected = (results.load(tmp_path / "o" / d / "result.json") for d in ("", "projected"))
    assert first.settings["projection"] is None and projected.settings["projection"]["r"] == 2.0
    assert first.settings["command"] == projected.settings["command"] == ["true"]

def tp_step_loop(prefix, sync_us, allreduce_toll_us, steps=50, emulated=False):
    """A TP decode step: 20 launches, 4 small all-reduces (64 KiB; their toll is GPU time the host does not wait
    for in the call), then one synchronize that waits for the GPU: natively 100 us, under the emulator longer by
    the all-reduces' queued time plus its own 22 us round trip."""
    lines, t = [], 0.0
    for _ in range(steps):
        for _ in range(20):
            lines.append((t, 5, "cuLaunchKernel", "launch", "", "", 0, 0, 0))
            t += 6
        for _ in range(4):
            lines.append((t, 8, "ncclAllReduce", "collective", "", "", 64 << 10, 0, allreduce_toll_us))
            t += 9
        lines.append((t, sync_us, "cuStreamSynchronize", "sync", "", "", 0, 0, 22 if emulated else 0))
        t += sync_us + 1
    write_trace(prefix, lines, profile="b300" if emulated else "passthrough", emulate=int(emulated))


def test_collectives_are_charged_the_waits_their_gpu_time_caused_once(tmp_path):
    """Under the emulator each all-reduce queues 30 us of GPU time; the step's synchronize grows by 4 x 30 us for
    them plus its own 22 us round trip. The 120 us per step belong to the all-reduces, not to the synchronize,
    and the rows still sum to the calls' net change."""
    tp_step_loop(tmp_path / "n", sync_us=100, allreduce_toll_us=0)
    tp_step_loop(tmp_path / "c", sync_us=100 + 4 * 30 + 22, allreduce_toll_us=30, emulated=True)
    base, other = trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c"))
    lines, wall = account.attribute(base, other)
    by = {x.api: x for x in lines}
    ar, sync = by["ncclAllReduce"], by["cuStreamSynchronize"]
    assert ar.kind == "collective" and ar.calls == (200, 200) and ar.in_call_delta_ms == 0  # the host calls did not grow
    assert abs(ar.device_ms[1] - 6.0) < 1e-6 and ar.device_ms[0] == 0  # 200 x 30 us of GPU time
    assert abs(ar.moved_ms - 6.0) < 1e-6 and abs(sync.moved_ms + 6.0) < 1e-6
    assert abs(sync.delta_ms - 50 * 22e-3) < 1e-6  # what is left on the synchronize: its own round trips
    assert lines[0] is ar and "fewer, larger collectives" in ar.recovery
    assert abs(account.net_in_calls_s(lines) - (sync.in_call_delta_ms / 1e3)) < 1e-9  # nothing counted twice
    assert abs(ar.share - 6.0 / (wall * 1e3)) < 1e-9
    text = account.render(lines, wall, emulated="b300")
    assert all(len(l) <= 120 for l in text.splitlines()), text
    assert "collectives: 6.0 ms more GPU time" in text and "the host waited for 6.0 ms of it" in text
    row = next(l for l in text.splitlines() if l.startswith("ncclAllReduce"))
    assert "64.0 KiB/op" in row and row.endswith("fewer collectives")
    rows = {(r.test, r.metric, r.params.get("api")): r for r in account.rows(lines, wall)}
    assert abs(rows[("account.api", "gpu_time", "ncclAllReduce")].median - 6.0) < 1e-6
    assert rows[("account.api", "payload_per_op", "ncclAllReduce")].median == 64 << 10
    assert abs(rows[("account.api", "waits_moved", "cuStreamSynchronize")].median + 6.0) < 1e-6
    assert abs(rows[("account.total", "collective_waits", None)].median - 0.006) < 1e-9
    why = account.render_why(lines)
    assert all(len(l) <= 120 for l in why.splitlines())
    assert "queued ahead of them (toll_ns) 0.00 -> 6.00 ms, 64.0 KiB per operation" in why.replace("\n    ", " ")


def test_gpu_time_no_wait_grew_by_is_not_slowdown(tmp_path):
    """The host never waited for the collectives (no synchronize grew): their GPU time moves nothing, and a
    large all-reduce (8 MiB) calls for overlap, not for more of them fused."""
    def loop(prefix, toll, **kw):
        write_trace(prefix, [(i * 50.0, 8, "ncclAllReduce", "collective", "", "", 8 << 20, 0, toll) for i in range(10)]
                    + [(600.0, 5, "cuStreamSynchronize", "sync", "", "", 0, 0, 0)], **kw)
    loop(tmp_path / "n", 0)
    loop(tmp_path / "c", 400, profile="b300", emulate=1)
    lines, _ = account.attribute(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))
    ar = next(x for x in lines if x.kind == "collective")
    assert ar.moved_ms == 0 and ar.delta_ms == 0 and ar.recovery == ""
    assert account.recovery("collective", "-", 10, 10 * (8 << 20), 0, 0, 4).startswith("overlap collectives")
    assert account.collectives_gpu_ms(lines) == (4.0, 0.0)


# ---- multi-process jobs: per rank, on each rank's steady-state window ----

def write_rank(prefix, rank, pid, steps, toll_us, sync_us, startup_us=0.0, marks=True, host_us=0.0, prep_us=0.0,
               **kw):
    """One TP rank: a start-up of host work (a model build: a context and an allocation), then steps of prep_us of
    host work, one graph launch replaying 4 all-reduces and a readback that waits for their GPU time, then host_us
    of host work, between begin/end marks."""
    lines, t = [(0.0, 10, "cuCtxCreate_v2", "context", "", "", 0, 0, 0), (startup_us, 5, "cuMemHostAlloc", "alloc",
                                                                         "", "", 1 << 20, 0, 0)], startup_us + 100
    lines.append((t, 1, "cuGraphLaunch", "launch", "", "", 0, 0, 0))  # capture of the step's collectives
    lines += [(t + 1, 1, "ncclAllReduce", "collective", "", "", 8192, 0, toll_us, "capture")] * 4
    t += 50
    if marks:
        lines.append((t, 0, "begin", "mark", "", "", 0, 0, 0))
    for _ in range(steps):
        t += prep_us
        lines.append((t, 5, "cuGraphLaunch", "launch", "", "", 0, 0, 0))
        lines += [(t + 5, 0, "ncclAllReduce", "collective", "", "", 8192, 0, toll_us, "replay")] * 4
        lines.append((t + 6, sync_us, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, sync_us * 0.9, 0))
        t += 6 + sync_us + 2 + host_us
    if marks:
        lines.append((t, 0, "end", "mark", "", "", 0, 0, 0))
    lines.append((t + 5000, 10, "cuCtxDestroy_v2", "context", "", "", 0, 0, 0))  # teardown, outside the window
    write_trace(prefix, lines, pid=pid, ranks=2, **kw)
    (prefix.parent / f"{prefix.name}.{pid}.summary.json").write_text(
        f'{{"pid": {pid}, "calls": {{}}, "crossings": {{}}, "rank": {rank}, "ranks": 2}}\n')


def two_ranks(prefix, toll_us, sync_us, startup_us, slow_rank_us=0.0, **kw):
    """Two ranks in step; rank 1 does slow_rank_us more host work a step, which rank 0 waits for in its readback."""
    for rank in (0, 1):
        write_rank(prefix, rank, 100 + rank, 50, toll_us, sync_us + (slow_rank_us if rank == 0 else 0),
                   startup_us, host_us=slow_rank_us if rank == 1 else 0.0, **kw)
    write_trace(prefix, [(0.0, 3, "cuInit", "launch", "", "", 0, 0, 0)], pid=99)  # the launcher: no rank


def test_each_rank_is_accounted_on_its_own_window_with_graph_replays_charged(tmp_path):
    """The emulated run built its model 2 s slower (start-up) and each step's readback waited for 4 replayed
    all-reduces of 12.5 us, and rank 1 did 4 us more host work a step, which rank 0 waited for: per rank the
    slowdown is the window's alone (57 us a step), rank 0's calls explain all of it, rank 1's host work its 4 us
    (rank 1 is the straggler)."""
    two_ranks(tmp_path / "n", 0, 100, 1000)
    two_ranks(tmp_path / "c", 12.5, 100 + 50 + 3, 2_001_000, slow_rank_us=4, profile="b300", emulate=1)
    base, other = trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c"))
    assert account_ranks.multi_process(base, other)
    ranks, notes = account_ranks.per_rank(base, other)
    assert [a.rank for a in ranks] == [0, 1] and notes == [] and {a.window for a in ranks} == {"marks"}
    r0 = ranks[0]
    assert abs(r0.slowdown_ms - 50 * 57e-3) < 1e-6  # 50 steps x 57 us: the 2 s start-up is not in it
    ar = next(x for x in r0.lines if x.api == "ncclAllReduce")
    assert ar.calls == (200, 200) and ar.replays == 200  # 4 captured collectives x 50 replays, not the 4 captures
    assert abs(ar.device_ms[1] - 200 * 12.5e-3) < 1e-9  # every replay's GPU time
    assert abs(r0.by_kind()["collective"] - 2.5) < 1e-6  # moved from the readbacks that waited for it
    assert abs(r0.explained_ms / r0.slowdown_ms - 1) < 0.01 and abs(r0.host_delta_ms) < 1e-6
    r1 = ranks[1]
    assert abs(r1.slowdown_ms - r0.slowdown_ms) < 1e-9 and abs(r1.host_delta_ms - 50 * 4e-3) < 1e-6
    assert abs(r1.explained_ms + r1.host_delta_ms - r1.slowdown_ms) < 1e-6  # calls and host: the whole window
    assert account_ranks.straggler(ranks).rank == 1
    text = account_ranks.render_ranks(ranks, notes)
    assert all(len(l) <= 120 for l in text.splitlines()), text
    assert "straggler: rank 1" in text and "ncclAllReduce 200 operations (200 replayed from CUDA graphs)" in text
    rows = {(r.test, r.metric, r.params.get("rank"), r.params.get("kind")): r for r in account_ranks.rank_rows(ranks)}
    assert abs(rows[("account.rank", "slowdown", 0, None)].median - r0.slowdown_ms) < 1e-9
    assert abs(rows[("account.rank", "calls", 0, "collective")].median - 2.5) < 1e-6
    assert abs(rows[("account.rank", "explained", 0, None)].median - r0.explained_ms) < 1e-9


def test_without_marks_the_window_is_first_to_last_collective(tmp_path):
    two_ranks(tmp_path / "n", 0, 100, 1000, marks=False)
    two_ranks(tmp_path / "c", 12.5, 153, 900_000, marks=False, profile="b300", emulate=1)
    ranks, _ = account_ranks.per_rank(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))
    assert {a.window for a in ranks} == {"collectives"}
    # the window runs from the first replay to the last: 49 steps of 53 us more (the last readback is after it)
    assert abs(ranks[0].slowdown_ms - 49 * 53e-3) < 1e-6


def test_a_rank_that_did_not_slow_down_gets_one_plain_line_and_no_shares(tmp_path):
    two_ranks(tmp_path / "n", 0, 100, 1000)
    two_ranks(tmp_path / "c", 0, 90, 1000, profile="b300", emulate=1)  # faster: a negative slowdown
    ranks, _ = account_ranks.per_rank(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))
    assert all(a.slowdown_ms < 0 and not a.measurable for a in ranks)
    assert all(x.share == 0 for a in ranks for x in a.lines)
    text = account_ranks.render_ranks(ranks, [])
    assert text.count("no measurable slowdown: no shares") == 2 and "%" not in text


def test_a_single_process_trace_is_not_a_multi_process_job(tmp_path):
    write_trace(tmp_path / "one", [(0.0, 5, "cuLaunchKernel", "launch", "", "", 0, 0, 0)])
    one = trace.summarize(str(tmp_path / "one"))
    assert not account_ranks.multi_process(one, one) and one.procs[0].rank is None


def test_a_jobs_ranks_share_the_span_all_of_them_are_in(tmp_path):
    """Rank 0 reached its begin mark 300 us before rank 1 and waited for it in its first readback: start-up skew,
    not the steady state. Each rank is compared on the span both are in (rank 1's begin to the common end); rank
    0's readback that straddles that begin counts only its time inside."""
    for prefix, extra in ((tmp_path / "n", 0.0), (tmp_path / "c", 10.0)):
        for rank, begin in ((0, 0.0), (1, 300.0)):
            lines = [(begin, 0, "begin", "mark", "", "", 0, 0, 0)]
            t, steps = begin, 10
            if rank == 0:  # its first step's readback waits for rank 1's first step
                lines.append((t, 5, "cuGraphLaunch", "launch", "", "", 0, 0, 0))
                lines.append((t + 5, 395 + extra, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, 390, 0))
                t, steps = 400.0 + extra, 9
            for _ in range(steps):
                lines.append((t, 5, "cuGraphLaunch", "launch", "", "", 0, 0, 0))
                lines.append((t + 5, 90 + extra, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, 80, 0))
                t += 100 + extra
            lines.append((t, 0, "end", "mark", "", "", 0, 0, 0))
            write_trace(prefix, lines, pid=100 + rank, ranks=2)
            (prefix.parent / f"{prefix.name}.{100 + rank}.summary.json").write_text(
                f'{{"pid": {100 + rank}, "calls": {{}}, "crossings": {{}}, "rank": {rank}, "ranks": 2}}\n')
    base, other = trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c"))
    for t in (base, other):
        spans = {p.rank: p.spans for p in t.procs}
        assert spans[0] == spans[1] and spans[0][0][0] == 300_000  # rank 1's begin, in ns
    ranks, _ = account_ranks.per_rank(base, other)
    assert ranks[0].base_ms == ranks[1].base_ms == 1.0 and ranks[0].slowdown_ms == ranks[1].slowdown_ms
    d2h = next(x for x in ranks[0].lines if x.api == "cuMemcpyDtoHAsync_v2")
    assert d2h.calls == (9, 9)  # the straddling readback's call is not counted, only its 100 us in the window
    assert abs(d2h.in_call_ms[0] - (0.1 + 9 * 0.09)) < 1e-9


def test_threads_in_calls_at_once_count_each_instant_once_launches_first():
    """A main thread waiting in a readback (0-100 us) while another thread launches (20-30, 50-70) and a
    synchronize (90-120) overlapping it: launch 30 us, the readback the 70 left, the synchronize only its 20
    beyond the readback; the window's 150 us less those 120 is host work."""
    calls = [(0, 100, "crossing"), (20, 30, "launch"), (50, 70, "launch"), (90, 120, "sync"), (130, 140, "launch"),
             (135, 160, "launch")]
    got = windows.exclusive(calls, [(0, 150)])
    assert got == [70, 10, 20, 20, 10, 10]  # the last launch: 140-150 (another thread's launch held 135-140)
    assert sum(got) == 140 and windows.exclusive([(0, 10, "launch"), (20, 30, "sync")], [(0, 5), (25, 40)]) == [5, 5]


def test_a_rank_whose_host_work_grew_is_named_not_charged_to_a_toll(tmp_path):
    """Rank 1's host work a step grew 100 us in OTHER (its host ran slower: no toll does that) and rank 0 waited
    for it in its readback: rank 1's share is its host work's, rank 0's its readback's, and the table says the
    host speed differed between the runs, naming rank 1 alone."""
    two_ranks(tmp_path / "n", 0, 100, 1000)
    two_ranks(tmp_path / "c", 12.5, 153, 1000, slow_rank_us=100, profile="b300", emulate=1)
    ranks, notes = account_ranks.per_rank(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))
    r0, r1 = ranks
    assert abs(r1.host_delta_ms - 50 * 0.1) < 1e-6 and abs(r0.host_delta_ms) < 1e-6
    assert [account_ranks.host_moved(a) for a in ranks] == [False, True] and account_ranks.straggler(ranks).rank == 1
    text = account_ranks.render_ranks(ranks, notes)
    assert "changed between the runs, which no toll does by itself: rank 1 0.15 -> 5.15 ms;" in text.replace("\n  ", " ")
    assert "or a wait moved: BASE waited for its GPU or its peers outside traced calls" in text.replace("\n  ", " ")
    assert all(len(l) <= 120 for l in text.splitlines())


def test_exclusive_time_is_the_union_of_calls_given_by_kind_then_entry():
    """Against a brute-force sweep of every instant on random small cases: each instant inside the spans goes to
    the call first in FIRST's order that holds it, among equals the one that entered first."""
    import random

    rnd = random.Random(7)
    kinds = list(windows.FIRST) + ["other"]
    for _ in range(400):
        calls = []
        for _ in range(rnd.randint(1, 7)):
            t0 = rnd.randint(0, 40)
            calls.append((t0, t0 + rnd.randint(0, 15), rnd.choice(kinds)))
        cuts = sorted(rnd.sample(range(0, 60), 2 * rnd.randint(1, 2)))
        spans = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)]
        want = [0] * len(calls)
        for t in range(60):
            if any(a <= t < b for a, b in spans):
                holders = [i for i, (t0, t1, _) in enumerate(calls) if t0 <= t < t1]
                if holders:
                    want[min(holders, key=lambda i: (windows.FIRST.get(calls[i][2], 3), calls[i][0], i))] += 1
        assert windows.exclusive(calls, spans) == want, (calls, spans)


def test_replays_written_at_a_windows_end_are_counted():
    """Without marks the window ends at the last collective line: a graph launch's replayed collectives, written
    at its return with no length, fall on that end and are the window's."""
    assert windows.inside([(0, 100)], 100, 100) and windows.inside([(0, 100)], 0, 5)
    assert not windows.inside([(0, 100)], 100, 101) and not windows.inside([(0, 100), (200, 300)], 150, 150)
    assert windows.inside([(0, 100), (200, 300)], 250, 260)


def test_two_jobs_of_one_size_in_a_trace_are_each_compared_with_their_own_twin(tmp_path):
    """bench decode --tp 2 2 (two jobs of 2 ranks, one after the other): each job's ranks pair with the same job
    in the other trace, named 0/2.1 ... 1/2.2, and all ranks together sum both jobs once."""
    for prefix, step in ((tmp_path / "n", 100), (tmp_path / "c", 150)):
        for job, start in ((0, 0.0), (1, 10_000.0)):
            for rank in (0, 1):
                t, lines = start, [(start, 0, "begin", "mark", "", "", 0, 0, 0)]
                for _ in range(10):
                    lines.append((t, 5, "cuGraphLaunch", "launch", "", "", 0, 0, 0))
                    lines.append((t + 5, step - 10, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, 50, 0))
                    t += step
                lines.append((t, 0, "end", "mark", "", "", 0, 0, 0))
                pid = 100 + 10 * job + rank
                write_trace(prefix, lines, pid=pid, ranks=2)
                (prefix.parent / f"{prefix.name}.{pid}.summary.json").write_text(
                    f'{{"pid": {pid}, "calls": {{}}, "crossings": {{}}, "rank": {rank}, "ranks": 2}}\n')
    base, other = trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c"))
    ranks, notes = account_ranks.per_rank(base, other)
    assert notes == [] and [a.name for a in ranks] == ["0/2.1", "1/2.1", "0/2.2", "1/2.2"]
    assert all(abs(a.slowdown_ms - 0.5) < 1e-9 for a in ranks)
    every = account_ranks.overall(base, other, ranks)
    assert abs(every.slowdown_ms - 2.0) < 1e-9 and abs(every.host_delta_ms) < 1e-6


def test_a_ranks_wait_for_a_later_peer_is_named_peers_and_taken_from_what_its_calls_explain(tmp_path):
    """OTHER: each step's 4 replayed all-reduces pay 12.5 us, and rank 1 prepares each step 100 us longer before
    its launch (host work: no toll), which rank 0 waits for in its readback. Rank 0's calls grew 150 us a step, but
    100 of them are its wait for rank 1's hand-off: peers; rank 1's own 100 us are host. Each rank's explained is
    the tolls' 50 us a step, and explained + peers + host is its slowdown."""
    for prefix, extra, prof in ((tmp_path / "n", 0.0, {}), (tmp_path / "c", 100.0, dict(profile="b300", emulate=1))):
        toll = 12.5 if extra else 0.0
        write_rank(prefix, 0, 100, 50, toll, 100 + 4 * toll + extra, 1000, **prof)
        write_rank(prefix, 1, 101, 50, toll, 100 + 4 * toll, 1000, prep_us=extra, **prof)
    ranks, _ = account_ranks.per_rank(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))
    r0, r1 = ranks
    for a in ranks:
        assert abs(a.slowdown_ms - 50 * 0.15) < 0.01 * 0.15, a.slowdown_ms  # the window: whole steps of both ranks
        assert abs(a.explained_ms - 50 * 0.05) < 0.06, (a.rank, a.explained_ms)  # the tolls (and one step's edge)
        assert abs(a.explained_ms + a.peers_delta_ms + a.host_delta_ms - a.slowdown_ms) < 1e-6
    assert abs(r0.peers_delta_ms - 49 * 0.1) < 0.11 and r0.peer_ms[0] == 0 and abs(r0.host_delta_ms) < 0.01
    assert r1.peer_ms == (0.0, 0.0) and abs(r1.host_delta_ms - 49 * 0.1) < 0.11
    every = ranks + [account_ranks.overall(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")),
                                     ranks)]
    text = account_ranks.render_ranks(every, [])
    assert all(len(line) <= 120 for line in text.splitlines()), text
    head = next(line for line in text.splitlines() if line.lstrip().startswith("rank window")).split()
    row0 = next(line for line in text.splitlines() if line.lstrip().startswith("0 marks")).split()
    assert head[-2:] == ["peers", "host"] and row0[-2] == f"{r0.peers_delta_ms / r0.slowdown_ms:.0%}"
    rows = {(r.metric, r.params.get("rank")): r for r in account_ranks.rank_rows(every)}
    assert rows[("peers", 0)].median == r0.peers_delta_ms and rows[("peers", 0)].extra["other_ms"] > 4.8
    assert abs(rows[("peers", "all")].median - r0.peers_delta_ms) < 1e-9


def test_peers_are_matched_step_by_step_inside_the_common_window_or_not_at_all():
    """windows.peer_waits: the k-th hand-off of each rank is one step, a wait at most the rank's block after it; a
    step handed before the common begin is start-up skew, one after its end is not in it; other counts, a rank
    not matched, or no step give None (the column says -)."""
    handed = [[[(100, 50), (200, 50), (300, 50)]], [[(130, 50), (210, 50), (330, 50)]]]
    assert windows.peer_waits(handed, [(0, 1000)]) == [30 + 10 + 30, 0]
    assert windows.peer_waits(handed, [(120, 1000)]) == [10 + 30, 0]  # rank 0's first hand-off is before the begin
    assert windows.peer_waits(handed, [(0, 320)]) == [30 + 10, 0]  # rank 1's last is after the end
    assert windows.peer_waits([[[(100, 5)]], [[(130, 50)]]], [(0, 1000)]) == [5, 0]  # capped at its block
    assert windows.peer_waits([[[(100, 9), (200, 9)]], [[(130, 9)]]], [(0, 1000)]) is None
    assert windows.peer_waits([None, [[(130, 9)]]], [(0, 1000)]) is None
    assert windows.peer_waits([[[]], [[]]], [(0, 1000)]) is None


def test_hand_offs_are_graph_launches_each_followed_by_a_block_on_the_gpu():
    """windows.handoffs: one hand-off per launch (its replay lines share a time; eager collectives are no step),
    each with the time blocked in readbacks and synchronizes until the next or the span's end; a host that hands
    two steps with no block between them runs ahead of its GPU: None."""
    rep = {"kind": "collective", "graph": "replay"}
    d2h, h2d = {"kind": "crossing", "dir": "d2h"}, {"kind": "crossing", "dir": "h2d"}
    lines = [(5, 5, rep)] * 3 + [(6, 9, d2h), (9, 9, {"kind": "collective", "graph": ""}), (10, 11, h2d),
                                 (12, 12, rep), (13, 16, {"kind": "sync"}), (17, 19, d2h), (50, 50, rep), (52, 55, d2h)]
    def blocks(lines):  # as the trace gives them: its blocking calls, in time order
        return sorted((t0, t1) for t0, t1, row in lines if windows.blocking(row))

    assert windows.handoffs(lines, [(0, 20), (40, 60)], blocks(lines)) == [[(5, 3), (12, 5)], [(50, 3)]]
    ahead = [(5, 5, rep), (6, 7, h2d), (8, 8, rep), (9, 10, d2h)]
    assert windows.handoffs(ahead, [(0, 20)], blocks(ahead)) is None


def test_three_ranks_that_began_apart_each_wait_for_the_last_hand_off_of_each_step(tmp_path):
    """Three ranks begin 0, 300 and 600 us apart (their first step waits for the last: start-up skew, outside the
    common window). In OTHER each step's 4 replayed all-reduces pay 12.5 us, and before each launch rank 1
    prepares 30 us and rank 2 60 us (host work), which the others wait for in their readbacks: rank 0's peers
    grow 60 us a step, rank 1's 30, rank 2's none; on every rank explained is the tolls' 50 us a step (within the
    first step's, windows.peer_waits), and the all-ranks row's peers is the ranks' summed."""
    steps, gpu_us = 20, 60.0
    for prefix, emu in ((tmp_path / "n", 0), (tmp_path / "c", 1)):
        prep, toll = (0.0, 30.0 * emu, 60.0 * emu), 12.5 * emu
        begins = (0.0, 300.0, 600.0)
        launch = [b + p for b, p in zip(begins, prep)]  # step 0: each rank launches right after its begin mark
        lines = [[(b, 0, "begin", "mark", "", "", 0, 0, 0)] for b in begins]
        for _ in range(steps):
            done = max(launch) + 1 + gpu_us + 4 * toll  # the GPUs run the step once the last rank launched it
            for r in range(3):
                lines[r].append((launch[r], 1, "cuGraphLaunch", "launch", "", "", 0, 0, 0))
                lines[r] += [(launch[r] + 1, 0, "ncclAllReduce", "collective", "", "", 8192, 0, toll, "replay")] * 4
                lines[r].append((launch[r] + 2, done - launch[r] - 2, "cuMemcpyDtoHAsync_v2", "crossing", "d2h",
                                 "pinned", 8, 0, 0))
            launch = [done + 1 + p for p in prep]
        for r in range(3):
            lines[r].append((done + 1, 0, "end", "mark", "", "", 0, 0, 0))
            write_trace(prefix, lines[r], pid=100 + r, ranks=3, **(dict(profile="b300", emulate=1) if emu else {}))
            (prefix.parent / f"{prefix.name}.{100 + r}.summary.json").write_text(
                f'{{"pid": {100 + r}, "calls": {{}}, "crossings": {{}}, "rank": {r}, "ranks": 3}}\n')
    base, other = trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c"))
    ranks, notes = account_ranks.per_rank(base, other)
    assert notes == [] and [a.rank for a in ranks] == [0, 1, 2]
    for a, wait_us in zip(ranks, (60, 30, 0)):
        assert a.peer_ms[0] == 0 and abs(a.peers_delta_ms - (steps - 1) * wait_us / 1e3) < 1e-6, (a.rank, a.peer_ms)
        # within one step: an early rank's first readback, from the common begin on, stays in its calls
        assert abs(a.explained_ms - (steps - 1) * 50 / 1e3) <= 0.110 + 1e-6, (a.rank, a.explained_ms)
        assert abs(a.explained_ms + a.peers_delta_ms + a.host_delta_ms - a.slowdown_ms) < 1e-6
    whole = account_ranks.overall(base, other, ranks)
    assert abs(whole.peers_delta_ms - (steps - 1) * 90 / 1e3) < 1e-6


def eager_job(prefix, emu: int, steps: int = 20) -> None:
    """DDP-like ranks: each step's 3 all-reduces issued one by one (no CUDA graph), then a readback that waits for
    the job's slowest rank. Natively rank 1's host work is the most (rank 0 waits 30 us a step in its readback);
    under emulation (emu=1: launch-like 10 us in each all-reduce, a 5 us device-side toll each, a 40 us readback
    toll) rank 0's grew past it (rank 1 waits 10 us beyond its own GPU's 15 us of tolls). Every rank pays 85 us of
    tolls a step; the step grows by 95."""
    c, own, host, step = {0: (2, 50, (60, 90), 146), 1: (12, 90, (100, 90), 241)}[emu]
    for rank in (0, 1):
        lines, t = [(0.0, 0, "begin", "mark", "", "", 0, 0, 0)], 1.0
        for _ in range(steps):
            for _ in range(3):
                lines.append((t, c, "ncclAllReduce", "collective", "", "", 8192, 0, 5 * emu))
                t += c + host[rank] / 3
            back = step - 3 * c - host[rank]  # the readback ends where the step does: it waits for the last
            lines.append((t, back, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, (back - own) * emu,
                          40 * emu))
            t += back
        lines.append((t, 0, "end", "mark", "", "", 0, 0, 0))
        write_trace(prefix, lines, pid=100 + rank, ranks=2, **(dict(profile="b300", emulate=1) if emu else {}))
        (prefix.parent / f"{prefix.name}.{100 + rank}.summary.json").write_text(
            f'{{"pid": {100 + rank}, "calls": {{}}, "crossings": {{}}, "rank": {rank}, "ranks": 2}}\n')


def test_an_eager_job_gets_its_peers_from_its_waits_and_a_note_that_says_how(tmp_path):
    """Each rank's peers are its time blocked between two of its collectives beyond the least blocked rank's there
    (the span from the j-th collective to the j+1-th one step's on every rank): then explained is exactly the tolls
    each rank paid, whichever rank was the straggler in each run (eager_job)."""
    steps = 20
    eager_job(tmp_path / "n", 0, steps)
    eager_job(tmp_path / "c", 1, steps)
    base, other = trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c"))
    assert all(p.joined and p.peers_how == "waits" for p in base.procs + other.procs)
    assert trace.eager(other.procs[0].summary) == 3 * steps
    us = lambda ns: round(ns / 1e3, 3)  # noqa: E731 - the trace's ns as the test's us
    assert [us(p.peers_ns) for p in base.procs] == [30 * steps, 0]  # rank 1's readback: each step's least
    assert [us(p.peers_ns) for p in other.procs] == [0, 10 * steps]  # rank 0's now
    ranks, notes = account_ranks.per_rank(base, other)
    assert len(notes) == 1 and notes[0].startswith("peers of the 2-rank job, eager collectives: matched by collective")
    for a, peers, host in zip(ranks, (-30, 10), (40, 0)):
        assert abs(a.slowdown_ms - 95 * steps / 1e3) < 1e-3
        assert abs(a.explained_ms - 85 * steps / 1e3) < 1e-3, (a.rank, a.explained_ms)  # 30 + 40 + 15: its tolls
        assert abs(a.peers_delta_ms - peers * steps / 1e3) < 1e-3 and abs(a.host_delta_ms - host * steps / 1e3) < 1e-3
    text = account_ranks.render_ranks(ranks, notes)
    row0 = next(line for line in text.splitlines() if line.lstrip().startswith("0 marks")).split()
    assert row0[-2] == "-32%" and "matched by collective" in text and all(len(x) <= 120 for x in text.splitlines())


def test_runs_that_make_no_driver_call_leave_no_result_folder(tmp_path, monkeypatch, capsys, driver_here):
    """Both runs made under the interposer (where no CUDA driver loads, past the checks that refuse that), then
    nothing to attribute: the folders account made are taken away again; one the user made stays."""
    monkeypatch.chdir(tmp_path)
    for out, left in ((None, []), ("a/b", []), ("kept", ["kept"])):
        if out == "kept":
            (tmp_path / "kept").mkdir()
        assert cli.main(["account", "--profile", "b300", *(["--out", out] if out else []), "--", "true"]) == 2
        err = capsys.readouterr().err
        assert "run 2 of 2" in err and err.splitlines()[-1] == ("ccbridge account: true made no CUDA driver call: "
                                                                "nothing to attribute")
        assert sorted(p.name for p in tmp_path.iterdir()) == left
