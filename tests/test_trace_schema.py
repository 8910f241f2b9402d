"""One trace schema, defined once: the interposer's header (emu.h) and what it
writes are held to emulate/trace.py's SCHEMA and COLUMNS; a trace of another
schema is refused with a clear error. Record-only traces (no emulation) hold
crossings, launches and synchronizes in the same schema as emulated ones."""

import ctypes
import os
import re
from pathlib import Path

import pytest

from ccbridge.emulate import trace
from ccbridge.errors import ResultFileError
from test_emulator_cpu import DEVICE, busy, host, init, lib  # noqa: F401 - the fixture

EMU_H = Path(__file__).resolve().parent.parent / "src" / "ccbridge" / "native" / "emu" / "emu.h"


def c_header():
    text = EMU_H.read_text()
    version = int(re.search(r"#define EMU_TRACE_SCHEMA (\d+)", text).group(1))
    body = re.search(r'#define EMU_TRACE_COLUMNS((?:[^\n]*\\\n)*[^\n]*)', text).group(1)  # the macro's lines
    columns = "".join(re.findall(r'"([^"]*)"', body))  # adjacent string literals, joined as C joins them
    return version, columns.split(",")


def test_c_and_python_declare_the_same_schema():
    version, columns = c_header()
    assert version == trace.SCHEMA
    assert columns == list(trace.COLUMNS)


def record_some(L, prefix, emulate):
    init(L, trace=str(prefix), emulate=emulate, sync_toll_us=0, h2d_toll_us=0, d2h_toll_us=0)
    n = 4096
    dev = L.ccbemu_fake_alloc(n, DEVICE)
    src, _k = host(L, n, True, os.urandom(n))
    dst, _k2 = host(L, n, False)
    s = L.ccbemu_fake_stream()
    busy(L, s, 100)
    assert L.cuMemcpyHtoDAsync_v2(dev, src, n, s) == 0
    assert L.cuMemcpyDtoHAsync_v2(dst, dev, n, s) == 0
    assert L.cuMemcpy(dst, dev, 100) == 0  # generic: direction from unified addressing
    assert L.cuStreamSynchronize(s) == 0
    assert ctypes.string_at(dst, n) == ctypes.string_at(src, n)
    L.ccbemu_trace_flush()
    return Path(f"{prefix}.{os.getpid()}.csv")


@pytest.mark.parametrize("emulate", [0, 1])
def test_the_interposer_writes_that_schema_record_only_or_emulated(lib, tmp_path, emulate):  # noqa: F811
    csv = record_some(lib, tmp_path / "t", emulate)
    first, second = csv.read_text().splitlines()[:2]
    assert first == f"# ccbridge trace schema {trace.SCHEMA}, profile test, emulate {emulate}"
    assert second == ",".join(trace.COLUMNS)
    s = trace.summarize(str(tmp_path / "t"))
    assert s.total("launch") == 1 and s.total("sync") == 1 and s.total("crossing") == 3
    assert s.by_api[("cuMemcpyHtoDAsync_v2", "h2d", "pinned")]["bytes"] == 4096
    assert s.by_api[("cuMemcpyDtoHAsync_v2", "d2h", "pageable")]["count"] == 1
    if emulate:  # files beside a trace that are not <prefix>.<pid>.csv (a copy, a longer prefix) are not its own
        (tmp_path / "t.copy.csv").write_text(csv.read_text())
        (tmp_path / f"t.b300.{os.getpid()}.csv").write_text(csv.read_text())
        again = trace.summarize(str(tmp_path / "t"))
        assert len(again.procs) == 1 and again.procs[0].pid == os.getpid() and again.total("crossing") == 3
    assert s.by_api[("cuMemcpy", "d2h", "pageable")]["bytes"] == 100
    assert s.by_api[("cuLaunchKernel", "-", "-")]["kind"] == "launch"
    assert s.by_api[("cuStreamSynchronize", "-", "-")]["kind"] == "sync"
    # the crossing entries of the summary count only emulated crossings
    assert s.total_crossings() == (3 if emulate else 0)
    text = trace.render(s)
    assert "1 launches" in text and text.startswith("EMULATED trace:" if emulate else "trace:")
    assert "stream wait ms" in text and all(len(line) <= 120 for line in text.splitlines())
    generic = next(line for line in text.splitlines() if line.startswith("cuMemcpy "))
    assert " <0.1 " in generic  # 100 bytes moved: not 0.0 MiB


def test_a_trace_of_another_schema_is_refused(tmp_path):
    cols = ",".join(trace.COLUMNS)
    (tmp_path / "a.1.csv").write_text(f"# ccbridge trace schema 99, profile b300, emulate 1\n{cols}\n")
    with pytest.raises(ResultFileError, match=f"trace schema 99; this ccbridge reads schema {trace.SCHEMA}"):
        trace.summarize(str(tmp_path / "a"))
    (tmp_path / "b.1.csv").write_text("t_enter_ns,t_return_ns,tid,ctx,stream,api,dir,mem,bytes\n1,2,3,,,x,h2d,pinned,4\n")
    with pytest.raises(ResultFileError, match=r"older ccbridge \(schema 1\)"):
        trace.summarize(str(tmp_path / "b"))
    (tmp_path / "c.1.csv").write_text(f"# ccbridge trace schema {trace.SCHEMA}, profile x, emulate 0\n{cols},extra\n")
    with pytest.raises(ResultFileError, match="columns are not those"):
        trace.summarize(str(tmp_path / "c"))


def test_threads_and_many_lines_all_reach_the_file(lib, tmp_path):  # noqa: F811
    """Per-thread buffers: every line of every thread is in the file after the flush, none torn."""
    import threading

    init(lib, trace=str(tmp_path / "t"), emulate=0)
    per = 3000  # more than one buffer's worth per thread

    def work():
        s = lib.ccbemu_fake_stream()
        for _ in range(per):
            busy(lib, s, 0)

    th = [threading.Thread(target=work) for _ in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    lib.ccbemu_trace_flush()
    s = trace.summarize(str(tmp_path / "t"))
    assert s.total("launch") == 4 * per
