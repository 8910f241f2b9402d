"""The net plugin inside NCCL on 2 GPUs forced onto the network (P2P and shared memory off): an unmodified
torch.distributed script, env vars only. A peer that dies mid-job and a peer with another key must make every
surviving rank fail with an error within a deadline, never return a tensor; an honest job returns the exact sum.
(The wire faults themselves, flips, drops, replays, truncation, are driven through the plugin's API on the CPU:
tests/test_ncclnet_cpu.py.)"""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NGPU < 2, reason=f"needs 2 or more GPUs, this machine has {NGPU} "
                                                                     "(runs through scripts/device-check)")]

from ccbridge import pluginenv  # noqa: E402

# Each rank: all_reduce of a known tensor, `steps` times; rank `die` leaves abruptly after step 2.
RANK = textwrap.dedent("""
    import datetime, os, sys, time, torch, torch.distributed as dist
    rank, steps, die = int(os.environ["RANK"]), int(sys.argv[1]), int(sys.argv[2])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=30), device_id=torch.device("cuda", rank))
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    for step in range(steps):
        if rank == die and step == 2:
            os._exit(3)
        y = x * (rank + 1)
        dist.all_reduce(y)
        torch.cuda.synchronize()
        assert torch.equal(y, x * 3), f"rank {rank} step {step}: wrong sum"
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(tmp_path, steps: int, die: int, keys: tuple[str, str], deadline_s: float = 120.0):
    """Two ranks; (returncode, seconds, output) per rank. A rank still running at the deadline is killed."""
    prog = tmp_path / "rank.py"
    prog.write_text(RANK)
    port = _port()
    procs = []
    for rank in range(2):
        env = pluginenv.env(dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                 MASTER_PORT=str(port), LOCAL_RANK=str(rank), NCCL_P2P_DISABLE="1",
                                 NCCL_SHM_DISABLE="1", NCCL_NET="ccbridge", NCCL_SOCKET_IFNAME="lo",
                                 NCCL_DEBUG="WARN", CCBRIDGE_KEY=keys[rank]))
        env.pop("CCBRIDGE_KEY_FILE", None)
        procs.append((time.monotonic(), subprocess.Popen([sys.executable, str(prog), str(steps), str(die)], env=env,
                                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    out = []
    for t0, p in procs:
        try:
            text, _ = p.communicate(timeout=max(1.0, deadline_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            out.append((None, time.monotonic() - t0, text))
            continue
        out.append((p.returncode, time.monotonic() - t0, text))
    return out


KEY = os.urandom(32).hex()


def test_an_honest_job_sums_exactly_through_the_plugin(tmp_path):
    res = _job(tmp_path, 6, -1, (KEY, KEY))
    for rank, (rc, _, text) in enumerate(res):
        assert rc == 0 and f"rank {rank} done" in text, text[-3000:]


def test_a_dead_peer_fails_the_survivor_within_the_deadline(tmp_path):
    (rc0, secs, text), (rc1, _, _) = _job(tmp_path, 200, 1, (KEY, KEY))
    assert rc1 == 3
    assert rc0 not in (0, None), f"rank 0 {'hung' if rc0 is None else 'returned'}:\n{text[-3000:]}"
    assert secs < 90 and "rank 0 done" not in text
    assert "ccbridge" in text.lower()  # NCCL's log names the plugin's failure, not a silent exit


def test_a_peer_with_another_key_fails_both_ranks(tmp_path):
    res = _job(tmp_path, 3, -1, (KEY, os.urandom(32).hex()))
    for rank, (rc, secs, text) in enumerate(res):
        assert rc not in (0, None), f"rank {rank} {'hung' if rc is None else 'returned'}:\n{text[-3000:]}"
        assert f"rank {rank} done" not in text and secs < 90
