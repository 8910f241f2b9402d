"""The machine's own state: its env stamp, its attestation bundle, where confidential tenants fit on it."""

from __future__ import annotations

import json
import sys

from rich.table import Table

from ccbridge import attest, env, pluginenv
from ccbridge import tenants, ui  # (tenants imports no GPU library)
from ccbridge.cli.args import checked, command, integer
from ccbridge.cli.checks import plugin_key
from ccbridge.cli.reports import wrote
from ccbridge.errors import UsageError
from ccbridge.report.tables import machine_table


def cmd_env(args) -> int:
    stamp = env.stamp()
    if args.json:
        print(json.dumps(stamp, indent=1))
        return 0

    plugin = stamp.get("nccl_net_plugin") or {}
    # its init reads the key: the plugin's row says what follows, the key's row where it comes from
    selected = plugin.get("selected") or (plugin.get("older_nccl") or {}).get("selected")
    key, key_text = plugin_key() if selected else (None, "")
    t = machine_table(stamp, key)
    table = Table(title="ccbridge env", show_header=False)
    for row in t.rows:
        table.add_row(*row)
    if pluginenv.settings_text(plugin):  # NCCL's own settings files may select it (or another) too
        table.add_row("NCCL net plugin settings", pluginenv.settings_text(plugin))
    if key_text:
        table.add_row("NCCL net plugin key", key_text)
    ui.terminal().print(table)
    return 0


def _nonce(text: str) -> bytes:
    return attest.parse_nonce(text)


def cmd_attest(args) -> int:
    if args.verifier_url and args.verify != "remote":
        raise UsageError("--verifier-url names the remote verifier: it goes with --verify remote")
    out = ui.writable_file(args.out, "--out") if args.out else None
    sdk = attest.load_sdk(required=bool(args.verify))
    b = attest.bundle(args.nonce, sdk=sdk)
    if args.verify:
        ppcie = b["env"].get("nvml", {}).get("cc", {}).get("multi_gpu_mode") == "protected-pcie"  # as collected
        b["verification"] = attest.verify(sdk, args.nonce, b["gpu_evidence"], args.verify, args.verifier_url, ppcie)
    b["protection"]["unprotected_allowed"] = bool(args.allow_unprotected)
    text = json.dumps(b, indent=1)
    if out:
        ui.write_out(out, text + "\n")
        print("\n".join(attest.summary(b)) + f"\nbundle: {out}")
    else:
        print(text)
    failed = []  # each "no" on a line of its own: the bundle holds the evidence
    if not b["protection"]["protected"] and not args.allow_unprotected:
        pr = b["protection"]
        failed.append(f"not protected (CPU TEE {pr['tee']}, GPU CC {pr['gpu_cc']}; see protection.why); "
                      "--allow-unprotected accepts it")
    if args.verify and not b["verification"]["result"]:
        failed.append(f"{b['verification']['verifier']} did not pass the GPU evidence")
    for why in failed:
        print(f"ccbridge attest: {why}", file=sys.stderr)
    return 1 if failed else 0


def _gpu_list(text: str) -> list[int]:
    """GPU indices, comma-separated: 0,1."""
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise UsageError(f"expected GPU indices such as 0,1, got {text!r}") from None


def cmd_plan_tenants(args) -> int:
    """Confidential tenants placed on the node's fabric partitions (or its whole complex, protected PCIe)."""
    if args.from_stamp:
        given = [o for o, v in (("--gpus", args.gpus), ("--mode", args.mode), ("--busy", args.busy)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} and --from-stamp: the stamp gives the GPUs, mode and busy GPUs")
        n, mode, busy = tenants.from_stamp(args.from_stamp)
    else:
        n, mode, busy = args.gpus or 8, args.mode or "nvle", args.busy or []
    if args.json:
        ui.writable_file(args.json, "--json")
    plan = tenants.plan(n, args.request, mode, busy, source=args.from_stamp)
    print(tenants.render(plan))
    if args.json:
        ui.write_out(args.json, json.dumps(plan.as_dict(), indent=1) + "\n")
        print(wrote(args.json), file=sys.stderr)
    return 1 if plan.unplaced else 0  # ran, and the answer is no: a tenant did not fit


def add_parsers(sub) -> None:
    p = command(sub, "env", cmd_env, help="print the environment stamp (GPUs, driver, CC state, TEE, CPU crypto)")
    p.add_argument("--json", action="store_true", help="the raw stamp as JSON")

    p = command(sub, "attest", cmd_attest,
                help="one JSON bundle of GPU evidence, CPU TEE report, CC settings and fabric state, bound to a verifier's"
                     " nonce; verification is NVIDIA's and the CPU vendor's")
    p.add_argument("--nonce", required=True, type=checked(_nonce), metavar="HEX",
                   help="the verifier's fresh 32-byte nonce, as 64 hex digits")
    p.add_argument("--out", metavar="FILE", help="write the bundle here and print a summary (default: the bundle "
                                                 "to stdout)")
    p.add_argument("--verify", choices=["local", "remote"], help="hand the GPU evidence to NVIDIA's attestation SDK "
                   "(pip install 'ccbridge[attest]'): its local verifier, or NVIDIA's remote service")
    p.add_argument("--verifier-url", metavar="URL", help="with --verify remote: another remote verifier's URL")
    p.add_argument("--allow-unprotected", action="store_true", help="exit 0 where this is not a CVM or GPU CC is "
                   "off (the bundle says so either way)")

    p = command(sub, "plan-tenants", cmd_plan_tenants,
                help="place confidential tenants of the requested sizes on a multi-GPU node's fabric partitions; what does"
                     " not fit and the free GPUs left")
    p.add_argument("--request", type=integer(1), nargs="+", required=True, metavar="SIZE",
                   help="tenant sizes in GPUs, each 1, 2, 4 or 8 (aligned fabric partitions)")
    p.add_argument("--gpus", type=integer(1), help="GPUs of the node: 1, 2, 4 or 8 (default 8, an HGX baseboard)")
    p.add_argument("--mode", choices=tenants.MODES, help="multi-GPU CC mode: nvle (B300: a tenant "
                   "is a fabric partition; default) or protected-pcie (Hopper: one tenant takes every GPU)")
    p.add_argument("--busy", type=checked(_gpu_list), help="GPUs other tenants hold, e.g. 0,1")
    p.add_argument("--from-stamp", metavar="FILE", help="`ccbridge env --json` output or a result.json taken on "
                   "the node: GPUs, mode and busy GPUs from its NVML multi-GPU mode and fabric cliques")
    p.add_argument("--json", help="also write the plan here")
