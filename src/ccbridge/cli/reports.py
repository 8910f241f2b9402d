"""A result's files, as probe, account and report write them: result.json, report.md, report.html."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from ccbridge import results
from ccbridge.report import html, markdown, plots
from ccbridge.resultschema import RESULTS
from ccbridge.textfit import fit

# The renderer's environment: numpy's OpenBLAS (and any OpenMP runtime) starts no threads when matplotlib imports it,
# so the interpreter that forks the charts' workers has no thread but its own.
RENDERER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def report_paths(out: Path) -> list[Path]:
    return [out / "result.json", out / "report.md", out / "report.html"]


def _saved(res, out: Path) -> list[Path]:
    """The report's paths, result.json written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = report_paths(out)
    res.save(paths[0])
    return paths


def write_reports(res, out: Path) -> list[Path]:
    paths = _saved(res, out)
    render(res, paths)
    return paths


def render(res, paths: list[Path], pool: ProcessPoolExecutor | None = None) -> None:
    """report.md and report.html at paths (report_paths'). pool: chart_pool()'s workers, which draw the charts
    side by side; should one die (killed, out of memory, a native crash), this process draws them."""
    paths[1].write_text(markdown.render(res))
    try:
        page = html.render(res, pool)
    except BrokenProcessPool:
        page = html.render(res)
    paths[2].write_text(page)


def chart_pool() -> ProcessPoolExecutor | None:
    """The charts' workers, forked now from this interpreter (call it after plots.ready(): each starts warm) and
    waiting; None where there is no fork. An executor, not a multiprocessing.Pool: a worker that dies fails the
    drawing at once (BrokenProcessPool), where a Pool waits for its chart forever."""
    if "fork" not in mp.get_all_start_methods():
        return None
    pool = ProcessPoolExecutor(min(len(plots.PLOTS), os.cpu_count() or 1), mp_context=mp.get_context("fork"))
    pool.submit(int)  # a fork executor forks every worker at its first task, before it starts its own thread
    return pool


class EarlyReports:
    """write_reports() by an interpreter started with the run: it imports the plotting library (seconds) while the
    run works, then renders the saved result when told where it is, its charts side by side. Should it fail, this
    process renders."""

    def __init__(self):
        # its output is not read: a renderer that fails is replaced by this process's own rendering. Its own session
        # (and process group): close() ends it with the chart workers it forks, which a kill of it alone left
        # waiting on their queue for ever (one per core, children of init).
        self.proc = subprocess.Popen([sys.executable, "-m", "ccbridge.cli.reports"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **RENDERER_ENV}, start_new_session=True)

    def write(self, res, out: Path) -> list[Path]:
        paths = _saved(res, out)
        try:
            self.proc.communicate(f"{paths[0]}\n", timeout=300)
            done = self.proc.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            done = False
        if not done:
            self.close()
            render(res, paths)
        return paths

    def close(self) -> None:
        """The renderer ended, with every process it forked; nothing to do where it finished its work."""
        if self.proc.returncode == 0:
            return
        try:  # the group's id is its own while the renderer (a zombie too) or a worker it forked lives
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it and its workers have all ended
            pass
        self.proc.wait()


def warm_up() -> None:
    """The renderers ready: matplotlib imported (the seconds) and the result schema's validator built (jsonschema's
    import, a tenth of a second)."""
    plots.ready()
    RESULTS["probe"].problem({})


def _main() -> int:
    """EarlyReports' interpreter: the renderers ready (warm_up), then a result.json path on stdin (nothing:
    leave)."""
    warm_up()
    # The charts' workers are forked now, warm, and wait: this interpreter has no thread (RENDERER_ENV) and no CUDA
    # context, so a fork of it is safe; where there is no fork, it draws them itself.
    pool = chart_pool()
    try:
        line = sys.stdin.readline().strip()
        if not line:
            return 0
        path = Path(line)
        render(results.load(path), report_paths(path.parent), pool)
        return 0
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def wrote(*paths) -> str:
    """`wrote A, B, C` for stderr, within 120 columns however long the paths."""
    return fit("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    sys.exit(_main())
