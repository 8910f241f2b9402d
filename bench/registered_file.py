"""Can the GPU read a checkpoint straight from the page cache, with no CPU copy?

    python3 bench/registered_file.py DIR [--threads 4 8 14] [--chunk-mib 64] [--repeat 3]

The native loader (CC off) is host bound: its readers copy every byte from the page cache into pinned
staging (bench/RESULTS.md, 2026-11-27 session 19: 14 of 16 cores busy at 0.85-0.89 of the H2D ceiling).
Here each *.safetensors file under DIR (warm in the page cache) is mapped read-only, and threads register
CHUNK pieces of the mapping with cuMemHostRegister(READ_ONLY) (which pins the page-cache pages), copy them
to one device buffer with cuMemcpyHtoDAsync on a stream of their own, wait, and unregister. Printed per
thread count: GB/s over the whole pass, the CPU cores it kept busy, and the seconds the threads spent in
register / copy wait / unregister (summed over threads). Bytes are checked: the first and last 4 KiB of
every file against os.pread, copied back from the device.

This is the experiment, not the loader: under CC a registered page-cache page cannot be read by the GPU
(private memory), so it could serve only the CC-off path.
"""

import argparse
import ctypes
import glob
import os
import threading
import time

import torch

from ccbridge.load import engine

MiB = 1 << 20
READ_ONLY = 8  # CU_MEMHOSTREGISTER_READ_ONLY
ATTR_RO_REGISTER = 113  # CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED

cu = ctypes.CDLL("libcuda.so.1")
for name, args in {"cuMemHostRegister_v2": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint],
                   "cuMemHostUnregister": [ctypes.c_void_p],
                   "cuMemcpyHtoDAsync_v2": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
                   "cuMemcpyDtoH_v2": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t],
                   "cuStreamCreate": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint],
                   "cuStreamSynchronize": [ctypes.c_void_p], "cuStreamDestroy_v2": [ctypes.c_void_p],
                   "cuCtxGetCurrent": [ctypes.POINTER(ctypes.c_void_p)], "cuCtxSetCurrent": [ctypes.c_void_p],
                   "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]}.items():
    getattr(cu, name).argtypes = args


def check(rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(f"{what}: CUDA error {rc}")


def map_files(folder: str) -> list[tuple[str, int, int]]:
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        try:
            addr = engine.map_file(fd, size)  # the loader's own read-only shared mapping (mapped staging's)
        finally:
            os.close(fd)
        out.append((path, addr, size))
    return out


def one_pass(ctx, files, dst: int, threads: int, chunk: int) -> dict:
    work, off = [], 0
    for _, addr, size in files:
        for o in range(0, size, chunk):
            work.append((addr + o, min(chunk, size - o), dst + off + o))
        off += size
    lock, spent, errors = threading.Lock(), {"register": 0.0, "wait": 0.0, "unregister": 0.0}, []

    def run():
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        s = ctypes.c_void_p()
        check(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        mine = {"register": 0.0, "wait": 0.0, "unregister": 0.0}
        try:
            while True:
                with lock:
                    if not work:
                        break
                    src, n, d = work.pop(0)
                    if errors:
                        break
                t0 = time.perf_counter()
                check(cu.cuMemHostRegister_v2(src, n, READ_ONLY), "cuMemHostRegister(READ_ONLY)")
                t1 = time.perf_counter()
                check(cu.cuMemcpyHtoDAsync_v2(d, src, n, s), "cuMemcpyHtoDAsync")
                check(cu.cuStreamSynchronize(s), "cuStreamSynchronize")
                t2 = time.perf_counter()
                check(cu.cuMemHostUnregister(src), "cuMemHostUnregister")
                t3 = time.perf_counter()
                mine["register"] += t1 - t0
                mine["wait"] += t2 - t1
                mine["unregister"] += t3 - t2
        except RuntimeError as e:
            errors.append(str(e))
        finally:
            cu.cuStreamDestroy_v2(s)
            with lock:
                for k, v in mine.items():
                    spent[k] += v

    cpu0, t0 = time.process_time(), time.perf_counter()
    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(errors[0])
    return {"gbps": off / wall / 1e9, "wall": wall, "cores": (time.process_time() - cpu0) / wall, **spent}


def verify(files, dst: int) -> None:
    off = 0
    for path, _, size in files:
        fd = os.open(path, os.O_RDONLY)
        for o in sorted({0, max(0, size - 4096)}):
            n = min(4096, size - o)
            back = ctypes.create_string_buffer(n)
            check(cu.cuMemcpyDtoH_v2(back, dst + off + o, n), "cuMemcpyDtoH")
            if back.raw != os.pread(fd, n, o):
                raise SystemExit(f"bytes differ: {path} at {o}")
        os.close(fd)
        off += size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 8, 14])
    ap.add_argument("--chunk-mib", type=int, nargs="+", default=[64])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    files = map_files(a.folder)
    if not files:
        raise SystemExit(f"no *.safetensors under {a.folder}")
    total = sum(f[2] for f in files)
    dst_t = torch.empty(total + 4096, dtype=torch.uint8, device="cuda:0")
    ctx = ctypes.c_void_p()
    check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    ok = ctypes.c_int()
    check(cu.cuDeviceGetAttribute(ctypes.byref(ok), ATTR_RO_REGISTER, 0), "cuDeviceGetAttribute")
    print(f"{len(files)} files, {total / 1e9:.2f} GB; read-only host register supported: {ok.value}")
    for path, _, size in files:  # warm the page cache
        with open(path, "rb") as f:
            while f.read(64 * MiB):
                pass
    for chunk in a.chunk_mib:
        for threads in a.threads:
            for r in range(a.repeat):
                x = one_pass(ctx, files, dst_t.data_ptr(), threads, chunk * MiB)
                print(f"chunk {chunk:>4} MiB threads {threads:>3} pass {r}: {x['gbps']:6.2f} GB/s, cores "
                      f"{x['cores']:4.1f}, s in register {x['register']:.2f} wait {x['wait']:.2f} "
                      f"unregister {x['unregister']:.2f} (wall {x['wall']:.2f})", flush=True)
            verify(files, dst_t.data_ptr())
    for _, addr, size in files:
        engine.unmap_file(addr, size)


if __name__ == "__main__":
    main()
