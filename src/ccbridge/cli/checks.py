"""Checks that collectives and the benchmarks share, made before any work starts."""

from __future__ import annotations

import sys

from ccbridge import pluginenv, ui
from ccbridge.errors import UsageError


def sizes_in_order(args) -> None:
    """-b/--minbytes no larger than -e/--maxbytes."""
    if args.maxbytes < args.minbytes:
        raise UsageError(f"-e/--maxbytes ({args.maxbytes}) is smaller than -b/--minbytes ({args.minbytes})")


def gpus_ready(cmd: str, json_path: str | None, cpu_ok: bool = False) -> bool:
    """The --json file can be written (that needs no GPU), then torch and GPUs are there (cpu_ok: or CPU ranks
    will do, as Gloo's do)."""
    if json_path:
        ui.writable_file(json_path, "--json")
    try:
        import torch  # (deferred: torch, a heavy optional dependency, only once the arguments are good)
    except ImportError:
        print(f"ccbridge {cmd}: needs torch (pip install torch)", file=sys.stderr)
        return False
    if not cpu_ok and not torch.cuda.is_available():
        print(f"ccbridge {cmd}: needs NVIDIA GPUs; torch sees none", file=sys.stderr)
        return False
    return True


def plugin_built() -> None:
    """The ccbridge NCCL net plugin is built (a command that loads it says so before it starts)."""
    try:
        pluginenv.library()
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
