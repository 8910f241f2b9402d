"""Checks that collectives and the benchmarks share, made before any work starts."""

from __future__ import annotations

import sys

from ccbridge import pluginenv, ui
from ccbridge.errors import KeyMaterialError, UsageError


def sizes_in_order(args) -> None:
    """-b/--minbytes no larger than -e/--maxbytes."""
    if args.maxbytes < args.minbytes:
        raise UsageError(f"-e/--maxbytes ({args.maxbytes}) is smaller than -b/--minbytes ({args.minbytes})")


def gpus_ready(cmd: str, json_path: str | None, cpu_ok: bool = False, without_gpu: str = "") -> bool:
    """The --json file can be written (that needs no GPU), then torch and GPUs are there (cpu_ok: or CPU ranks
    will do, as Gloo's do). without_gpu: what runs without one, said where there is none."""
    if json_path:
        ui.writable_file(json_path, "--json")
    try:
        import torch  # (deferred: torch, a heavy optional dependency, only once the arguments are good)
    except ImportError:
        print(f"ccbridge {cmd}: needs torch (pip install torch)", file=sys.stderr)
        return False
    if not cpu_ok and not torch.cuda.is_available():
        print(f"ccbridge {cmd}: needs NVIDIA GPUs; torch sees none{without_gpu}", file=sys.stderr)
        return False
    return True


def plugin_built() -> None:
    """The ccbridge NCCL net plugin is built (a command that loads it says so before it starts)."""
    try:
        pluginenv.library()
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None


def named_key() -> None:
    """The key this environment names ($CCBRIDGE_KEY, else $CCBRIDGE_KEY_FILE; an empty variable is unset), held to
    the rules the net plugin and ccbridge.secure hold it to (tests/test_ncclnet_cpu.py keeps the two together), so
    that a key they would refuse is one line before any rank starts; none named: nothing to check (a benchmark draws
    its own)."""
    from ccbridge.secure import keys  # (deferred: the secure package)

    if keys.configured():
        keys.default_provider().secret()  # KeyMaterialError: its one line, exit 2


def plugin_key() -> tuple[str, str]:
    """What the plugin will make of the key in this environment, for `ccbridge env` (not the stamp: a result's key
    is its bench's): "taken", "none" or "refused" (pluginenv.status_text's key, which says what follows for NCCL),
    and in words where it comes from, or why it is refused, or what to set."""
    from ccbridge.secure import keys  # (deferred: the secure package)

    if not keys.configured():
        return "none", "none: set $CCBRIDGE_KEY (64 hex digits) or $CCBRIDGE_KEY_FILE"
    try:
        provider = keys.default_provider()
        provider.secret()
    except KeyMaterialError as e:
        return "refused", f"refused: {e}"
    return "taken", "$CCBRIDGE_KEY: taken" if isinstance(provider, keys.EnvKey) else f"key file {provider.path}: taken"
