import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from concurrent.futures.process import BrokenProcessPool

import pytest
from conftest import synthetic

from ccbridge.report import html, markdown, plots
from ccbridge.results import Row


def test_markdown_opens_with_findings_then_tables(h100):
    md = markdown.render(h100)
    assert md.startswith("# ccbridge probe — NVIDIA H100 80GB HBM3 — 2026-11-21")
    assert md.index("## Findings") < md.index("## Headline figures") < md.index("## Machine")
    for name in ("compute.parity", "transfer.sweep", "semantics.nonblocking", "smallcopy.d2h32",
                 "concurrency.scaling", "launch.cost", "toll.h2d_idioms", "lifecycle.contexts", "hostcrypto.aes256gcm"):
        assert f"## {name}:" in md
    assert "EMULATED" not in md
    assert "need a GPU" not in md  # one GPU: only the peer family was skipped, for want of a second
    assert "| dir=h2d, mem=pinned, bytes=1 GiB | bandwidth |" in md


def test_html_is_self_contained_with_plots(h100):
    page = html.render(h100)
    assert page.count("data:image/png;base64,") == 5
    assert not re.search(r"(src|href)=[\"']https?:", page)
    assert "<h2>Findings</h2>" in page


def test_emulated_results_say_so_everywhere():
    res = synthetic([Row.of("launch.cost", "time_per_kernel", "us", [26.0], mode="pipelined")], emulated="b300")
    md = markdown.render(res)
    assert "EMULATED (profile b300)" in md.splitlines()[0]
    assert "not measured on confidential-computing hardware" in md
    assert "EMULATED" in html.render(res)


def test_empty_result_renders():
    res = synthetic([])
    res.skipped = [{"test": "transfer.sweep", "reason": "no usable GPU: none"}]
    res.settings["missing"] = {"gpu": "no usable GPU: none"}
    md = markdown.render(res)
    assert "No GPU family ran" in md and "need a GPU" in md
    assert plots.all_plots(res) == []
    assert "<html>" in html.render(res)


def test_ratio_chart_png():
    png = plots.ratio_chart([("a", 0.2, 0.18, 0.22), ("b", 1.0, 0.9, 1.1)])
    assert png.startswith(b"\x89PNG")
    assert plots.ratio_chart([]) is None


def test_early_reports_write_what_write_reports_writes(h100, tmp_path):
    """The renderer started with the run writes the same report.md and report.html as this process would, and if
    it is gone, this process writes them."""
    from ccbridge.cli.reports import EarlyReports, write_reports

    res = h100
    want = write_reports(res, tmp_path / "here")
    early = EarlyReports()
    got = early.write(res, tmp_path / "early")
    assert early.proc.returncode == 0, "the early renderer failed: this process wrote the report instead"
    assert [p.name for p in got] == [p.name for p in want]
    for a, b in zip(want[1:], got[1:]):
        assert a.read_text() == b.read_text()
    dead = EarlyReports()
    dead.proc.kill()
    dead.proc.wait()
    again = dead.write(res, tmp_path / "fallback")
    assert again[2].read_text() == want[2].read_text()


def test_the_report_renderer_has_no_thread_of_its_own_when_it_forks_its_workers():
    """Warm (matplotlib, and numpy's OpenBLAS with it, imported), the renderer's interpreter has its main thread
    alone, in RENDERER_ENV: a fork of it copies no thread's half-held lock."""
    from ccbridge.cli.reports import RENDERER_ENV

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc/self/task to count threads in")
    code = "import os; from ccbridge.cli import reports; reports.warm_up(); print(len(os.listdir('/proc/self/task')))"
    got = subprocess.run([sys.executable, "-c", code], env={**os.environ, **RENDERER_ENV}, capture_output=True,
                         text=True, check=True)
    assert got.stdout.strip() == "1"


def test_charts_drawn_side_by_side_are_the_same_pngs(h100):
    """The report renderer's pool of forked workers draws each chart as this process would, in PLOTS' order."""
    from ccbridge.cli.reports import chart_pool

    pool = chart_pool()
    try:
        got = plots.all_plots(h100, pool)
    finally:
        pool.shutdown()
    want = plots.all_plots(h100)
    assert [name for name, _ in got] == [name for name, _ in want] and len(want) == 5
    assert got == want


def test_a_chart_worker_that_dies_leaves_its_charts_to_the_renderer(h100, tmp_path, monkeypatch):
    """A worker killed mid-chart (SIGKILL, out of memory, a native crash) fails the pool at once, and the renderer
    draws the charts itself: the same report, in seconds (a multiprocessing.Pool waited for that chart forever)."""
    from ccbridge.cli import reports

    renderer = os.getpid()

    def dies(res):  # a worker's death; drawn here, no chart
        if os.getpid() != renderer:
            os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(plots, "PLOTS", plots.PLOTS + (("Dies", dies),))
    want = reports.write_reports(h100, tmp_path / "here")
    pool = reports.chart_pool()
    paths = reports.report_paths(tmp_path / "pooled")
    paths[0].parent.mkdir()
    t0 = time.monotonic()
    th = threading.Thread(target=reports.render, args=(h100, paths, pool), daemon=True)
    th.start()
    th.join(60)  # not forever, should it hang
    took = time.monotonic() - t0
    try:
        assert not th.is_alive() and took < 30, f"the report took {took:.1f} s"
        with pytest.raises(BrokenProcessPool):
            pool.submit(int)  # the worker did die
        assert paths[2].read_text() == want[2].read_text() and paths[1].read_text() == want[1].read_text()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def test_the_skipped_table_gives_a_shared_reason_once():
    """A machine without a driver skipped 16 GPU tests for one 150-character reason: report.md repeated it 16
    times; the rows after the first say (same reason), as the console does."""
    from ccbridge.report.tables import skipped_table
    from ccbridge.results import Result

    why = "no GPU: cannot load the CUDA driver library libcuda.so.1"
    res = Result(kind="probe", env={}, settings={}, skipped=[{"test": "a.x", "reason": why},
                                                             {"test": "a.y", "reason": why},
                                                             {"test": "b.z", "reason": "needs 2+ GPUs"}])
    assert skipped_table(res).rows == [["a.x", why], ["a.y", "(same reason)"], ["b.z", "needs 2+ GPUs"]]


def test_the_run_line_says_its_seconds_are_the_tests():
    """report.md said '3 s' where the probe's own line said 4 s (start-up and reports added): the run line says
    whose seconds it gives, and how many tests ran (a stranger's review, session 24)."""
    from ccbridge.report.tables import run_line
    from ccbridge.results import Result

    res = Result(kind="probe", env={}, settings={"quick": True, "device": 0, "tests": ["hostcrypto.aes256gcm"]},
                 duration_s=3.46)
    assert run_line(res).startswith("Run: 1 test of the quick suite on device 0, tests 3.5 s, 0 rows")


def _alive_children(pid: int) -> list[int]:
    """The processes whose parent is pid, zombies left out (/proc/PID/stat: pid (comm) state ppid ...)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:  # not a process, or it ended
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            out.append(int(entry))
    return out


def _still_alive(pids: list[int]) -> list[int]:
    alive = []
    for p in pids:
        try:
            if open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(p)
        except OSError:
            pass
    return alive


def test_closing_the_early_renderer_ends_its_chart_workers():
    """A probe that ends before its reports (a broken pipe, an interrupt) closes the renderer: its chart workers,
    forked one per core and waiting on their queue, end with it. SIGKILL of the renderer alone left them, children
    of init, blocked for ever (a stranger's review found two after `ccbridge probe --quick 2>&1 | head -2`)."""
    from ccbridge.cli.reports import EarlyReports

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc to find the workers in")
    early = EarlyReports()
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120  # its warm-up (matplotlib's import), then the fork
        while not workers and time.monotonic() < deadline and early.proc.poll() is None:
            time.sleep(0.1)
            workers = _alive_children(early.proc.pid)
        assert workers, "the renderer forked no chart worker"
        early.close()
        deadline = time.monotonic() + 10
        while _still_alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _still_alive(workers), "chart workers outlived their renderer"
    finally:
        for p in _still_alive(workers):
            os.kill(p, signal.SIGKILL)
        if early.proc.poll() is None:
            early.proc.kill()
            early.proc.wait()


def test_the_run_line_names_no_device_where_there_is_no_gpu():
    """report.md said 'on device 0' of a machine with no GPU (a stranger's review)."""
    from ccbridge.report.tables import run_line
    from ccbridge.results import Result

    missing = {"gpu": "no usable GPU: cannot load the CUDA driver library libcuda.so.1 (no NVIDIA driver here?)"}
    res = Result(kind="probe", env={}, settings={"quick": True, "device": 0, "tests": ["hostcrypto.aes256gcm"],
                                                 "missing": missing}, duration_s=3.46)
    line = run_line(res)
    assert line.startswith("Run: 1 test of the quick suite without a usable GPU, tests 3.5 s") and "device" not in line


def test_a_skip_reason_is_said_briefly_on_the_console():
    from ccbridge.probe import registry

    loader = ("no usable GPU: cannot load the CUDA driver library libcuda.so.1 (no NVIDIA driver here?): libcuda.so.1: "
              "cannot open shared object file: No such file or directory")
    assert registry.briefly(loader) == "no NVIDIA driver (libcuda.so.1 did not load)"
    assert registry.briefly("the CUDA driver sees no GPU") == "the CUDA driver sees no GPU"
    assert len(registry.briefly("no usable GPU: " + "x" * 200)) == 70


def test_where_the_time_went_gives_each_api_of_a_site_its_own_bar_capped_at_its_growth(tmp_path, capsys):
    """Session 27's decode sample: its line 20 (silu) grew 19.61 ms in cuLaunchKernel and 9.85 ms in
    cuLaunchKernelEx: both bars were labelled by the site alone and drawn on one place, the larger hiding the
    smaller. And each wait or toll was capped at the row's growth on its own, not at what was left of it:
    cuMemcpyDtoHAsync's bar (its stream wait 1.62 ms, its toll 2.94 ms) reached 2.7 ms where it grew 1.37 ms. Each
    row is its own bar now, named by its API, and sums to its growth (checked on session 28's sample)."""
    from ccbridge import results
    from ccbridge.cli import main

    traces = Path(__file__).resolve().parent.parent / "examples" / "traces" / "decode-h200"
    assert main(["account", str(traces / "native"), str(traces / "emulated"), "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    res = results.load(tmp_path / "a" / "result.json")
    panels = {title: (labels, segments) for title, labels, segments in plots.account_bars(res)}
    labels, segments = panels["by call site"]
    assert len(labels) == len(set(labels)), labels
    silu = [(label, sum(seg)) for label, seg in zip(labels, segments) if "loop.py:20 " in label]
    assert [label.rsplit("[", 1)[1] for label, _ in silu] == ["cuLaunchKernel]", "cuLaunchKernelEx]"], silu
    assert abs(sum(ms for _, ms in silu) - 29.04) < 0.01, silu
    for title, test in (("by API", "account.api"), ("by call site", "account.site")):
        grew = sorted((r.median for r in res.by_test(test) if r.metric == "in_call_delta" and r.median > 0),
                      reverse=True)
        assert [round(sum(seg), 9) for seg in panels[title][1]] == [round(ms, 9) for ms in grew[:10]], title
        assert all(min(seg) >= 0 and len(seg) == len(plots.PARTS) + 1 for seg in panels[title][1])
    d2h = next(seg for label, seg in zip(labels, segments) if "cuMemcpyDtoHAsync_v2" in label)
    assert abs(sum(d2h) - 3.491) < 0.001, d2h  # its growth, as the table says (+3.49 ms in session 28's sample)
    assert plots.account(res).startswith(b"\x89PNG")
