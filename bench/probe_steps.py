"""Where a probe's seconds went: each test's seconds and its slowest steps, from a result.json (issue 35).

    python bench/probe_steps.py ccbridge-results/probe-.../result.json [--top 12]

The probe records each test's seconds (settings.seconds) and, for a test that names its steps (ctx.step), each
step's seconds to the next (settings.steps). Printed: the run's wall time, the tests by seconds, then the slowest
steps of all; a result without steps (before 2026-11-27) prints the tests alone.
"""

from __future__ import annotations

import argparse
import sys

from ccbridge import results
from ccbridge.errors import CCBridgeError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    if args.top < 1:
        print(f"probe_steps: --top must be 1 or more (got {args.top})", file=sys.stderr)
        return 2
    try:
        res = results.load(args.result)
    except CCBridgeError as e:
        print(f"probe_steps: {e}", file=sys.stderr)
        return 2
    if res.kind != "probe":
        print(f"probe_steps: {args.result}: a {res.kind} result, not a probe's", file=sys.stderr)
        return 2
    secs, steps = res.settings.get("seconds", {}), res.settings.get("steps", {})
    print(f"wall {res.duration_s} s, tests {sum(secs.values()):.1f} s")
    for name, s in sorted(secs.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {s:7.2f} s  {name}")
    every = sorted(((st["s"], name, st["step"]) for name, ss in steps.items() for st in ss), reverse=True)
    if every:
        print("slowest steps:")
    for s, name, step in every[:args.top]:
        print(f"  {s:7.3f} s  {name}: {step}"[:120])
    return 0


if __name__ == "__main__":
    sys.exit(main())
