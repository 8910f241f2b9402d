"""Independent check of the probe's pinned H2D/D2H figures: a plain CUDA-event-timed torch loop.

It shares no code with ccbridge's native core, so agreement between the two
says the probe measures the link and not itself.
    python3 bench/copy_check.py [--device N] [--bytes 1073741824] [--reps 10]
"""

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dev = torch.device("cuda", a.device)
    host = torch.randint(0, 255, (a.bytes,), dtype=torch.uint8).pin_memory()
    gpu = torch.empty(a.bytes, dtype=torch.uint8, device=dev)
    out = {"bytes": a.bytes, "device": torch.cuda.get_device_name(dev)}
    for name, fn in (("h2d", lambda: gpu.copy_(host, non_blocking=True)),
                     ("d2h", lambda: host.copy_(gpu, non_blocking=True))):
        for _ in range(2):
            fn()
        torch.cuda.synchronize(dev)
        samples = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(a.reps):
                fn()
            e.record()
            e.synchronize()
            samples.append(a.bytes * a.reps / (s.elapsed_time(e) * 1e-3) / 1e9)
        out[name + "_GBps"] = sorted(samples)[len(samples) // 2]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
