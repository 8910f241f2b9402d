"""The host's memory copy rate on N threads: how many bytes a second memcpy moves when every core copies.

    python3 bench/memcopy_rate.py [--threads 1 8 16] [--mib 256] [--seconds 2]

Each thread copies its own buffer (MIB MiB, past the CPU's caches) into another, again and again, through
ctypes.memmove (glibc's memcpy; ctypes lets go of the GIL for the call). GB/s is bytes copied; the memory
traffic is twice that (each byte read once and written once). Beside `ccbridge bench net` it says whether
the host's memory bandwidth can carry what the net plugin's copies and ciphers move (bench/RESULTS.md).
"""

import argparse
import ctypes
import threading
import time


def rate(threads: int, nbytes: int, seconds: float) -> float:
    bufs = [(ctypes.create_string_buffer(nbytes), ctypes.create_string_buffer(nbytes)) for _ in range(threads)]
    for a, b in bufs:  # fault the pages in before the clock
        ctypes.memset(a, 1, nbytes)
        ctypes.memset(b, 2, nbytes)
    copied = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = time.perf_counter() + 1e9

    def run(i: int) -> None:
        a, b = bufs[i]
        start.wait()
        while time.perf_counter() < stop:
            ctypes.memmove(b, a, nbytes)
            copied[i] += nbytes

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    stop = t0 + seconds
    start.wait()
    for t in ts:
        t.join()
    return sum(copied) / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    for n in a.threads:
        gbps = rate(n, a.mib << 20, a.seconds)
        print(f"memcpy, {n:2d} threads x {a.mib} MiB: {gbps:6.2f} GB/s copied ({2 * gbps:6.2f} GB/s of memory traffic)")


if __name__ == "__main__":
    main()
