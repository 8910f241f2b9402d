"""Read the call sites a traced Python program noted (siteboot/ccbridge_sites.py): the trace's site
column holds an id into <prefix>.<pid>.sites.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ccbridge.emulate.siteboot import ccbridge_sites as recorder
from ccbridge.errors import ResultFileError
from ccbridge.textfit import json_why

BOOT = str(Path(recorder.__file__).parent)  # the folder a traced program gets on its PYTHONPATH
NONE = "(no Python frame)"  # a call from a thread that noted no site (C++ threads, before the first)


def environment(env: dict[str, str], prefix: str, interposer: str) -> dict[str, str]:
    """env with the recorder switched on for every Python process started from it; interposer: the emulator
    library's path (launcher.library()), whose site slot the recorder writes, unless env names one already."""
    env = dict(env)
    env[recorder.ENV] = prefix
    env.setdefault(recorder.LIB_ENV, interposer)
    env["PYTHONPATH"] = BOOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def short(path: str, cwd: str | None) -> str:
    """A site's file as people name it: from the package folder on for installed code, else relative
    to the folder the program started in."""
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return str(Path(*parts[len(parts) - parts[::-1].index(marker):]))
    try:
        return str(Path(path).relative_to(cwd)) if cwd else path
    except ValueError:
        return path


class Sites:
    """One process's sites: label(id column) -> "file:line function -> callee", or NONE."""

    def __init__(self, path: str, pid: int | None = None):
        self.path = path
        try:
            with open(path) as f:
                doc = json.load(f)
            if doc.get("schema") != recorder.SCHEMA:
                raise ResultFileError(f"call sites {path}: schema {doc.get('schema')}; this ccbridge reads "
                                      f"{recorder.SCHEMA}: record again")
            if pid is not None and doc.get("pid") != pid:
                raise ResultFileError(f"call sites {path}: written by process {doc.get('pid')}, not {pid} whose "
                                      "trace it sits beside (files of different runs?)")
            self.labels = [f"{short(f, doc.get('cwd'))}:{line} {func} -> {callee}"
                           for f, line, func, callee in doc["sites"]]
        except ResultFileError:
            raise
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            why = json_why(e) if isinstance(e, (OSError, ValueError, RecursionError)) else f"{type(e).__name__}: {e}"
            raise ResultFileError(f"unreadable call sites {path}: {why}") from None

    def label(self, column: str) -> str:
        if not column:
            return NONE
        sid = int(column)
        if not 0 <= sid < len(self.labels):
            raise ResultFileError(f"call sites {self.path}: site {sid} is not in it (a trace and a sites file "
                                  "of different runs?)")
        return self.labels[sid]


def for_trace(csv_path: str) -> Sites | None:
    """The sites file beside <prefix>.<pid>.csv, if the run noted sites."""
    path = csv_path[: -len(".csv")] + ".sites.json"
    pid = path.rsplit(".", 3)[-3]  # <prefix>.<pid>.sites.json
    return Sites(path, int(pid) if pid.isdigit() else None) if os.path.exists(path) else None
