"""Benchmarks of the encryption (ddp, cipher, net) and of serving under it (decode, kv)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ccbridge import ui
from ccbridge.choices import DDP_MODELS, DECODE_MODES, DECODE_PRESETS
from ccbridge.cli.args import checked, command, device_spec, float_ge0, integer, size
from ccbridge.cli.checks import plugin_built, secure_ready
from ccbridge.errors import UsageError


# bench kv's own options (None when not given), refused by every other benchmark.
KV_OPTIONS = {"prefixes": "--prefixes", "prefix_len": "--prefix-len", "suffix_len": "--suffix-len",
              "requests": "--requests", "thresholds": "--thresholds", "zipf": "--zipf",
              "device_blocks": "--device-blocks", "gpu_fraction": "--gpu-fraction", "churn": "--churn"}


# The other benchmarks' own options (None when not given) and the benchmarks that read them: any other
# refuses them rather than run without them.
BENCH_OPTIONS = {"models": ("--models", ("ddp",)), "ngpus": ("--ngpus", ("ddp",)), "buckets": ("--buckets", ("ddp",)),
                 "net": ("--net", ("ddp",)), "wrap": ("--wrap", ("ddp",)), "lanes": ("--lanes", ("net",)),
                 "inflight": ("--inflight", ("net",)), "total": ("--total", ("net",)),
                 "minbytes": ("-b/--minbytes", ("cipher", "net")), "maxbytes": ("-e/--maxbytes", ("cipher", "net")),
                 "warmup": ("--warmup", ("ddp", "decode", "kv")), "seed": ("--seed", ("decode", "kv")),
                 "host_prep_us": ("--host-prep-us", ("decode",)), "tp": ("--tp", ("decode",))}
# list options whose values each make a row or a run: one given twice would make two rows of one key
BENCH_LISTS = {"models": "--models", "ngpus": "--ngpus", "buckets": "--buckets", "lanes": "--lanes",
               "batch": "--batch", "modes": "--modes", "thresholds": "--thresholds", "tp": "--tp"}


def cmd_bench(args) -> int:
    given_kv = [flag for name, flag in KV_OPTIONS.items() if getattr(args, name) is not None]
    if args.what != "kv" and given_kv:
        raise UsageError(f"{given_kv[0]} goes with `bench kv`")
    for name, (flag, whats) in BENCH_OPTIONS.items():
        if getattr(args, name) is not None and args.what not in whats:
            raise UsageError(f"{flag} goes with " + " or ".join(f"`bench {w}`" for w in whats))
    for name, flag in BENCH_LISTS.items():
        values = getattr(args, name) or []
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise UsageError(f"{flag} {twice[0]} is given twice")
    defaults = {"models": list(DDP_MODELS), "ngpus": [2, 4], "buckets": [25, 100, 400, 800], "wrap": "ddp",
                "lanes": [1, 2, 4, 8], "inflight": 8, "total": size("2G"), "seed": 0}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.what == "decode":
        return _bench_decode(args)
    if args.what == "kv":
        return _bench_kv(args)
    if args.graphs or args.model or args.batch or args.modes or args.device or args.prompt or args.output or \
            args.checkpoint is not None:
        raise UsageError("--model, --checkpoint, --batch, --prompt, --output, --modes, --graphs and --device go with "
                         "`bench decode` (--model, --modes and --device also with `bench kv`)")
    args.warmup = 3 if args.warmup is None else args.warmup
    default = {"net": ("64K", "4M"), "cipher": ("1M", "1G"), "ddp": ("1M", "1G")}[args.what]
    args.iters = args.iters or (3 if args.what == "net" else 10)
    args.minbytes = size(default[0]) if args.minbytes is None else args.minbytes
    args.maxbytes = size(default[1]) if args.maxbytes is None else args.maxbytes
    if args.what == "net":
        return _bench_net(args)
    if args.wrap == "fsdp" and (args.what != "ddp" or not args.net):
        raise UsageError("--wrap fsdp goes with `bench ddp --net ccbridge` (ccbridge.secure's hook is for DDP)")
    if args.net and args.what != "ddp":
        raise UsageError("--net goes with `bench ddp` (and `bench net` needs none)")
    if args.net:
        plugin_built()
    if not secure_ready("bench", args):
        return 2
    from ccbridge.secure import bench

    if args.what == "cipher":
        res = bench.cipher(bench.sizes(args.minbytes, args.maxbytes, 4), args.iters)
        print(bench.render_cipher(res))
    else:
        res = {"runs": []}
        for n in args.ngpus:
            r = bench.ddp(args.models, n, args.buckets, args.iters, args.warmup, net=args.net, wrap=args.wrap)
            res["runs"].append(r)
            print(bench.render_ddp(r))
        if any(row["grads_agree"] is False for r in res["runs"] for row in r["rows"]):
            print("ccbridge bench: gradients differ across ranks (see the grads column)", file=sys.stderr)
            if args.json:
                Path(args.json).write_text(json.dumps(res, indent=1))
            return 1
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def _bench_decode(args) -> int:
    """Greedy decode of a transformer (random weights) in each scheduling mode; tokens must agree."""
    if args.json:
        ui.writable_file(args.json, "--json")
    if args.graphs and args.device == "cpu":
        raise UsageError("--graphs captures CUDA graphs: it needs a CUDA device (not --device cpu)")
    if args.checkpoint is not None and args.model:
        raise UsageError("give --model (a preset with random weights) or --checkpoint DIR (real weights), not both")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("ccbridge bench: decode needs torch (pip install torch)", file=sys.stderr)
        return 2
    from ccbridge.serve import decode

    batches = args.batch or [1, 8, 32, 128]
    common = dict(iters=args.iters or 3, warmup=1 if args.warmup is None else args.warmup, graphs=args.graphs,
                  seed=args.seed, log=lambda m: print(f"ccbridge bench: {m}", file=sys.stderr, flush=True),
                  host_prep_us=args.host_prep_us or 0.0)
    shape = (batches, args.prompt or 128, args.output or 64, args.modes or list(DECODE_MODES), args.device or "cuda")
    if args.tp:
        if args.checkpoint is not None:
            raise UsageError("--tp splits a preset's layers (--model, random weights); --checkpoint runs on one GPU")
        from ccbridge.serve import tp

        res = tp.bench(args.model or "llama-1b", args.tp, *shape, **common)
        return _bench_done(res, tp.render(res), args.json)
    res = decode.bench(args.model or "llama-1b", *shape, checkpoint=args.checkpoint, **common)
    return _bench_done(res, decode.render(res), args.json)


def _bench_kv(args) -> int:
    """Prefix-reuse churn through a KVCache with a host tier, per store threshold and sync/async crossings."""
    if args.graphs or args.batch or args.prompt or args.output or args.checkpoint is not None:
        raise UsageError("--batch, --prompt, --output, --checkpoint and --graphs go with `bench decode` "
                         "(kv: --prefix-len, --suffix-len, --requests)")
    if args.json:
        ui.writable_file(args.json, "--json")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("ccbridge bench: kv needs torch (pip install torch)", file=sys.stderr)
        return 2
    from ccbridge.serve import kvbench

    res = kvbench.bench(args.model, args.prefixes, args.prefix_len, args.suffix_len, args.requests,
                        args.thresholds, args.modes, args.device or "cuda", zipf=args.zipf,
                        gpu_fraction=args.gpu_fraction, device_blocks=args.device_blocks, seed=args.seed,
                        warmup=args.warmup, iters=args.iters, churn=args.churn,
                        log=lambda m: print(f"ccbridge bench: {m}", file=sys.stderr, flush=True))
    return _bench_done(res, kvbench.render(res), args.json)


def _bench_done(res, table: str, json_path: str | None) -> int:
    """A bench Result's ending: its table, the file, its errors on stderr; 1 if it had any."""
    print(table)
    if json_path:
        res.save(Path(json_path))
        print(f"wrote {json_path}", file=sys.stderr)
    for e in res.errors:
        print(f"ccbridge bench: {e['error']}", file=sys.stderr)
    return 1 if res.errors else 0


def _bench_net(args) -> int:
    """The net plugin's loopback stream: needs neither torch nor a GPU."""
    from ccbridge.secure import bench, netbench, netplugin

    if args.maxbytes < args.minbytes:
        raise UsageError(f"-e/--maxbytes ({args.maxbytes}) is smaller than -b/--minbytes ({args.minbytes})")
    if args.json:
        ui.writable_file(args.json, "--json")
    if max(args.lanes) > 16:
        raise UsageError(f"--lanes: at most 16 (got {max(args.lanes)})")
    plugin_built()
    print(f"# ccbridge bench net: {netplugin.NAME} loopback, two processes, {args.inflight} messages in flight, "
          f"{args.total} bytes per measurement x {args.iters}, {os.cpu_count()} cores", flush=True)
    res = netbench.loopback(bench.sizes(args.minbytes, args.maxbytes, 8), args.lanes, args.inflight, args.total,
                            args.iters)
    return _bench_done(res, netbench.render(res), args.json)


def add_parsers(sub) -> None:
    p = command(sub, "bench", cmd_bench,
                help="benchmarks of the encryption: ddp (training iterations), cipher (the GPU kernels) or net (the NCCL "
                     "net plugin's loopback stream, CPU only); decode: a transformer's greedy decode under "
                     "sync/async/staged/drain scheduling; kv: prefix-reuse churn through a KV cache with a host tier "
                     "(TTFT, spill and restore bytes, hit rates per store threshold)")
    p.add_argument("what", choices=["ddp", "cipher", "net", "decode", "kv"])
    p.add_argument("--models", nargs="+", choices=DDP_MODELS, help="ddp: models (default all three)")
    p.add_argument("--ngpus", type=integer(2), nargs="+", help="ddp: world sizes, each at least 2 (default 2 4)")
    p.add_argument("--buckets", type=integer(1), nargs="+",
                   help="ddp: bucket_cap_mb sweep for the encrypted runs (default 25 100 400 800)")
    p.add_argument("--iters", type=integer(1), help="ddp, cipher: timed iterations (default 10); net: repeats (default 3); "
                                                 "decode: timed runs per batch and mode (default 3); kv: passes of "
                                                 "the request stream, each with fresh suffixes (default 1)")
    p.add_argument("--warmup", type=integer(0), help="ddp: warm-up iterations (default 3); decode: warm-up runs (default 1); "
                   "kv: untimed passes over every prefix, with its churn, before the stream (default 2)")
    p.add_argument("-b", "--minbytes", type=size, help="cipher, net: smallest size (default 1M; net 64K)")
    p.add_argument("-e", "--maxbytes", type=size, help="cipher, net: largest size (default 1G; net 4M)")
    p.add_argument("--net", choices=["ccbridge"], help="ddp: NCCL's plaintext sockets beside NCCL on the ccbridge "
                   "net plugin (both without P2P or shared memory) instead of ccbridge.secure's hook")
    p.add_argument("--wrap", choices=["ddp", "fsdp"], help="ddp: DDP (default) or FSDP2 (with --net)")
    p.add_argument("--lanes", type=integer(1), nargs="+",
                   help="net: sockets (each with a thread) per connection to compare (default 1 2 4 8; at most 16)")
    p.add_argument("--inflight", type=integer(1), help="net: messages in flight (default 8, as NCCL's steps)")
    p.add_argument("--total", type=size, help="net: bytes moved per measurement (default 2G)")
    p.add_argument("--model", choices=list(DECODE_PRESETS), help="decode, kv: model shape, random weights (default llama-1b; kv on CUDA: qwen2.5-3b, "
                        "the published setup's)")
    p.add_argument("--checkpoint", metavar="DIR", help="decode: a local Hugging Face model folder (config.json, "
                                                       "*.safetensors) read by ccbridge's loader, instead of --model")
    p.add_argument("--batch", type=integer(1), nargs="+", help="decode: batch sizes (default 1 8 32 128)")
    p.add_argument("--prompt", type=integer(1), help="decode: prompt tokens (default 128)")
    p.add_argument("--output", type=integer(2), help="decode: tokens generated per sequence, the first by prefill "
                                                  "(default 64)")
    p.add_argument("--modes", nargs="+", choices=DECODE_MODES, help="decode: scheduling modes (default all); kv: "
                   "sync (wait for each restore and spill crossing) and/or async (default both)")
    p.add_argument("--graphs", action="store_true", help="decode: each step one CUDA-graph replay over a static KV cache (captured per run, "
                        "outside the timing); needs a CUDA device")
    p.add_argument("--host-prep-us", type=float_ge0, metavar="US",
                   help="decode: an engine's host work per step (scheduling, metadata), as CPU time between the "
                        "step's input crossings and its launch (default 0: the harness's own few us)")
    p.add_argument("--tp", type=integer(1), nargs="+", metavar="N",
                   help="decode: tensor-parallel degrees, e.g. 1 2 4 8: one process per GPU over NCCL (gloo, at most "
                        "4 ranks, on --device cpu), an all-reduce after each layer's attention and MLP; tokens "
                        "checked across degrees and modes")
    p.add_argument("--device", type=device_spec, help="decode, kv: cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--seed", type=integer(0), help="decode, kv: seed of the weights, prompts and the kv "
                                                           "request stream (default 0)")
    p.add_argument("--prefixes", type=integer(1), help="kv: distinct shared prefixes (default 4 on CUDA, 8 on the CPU)")
    p.add_argument("--churn", type=integer(0), help="kv: one-off requests (prefix + suffix tokens, never reused) after "
                                                 "each request, not timed (default 3)")
    p.add_argument("--prefix-len", type=integer(1), help="kv: tokens per prefix (default 31744 on CUDA, "
                   "a 1.1 GiB prefix of qwen2.5-3b as published; 64 on the CPU)")
    p.add_argument("--suffix-len", type=integer(1), help="kv: unique tokens after the prefix per request (default 32)")
    p.add_argument("--requests", type=integer(1), help="kv: timed requests per pass, each generating 1 token (default 12 on CUDA, 64 on the CPU; "
                                                    "--iters passes, --warmup passes over every prefix first)")
    p.add_argument("--thresholds", type=integer(1), nargs="+", help="kv: store thresholds to sweep: a block is spilled "
                   "to the host on eviction only if looked up this often (default 1 2 3)")
    p.add_argument("--zipf", type=float_ge0, help="kv: reuse skew, prefix i drawn with weight "
                   "1/(i+1)^S (default 1; 0 uniform)")
    p.add_argument("--gpu-fraction", type=float_ge0, help="kv: device KV blocks as a fraction of the "
                   "distinct prefixes' blocks (default 1/3)")
    p.add_argument("--device-blocks", type=integer(1), help="kv: device KV blocks (16 tokens each), instead of "
                   "--gpu-fraction")
    p.add_argument("--json", help="write the rows here (decode, kv: a result file `ccbridge compare` reads)")
