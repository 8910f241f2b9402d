"""The ccbridge command line: thin wrappers that parse, call and print.

Each module of this package adds its commands' parsers (add_parsers) and holds their handlers; main() runs the
one named and turns every CCBridgeError into one line `ccbridge CMD: reason` (CMD in full: `ccbridge bench net`,
as argparse names it) and exit 2.
"""

from __future__ import annotations

import sys

from ccbridge import ui
from ccbridge.version import __version__
from ccbridge.cli import bench, collectives, emulation, loading, node, probing, reporting
from ccbridge.cli.args import Parser, one_line
from ccbridge.errors import CCBridgeError

GROUPS = (node, probing, emulation, reporting, loading, collectives, bench)  # in the order `ccbridge --help` lists


def build_parser() -> Parser:
    ap = Parser(prog="ccbridge", description="Measure the CPU<->GPU bridge of GPU confidential computing.")
    ap.add_argument("--version", action="version", version=f"ccbridge {__version__}")
    # dest "command": a subcommand's own arguments must not reuse the name (run's program did). Not required here:
    # main() names an unrecognised word first (`ccbridge --help-me`), then a missing command.
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    # a reader that stops (`| head`) silences the output, never the work or its status; a default output folder
    # the command wrote nothing in is taken away again
    with ui.unread_ok(), ui.run_folders():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    prog = getattr(args, "prog", parser.prog)  # the (sub)command's, whose words these are; ccbridge's without one
    if extra:  # argparse would blame the top-level parser; the words belong to the (sub)command
        parser.exit(2, one_line(prog, f"unrecognized arguments: {' '.join(extra)}", hint=f" (see {prog} --help)")
                    + "\n")
    if args.command is None:
        parser.error("the following arguments are required: COMMAND")
    if args.fn is None:  # a command of subcommands (bench) given none
        parser.exit(2, one_line(prog, "the following arguments are required: BENCH", hint=f" (see {prog} --help)")
                    + "\n")
    try:
        return args.fn(args)
    except CCBridgeError as e:  # say why, in one line
        print(one_line(args.prog, str(e)), file=sys.stderr)
        return 2
    except OSError as e:  # the machine refused after the checks passed: a full disk, a lost mount, or a broken pipe
        # that is not the terminal's (ui.Unread takes those): an --json stream's reader gone
        where = f": {e.filename}" if e.filename else ""
        print(one_line(args.prog, f"{e.strerror or e}{where}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # whatever was half-written has been removed on the way out
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130
