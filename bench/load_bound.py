"""The native loader's bound on this host: its reads and its copies at once, with nothing tying one to the other.

    python3 bench/load_bound.py DIR [--readers 14] [--streams 14] [--chunk-mib 4] [--repeat 3]

The loader (CC off) reads every byte of the checkpoint from the page cache into pinned staging with READERS
threads and has one thread issue the staging's copies over as many streams. Both share the host's memory: the
page cache is read from DRAM while the DMA reads staging. Here the same work runs without the loader's
coupling (no reader waits for a copy, no copy for a read), alone and then both at once:

  reads   READERS threads pread the files in CHUNK pieces, claimed in order, each into two buffers of its own
  copies  one thread copies CHUNK pieces of pinned memory to the GPU over STREAMS streams, as many bytes
          (ccbridge.bindings.core.Session.copy: the probe's copy loop)

The slower of the two when run at once bounds the loader's time for these bytes on this host (a loader cannot
do both jobs faster than they go with no waits between them); `ccbridge load --bench` set beside it tells how
close the loader comes. Printed per repeat: GB/s of each alone and of each at once.
"""

import argparse
import glob
import itertools
import os
import statistics
import threading
import time

from ccbridge.bindings import core

MiB = 1 << 20


def chunks(folder: str, chunk: int) -> list[tuple[str, int, int]]:
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        size = os.path.getsize(path)
        out += [(path, o, min(chunk, size - o)) for o in range(0, size, chunk)]
    return out


def reads(work: list[tuple[str, int, int]], readers: int, chunk: int) -> float:
    """Seconds for `readers` threads to pread every chunk (claimed in order) into buffers of their own."""
    fds = {p: os.open(p, os.O_RDONLY) for p in {w[0] for w in work}}
    claim = itertools.count()

    def run():
        bufs = [bytearray(chunk), bytearray(chunk)]
        k = 0
        while (i := next(claim)) < len(work):
            path, off, n = work[i]
            os.preadv(fds[path], [memoryview(bufs[k])[:n]], off)
            k ^= 1

    t0 = time.perf_counter()
    ts = [threading.Thread(target=run) for _ in range(readers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return dt


def copies(s: core.Session, nbytes: int, chunk: int, streams: int) -> float:
    out, _ = s.copy("h2d", chunk, max(1, nbytes // chunk), nstreams=streams)
    return out.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--readers", type=int, default=14)
    ap.add_argument("--streams", type=int, default=14)
    ap.add_argument("--chunk-mib", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    chunk = a.chunk_mib * MiB
    work = chunks(a.folder, chunk)
    if not work:
        raise SystemExit(f"no *.safetensors under {a.folder}")
    total = sum(w[2] for w in work)
    print(f"{total / 1e9:.2f} GB in {len(work)} chunks of {a.chunk_mib} MiB; {a.readers} readers, "
          f"{a.streams} streams; {os.cpu_count()} CPUs")
    reads(work, a.readers, chunk)  # warm the page cache
    rows = {"reads alone": [], "copies alone": [], "reads at once": [], "copies at once": [], "both at once": []}
    with core.Session(0, "pinned", chunk, nstreams=a.streams) as s:
        copies(s, 64 * chunk, chunk, a.streams)  # warm
        for r in range(a.repeat):
            rows["reads alone"].append(total / reads(work, a.readers, chunk))
            rows["copies alone"].append(total / copies(s, total, chunk, a.streams))
            got = {}
            t0 = time.perf_counter()
            c = threading.Thread(target=lambda: got.update(copies=copies(s, total, chunk, a.streams)))
            c.start()
            got["reads"] = reads(work, a.readers, chunk)
            c.join()
            both = time.perf_counter() - t0
            rows["reads at once"].append(total / got["reads"])
            rows["copies at once"].append(total / got["copies"])
            rows["both at once"].append(total / both)
            print(f"repeat {r}: " + ", ".join(f"{k} {v[-1] / 1e9:.2f}" for k, v in rows.items()) + " GB/s", flush=True)
    print("median GB/s: " + ", ".join(f"{k} {statistics.median(v) / 1e9:.2f}" for k, v in rows.items()))


if __name__ == "__main__":
    main()
