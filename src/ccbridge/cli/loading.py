"""Checkpoints: loading one through ccbridge's pool (or benchmarking loaders on it), and making a synthetic one."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ccbridge import env, ui
from ccbridge.cli.args import command, device_spec, integer, size
from ccbridge.cli.reports import wrote
from ccbridge.errors import UsageError
from ccbridge.load import bench, benchresult, bound, checkpoint, loader, synth
from ccbridge.load.engine import MAX_BUFS, MAX_WORKERS  # the pool's own limits, refused before it sees them
from ccbridge.textfit import fit, wrap


def cmd_load(args) -> int:
    if not args.bench and (args.json or args.ceiling):
        raise UsageError("--json and --ceiling go with --bench")
    if args.bound and not args.bench:
        raise UsageError("--bound goes with --bench")
    if args.bound and args.device == "cpu":
        raise UsageError(bound.HOST_NO_BOUND)
    if args.json:
        ui.writable_file(args.json, "--json")
    checkpoint.resolve(args.paths)  # the paths exist and none is given twice, before torch is imported
    ceiling = bench.probe_ceiling(args.ceiling) if args.ceiling else None
    try:
        import torch  # noqa: F401 - deferred: torch, only asked whether it is installed
    except ImportError:
        print("ccbridge load: needs torch (pip install torch)", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in dict(workers=args.workers, contexts=args.contexts, staging=args.staging,
                                       chunk_bytes=args.chunk, buffers=args.buffers).items() if v is not None}
    label = env.emulated_banner(env.emulation_info())
    if label:
        print(f"ccbridge load: {label}", file=sys.stderr)
    if args.bench:
        stamp, t0 = env.stamp() if args.json else None, time.perf_counter()  # the stamp: the run's start

        def save(rep: dict, early: bool = False) -> None:  # early: before the bound, which may not finish
            rep.update(emulation=label, ceiling_gbps=ceiling)
            # a Result of kind load, as every bench writes; a stream (a pipe, /dev/stdout) gets the final one only:
            # the early one would stand before it, two documents that no JSON reader parses
            if args.json and not (early and ui.is_stream(args.json)):
                benchresult.to_result(rep, stamp, time.perf_counter() - t0).save(Path(args.json))
                if early:
                    print(fit(f"ccbridge load: the loaders' results written to {args.json} before the bound runs"),
                          file=sys.stderr)

        rep = bench.run(args.paths, args.device, args.repeat, overrides,
                        log=lambda m: print(fit(f"ccbridge load: {m}"), file=sys.stderr), with_bound=args.bound,
                        before_bound=lambda r: save(r, early=True))
        save(rep)
        print(fit(bench.render(rep, ceiling)))
        if args.json:
            print(wrote(args.json), file=sys.stderr)
        if rep.get("error"):
            print(fit(f"ccbridge load: {rep['error']}"), file=sys.stderr)
            return 1
        return 0
    st = loader.LoadStats()
    with ui.bytes_progress("loading") as advance:
        got = loader.load_safetensors(args.paths, args.device, stats=st, progress=advance, **overrides)
    st.join_teardown()
    print("\n".join(wrap([
        f"{st.tensors} tensors from {st.files} files, {st.bytes / 1e9:.2f} GB to {args.device} in {st.total_s:.2f} s: "
        f"{st.gbps:.2f} GB/s ({st.load_gbps:.2f} GB/s from the load's start, the pool warm)" + (f" [{label}]" if label else ""),
        f"pool: {st.why}",
        f"stages: headers {st.headers_s:.3f} s, allocation {st.alloc_s:.3f} s (beside the data), pool prewarm {st.prewarm_s:.3f} s "
        f"(waited {st.prewarm_wait_s:.3f} s), data {st.load_s:.3f} s (per worker: read {st.read_s:.3f} s, "
        f"copy {st.copy_s:.3f} s), teardown {st.teardown_s or 0:.3f} s (in the background)"])))
    del got
    return 0


def cmd_make_checkpoint(args) -> int:
    with ui.count_progress("writing shards") as step:
        files = synth.make_checkpoint(args.out, args.size, args.shard_size, seed=args.seed, progress=step)
    written = sum(Path(f).stat().st_size for f in files)
    print(f"wrote {len(files)} shard{'s' * (len(files) != 1)}, {written / 2**30:.2f} GiB, and "
          f"model.safetensors.index.json to {args.out}")
    return 0


def add_parsers(sub) -> None:
    p = command(sub, "load", cmd_load,
                help="load safetensors to the GPU through ccbridge's pool; --bench compares loaders")
    p.add_argument("paths", nargs="+", help=".safetensors files, a checkpoint directory or its index json")
    p.add_argument("--device", type=device_spec, default="cuda:0", help="cuda, cuda:N or cpu (default cuda:0)")
    p.add_argument("--bench", action="store_true", help="compare with safetensors and fastsafetensors on the same files")
    p.add_argument("--repeat", type=integer(1), default=3, help="with --bench: loads per loader (default 3)")
    p.add_argument("--ceiling", help="with --bench: a probe result.json whose best multi-worker H2D is the ceiling")
    p.add_argument("--json", help="with --bench: write the full report here, a result (kind load) as "
                   "every bench writes")
    p.add_argument("--bound", action="store_true", help="with --bench: then time the loader's reads and copies at "
                   "once, nothing coupling them (its bound on this host), in the pool's shape")
    p.add_argument("--workers", type=integer(1, MAX_WORKERS), help="worker threads (default: by CC state or emulation profile)")
    p.add_argument("--contexts", type=integer(0, MAX_WORKERS), help="contexts of the pool's own; 0 = the primary context")
    p.add_argument("--staging", choices=["pinned", "pageable"], help="host staging buffers")
    p.add_argument("--chunk", type=size, help="bytes per read and copy, e.g. 16MiB")
    p.add_argument("--buffers", type=integer(1, MAX_BUFS), help="staging buffers per worker")

    p = command(sub, "make-checkpoint", cmd_make_checkpoint,
                help="write a synthetic large-model checkpoint of random bytes")
    p.add_argument("out", help="output directory")
    p.add_argument("--size", type=size, default="32GiB", help="total size (default 32GiB)")
    p.add_argument("--shard-size", type=size, default="4GiB", help="shard size (default 4GiB)")
    p.add_argument("--seed", type=integer(0), default=0, help="seed of the random bytes: the same seed and sizes "
                   "write the same checkpoint (default 0)")
