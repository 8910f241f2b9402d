"""`ccbridge bench BENCH`: benchmarks of the encryption (ddp, cipher, net) and of serving under it (decode, kv).

Each bench is a subcommand of its own, declaring only its own options and their defaults: argparse refuses
another bench's option, and `ccbridge bench decode --help` lists decode's alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ccbridge import busbw, pluginenv, ui
from ccbridge.choices import DDP_MODELS, DECODE_MODES, DECODE_PRESETS, KV_MODES, TP_ONLY
from ccbridge.cli.args import Distinct, add_timer, apply_timer, command, device_spec, float_ge0, float_gt0, integer, size
from ccbridge.cli.checks import gpus_ready, named_key, plugin_built, sizes_in_order
from ccbridge.cli.reports import wrote
from ccbridge.errors import UsageError
from ccbridge.textfit import fit

DECODE_MODEL = "llama-1b"  # bench decode's model when neither --model nor --checkpoint names one
CIPHER_STEP, NET_STEP = 4, 8  # the size sweeps' factors (nccl-tests' -f): bench cipher, bench net


def cmd_ddp(args) -> int:
    """DDP (or FSDP2) training iterations, plain vs encrypted, per world size."""
    if args.wrap == "fsdp" and not args.net:
        raise UsageError("--wrap fsdp goes with `bench ddp --net ccbridge` (ccbridge.secure's hook is for DDP)")
    if args.net:
        plugin_built()
    named_key()  # the plugin's, or ccbridge.secure's: the ranks read it
    if not gpus_ready("bench ddp", args.json):
        return 2
    from ccbridge.secure import bench, benchrows  # (deferred: torch)

    res = bench.ddp(args.models, args.ngpus, args.buckets, args.iters, args.warmup, net=args.net, wrap=args.wrap,
                    show=print)
    if args.json:
        res.save(Path(args.json))
    if benchrows.grads_differ(res):
        print(f"{args.prog}: gradients differ across ranks (see the grads column)", file=sys.stderr)
        return 1
    return 0


def cmd_cipher(args) -> int:
    """GB/s of the GPU AES-256-GCM kernels per size."""
    sizes_in_order(args)
    if not gpus_ready("bench cipher", args.json):
        return 2
    apply_timer(args)
    from ccbridge.secure import bench, benchrows  # (deferred: torch)

    res = bench.cipher(busbw.sizes(args.minbytes, args.maxbytes, CIPHER_STEP), args.iters)
    print(benchrows.render_cipher(res))
    if args.json:
        res.save(Path(args.json))
    return 0


def cmd_net(args) -> int:
    """The net plugin's loopback stream: needs neither torch nor a GPU."""
    from ccbridge.secure import benchrows, netbench  # (deferred: its ranks and plugin bindings)

    sizes_in_order(args)
    if args.json:
        ui.writable_file(args.json, "--json")
    sizes = busbw.sizes(args.minbytes, args.maxbytes, NET_STEP)
    netbench.check(sizes, args.lanes, args.inflight, args.total)
    plugin_built()
    named_key()
    netbench.plugin_ready()  # (loopback checks again, for library callers: here it is before the header)
    print(fit(f"# ccbridge bench net: {pluginenv.NAME} loopback, two processes, {os.cpu_count()} cores, "
              f"{pluginenv.lane_mode()}, spin {pluginenv.spin_us()} us\n"
              f"# {_sweep(sizes, args.maxbytes, NET_STEP)}, lanes {' '.join(map(str, args.lanes))}, {args.inflight} "
              f"messages in flight, {args.total} bytes per measurement x {args.iters}"), flush=True)
    # each measurement's line as it ends on stderr (a default run takes minutes); the account on stdout
    res = netbench.loopback(sizes, args.lanes, args.inflight, args.total, args.iters,
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.link is None:
        return _done(res, benchrows.render_net(res), args)
    res.settings["link_gbits"] = args.link
    lines, carried = benchrows.link_lines(res, args.link)
    rc = _done(res, "\n".join([benchrows.render_net(res), ""] + lines), args)
    return rc or (0 if carried else 1)  # --link asks whether it carries the link here: no is 1


def _sweep(sizes: list[int], end: int, step: int) -> str:
    """The sizes a sweep measures, and why -e is not one of them where it is not (-b, step x -b, ... up to -e, as
    nccl-tests' -f: `-b 64K -e 1M` measured 64 KiB and 512 KiB and did not say that 1 MiB was left out)."""
    text = f"sizes {', '.join(ui.human_bytes(s) for s in sizes)}"
    if sizes[-1] != end:
        text += (f" (-e {ui.human_bytes(end)} is not on the {step}x steps from -b {ui.human_bytes(sizes[0])}: "
                 f"the next, {ui.human_bytes(sizes[-1] * step)}, is past it)")
    return text


def _gpu_timer(args) -> None:
    """apply_timer(), a --timer named on a CPU run refused (it times GPU work; the result would record none)."""
    if args.timer not in (None, "auto") and str(args.device or "").startswith("cpu"):
        raise UsageError(f"--timer {args.timer} times GPU work: it goes with a CUDA --device")
    apply_timer(args)


def cmd_decode(args) -> int:
    """Greedy decode of a transformer (random weights) in each scheduling mode; tokens must agree."""
    _gpu_timer(args)
    if args.json:
        ui.writable_file(args.json, "--json")
    if args.graphs and args.device == "cpu":
        raise UsageError("--graphs captures CUDA graphs: it needs a CUDA device (not --device cpu)")
    if args.checkpoint is not None and args.model:
        raise UsageError("give --model (a preset with random weights) or --checkpoint DIR (real weights), not both")
    if not _torch_found("decode"):
        return 2
    from ccbridge.serve import decode  # (deferred: torch)

    common = dict(iters=args.iters, warmup=args.warmup, graphs=args.graphs, seed=args.seed, log=_logger(args.prog),
                  host_prep_us=args.host_prep_us)
    shape = (args.batch, args.prompt, args.output, args.modes, args.device)
    if args.tp:
        if args.checkpoint is not None:
            raise UsageError("--tp splits a preset's layers (--model, random weights); --checkpoint runs on one GPU")
        from ccbridge.serve import tp  # (deferred: torch)

        res = tp.bench(args.model or DECODE_MODEL, args.tp, *shape, **common)
        return _done(res, tp.render(res), args)
    res = decode.bench(args.model or DECODE_MODEL, *shape, checkpoint=args.checkpoint, **common)
    return _done(res, decode.render(res), args)


def cmd_kv(args) -> int:
    """Prefix-reuse churn through a KVCache with a host tier, per store threshold and sync/async crossings.
    An option not given is None: kvbench's defaults depend on the device."""
    _gpu_timer(args)
    if args.json:
        ui.writable_file(args.json, "--json")
    if not _torch_found("kv"):
        return 2
    from ccbridge.serve import kvbench  # (deferred: torch)

    res = kvbench.bench(args.model, args.prefixes, args.prefix_len, args.suffix_len, args.requests,
                        args.thresholds, args.modes, args.device, zipf=args.zipf,
                        gpu_fraction=args.gpu_fraction, device_blocks=args.device_blocks, seed=args.seed,
                        warmup=args.warmup, iters=args.iters, churn=args.churn, log=_logger(args.prog))
    return _done(res, kvbench.render(res), args)


def _torch_found(what: str) -> bool:
    """torch is installed (looked up, not imported: the arguments are checked first)."""
    if importlib.util.find_spec("torch") is None:
        print(f"ccbridge bench {what}: needs torch (pip install torch)", file=sys.stderr)
        return False
    return True


def _logger(prog: str):
    """A bench's progress lines on stderr, named as its errors are (`ccbridge bench decode: ...`)."""
    return lambda message: print(f"{prog}: {message}", file=sys.stderr, flush=True)


def _done(res, table: str, args) -> int:
    """A bench Result's ending: its table (each line within 120 columns), the --json file, its errors on stderr,
    each after the bench's name; 1 if it had any (tokens that differ are one)."""
    json_path = args.json
    print(fit(table))
    if json_path:
        res.save(Path(json_path))
        print(wrote(json_path), file=sys.stderr)
    for e in res.errors:
        print(fit(f"{args.prog}: {e['error']}"), file=sys.stderr)
    return 1 if res.errors else 0


def add_parsers(sub) -> None:
    p = sub.add_parser("bench", description="One benchmark per subcommand: `ccbridge bench BENCH --help` lists "
                       "its options.",
                       help="benchmarks of the encryption: ddp (training iterations), cipher (the GPU kernels) or net "
                            "(the NCCL net plugin's loopback stream, CPU only); decode: a transformer's greedy decode "
                            "under sync/async/staged/drain scheduling; kv: prefix-reuse churn through a KV cache with "
                            "a host tier (TTFT, spill and restore bytes, hit rates per store threshold)")
    # BENCH not required here, as COMMAND is not: main() names an unrecognised word first (`bench --bogus`), then
    # the missing BENCH (this parser's fn: None)
    p.set_defaults(fn=None, prog=p.prog)
    benches = p.add_subparsers(dest="what", metavar="BENCH")
    for add in (_add_ddp, _add_cipher, _add_net, _add_decode, _add_kv):
        add(benches)


def _bench(benches, name: str, fn, what: str):
    """One bench's parser: `what` is its line in `ccbridge bench --help` and the head of its own --help."""
    return command(benches, name, fn, help=what, description=what[0].upper() + what[1:] + ".")


def _add_iters(p, default: int | None, what: str) -> None:
    p.add_argument("--iters", type=integer(1), default=default, help=what)


def _add_warmup(p, default: int | None, what: str) -> None:
    p.add_argument("--warmup", type=integer(0), default=default, help=what)


def _add_sizes(p, smallest: str, largest: str, step: int) -> None:
    p.add_argument("-b", "--minbytes", type=size, default=smallest, help=f"smallest size (default {smallest})")
    p.add_argument("-e", "--maxbytes", type=size, default=largest,
                   help=f"largest size (default {largest}); sizes go -b, {step}x -b, ... up to it (nccl-tests' -f "
                        f"{step}): -e is measured where it falls on that step")


def _add_json(p) -> None:
    p.add_argument("--json", help="write the rows here: a result file `ccbridge compare` reads")


def _add_model(p, default: str) -> None:
    p.add_argument("--model", choices=list(DECODE_PRESETS), metavar="MODEL",
                   help=f"model shape, random weights: {', '.join(DECODE_PRESETS)} (default {default}; "
                        f"{', '.join(TP_ONLY)}: with --tp only)")


def _add_device_seed(p, seeds: str) -> None:
    add_timer(p)
    p.add_argument("--device", type=device_spec, default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--seed", type=integer(0), default=0, help=f"seed of {seeds} (default 0)")


def _add_ddp(benches) -> None:
    p = _bench(benches, "ddp", cmd_ddp, "DDP training iterations of ResNet-50, BERT-large and GPT-2-large, plain "
               "vs encrypted (one rank per GPU)")
    p.add_argument("--models", nargs="+", choices=DDP_MODELS, action=Distinct, default=list(DDP_MODELS),
                   help="models (default all three)")
    p.add_argument("--ngpus", type=integer(2), nargs="+", action=Distinct,
                   help="world sizes, each at least 2 (default 2 4, those this machine has the GPUs for)")
    p.add_argument("--buckets", type=integer(1), nargs="+", action=Distinct, default=[25, 100, 400, 800],
                   help="bucket_cap_mb sweep for the encrypted runs (default 25 100 400 800)")
    _add_iters(p, 10, "timed iterations (default 10)")
    _add_warmup(p, 3, "warm-up iterations (default 3)")
    p.add_argument("--net", choices=["ccbridge"], help="NCCL's plaintext sockets beside NCCL on the ccbridge net "
                   "plugin (both without P2P or shared memory) instead of ccbridge.secure's hook")
    p.add_argument("--wrap", choices=["ddp", "fsdp"], default="ddp", help="DDP (default) or FSDP2 (with --net)")
    _add_json(p)


def _add_cipher(benches) -> None:
    p = _bench(benches, "cipher", cmd_cipher, "GB/s of the GPU AES-256-GCM kernels (encrypt, decrypt, fused "
               "reduce hop)")
    _add_sizes(p, "1M", "1G", CIPHER_STEP)
    _add_iters(p, 10, "timed iterations (default 10)")
    add_timer(p)
    _add_json(p)


def _add_net(benches) -> None:
    p = _bench(benches, "net", cmd_net, "the NCCL net plugin's encrypted loopback stream, plain TCP beside it "
               "(CPU only)")
    p.add_argument("--lanes", type=integer(1), nargs="+", action=Distinct, default=[1, 2, 4, 8],
                   help=f"sockets (each with a thread) per connection to compare (default 1 2 4 8; at most "
                        f"{pluginenv.MAX_LANES})")
    p.add_argument("--inflight", type=integer(1), default=8, help="messages in flight (default 8, as NCCL's steps)")
    p.add_argument("--total", type=size, default="2G", help="bytes moved per measurement (default 2G)")
    _add_sizes(p, "64K", "4M", NET_STEP)
    _add_iters(p, 3, "repeats (default 3)")
    p.add_argument("--link", type=float_gt0, metavar="GBITS",
                   help="a link speed in Gb/s (e.g. 200): say whether the plugin carried it here at the largest "
                        "size, and the cores a host needs to send and receive at it; exit 1 where it did not")
    _add_json(p)


def _add_decode(benches) -> None:
    p = _bench(benches, "decode", cmd_decode, "a transformer's greedy decode under sync/async/staged/drain "
               "scheduling: tok/s, step time and GPU busy per batch and mode, tokens checked across modes")
    _add_model(p, DECODE_MODEL)
    p.add_argument("--checkpoint", metavar="DIR", help="a local Hugging Face model folder (config.json, "
                   "*.safetensors) read by ccbridge's loader, instead of --model")
    p.add_argument("--batch", type=integer(1), nargs="+", action=Distinct, default=[1, 8, 32, 128],
                   help="batch sizes (default 1 8 32 128)")
    p.add_argument("--prompt", type=integer(1), default=128, help="prompt tokens (default 128)")
    p.add_argument("--output", type=integer(2), default=64, help="tokens generated per sequence, the first by "
                   "prefill (default 64)")
    p.add_argument("--modes", nargs="+", choices=DECODE_MODES, action=Distinct, default=list(DECODE_MODES),
                   help="scheduling modes (default all)")
    p.add_argument("--graphs", action="store_true", help="each step one CUDA-graph replay over a static KV cache "
                   "(captured per run, outside the timing); needs a CUDA device")
    p.add_argument("--host-prep-us", type=float_ge0, default=0.0, metavar="US",
                   help="an engine's host work per step (scheduling, metadata), as CPU time between the step's "
                        "input crossings and its launch (default 0: the harness's own few us)")
    p.add_argument("--tp", type=integer(1), nargs="+", action=Distinct, metavar="N",
                   help="tensor-parallel degrees, e.g. 1 2 4 8: one process per GPU over NCCL (gloo, at most 4 "
                        "ranks, on --device cpu), an all-reduce after each layer's attention and MLP; tokens "
                        "checked across degrees and modes")
    _add_device_seed(p, "the weights and prompts")
    _add_iters(p, 3, "timed runs per batch and mode (default 3)")
    _add_warmup(p, 1, "warm-up runs (default 1)")
    _add_json(p)


def _add_kv(benches) -> None:
    """Its defaults that depend on the device (and those kvbench shares with library callers) are kvbench's own."""
    p = _bench(benches, "kv", cmd_kv, "prefix-reuse churn through a KV cache with a host tier: TTFT, spill and "
               "restore bytes, hit rates per store threshold")
    single = [m for m in DECODE_PRESETS if m not in TP_ONLY]  # one device: no preset that needs tensor parallelism
    p.add_argument("--model", choices=single, metavar="MODEL", help=f"model shape, random weights: {', '.join(single)} "
                   "(default qwen2.5-3b on CUDA, the published setup's; llama-1b on the CPU)")
    p.add_argument("--prefixes", type=integer(1), help="distinct shared prefixes (default 4 on CUDA, 8 on the CPU)")
    p.add_argument("--prefix-len", type=integer(1), help="tokens per prefix (default 31744 on CUDA, a 1.1 GiB "
                   "prefix of qwen2.5-3b as published; 64 on the CPU)")
    p.add_argument("--suffix-len", type=integer(1), help="unique tokens after the prefix per request (default 32)")
    p.add_argument("--requests", type=integer(1), help="timed requests per pass, each generating 1 token (default "
                   "12 on CUDA, 64 on the CPU; --iters passes, --warmup passes over every prefix first)")
    p.add_argument("--churn", type=integer(0), help="one-off requests (prefix + suffix tokens, never reused) after "
                   "each request, not timed (default 3)")
    p.add_argument("--thresholds", type=integer(1), nargs="+", action=Distinct, help="store thresholds to sweep: "
                   "a block is spilled to the host on eviction only if looked up this often (default 1 2 3)")
    p.add_argument("--modes", nargs="+", choices=KV_MODES, action=Distinct, help="sync (wait for each "
                   "restore and spill crossing) and/or async (default both)")
    p.add_argument("--zipf", type=float_ge0, help="reuse skew, prefix i drawn with weight 1/(i+1)^S (default 1; "
                   "0 uniform)")
    p.add_argument("--gpu-fraction", type=float_ge0, help="device KV blocks as a fraction of the distinct "
                   "prefixes' blocks (default 1/3)")
    p.add_argument("--device-blocks", type=integer(1), help="device KV blocks (16 tokens each), instead of "
                   "--gpu-fraction")
    _add_device_seed(p, "the weights, prompts and the request stream")
    _add_iters(p, None, "passes of the request stream, each with fresh suffixes (default 1)")
    _add_warmup(p, None, "untimed passes over every prefix, with its churn, before the stream (default 2)")
    _add_json(p)
