"""account on jobs whose collectives are eager (DDP): each rank's wait for its peers matched by collective (the span
from a rank's j-th collective to its j+1-th is the same step's on every rank; a rank's wait is its time blocked there
beyond the least blocked rank's), so what every rank waits alike cancels (its own GPU, a synchronize's toll, a toll
its GPU hid). The cases two independent reviews built against the earlier definitions (session 14: from the tolls,
then by the k-th blocking call of a kind): each read wrong under one of them."""

from ccbridge import account_ranks
from ccbridge.emulate import runs, trace
from test_account import eager_job, two_ranks, write_trace


def _summary(prefix, pid, rank):
    (prefix.parent / f"{prefix.name}.{pid}.summary.json").write_text(
        f'{{"pid": {pid}, "calls": {{}}, "crossings": {{}}, "rank": {rank}, "ranks": 2}}\n')


def _job(prefix, emu, step, steps=20):
    """Two ranks of `steps` steps each; step(emu, rank, t) -> (lines, t)."""
    for rank in (0, 1):
        lines, t = [(0.0, 0, "begin", "mark", "", "", 0, 0, 0)], 1.0
        for _ in range(steps):
            more, t = step(emu, rank, t)
            lines += more
        lines.append((t, 0, "end", "mark", "", "", 0, 0, 0))
        lines.sort(key=lambda x: x[0])
        write_trace(prefix, lines, pid=100 + rank, ranks=2, **(dict(profile="b300", emulate=1) if emu else {}))
        _summary(prefix, 100 + rank, rank)


def _ranks(tmp_path, step):
    _job(tmp_path / "n", 0, step)
    _job(tmp_path / "c", 1, step)
    return account_ranks.per_rank(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))


def _gpu_bound(emu, rank, t):
    """Identical ranks: each step's readback waits 1000 us for the rank's own GPU (15 us more of tolls emulated)."""
    c, out = 12 if emu else 2, []
    for _ in range(3):
        out.append((t, c, "ncclAllReduce", "collective", "", "", 8192, 0, 5 * emu))
        t += c + 20
    w, own = 1000 + 15 * emu, 90 if emu else 50
    out.append((t, w + own, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, w * emu, 40 * emu))
    return out, t + w + own


def test_a_wait_for_the_ranks_own_gpu_is_no_wait_for_its_peers(tmp_path):
    ranks, notes = _ranks(tmp_path, _gpu_bound)
    assert notes[0].startswith("peers of the 2-rank job, eager collectives: matched by collective")
    for a in ranks:
        assert a.peer_ms == (0.0, 0.0) and abs(a.explained_ms - a.slowdown_ms) < 1e-3


def _two_syncs(emu, rank, t):
    """The first synchronize pays a 20 us toll emulated, the second finds nothing submitted since."""
    out = [(t, 2, "ncclAllReduce", "collective", "", "", 8192, 0, 0)]
    t += 30
    for toll in (20 * emu, 0):
        out.append((t, 10 + toll, "cuStreamSynchronize", "sync", "", "", 0, 0, toll))
        t += 15 + toll
    return out, t


def test_a_synchronizes_toll_is_explained_not_read_as_peers(tmp_path):
    ranks, _ = _ranks(tmp_path, _two_syncs)
    for a in ranks:
        assert abs(a.explained_ms - a.slowdown_ms) < 1e-3 and a.slowdown_ms > 0.3


def _hidden_launches(emu, rank, t):
    """Rank 1 straggles 500 us a step; rank 0's other thread launches inside its wait for it."""
    c = 12 if emu else 2
    out = [(t, c, "ncclAllReduce", "collective", "", "", 8192, 0, 15 * emu)]
    t += c + 20 + 500 * rank
    s = 100 + 15 * emu + 500 * (1 - rank)
    out.append((t, s, "cuStreamSynchronize", "sync", "", "", 0, 0, 0))
    if rank == 0:
        out += [(t + 1 + 40 * i, 30 if emu else 5, "cuLaunchKernel", "launch", "", "", 0, 0, 0) for i in range(10)]
    return out, t + s + 5


def test_another_threads_launches_inside_a_wait_explain_no_more_than_the_slowdown(tmp_path):
    ranks, _ = _ranks(tmp_path, _hidden_launches)
    assert abs(ranks[0].explained_ms - ranks[0].slowdown_ms) < 1e-3


def _hidden_toll(emu, rank, t):
    """The collectives' device-side tolls hidden under other GPU work; rank 0 waits 30 us a step for rank 1."""
    c, out = 12 if emu else 2, []
    for _ in range(3):
        out.append((t, c, "ncclAllReduce", "collective", "", "", 8192, 0, 5 * emu))
        t += c + 20 + 10 * rank
    w, own = 30 * (1 - rank), 50 + 40 * emu
    out.append((t, w + own, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, w * emu, 40 * emu))
    return out, t + w + own


def test_a_collective_toll_the_gpu_hid_is_not_explained(tmp_path):
    ranks, _ = _ranks(tmp_path, _hidden_toll)
    assert abs(ranks[0].explained_ms - ranks[0].slowdown_ms) < 1e-3


def _one_reads_back(emu, rank, t):
    """Only rank 0 reads its loss back (if rank == 0: loss.item()): rank 1 never blocks in a traced call."""
    out = [(t + 24 * i, 2 + 10 * emu, "ncclAllReduce", "collective", "", "", 8192, 0, 5 * emu) for i in range(3)]
    t += 72 + 30 * emu
    if rank == 0:
        w = 300 + 15 * emu
        out.append((t, w + 50 + 40 * emu, "cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, w * emu, 40 * emu))
    return out, t + 350 + 55 * emu


def test_a_rank_that_blocks_in_no_traced_call_leaves_the_job_without_peers_and_a_note(tmp_path):
    ranks, notes = _ranks(tmp_path, _one_reads_back)
    assert all(a.peer_ms is None for a in ranks)
    assert notes == ["peers of the 2-rank job: not measured (eager collectives: no collective was issued as many times on every "
                     "rank, or a rank blocked in no traced call inside the window, its waits polled or spun outside "
                     "them)"]


def test_runs_whose_peers_were_had_in_two_ways_are_not_summed(tmp_path):
    two_ranks(tmp_path / "g", 0, 100, 1000)
    eager_job(tmp_path / "e", 0)
    merged, notes = runs.merge([trace.summarize(str(tmp_path / p)) for p in "ge"])
    assert all(p.peers_ns is None for p in merged.procs if p.rank is not None)
    assert notes == [f"rank {r} of the job of 2: peers measured in 2 of the 2 runs, by steps in some and by waits in "
                     "others: not summed ('-'); its waits for them stay in its calls" for r in (0, 1)]


AR = ("ncclAllReduce", "collective", "", "", 8192, 0, 0)
RB = ("cuMemcpyDtoHAsync_v2", "crossing", "d2h", "pinned", 8, 0, 0)
SY = ("cuStreamSynchronize", "sync", "", "", 0, 0, 0)
EV = ("cuEventSynchronize", "sync", "", "", 0, 0, 0)


def _rank_file(prefix, rank, lines, emu, in_time=True):
    lines = sorted(lines, key=lambda x: x[0]) if in_time else lines
    write_trace(prefix, lines, pid=100 + rank, ranks=2, **(dict(profile="b300", emulate=1) if emu else {}))
    _summary(prefix, 100 + rank, rank)


def _sides(tmp_path, build):
    for emu, side in ((0, "n"), (1, "c")):
        build(tmp_path / side, emu)
    return account_ranks.per_rank(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))


def _two_threads(prefix, emu, steps=20):
    """Two threads a rank, each writing its own chunk of the file (the interposer buffers lines per thread): rank 0
    waits 200 us a step for rank 1 in its main thread's synchronize."""
    for rank in (0, 1):
        main, other, t = [], [], 1.0
        for _ in range(steps):
            other.append((t, 10, *SY))
            main += [(t + 20, 2, *AR), (t + 30, 500 + 15 * emu + (200 if rank == 0 else 0), *SY)]
            t += 1000
        first, second = (main, other) if rank == 0 else (other, main)
        _rank_file(prefix, rank, [(0, 0, "begin", "mark", "", "", 0, 0, 0)] + first + second +
                   [(t, 0, "end", "mark", "", "", 0, 0, 0)], emu, in_time=False)


def test_blocking_calls_are_read_in_time_not_in_the_files_order(tmp_path):
    ranks, _ = _sides(tmp_path, _two_threads)
    assert [a.peer_ms for a in ranks] == [(4.0, 4.0), (0.0, 0.0)]


def _overlapping(prefix, emu, steps=20):
    """Rank 0 waits for rank 1 in a readback and, at the same time, in a synchronize on another thread."""
    for rank in (0, 1):
        lines, t, late = [(0, 0, "begin", "mark", "", "", 0, 0, 0)], 1.0, 500 if emu else 300
        for _ in range(steps):
            lines.append((t + (late if rank else 0), 2, *AR))
            lines += [(t + 10, late, *RB), (t + 12, late - 2, *SY)] if rank == 0 else \
                [(t + late + 10, 5, *RB), (t + late + 12, 5, *SY)]
            t += late + 20
        _rank_file(prefix, rank, lines + [(t, 0, "end", "mark", "", "", 0, 0, 0)], emu)


def test_two_threads_blocked_together_count_once(tmp_path):
    a = _sides(tmp_path, _overlapping)[0][0]
    assert abs(a.peers_delta_ms - 20 * 0.2) < 1e-3 and a.explained_ms > -1e-3  # 200 us more a step, once


def _timed_rank_0(prefix, emu, steps=20):
    """Identical GPU-bound ranks; rank 0 alone times its step (an event synchronize before its readback, as bench
    ddp does), so its GPU wait falls in another kind of call than rank 1's."""
    for rank in (0, 1):
        lines, t = [(0, 0, "begin", "mark", "", "", 0, 0, 0)], 1.0
        for _ in range(steps):
            lines.append((t, 2 + 10 * emu, *AR))
            t += 20
            gpu, own = 1000 + 15 * emu, 50 + 40 * emu
            lines += [(t, gpu, *EV), (t + gpu, own, *RB)] if rank == 0 else [(t, gpu + own, *RB)]
            t += gpu + own + 10
        _rank_file(prefix, rank, lines + [(t, 0, "end", "mark", "", "", 0, 0, 0)], emu)


def test_a_wait_in_another_kind_of_call_is_no_wait_for_the_peers(tmp_path):
    ranks, _ = _sides(tmp_path, _timed_rank_0)
    assert [a.peer_ms for a in ranks] == [(0.0, 0.0), (0.0, 0.0)]


def _edge(prefix, emu, steps=20):
    """The common window ends at the fast rank's end mark, before the straggler's last readback begins."""
    c = 2 + 10 * emu
    for rank in (0, 1):
        s = 1000.0
        lines = [(s + (0 if rank else -130), 0, "begin", "mark", "", "", 0, 0, 0)]
        for _ in range(steps):
            issue = s + 300
            if rank == 0:
                lines += [(s - 120, c, *AR), (s - 110, issue + c + 10 - (s - 110), *RB)]
            else:
                lines += [(issue, c, *AR), (issue + c + 150, 10, *RB)]
            s += 460 + c
        end = (s - 460 - c) + 300 + c + 30 if rank == 0 else s
        _rank_file(prefix, rank, lines + [(end, 0, "end", "mark", "", "", 0, 0, 0)], emu)


def test_a_straggler_whose_last_readback_is_past_the_common_end_still_pairs(tmp_path):
    ranks, notes = _sides(tmp_path, _edge)
    assert all(a.peer_ms is not None for a in ranks), notes


def _uneven_sends(emu, rank, t):
    """_gpu_bound's steps with point-to-point sends that differ between the ranks (rank 0 sends one more a step, as
    a ring's ends may): the all-reduces pair, the sends are left out."""
    out, t = _gpu_bound(emu, rank, t)
    sends = [(t + 1 + i, 2, "ncclSend", "collective", "", "", 64, 0, 0) for i in range(2 if rank == 0 else 1)]
    return out + sends, t + 5


def test_sends_whose_counts_differ_between_ranks_are_left_out_and_the_collectives_pair(tmp_path):
    ranks, notes = _ranks(tmp_path, _uneven_sends)
    assert notes[0].startswith("peers of the 2-rank job, eager collectives: matched by collective")
    assert [a.peer_ms for a in ranks] == [(0.0, 0.0), (0.0, 0.0)]
    (tmp_path / "x").mkdir()
    sends_alone = _ranks(tmp_path / "x", lambda emu, rank, t: (
        [(t, 2, "ncclSend", "collective", "", "", 64, 0, 0)] * (rank + 1) + [(t + 5, 50, *RB)], t + 60))
    assert sends_alone[0][0].peer_ms is None  # nothing pairs


def test_sides_whose_peers_were_had_in_two_ways_are_not_compared(tmp_path):
    two_ranks(tmp_path / "g", 0, 100, 1000)  # graph-launched steps
    eager_job(tmp_path / "e", 1)  # eager collectives
    ranks, notes = account_ranks.per_rank(trace.summarize(str(tmp_path / "g")), trace.summarize(str(tmp_path / "e")))
    assert all(a.peer_ms is None for a in ranks)
    assert "peers of the 2-rank job: not compared (BASE's and OTHER's were had in two ways: graph-launched steps in one, its " \
        "eager collectives in the other)" in notes
