"""The native loader's bound on this host: its reads and its copies at once, with nothing tying one to the other.

    python3 bench/load_bound.py DIR [--readers N] [--streams N] [--chunk-mib 4] [--repeat 3]
                                    [--contexts K] [--staging pinned|pageable]

A command line over ccbridge.load.bound, the measurement `ccbridge load DIR --bench --bound` runs after its
loaders (that module's docstring says what is timed). The shape is the loader pool's plan for device 0, as
`ccbridge load` makes it (--contexts and --staging override the plan as there); --readers, --streams and
--chunk-mib override the bound's shape alone. CC off on a 16-core host the plan is 14 workers on the primary
context with 4 MiB pinned chunks: 14 readers, one thread copying over 14 streams, as the earlier script's
defaults. Printed: the bound's shape; per repeat (from 1) GB/s of each alone and of each at once; then the bytes
and chunks measure() timed, and the figures' medians and best repeats (both at once's best is the bound).
"""

import argparse
import os
import sys

from ccbridge.errors import CCBridgeError, UsageError
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
        got = bound.measure(files, shape, a.repeat, log=lambda m: print(m, flush=True),
                            each=lambda r, f: print(f"bound {r + 1}/{a.repeat}: {bound.figures_line(f)}", flush=True))
    except UsageError as e:  # bad input: one line, exit 2 (as argparse's own)
        print(f"load_bound: {e}", file=sys.stderr)
        sys.exit(2)
    except CCBridgeError as e:
        sys.exit(f"load_bound: {e}")
    print(f"{got['bytes'] / 1e9:.2f} GB in {got['chunks']} chunks of {shape.chunk / MiB:g} MiB (copies "
          f"{got['copy_bytes'] / 1e9:.2f} GB); {shape.readers} readers, {shape.streams} streams; {os.cpu_count()} CPUs")
    print("median GB/s: " + bound.figures_line(got["gbps"])[:-len(" GB/s")])
    print("best GB/s: " + bound.figures_line(got["best"])[:-len(" GB/s")])


if __name__ == "__main__":
    main()
