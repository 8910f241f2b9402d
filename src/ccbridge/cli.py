"""The ccbridge command line: thin wrappers that parse, call and print."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from ccbridge import __version__


def _write_reports(res, out: Path) -> list[Path]:
    from ccbridge.report import html, markdown

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "result.json", out / "report.md", out / "report.html"]
    res.save(paths[0])
    paths[1].write_text(markdown.render(res))
    paths[2].write_text(html.render(res))
    return paths


def cmd_env(args) -> int:
    from ccbridge import env

    stamp = env.stamp()
    if args.json:
        print(json.dumps(stamp, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    from ccbridge.report.tables import machine_table

    t = machine_table(stamp)
    table = Table(title="ccbridge env", show_header=False)
    for row in t.rows:
        table.add_row(*row)
    Console().print(table)
    return 0


def cmd_probe(args) -> int:
    from rich.console import Console

    from ccbridge import env
    from ccbridge.findings import shown
    from ccbridge.probe import registry

    if args.list:
        for t in registry.select(None):
            needs = f" (needs {', '.join(t.needs)})" if t.needs else ""
            print(f"{t.name:<24} {t.title}{needs}")
        return 0
    try:
        tests = registry.select(args.tests)
    except ValueError as e:
        print(f"ccbridge probe: {e}", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    console.print(f"ccbridge probe: {len(tests)} tests, {'quick' if args.quick else 'full'} suite, device {args.device}")
    stamp = env.stamp()
    if stamp["emulation"]["active"]:
        console.print(f"[bold yellow]EMULATED run (profile {stamp['emulation']['profile']}): figures are not CC hardware measurements[/]")
    from ccbridge.ui import ProbeProgress

    settings = registry.Settings(device=args.device, quick=args.quick, tests=args.tests)
    with ProbeProgress(len(tests), console) as progress:
        res = registry.run(settings, stamp, progress)
    out = Path(args.out) if args.out else Path("ccbridge-results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    paths = _write_reports(res, out)
    console.print()
    for f in shown(res):
        console.print(f"- {f.text}", highlight=False)
    if res.no_gpu:
        console.print(f"[yellow]The GPU families need a GPU ({res.no_gpu}); ran what needs none.[/]")
    elif res.skipped:
        console.print("[yellow]Skipped: " + "; ".join(f"{s['test']} ({s['reason']})" for s in res.skipped) + "[/]")
    console.print(f"\n{len(res.rows)} rows in {res.duration_s:.0f} s; wrote " + ", ".join(str(p) for p in paths))
    if res.errors:
        console.print(f"[red]{len(res.errors)} test(s) failed:[/] " + "; ".join(f"{e['test']}: {e['error']}" for e in res.errors))
        return 1
    return 0


def cmd_report(args) -> int:
    from ccbridge import results

    try:
        res = results.load(args.result)
    except results.ResultFileError as e:
        print(f"ccbridge report: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(args.result).parent
    for p in _write_reports(res, out)[1:]:
        print(p)
    return 0


def cmd_compare(args) -> int:
    from ccbridge import compare, results

    try:
        base, other = results.load(args.base), results.load(args.other)
    except results.ResultFileError as e:
        print(f"ccbridge compare: {e}", file=sys.stderr)
        return 2
    c = compare.compare(base, other)
    md = compare.render_markdown(c)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(md)
        (out / "compare.html").write_text(compare.render_html(c))
        print(f"wrote {out / 'compare.md'}, {out / 'compare.html'}", file=sys.stderr)
    if not c.ratios:
        print("ccbridge compare: the two results share no rows", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ccbridge", description="Measure the CPU<->GPU bridge of GPU confidential computing.")
    ap.add_argument("--version", action="version", version=f"ccbridge {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("env", help="print the environment stamp (GPUs, driver, CC state, TEE, CPU crypto)")
    p.add_argument("--json", action="store_true", help="the raw stamp as JSON")
    p.set_defaults(fn=cmd_env)

    p = sub.add_parser("probe", help="measure the bridge; writes result.json, report.md, report.html")
    p.add_argument("--tests", help="comma list of test or family names (see --list); default all")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (under a minute)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--out", help="output folder (default ccbridge-results/<timestamp>)")
    p.add_argument("--list", action="store_true", help="list the registered tests and exit")
    p.set_defaults(fn=cmd_probe)

    p = sub.add_parser("report", help="re-render report.md and report.html from a result.json")
    p.add_argument("result")
    p.add_argument("--out", help="output folder (default: beside the result)")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("compare", help="OTHER/BASE ratio table and changed findings of two probe results")
    p.add_argument("base")
    p.add_argument("other")
    p.add_argument("--out", help="also write compare.md and compare.html here")
    p.set_defaults(fn=cmd_compare)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)
