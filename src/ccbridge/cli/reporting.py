"""Reading results back: the reports of one, two compared, and the settings they advise."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ccbridge import advise, compare, results, ui
from ccbridge.cli.args import command
from ccbridge.cli.reports import render, report_paths, wrote
from ccbridge.errors import CCBridgeError, UsageError


def cmd_report(args) -> int:
    """report.md and report.html of a result, and nothing else: the reports embed everything they show (charts
    inline), so no copy of the result is made beside them."""
    src = Path(args.result)
    out = ui.writable_folder(args.out or src.parent, "--out")
    res = results.load(src)
    paths = report_paths(out)
    if paths[0].exists() and not _same(paths[0], src, res):
        # that folder's reports are its result.json's: these would replace them with another result's
        raise UsageError(f"{paths[0]} is another result, whose reports these would replace"
                         + ("" if args.out else ": give --out a folder"))
    out.mkdir(parents=True, exist_ok=True)
    render(res, paths)
    for p in paths[1:]:
        print(p)
    return 0


def _same(there: Path, src: Path, res) -> bool:
    """there is src, or a copy of the same result (its reports are these)."""
    if there.samefile(src):
        return True
    try:
        return results.load(there).to_json() == res.to_json()
    except CCBridgeError:  # not a result at all: another file, kept
        return False


def cmd_compare(args) -> int:
    out = ui.writable_folder(args.out, "--out") if args.out else None
    base, other = results.load(args.base), results.load(args.other)
    c = compare.compare(base, other)
    print(compare.render_text(c))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(compare.render_markdown(c))
        (out / "compare.html").write_text(compare.render_html(c))
        print(wrote(out / "compare.md", out / "compare.html"), file=sys.stderr)
    if not c.ratios and not c.same:  # one result twice is compared as asked: nothing differs
        print("ccbridge compare: the two results share no rows" + (" in one unit" if c.unlike else ""), file=sys.stderr)
        return 1
    return 0


def cmd_advise(args) -> int:
    """The CC-mode-aware settings for vLLM, SGLang, TRT-LLM, torch and the loader, from stamps and results."""
    seen: dict = {}
    for f in args.files:  # the same file twice would print every line twice
        key = os.path.realpath(f)
        if key in seen:
            raise UsageError(f"{f} is given twice (as {seen[key]})")
        seen[key] = f
    if args.json:
        if os.path.realpath(args.json) in seen:
            raise UsageError(f"--json {args.json} is one of the inputs: it would be overwritten")
        ui.writable_file(args.json, "--json")
    inputs, recs = advise.advise(args.files)
    print(advise.render_why(inputs, recs) if args.why else advise.render(inputs, recs))
    if args.json:
        ui.write_out(args.json, json.dumps(advise.to_json(inputs, recs), indent=1) + "\n")
        print(wrote(args.json), file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    p = command(sub, "report", cmd_report, help="re-render report.md and report.html from a result.json")
    p.add_argument("result", help="a result.json, or a bench's or collectives' --json file")
    p.add_argument("--out", help="output folder (default: beside the result); one whose result.json is another "
                                 "result is refused (its reports are that result's)")

    p = command(sub, "compare", cmd_compare, help="OTHER/BASE ratio of every row two results of one kind share (probe, "
                "account, load, collectives or bench), and the findings that changed")
    p.add_argument("base", help="the result the ratios are relative to: a result.json or a --json file")
    p.add_argument("other", help="the result compared with BASE, of the same kind (e.g. CC on, or emulated)")
    p.add_argument("--out", help="also write compare.md and compare.html here")


    p = command(sub, "advise", cmd_advise,
                help="CC-aware settings for vLLM, SGLang, TRT-LLM, torch and the loader from env stamps and probe, "
                     "account, bench decode and bench kv results, each with the number behind it")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="result.json of probe, account, bench decode or bench kv, or `ccbridge env --json` output")
    p.add_argument("--json", help="also write the advice and the inputs' env summaries here")
    p.add_argument("--why", action="store_true", help="print the full evidence per line (the row keys and "
                                                      "medians behind each number) instead of the table")
