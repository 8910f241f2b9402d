"""Pool shapes against each other on one checkpoint: median GB/s of prewarmed loads.

    python3 bench/load_sweep.py CKPT... --shapes SHAPE[,SHAPE...] > sweep.json
    SHAPE: staging:workers:contexts:chunk_mib[:buffers], e.g. pinned:16:0:16:2

Each shape gets a prewarmed pool and `--repeat` loads (the page cache warmed
first); gbps is from submit to the last tensor (the allocation it overlaps included), call_gbps over the whole call;
per-worker read and copy time show which side limits; cores is the
process's CPU time (all threads, the emulator's included) over the calls' time. Under
`ccbridge run --profile ...` the figures are EMULATED.
"""

import argparse
import json
import resource
import statistics
import sys

import torch

from ccbridge import env
from ccbridge.load import LoadStats, Pool, PoolConfig, checkpoint, load_safetensors
from ccbridge.load.bench import warm_page_cache


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt", nargs="+")
    ap.add_argument("--shapes", default="pinned:8:0:16,pinned:16:0:16,pinned:16:0:8")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    files, _, _ = checkpoint.resolve(a.ckpt)
    warm_page_cache(files)
    out = {"emulation": env.emulation_info().get("profile"), "gpu": torch.cuda.get_device_name(0), "shapes": []}
    for spec in a.shapes.split(","):
        staging, w, c, mib, *b = spec.split(":")
        cfg = PoolConfig(0, int(w), int(c), staging, int(mib) << 20, int(b[0]) if b else 2)
        row = {"shape": spec}
        try:
            with Pool(cfg) as pool:
                row["prewarm_s"] = pool.ready()
                runs = []
                cpu0 = resource.getrusage(resource.RUSAGE_SELF)
                for _ in range(a.repeat):
                    st = LoadStats()
                    got = load_safetensors(files, "cuda:0", pool=pool, stats=st)
                    st.join_teardown()
                    del got
                    torch.cuda.empty_cache()
                    runs.append(st)
                cpu1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu_s = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
                row["cores"] = cpu_s / sum(s.total_s for s in runs)  # CPU time of every thread (emulator's too) over the calls
                row["gbps"] = statistics.median(s.load_gbps for s in runs)
                row["call_gbps"] = statistics.median(s.gbps for s in runs)
                row["read_s"] = statistics.median(s.read_s for s in runs)
                row["copy_s"] = statistics.median(s.copy_s for s in runs)
                row["load_s"] = statistics.median(s.load_s for s in runs)
                row["unmap_s"] = statistics.median(s.unmap_s or 0.0 for s in runs)
            row["teardown_s"] = pool.teardown_s
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(row), file=sys.stderr)
        out["shapes"].append(row)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
