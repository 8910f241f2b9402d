"""What CC drivers answer that plain drivers don't, on the CPU over the fake driver: pointer attributes of pinned
memory (the managed type, pinned_reports_managed), event-time reads noted in the trace, and the marks a program
makes (ccbridge.mark) as trace lines."""

import csv
import ctypes
import os
from pathlib import Path

import pytest

from ccbridge.emulate import profiles, trace
from test_emulator_cpu import DEVICE, PINNED, init, lib  # noqa: F401 - the fixture

c_p, c_u64, c_uint = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint
MEMORY_TYPE, IS_MANAGED = 2, 8
HOST, DEV = 1, 2


def lines(L, prefix, kind=None):
    L.ccbemu_trace_flush()
    path = Path(f"{prefix}.{os.getpid()}.csv")
    text = path.read_text().splitlines() if path.exists() else []  # (no line written: no file)
    return [r for r in csv.DictReader(text[1:]) if kind is None or r["kind"] == kind]


def attr(L, a, p):
    L.cuPointerGetAttribute.argtypes = [c_p, ctypes.c_int, c_u64]
    out = c_uint(0xFFFF)
    assert L.cuPointerGetAttribute(ctypes.byref(out), a, p) == 0
    return out.value


def attrs(L, p):
    """(memory type, is managed) through cuPointerGetAttributes, as cudart's cudaPointerGetAttributes asks."""
    L.cuPointerGetAttributes.argtypes = [c_uint, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(c_p), c_u64]
    kinds = (ctypes.c_int * 2)(MEMORY_TYPE, IS_MANAGED)
    vals = (c_uint * 2)(0xFFFF, 0xFFFF)
    data = (c_p * 2)(ctypes.addressof(vals), ctypes.addressof(vals) + 4)
    assert L.cuPointerGetAttributes(2, kinds, data, p) == 0
    return vals[0], vals[1]


@pytest.mark.parametrize("managed", [1, 0])
def test_pinned_memory_answers_managed_only_where_the_profile_says(lib, tmp_path, managed):  # noqa: F811
    prefix = tmp_path / "q"
    init(lib, trace=str(prefix), pinned_reports_managed=managed)
    pinned, dev = lib.ccbemu_fake_alloc(64, PINNED), lib.ccbemu_fake_alloc(64, DEVICE)
    if managed:
        assert (attr(lib, MEMORY_TYPE, pinned), attr(lib, IS_MANAGED, pinned)) == (DEV, 1)
        assert attrs(lib, pinned) == (DEV, 1)
    else:
        assert (attr(lib, MEMORY_TYPE, pinned), attr(lib, IS_MANAGED, pinned)) == (HOST, 0)
        assert attrs(lib, pinned) == (HOST, 0)
    assert attrs(lib, dev) == (DEV, 0)  # device memory is never touched
    q = lines(lib, prefix, "query")
    assert len(q) == (3 if managed else 0)  # each answer that was changed, on the pinned memory
    assert all(r["mem"] == "pinned" and r["api"].startswith("cuPointerGetAttribute") for r in q)


def test_the_emulators_own_classification_still_sees_pinned_memory(lib):  # noqa: F811
    """A pinned D2H is still a pinned crossing (DMA on the channel), whatever the program is told."""
    init(lib, pinned_reports_managed=1)
    n = 4096
    dev, dst = lib.ccbemu_fake_alloc(n, DEVICE), lib.ccbemu_fake_alloc(n, PINNED)
    ctypes.memmove(dev, os.urandom(n), n)
    s = lib.ccbemu_fake_stream()
    assert lib.cuMemcpyDtoHAsync_v2(dst, dev, n, s) == 0
    assert ctypes.string_at(dst, n) == ctypes.string_at(dev, n)  # byte-exact
    from test_emulator_cpu import summary
    assert summary(lib)["crossings"]["d2h_pinned"]["count"] == 1


def test_passthrough_answers_as_the_driver_and_the_shipped_cc_profiles_answer_managed():
    assert profiles.load("passthrough").params["pinned_reports_managed"].value == 0
    for name in ("b300", "h200", "rtxpro6000"):
        p = profiles.load(name).params["pinned_reports_managed"]
        assert p.value == 1 and ("PR #4740" in p.source or "#57404" in p.source)


def test_a_profile_file_from_before_the_parameter_runs_as_before(tmp_path):
    import json

    doc = json.loads((Path(profiles.__file__).parent / "profiles" / "b300.json").read_text())
    for key in profiles.ADDED:
        del doc["params"][key]
    f = tmp_path / "old.json"
    f.write_text(json.dumps(doc))
    p = profiles.load(str(f))
    assert p.params["pinned_reports_managed"].value == 0 and p.params["nccl_one_rank"].value == 0
    assert "not in the profile file" in p.params["pinned_reports_managed"].source


def test_event_time_reads_are_trace_lines(lib, tmp_path):  # noqa: F811
    """Each read is noted with what it returned (here: events never recorded, which the driver refuses)."""
    prefix = tmp_path / "e"
    init(lib, trace=str(prefix), emulate=0)
    lib.cuEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), c_p, c_p]
    a, b = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)  # the fake's events, never recorded
    ms = ctypes.c_float()
    for _ in range(3):
        assert lib.cuEventElapsedTime(ctypes.byref(ms), a, b) == 400
    t = lines(lib, prefix, "timing")
    assert [(r["api"], r["rc"]) for r in t] == [("cuEventElapsedTime", "400")] * 3
    assert trace.summarize(str(prefix)).by_api[("cuEventElapsedTime", "-", "-")]["count"] == 3


def test_marks_are_trace_lines_and_refuse_names_that_are_not_words(lib, tmp_path):  # noqa: F811
    prefix = tmp_path / "m"
    init(lib, trace=str(prefix))
    assert lib.ccbemu_mark(b"begin") == 1 and lib.ccbemu_mark(b"end") == 1
    for bad in (b"", b"a,b", b"x" * 33, b"new\nline", None):
        assert lib.ccbemu_mark(bad) == 0
    got = lines(lib, prefix, "mark")
    assert [r["api"] for r in got] == ["begin", "end"]
    s = trace.summarize(str(prefix))
    assert s.by_api == {} and s.procs[0].window == "marks"  # marks are no calls; they bound the window
    init(lib)  # no trace: nothing written
    assert lib.ccbemu_mark(b"begin") == 0


def test_ccbridge_mark_writes_a_mark_inside_ccbridge_run_and_nothing_outside(lib, tmp_path, monkeypatch):  # noqa: F811
    import ccbridge
    from ccbridge.emulate import launcher
    from ccbridge.errors import UsageError

    prefix = tmp_path / "w"
    init(lib, trace=str(prefix))
    monkeypatch.delenv(trace.LIB_ENV, raising=False)
    assert ccbridge.mark("begin") is False  # outside `ccbridge run`: nothing, no error
    monkeypatch.setenv(trace.LIB_ENV, launcher.library())  # as `ccbridge run` sets it
    with ccbridge.window():
        pass
    with pytest.raises(UsageError, match="begin and end"):
        ccbridge.mark("middle")
    assert [r["api"] for r in lines(lib, prefix, "mark")] == ["begin", "end"]


def test_a_polled_wait_is_a_sync_line_from_its_start(lib, tmp_path, monkeypatch):  # noqa: F811
    """marks.waited: a wait a program did by polling (ccbridge.secure's poll loop, whose event queries are not
    traced) is a sync line from its start to its end, so account finds it in a call natively as it does under CC,
    where the readback before it blocks."""
    import time

    from ccbridge import marks
    from ccbridge.emulate import launcher

    prefix = tmp_path / "p"
    init(lib, trace=str(prefix))
    monkeypatch.delenv(trace.LIB_ENV, raising=False)
    assert marks.waited("secure.poll", time.monotonic_ns()) is False  # outside `ccbridge run`: nothing
    monkeypatch.setenv(trace.LIB_ENV, launcher.library())
    t0 = time.monotonic_ns()
    time.sleep(0.02)
    assert marks.waited("secure.poll", t0) is True
    lib.ccbemu_waited.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    assert lib.ccbemu_waited(b"a,b", t0) == 0  # not a word: nothing
    assert lib.ccbemu_waited(b"late", time.monotonic_ns() + 10**9) == 0  # a start after now: nothing
    got = lines(lib, prefix, "sync")
    assert [r["api"] for r in got] == ["secure.poll"]
    assert int(got[0]["t_enter_ns"]) == t0 and int(got[0]["t_return_ns"]) - t0 >= 20_000_000
    assert trace.summarize(str(prefix)).by_api[("secure.poll", "-", "-")]["count"] == 1


def test_the_secure_poll_writes_its_wait_and_nothing_when_it_did_not_wait(monkeypatch):
    import time
    from types import SimpleNamespace

    from ccbridge.secure import group

    got = []
    monkeypatch.setattr(group.marks, "waited", lambda name, t0: got.append((name, t0)) or True)
    g = SimpleNamespace(timeout=5.0, rank=0)
    group.SecureGroup.poll(g, lambda: True, "ready at once")
    assert got == []
    answers = iter([False, False, False, True])
    before = time.monotonic_ns()
    group.SecureGroup.poll(g, lambda: next(answers), "a ring step")
    assert len(got) == 1 and got[0][0] == "secure.poll" and before <= got[0][1] <= time.monotonic_ns()
