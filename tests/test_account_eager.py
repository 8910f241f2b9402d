"""account on jobs whose collectives are eager (DDP): each rank's wait for its peers matched by blocking calls (the
k-th synchronize or readback of a kind on every rank is one step's; a rank's wait is its time in it beyond the
step's shortest), so what every rank waits alike cancels (its own GPU, a synchronize's toll, a toll its GPU hid).
The cases an independent review built against the first estimate (session 14): each read wrong there."""

from ccbridge import account
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
    return account.per_rank(trace.summarize(str(tmp_path / "n")), trace.summarize(str(tmp_path / "c")))


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
    assert notes[0].startswith("peers of job 2, eager collectives: matched by blocking calls")
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


def test_ranks_whose_blocking_calls_do_not_pair_up_get_no_peers_and_a_note(tmp_path):
    ranks, notes = _ranks(tmp_path, _one_reads_back)
    assert all(a.peer_ms is None for a in ranks)
    assert notes == ["peers of job 2: not measured (eager collectives, and no kind of its ranks' blocking calls "
                     "pairs up: each kind's count differs between ranks, or none blocked)"]


def _timed_on_rank_0(emu, rank, t):
    """eager_job's step shape with a timing synchronize on rank 0 alone (cuEventSynchronize, after its readback):
    the readbacks pair up, the synchronizes do not and are left out, named in the note."""
    out, t = _hidden_toll(emu, rank, t)
    if rank == 0:
        out.append((t, 7, "cuEventSynchronize", "sync", "", "", 0, 0, 0))
    return out, t + 10


def test_a_kind_whose_count_differs_between_ranks_is_left_out_and_named(tmp_path):
    ranks, notes = _ranks(tmp_path, _timed_on_rank_0)
    assert [round(a.peer_ms[0], 6) for a in ranks] == [0.6, 0.0]  # rank 0's 30 us a step for rank 1, 20 steps
    assert "left out, their counts differing between ranks (their waits stay in the calls): cuEventSynchronize;" \
        in notes[0]


def test_runs_whose_peers_were_had_in_two_ways_are_not_summed(tmp_path):
    two_ranks(tmp_path / "g", 0, 100, 1000)
    eager_job(tmp_path / "e", 0)
    merged, notes = runs.merge([trace.summarize(str(tmp_path / p)) for p in "ge"])
    assert all(p.peers_ns is None for p in merged.procs if p.rank is not None)
    assert notes == [f"rank {r} of the job of 2: peers measured in 2 of the 2 runs, by steps in some and by waits in "
                     "others: not summed ('-'); its waits for them stay in its calls" for r in (0, 1)]
