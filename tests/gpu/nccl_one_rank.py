"""A one-rank NCCL job, the two ways programs reach NCCL: torch.distributed (libtorch links libnccl) and
libnccl loaded with ctypes (as vLLM's pynccl does). Prints one JSON line.

Per way: whether every all_reduce gave the exact sum (a one-rank sum is the input; int32, random), and the op's
time on the GPU timeline, median of REPS: CUDA events around one all_reduce, recorded while a sleep kernel
queued ahead keeps the GPU busy, so the host's own launch costs (and the emulator's launch toll) are hidden
and the events see only device time. torch also replays GRAPH_OPS all_reduces captured in one CUDA graph
(per-op device time: a replay pays each captured op's charge again; natively a one-rank in-place all_reduce
launches nothing, so the native graph is empty and PyTorch warns so), and times LOOP back-to-back all_reduces
on the host clock (what the interposer's own bookkeeping costs a pipelined loop).

    python tests/gpu/nccl_one_rank.py [REPS]
"""

import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 50
COUNT = 1024  # 4 KiB of int32: the small-message regime of the published per-operation toll
GRAPH_OPS, LOOP = 20, 400
SLEEP_CYCLES = 2_000_000  # ~1 ms at H100 clocks: longer than the host needs to submit one op, tolls included


def device_us(op, reps=REPS):
    """Median GPU time of op() between two events, the GPU kept busy ahead of them."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        a.record()
        op()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def loop_us(op):
    op()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(LOOP):
        op()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / LOOP * 1e6


def with_torch(x):
    want = x.clone()
    fd, path = tempfile.mkstemp()
    os.close(fd)
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        dist.all_reduce(x)
        out = {"eager_device_us": device_us(lambda: dist.all_reduce(x))}
        exact = torch.equal(x, want)
        y = x.clone()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dist.all_reduce(y)  # NCCL's own warm-up on this stream, outside the capture
            with torch.cuda.graph(g, stream=s):
                for _ in range(GRAPH_OPS):
                    dist.all_reduce(y)
        torch.cuda.current_stream().wait_stream(s)
        g.replay()
        out["graph_device_us_per_op"] = device_us(g.replay, max(5, REPS // 5)) / GRAPH_OPS
        out["loop_host_us"] = loop_us(lambda: dist.all_reduce(x))
        exact = exact and torch.equal(x, want) and torch.equal(y, want)
        out["exact"] = bool(exact)
        return out
    finally:
        dist.destroy_process_group()
        if os.path.exists(path):  # (the file store removes it itself once every rank has left)
            os.unlink(path)


def libnccl_path():
    """The libnccl.so.2 this process already has (torch's), else the nvidia-nccl wheel's."""
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("libnccl.so.2"):
            return line.split()[-1]
    import nvidia.nccl

    return os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2")


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def with_ctypes(x):
    nccl = ctypes.CDLL(libnccl_path())  # each attribute below is a dlsym on this handle
    uid, comm = UniqueId(), ctypes.c_void_p()
    assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    want = x.clone()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    allreduce = nccl.ncclAllReduce
    allreduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_void_p, ctypes.c_void_p]

    def op():
        assert allreduce(x.data_ptr(), x.data_ptr(), x.numel(), 2, 0, comm, stream) == 0  # ncclInt32, ncclSum

    try:
        op()
        out = {"eager_device_us": device_us(op), "loop_host_us": loop_us(op)}
        torch.cuda.synchronize()
        out["exact"] = bool(torch.equal(x, want))
        return out
    finally:
        nccl.ncclCommDestroy(comm)


def main():
    torch.manual_seed(0)
    x = torch.randint(-(1 << 20), 1 << 20, (COUNT,), dtype=torch.int32, device="cuda")
    print(json.dumps({"bytes": COUNT * 4, "torch": with_torch(x.clone()), "ctypes": with_ctypes(x.clone())}))


if __name__ == "__main__":
    main()
