"""A rank of a multi-process job for account's CPU test (tests/test_account_ranks_cpu.py): the interposer over its
fake driver and a fake libnccl, in a process started by ccbridge.ranks (gloo group). Importable by the ranks."""

import ctypes
import os
import time

c_p, c_int, c_sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
INT32, SUM = 2, 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def job(rank, n, dev, send, lib, nccl, config, startup_s, steps, captured):
    """start-up (sleep), then between marks: steps of one eager all-reduce, a synchronize that waits for it, and one
    launch of a graph that captured `captured` all-reduces."""
    import torch.distributed as dist

    # every all-reduce waits for the last rank, as a real one does (the fake libnccl's rendezvous, a file a job)
    prefix = dict(kv.split("=", 1) for kv in config.split())["trace"]  # its folder: not a name the traces match
    os.environ["FAKE_NCCL_RENDEZVOUS"] = os.path.join(os.path.dirname(prefix), "rendezvous-" + os.path.basename(prefix))
    L = ctypes.CDLL(lib)
    err = ctypes.create_string_buffer(256)
    assert L.ccbemu_test_init(config.encode(), err, 256) == 0, err.value
    F = ctypes.CDLL(nccl)
    for name in ("ccbemu_fake_alloc", "ccbemu_fake_stream", "ccbemu_fake_graph"):
        getattr(L, name).restype = c_p
    L.ccbemu_fake_alloc.argtypes = [c_sz, c_int]
    L.ccbemu_fake_capture.argtypes = [c_p, c_int]
    L.ccbemu_fake_graph.argtypes = [c_p]
    L.ccbemu_mark.argtypes = [ctypes.c_char_p]
    L.dlsym.restype, L.dlsym.argtypes = c_p, [c_p, ctypes.c_char_p]
    L.cuStreamSynchronize.argtypes = [c_p]
    L.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(c_p), c_p, ctypes.c_uint64]
    L.cuGraphLaunch.argtypes = [c_p, c_p]
    ar = ctypes.CFUNCTYPE(c_int, c_p, c_p, c_sz, c_int, c_int, c_p, c_p)(L.dlsym(F._handle, b"ncclAllReduce"))
    comm = c_p()
    assert F.ncclCommInitRank(ctypes.byref(comm), n, UniqueId(), rank) == 0
    s, buf = L.ccbemu_fake_stream(), L.ccbemu_fake_alloc(256, 2)
    time.sleep(startup_s)  # a model build: outside the window
    L.ccbemu_fake_capture(s, 1)
    for _ in range(captured):
        assert ar(buf, buf, 16, INT32, SUM, comm, s) == 0
    L.ccbemu_fake_capture(s, 0)
    exe = c_p()
    assert L.cuGraphInstantiateWithFlags(ctypes.byref(exe), L.ccbemu_fake_graph(s), 0) == 0
    dist.barrier()
    L.ccbemu_mark(b"begin")
    for _ in range(steps):
        assert ar(buf, buf, 16, INT32, SUM, comm, s) == 0
        assert L.cuStreamSynchronize(s) == 0
        assert L.cuGraphLaunch(exe, s) == 0
    L.ccbemu_mark(b"end")
    L.ccbemu_trace_flush()
    return os.getpid()
