"""ccbridge.ranks, the one launcher of rank processes, on gloo CPU ranks: every failure of a rank (it raises, dies by
exit or signal, hangs past its user's limit, ends without an answer) is one line naming it, through each of its
users' entry points (serve.tp, the peer family's settings, secure.bench's collectives and DDP, the net bench), with
no hang, no process left behind and the caller's environment untouched."""

import os
import statistics
import re
import signal
import time

import pytest

torch = pytest.importorskip("torch", reason="process groups need torch")
import torch.distributed as dist  # noqa: E402

from ccbridge import ranks  # noqa: E402
from ccbridge.errors import CCBridgeError, GpuError, SecureError  # noqa: E402
from ccbridge.secure import bench  # noqa: E402
from ccbridge.serve import tp  # noqa: E402

HANG_S = 8  # each user's stall or overall limit when a rank hangs (a rank's start takes a few seconds here)
LIMIT_S = 120  # and when none should: a failure must be seen at once, not at the limit


def _children() -> set[int]:
    """This process's live children (zombies are not: nothing runs there)."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if int(ppid) == os.getpid() and state != "Z":
            out.add(int(pid))
    return out


@pytest.fixture
def clean():
    """The test's call must leave no child running and os.environ as it found it, and not take long."""
    def environ():
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's own, per phase

    before, env, t0 = _children(), environ(), time.monotonic()
    yield
    assert time.monotonic() - t0 < 60
    assert _children() <= before, "a rank was left running"
    assert environ() == env, "the caller's environment changed"


# Rank targets: module level, so that the started ranks can import them.
def _fail(rank, n, dev, send, kind):
    """Rank 1 fails as `kind` says once every rank has joined; rank 0 then waits on it in a collective (or, for
    "hang", has answered)."""
    dist.barrier()
    if rank == 1:
        if kind == "raise":
            raise ValueError("boom\nsecond line")
        if kind == "exit":
            os._exit(3)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            time.sleep(600)
        if kind == "quiet":
            os._exit(0)  # ends well, without an answer
    if kind != "hang":
        dist.all_reduce(torch.ones(1))
    return rank


def _bench_fail(rank, n, kind, say):
    """secure.bench's rank shape: it joins its group itself, as under torchrun."""
    bench._init(rank, n, "gloo", secure=False)
    return _fail(rank, n, None, say, kind)


def _tp(kind, limit_s):
    return tp.run_ranks(2, _fail, kind, device="cpu", stall_s=limit_s)


def _peer(kind, limit_s):
    # the peer family's rendezvous (a file) and overall deadline, on gloo ranks (its measurements need CUDA)
    return ranks.run(2, _fail, kind, label="all_reduce", backend="gloo", rendezvous="file", timeout_s=limit_s)


def _bench(kind, limit_s):  # limit_s: bench.STALL_S, which the test sets
    return bench.launch(_bench_fail, 2, kind, label="collectives")


USERS = {"tp": (_tp, "tensor-parallel", "none spoke for"), "peer": (_peer, "all_reduce", "not all answered within"),
         "bench": (_bench, "collectives", "none spoke for")}
WHAT = {"raise": "rank 1 of 2 failed: ValueError: boom", "exit": "rank 1 of 2 died (exit status 3) without a word",
        "kill": f"rank 1 of 2 died (signal {signal.SIGKILL.value}) without a word",
        "quiet": "rank 1 of 2 ended (exit status 0) without a word"}


@pytest.mark.parametrize("kind", ["raise", "exit", "hang", "quiet"])
@pytest.mark.parametrize("user", USERS)
def test_a_failing_rank_is_one_line_naming_it(user, kind, clean, monkeypatch):
    """Each user's ranks, each failure: the rank's own line, or (hanging) the user's limit's, at once and alone."""
    run, label, stalled = USERS[user]
    limit_s = HANG_S if kind == "hang" else LIMIT_S
    monkeypatch.setattr(bench, "STALL_S", limit_s)
    with pytest.raises(GpuError) as e:
        run(kind, limit_s)
    if kind == "hang":  # rank 0 has answered, unless the ranks' start took the limit
        assert re.fullmatch(rf"{label} ranks: {stalled} {HANG_S} s \(answered: (\[0\]|none) of 2\); stopped them",
                            str(e.value)), str(e.value)
    else:
        assert str(e.value) == f"{label} {WHAT[kind]}"


def test_a_rank_killed_by_a_signal_is_named_with_it(clean):
    with pytest.raises(GpuError) as e:
        _peer("kill", LIMIT_S)
    assert str(e.value) == f"all_reduce {WHAT['kill']}"


def _answer(rank, n, dev, send, var):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    send(("hello", rank))
    send(("threads", torch.get_num_threads()))
    return rank, float(t), str(dev), {k: os.environ.get(k) for k in [*ranks.NVLS_OFF, var, "MASTER_PORT"]}


@pytest.mark.parametrize("rendezvous", ranks.RENDEZVOUS)
def test_ranks_answer_by_rank_with_their_environment_and_multicast_off(rendezvous, clean, monkeypatch):
    """The caller's NCCL_NVLS_ENABLE=1 does not reach the ranks (nor does its absence of the others); `env` does,
    without touching os.environ; each rank's messages arrive in order."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.delenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", raising=False)
    seen = []
    got = ranks.run(2, _answer, "CCB_RANKS_TEST", label="test", backend="gloo", rendezvous=rendezvous,
                    env={"CCB_RANKS_TEST": "yes", "NCCL_NVLS_ENABLE": "1"}, on_message=lambda r, m: seen.append((r, m)))
    env = {**ranks.NVLS_OFF, "CCB_RANKS_TEST": "yes", "MASTER_PORT": None}
    assert got == [(0, 3.0, "cpu", env), (1, 3.0, "cpu", env)]
    for r in (0, 1):
        assert [m for rank, m in seen if rank == r] == [("hello", r), ("threads", max(1, (os.cpu_count() or 1) // 2))]


def _no_group(rank, n, dev, send):
    return rank, dev, dist.is_initialized()


def test_ranks_without_a_group(clean):
    assert ranks.run(3, _no_group, label="test") == [(r, None, False) for r in range(3)]


def _chatty(rank, n, dev, send):
    while True:
        send("tick")
        time.sleep(0.2)


def test_ranks_that_talk_but_never_answer_are_stopped_at_the_deadline(clean):
    heard = []
    with pytest.raises(GpuError, match=rf"^test ranks: not all answered within {HANG_S} s \(answered: none of 2\); "
                                       r"stopped them$"):
        ranks.run(2, _chatty, label="test", on_message=lambda r, m: heard.append(r), timeout_s=HANG_S)
    assert {0, 1} <= set(heard)


def test_a_ccbridge_error_keeps_its_class_and_the_caller_may_name_the_others():
    e = ranks.rank_error("net bench", 0, 2, "KeyMaterialError", "no key")
    assert type(e).__name__ == "KeyMaterialError" and str(e) == "net bench rank 0 of 2: no key"
    e = ranks.rank_error("net bench", 0, 2, "NetError", "init returned NCCL error 2", failure=SecureError)
    assert type(e) is SecureError and str(e) == "net bench rank 0 of 2 failed: NetError: init returned NCCL error 2"


class _PluginFailure(SecureError):  # a ccbridge error defined outside ccbridge.errors (as the net plugin's NetError)
    pass


def _fails_as_a_subclass(rank, n, dev, send):
    raise _PluginFailure("init: no usable interface (NCCL error 2)")


def test_a_rank_error_of_a_subclass_is_raised_as_its_ccbridge_class_without_its_name(clean):
    # a rank's NetError read "net bench rank 1 of 2 failed: NetError: init returned NCCL error 2: NET/ccbridge: ...",
    # 147 columns; its SecureError says the same in the CLI's one line
    with pytest.raises(SecureError, match=r"^test rank [01] of 2: init: no usable interface \(NCCL error 2\)$") as e:
        ranks.run(2, _fails_as_a_subclass, label="test")
    assert type(e.value) is SecureError


def test_what_cannot_reach_a_rank_fails_before_any_starts(clean):
    with pytest.raises(Exception, match="pickle|local object"):
        ranks.run(2, lambda *a: None, label="test")
    with pytest.raises(ValueError, match="rendezvous must be one of tcp, file"):
        ranks.run(2, _no_group, label="test", rendezvous="env")


def test_the_ddp_bench_rank_failure_is_one_line(clean):
    """secure.bench's DDP ranks on gloo: a model no rank knows fails every rank, and the first is named."""
    pytest.importorskip("transformers", reason="bench ddp's models other than resnet50 come from transformers")
    with pytest.raises(CCBridgeError, match=r"^ddp bench rank [01] of 2 failed: ValueError: unknown model nothing "):
        bench.launch(bench._ddp_rank, 2, ["nothing"], [("plain", 25)], 1, 0, "gloo", label="ddp bench")


def test_the_collectives_bench_answers_through_the_launcher(clean, monkeypatch, capfd):
    """Rank 0's progress lines are printed by the parent as they come; the benchmark key is the ranks' alone."""
    monkeypatch.delenv("CCBRIDGE_KEY", raising=False)
    monkeypatch.setenv("CCBRIDGE_PROGRESS", "1")
    res = bench.launch(bench._collectives_rank, 2, "all_reduce", [64, 4096], "float", 1, 0, "gloo", False)
    assert [r["size"] for r in res["rows"]] == [64, 4096] and all(r["wrong_plain"] == 0 for r in res["rows"])
    out = capfd.readouterr().out.splitlines()
    assert len(out) == 5 and out[3].split()[:3] == ["64", "16", "float"], out


def test_the_net_bench_runs_its_pair_through_the_launcher(clean, monkeypatch):
    from ccbridge import pluginenv
    from ccbridge.secure import netbench

    try:
        pluginenv.library()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    monkeypatch.delenv("CCBRIDGE_KEY", raising=False)
    monkeypatch.delenv("CCBRIDGE_KEY_FILE", raising=False)
    lines = []
    res = netbench.loopback([1 << 16], [1, 2], inflight=4, total=1 << 20, repeat=2, rtt_sizes=(8,), rtt_iters=10,
                            progress=lines.append)
    assert not res.errors and res.settings["interface"] == "lo"
    net = [r for r in res.rows if not r.metric.startswith("aes_gcm")]
    assert [(r.metric, r.params.get("lanes", r.params.get("streams")), r.n) for r in net] == [
        (m, n, 2) for n in (1, 2) for m in ("stream", "tcp_plaintext", "half_rtt")] + [("uncoupled", n, 2) for n in (1, 2)]
    # the AES-GCM rates first (records of 32 and 64 KiB, on 1 thread and on every visible core), then the steps,
    # each stream's bound (measured after each of its repeats) right after it
    gcm = [line for line in lines if "AES-256-GCM" in line]
    assert len(gcm) == 2 * len({1, netbench.cores_visible()}) and lines[:len(gcm)] == gcm
    steps = lines[len(gcm):]
    assert len(steps) == 8 and "encrypted " in steps[0] and "at once " in steps[1] and "one-way trip" in steps[3]
    assert "at once " in steps[5] and not res.skipped and max(map(len, lines)) <= 120
    for s in (r for r in net if r.metric == "stream"):  # each encrypted row beside the bound at its lanes and size
        u = next(r for r in net if r.metric == "uncoupled" and r.params["streams"] == s.params["lanes"])
        assert u.params["size"] == s.params["size"]
        # each repeat's share is its rate over the bound measured right after it (the rates kept to 3 decimals: at
        # this test's small sizes on a loaded host that is up to a percent), the row's share their median
        each = s.extra["of_uncoupled_each"]
        assert all(e == pytest.approx(g / b, rel=0.02) for e, g, b in zip(each, s.extra["gbps_each"], u.extra["both"]))
        assert s.extra["of_uncoupled"] == pytest.approx(statistics.median(each), abs=1e-3)


def test_a_net_bench_process_that_fails_is_one_line(clean, monkeypatch):
    from ccbridge import pluginenv
    from ccbridge.secure import netbench

    try:
        pluginenv.library()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    monkeypatch.setenv("CCBRIDGE_KEY", "not hex")
    with pytest.raises(SecureError) as e:  # refused here before any rank starts (its own test: test_ncclnet_cpu.py)
        netbench.plugin_ready()
    assert str(e.value).startswith("the net plugin's init: $CCBRIDGE_KEY: expected 64 hex digits")
    monkeypatch.setattr(netbench, "plugin_ready", lambda env=None: None)  # so that the ranks meet it themselves
    with pytest.raises(SecureError) as e:
        netbench.loopback([1 << 16], [1], total=1 << 20, repeat=1, rtt_sizes=(), progress=lambda _: None)
    # the plugin's init says why in the rank's line: its SecureError, no class name, no log prefix, within 120
    assert re.fullmatch(r"net bench rank [01] of 2: init: \$CCBRIDGE_KEY: expected 64 hex digits \(32 bytes\), "
                        r"got 7 characters", str(e.value)), str(e.value)
    assert len(f"ccbridge bench net: {e.value}") <= 120


def _stamp(rank, n, dev, send, folder):
    """Leaves a file when the rank runs: proof of when it ran."""
    with open(os.path.join(folder, f"ran-{rank}"), "w") as f:
        f.write(str(time.monotonic()))
    dist.barrier()
    return rank


@pytest.mark.parametrize("how", ["open", "shut"])
def test_gated_ranks_start_early_and_run_only_when_the_gate_opens(how, clean, tmp_path):
    """A gate holds started ranks before they join: nothing runs until open() (then run() returns their answers as
    ever), and shut() sends them home without joining (run() returns None for each)."""
    import threading

    gate, out = ranks.Gate(), {}
    th = threading.Thread(target=lambda: out.setdefault("got", ranks.run(2, _stamp, str(tmp_path), label="test",
                                                                          backend="gloo", gate=gate, timeout_s=LIMIT_S)))
    th.start()
    time.sleep(3)  # time enough for them to start and reach the gate
    assert not list(tmp_path.iterdir()) and th.is_alive()
    opened = time.monotonic()
    gate.open() if how == "open" else gate.shut()
    th.join(LIMIT_S)
    gate.close()
    if how == "open":
        assert out["got"] == [0, 1]
        assert all(float(p.read_text()) >= opened for p in tmp_path.iterdir()) and len(list(tmp_path.iterdir())) == 2
    else:
        assert out["got"] == [None, None] and not list(tmp_path.iterdir())


def test_a_gate_is_set_once_and_closes_once():
    """open() after shut() changes nothing (a rank may have read the word), and close() may be called again, by every
    owner that ends its run (the probe's registry and its command both do)."""
    gate = ranks.Gate()
    gate.shut()
    gate.open()
    with open(gate.path) as f:
        assert f.read() == "shut"
    folder = os.path.dirname(gate.path)
    gate.close()
    gate.close()
    gate.open()
    assert not os.path.exists(folder)


def _affinity(rank, n, dev, send):
    return sorted(os.sched_getaffinity(0)), torch.get_num_threads()


def test_each_rank_runs_on_the_cores_it_was_given(clean, monkeypatch):
    """CCBRIDGE_RANK_CPUS: rank r on the r-th CPU list (taskset's syntax), its torch threads that many; without it
    each rank has the parent's cores."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("needs 2 CPUs to give 2 ranks their own")
    monkeypatch.setenv(ranks.CPUS_ENV, f"{mine[-1]};{mine[0]};{mine[0]}")  # a third list: a job of 3 would take it
    got = ranks.run(2, _affinity, label="test", backend="gloo")
    assert got == [([mine[-1]], 1), ([mine[0]], 1)]
    monkeypatch.setenv(ranks.CPUS_ENV, " AUTO ")
    assert sorted(c for cpus, _ in ranks.run(2, _affinity, label="test") for c in cpus) == mine
    monkeypatch.delenv(ranks.CPUS_ENV)
    assert [cpus for cpus, _ in ranks.run(2, _affinity, label="test")] == [mine, mine]


@pytest.mark.parametrize("text,why", [
    ("0-1", "1 CPU list for 2 ranks"), ("a;b", "expected a CPU list per rank"),
    ("3-1;0", "expected a CPU list per rank"), ("0;;", "expected a CPU list per rank"),
    ("0-;1", "expected a CPU list per rank"), ("+0;1", "expected a CPU list per rank"),
    ("0-4000000000;1", "expected a CPU list per rank"), ("0-1;1", "ranks 0 and 1 share CPUs 1:"),
    ("0;9999", "rank 1's CPUs 9999 are outside this process's 0"),
    ("0;9990-9999,5000", "CPUs 5000,9990-9999 are outside"), ("0;9991,9993,9995,9997,9999", "CPUs 9991,9993,9995,9997,...")])
def test_a_bad_cpu_list_is_one_line_before_any_rank_starts(text, why, clean, monkeypatch):
    from ccbridge.errors import UsageError

    monkeypatch.setenv(ranks.CPUS_ENV, text)
    with pytest.raises(UsageError, match=re.escape(why)) as e:
        ranks.run(2, _affinity, label="test")
    assert "\n" not in str(e.value) and len(str(e.value)) <= 100


def test_auto_cuts_this_processs_cores_evenly_keeping_smt_siblings_together(tmp_path, monkeypatch):
    """Two packages of two cores, each core two SMT siblings (cpu i and i + 4): 2 ranks get a package each, 4 ranks
    a core each, siblings with it; 5 ranks are refused in one line."""
    for cpu in range(8):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(f"{cpu % 4},{cpu % 4 + 4}\n")
        (d / "physical_package_id").write_text(f"{(cpu % 4) // 2}\n")
    monkeypatch.setattr(ranks.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert ranks.even_cpus(2, str(tmp_path)) == (frozenset({0, 1, 4, 5}), frozenset({2, 3, 6, 7}))
    assert ranks.even_cpus(4, str(tmp_path)) == tuple(frozenset({c, c + 4}) for c in range(4))
    from ccbridge.errors import UsageError
    with pytest.raises(UsageError, match=r"=auto: 4 cores for 5 ranks"):
        ranks.even_cpus(5, str(tmp_path))
    (tmp_path / "cpu6" / "topology" / "thread_siblings_list").unlink()  # cpu 6's own list unreadable: one rank's
    got = ranks.even_cpus(4, str(tmp_path))
    assert all(got) and sum(len(c) for c in got) == len(frozenset().union(*got))  # no CPU given to two ranks
    monkeypatch.setenv(ranks.CPUS_ENV, "auto")
    assert len(ranks.rank_cpus(2)) == 2  # (this machine's own topology)


def _threads(rank, n, dev, send):
    return torch.get_num_threads()


def test_a_rank_is_pinned_before_its_job_imports_torch(clean, monkeypatch):
    """The CPU list reaches the rank before its job is unpickled (which imports the target's module, and torch):
    torch's default thread pool is sized from the rank's own CPUs (a rank without a group keeps torch's default)."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("needs 2 CPUs")
    monkeypatch.setenv(ranks.CPUS_ENV, f"{mine[0]};{mine[1]}")
    assert ranks.run(2, _threads, label="test") == [1, 1]
