"""nccl-tests style tables of plaintext and encrypted collectives."""

from __future__ import annotations

from pathlib import Path

from ccbridge.choices import SECURE_DTYPES
from ccbridge.cli.args import command, integer, size
from ccbridge.cli.checks import gpus_ready, named_key, plugin_built, sizes_in_order
from ccbridge.errors import UsageError
from ccbridge.textfit import fit


def cmd_collectives(args) -> int:
    if args.net and (args.backend != "nccl" or args.transport != "default"):
        raise UsageError("--net compares NCCL's own transports: it takes neither --backend gloo nor --transport")
    if args.transport != "default" and args.backend != "nccl":
        raise UsageError(f"--transport {args.transport} picks NCCL's transport: it goes with --backend nccl")
    if args.net:
        plugin_built()
    named_key()  # the plugin's, or ccbridge.secure's: the ranks read it
    sizes_in_order(args)
    # Gloo runs on CPU ranks too (not with --net or --transport: they are NCCL's)
    gloo = " (without one: --backend gloo, CPU ranks)" if not args.net and args.transport == "default" else ""
    if not gpus_ready("collectives", args.json, cpu_ok=args.backend == "gloo", without_gpu=gloo):
        return 2
    import torch  # deferred: torch, which secure.bench imports (gpus_ready checked it is there)

    from ccbridge.secure import bench, benchrows  # deferred: torch

    n = bench.nranks(args.ngpus, args.backend)
    bench.sizes(args.op, args.minbytes, args.maxbytes, args.stepfactor, args.dtype, n)  # they fit: before the header
    ranks = "GPUs" if torch.cuda.is_available() else "CPU ranks"
    transport = "sockets vs ccbridge net plugin" if args.net else args.transport
    how = "; each encrypted op ends with a host wait" if args.net is None else ""
    iters = f"{args.iters} iteration{'s' if args.iters != 1 else ''}"
    print(fit(f"# ccbridge collectives: {args.op} on {n} {ranks}, backend {args.backend}, transport {transport}, "
              f"{iters}{how}; #wrong: elements differing from the exact result"), flush=True)
    res = bench.collectives(args.op, args.minbytes, args.maxbytes, args.stepfactor, args.dtype,
                            args.iters, args.warmup, n, args.backend, args.transport, args.net)
    # rank 0 printed each size's row as it came (nccl-tests' way); --net's passes printed one transport each,
    # so their rows side by side follow, as they do where no progress was shown
    if args.net or not bench.rows_shown():
        if args.net:
            print(fit(f"# both transports side by side; NCCL's log showed networks {res.settings['nets']}"))
        print(benchrows.render_collectives(benchrows.collectives_rows(res), encrypted=res.settings["encrypted"]))
    if args.json:
        res.save(Path(args.json))
    return 1 if benchrows.wrong_elements(res) else 0


def add_parsers(sub) -> None:
    what = "nccl-tests style table: plaintext vs encrypted collectives (spawns one rank per GPU)"
    p = command(sub, "collectives", cmd_collectives, help=what, description=f"An {what}.")
    p.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter", "broadcast"],
                   help="the collective (default all_reduce)")
    p.add_argument("-b", "--minbytes", type=size, default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=size, default="256M", help="largest size (default 256M)")
    p.add_argument("-f", "--stepfactor", type=integer(2), default=2, help="size multiplier, at least 2 (default 2)")
    p.add_argument("-d", "--dtype", default="float", choices=list(SECURE_DTYPES),
                   help="element type, as nccl-tests' -d (default float)")
    p.add_argument("-n", "--iters", type=integer(1), default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup", type=integer(0), default=5, help="untimed iterations per size first (default 5)")
    p.add_argument("-g", "--ngpus", type=integer(2), help="ranks, at least 2 (default: every GPU)")
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"],
                   help="nccl (default: a GPU per rank) or gloo (ranks share the GPUs, or run on the CPU where there "
                        "is none: two unless -g, at most 4 a CPU)")
    p.add_argument("--transport", default="default", choices=["default", "sockets"],
                   help="sockets: NCCL without P2P or shared memory, a stand-in for crossing nodes")
    p.add_argument("--net", choices=["ccbridge"],
                   help="compare NCCL's plaintext socket transport with NCCL on the ccbridge net plugin "
                        "(both without P2P or shared memory) instead of with ccbridge.secure")
    p.add_argument("--json", help="write the rows here: a result file `ccbridge compare` reads")
