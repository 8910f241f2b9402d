"""The native loader's bound on this host: its reads and its copies at once, with nothing tying one to the other.

    python3 bench/load_bound.py DIR [--readers N] [--streams N] [--chunk-mib 4] [--repeat 3]
                                    [--contexts K] [--staging pinned|pageable]

A command line over ccbridge.load.bound, the measurement `ccbridge load DIR --bench --bound` runs after its
loaders (that module's docstring says what is timed). The shape is the loader pool's plan for device 0, as
`ccbridge load` makes it (--contexts and --staging override the plan as there); --readers, --streams and
--chunk-mib override the bound's shape alone. CC off on a 16-core host the plan is 14 workers on the primary
context with 4 MiB pinned chunks: 14 readers, one thread copying over 14 streams, as the earlier script's
defaults. Printed per repeat: GB/s of each alone and of each at once; then their medians.
"""

import argparse
import os
import sys

from ccbridge.errors import CCBridgeError
from ccbridge.load import bound, checkpoint, policy

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--readers", type=int, help="reader threads (default: the plan's workers)")
    ap.add_argument("--streams", type=int, help="copy streams, one per copying worker (default: the plan's workers)")
    ap.add_argument("--chunk-mib", type=int, help="chunk in MiB (default: the plan's)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--contexts", type=int, help="the plan's contexts (0: the primary context)")
    ap.add_argument("--staging", choices=["pinned", "pageable"], help="the plan's staging")
    a = ap.parse_args()
    try:
        files, _, _ = checkpoint.resolve([a.folder])
        overrides = {k: v for k, v in dict(contexts=a.contexts, staging=a.staging).items() if v is not None}
        plan = policy.for_device(0, **overrides)
        shape = bound.shape_of(plan.config, a.readers, a.streams, a.chunk_mib and a.chunk_mib * MiB)
        work = bound.chunks(files, shape.chunk)
        total = sum(w[2] for w in work)
        print(f"{total / 1e9:.2f} GB in {len(work)} chunks of {shape.chunk / MiB:g} MiB; {shape.readers} readers, "
              f"{shape.streams} streams; {os.cpu_count()} CPUs")
        print(bound.shape_line(shape.describe()))
        got = bound.measure(files, shape, a.repeat,
                            each=lambda r, f: print(f"repeat {r}: {bound.figures_line(f)}", flush=True))
    except CCBridgeError as e:
        sys.exit(f"load_bound: {e}")
    print("median GB/s: " + bound.figures_line(got["gbps"])[:-len(" GB/s")])


if __name__ == "__main__":
    main()
