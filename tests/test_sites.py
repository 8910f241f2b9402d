"""Python call sites beside a trace: which line issued each driver call (emulate/sites.py and its recorder)."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from ccbridge import account, cli
from ccbridge.emulate import launcher, sites, trace
from ccbridge.errors import ResultFileError

# A traced program: the interposer (ctypes, its fake driver) writes the trace; the recorder, switched on by
# sites.environment() through the siteboot sitecustomize, notes the sites. Each readback goes through a
# Python function, as a torch op would (a ctypes call itself is not a Python call).
PROGRAM = textwrap.dedent("""
    import ctypes, os, sys, threading
    L = ctypes.CDLL(os.environ["CCBRIDGE_EMU_LIB"])  # no ccbridge import: any Python can run it
    c_p = ctypes.c_void_p
    L.ccbemu_fake_alloc.restype = c_p
    L.ccbemu_fake_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
    L.ccbemu_fake_stream.restype = c_p
    L.cuMemcpyDtoHAsync_v2.argtypes = [c_p, ctypes.c_uint64, ctypes.c_size_t, c_p]
    text = f"profile=test\\nemulate=1\\nlanes=1\\nchunk_bytes=65536\\nd2h_toll_us={sys.argv[2]}\\ntrace={sys.argv[1]}\\n"
    err = ctypes.create_string_buffer(256)
    assert L.ccbemu_test_init(text.encode(), err, 256) == 0, err.value
    dev, host, s = L.ccbemu_fake_alloc(64, 2), L.ccbemu_fake_alloc(64, 1), L.ccbemu_fake_stream()

    def read_token():
        assert L.cuMemcpyDtoHAsync_v2(host, dev, 32, s) == 0   # TOKEN_LINE

    def read_logits():
        assert L.cuMemcpyDtoHAsync_v2(host, dev, 64, s) == 0   # LOGITS_LINE

    def worker():
        read_logits()                      # WORKER_LINE

    for _ in range(3):
        read_token()                       # LOOP_LINE
    t = threading.Thread(target=worker)
    t.start(); t.join()
    L.ccbemu_trace_flush()
""")


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(PROGRAM.splitlines(), start=1) if marker in text)


def pythons() -> list[tuple[str, bool]]:
    """This interpreter, and others here whose hook differs: (path, whether it has sys.monitoring, 3.12+)."""
    have = sys.version_info[:2]
    found = [(sys.executable, have >= (3, 12))]
    for minor in (11, 12, 13):
        v = f"3.{minor}"
        for exe in glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}*/bin/python{v}")) + [shutil.which(f"python{v}")]:
            if (3, minor) != have and exe and subprocess.run([exe, "-c", ""], capture_output=True).returncode == 0:
                found.append((exe, minor >= 12))
                break
    return found


def record(tmp_path, name: str, toll_us: int, env=None, python=sys.executable, program=PROGRAM, file="prog.py",
           timeout=60) -> str:
    """Run program (saved as file) with the recorder on; the trace prefix. It must exit 0 and say nothing."""
    prog = tmp_path / file
    prog.write_text(program)
    prefix = str(tmp_path / name)
    run = subprocess.run([python, str(prog), prefix, str(toll_us)], capture_output=True, text=True,
                         env=sites.environment(env or dict(os.environ), prefix, launcher.library()), timeout=timeout,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert not run.stderr, run.stderr  # no warning: the recorder found the interposer's slot
    return prefix


def expected(monitoring: bool) -> tuple[str, str]:
    """The sites of the loop's and the worker's readbacks."""
    if monitoring:  # sys.monitoring sees every call, the ctypes one too: the innermost line is the call itself
        return (f"prog.py:{line_of('TOKEN_LINE')} read_token -> ctypes._FuncPtr",
                f"prog.py:{line_of('LOGITS_LINE')} read_logits -> ctypes._FuncPtr")
    # sys.setprofile sees Python and builtin calls: the lines that called the readback functions
    return (f"prog.py:{line_of('LOOP_LINE')} <module> -> __main__.read_token",
            f"prog.py:{line_of('WORKER_LINE')} worker -> __main__.read_logits")


@pytest.mark.parametrize("python,monitoring", pythons())
def test_each_call_gets_the_line_that_issued_it_on_its_own_thread(tmp_path, python, monitoring):
    s = trace.summarize(record(tmp_path, "t", 0, python=python))
    got = {site: agg["count"] for (site, api, d, m), agg in s.by_site.items()}
    loop, worker = expected(monitoring)
    assert got == {loop: 3, worker: 1}, got
    by = {site: (api, d, agg["bytes"]) for (site, api, d, m), agg in s.by_site.items()}
    assert by[loop] == ("cuMemcpyDtoHAsync_v2", "d2h", 96) and by[worker][2] == 64
    # the per-API table is what it was without sites
    assert sum(a["count"] for a in s.by_api.values()) == 4


RACE = PROGRAM.split("def read_token():")[0] + textwrap.dedent("""
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: a race in the recorder shows
    threads = []
    for i in range(8):  # 150 distinct functions a thread, so new sites all the time; thread i copies i + 1 bytes
        src = "".join(f"def f_{i}_{j}():\\n    assert L.cuMemcpyDtoHAsync_v2(host, dev, {i + 1}, s) == 0\\n"
                      for j in range(150))
        exec(src + f"def run_{i}():\\n" + "".join(f"    f_{i}_{j}()\\n" for j in range(150)), globals())
        threads.append(threading.Thread(target=globals()[f"run_{i}"]))
    for t in threads: t.start()
    for t in threads: t.join()
    L.ccbemu_trace_flush()
""")


@pytest.mark.parametrize("python,monitoring", pythons())
def test_threads_seeing_new_sites_at_once_never_share_an_id(tmp_path, python, monitoring):
    got = trace.summarize(record(tmp_path, "r", 0, python=python, program=RACE, file="race.py", timeout=120)).by_site
    assert sum(a["count"] for a in got.values()) == 8 * 150
    for (site, *_), agg in got.items():
        # the site's function f_i_j (monitoring) or its callee __main__.f_i_j (setprofile)
        i = int(re.search(r"f_(\d+)_\d+", site).group(1))
        assert agg["bytes"] == agg["count"] * (i + 1), (site, agg)


# Callables whose attributes misbehave, as libraries make them: transformers' doc.copy_func calls
# types.FunctionType (whose class attribute __code__ is a descriptor, not code), a lazy module's
# __getattr__ imports or raises, a __call__ object, a builtin bound method.
ODD = PROGRAM.split("for _ in range(3):")[0] + textwrap.dedent("""
    import types

    class Lazy:
        def __getattr__(self, name):
            raise ModuleNotFoundError(f"Could not import module {name!r}")
        def __call__(self):
            read_token()                   # CALLABLE_LINE

    copy = types.FunctionType(read_token.__code__, read_token.__globals__, name="copy")
    copy()                                 # COPY_LINE
    Lazy()()
    [].append(1)
    def via_descriptor():
        list.append([], 1)               # a C method descriptor: named by its qualname, not its type
        read_token()
    via_descriptor()
    L.ccbemu_trace_flush()
""")


@pytest.mark.parametrize("python,monitoring", pythons())
def test_odd_callables_never_break_the_program(tmp_path, python, monitoring):
    by_site = trace.summarize(record(tmp_path, "o", 0, python=python, program=ODD, file="odd.py")).by_site
    assert sum(a["count"] for a in by_site.values()) == 3  # every readback noted, each at a site
    if monitoring:  # the descriptor call was a site of its own, named as the tensor methods torch has are
        rec = json.loads(next(tmp_path.glob("o.*.sites.json")).read_text())
        assert any(callee == "list.append" for _, _, _, callee in rec["sites"]), rec["sites"]


@pytest.mark.skipif(not any(m for _, m in pythons()), reason="no Python 3.12+ here (sys.monitoring)")
def test_a_profiler_in_the_program_still_works(tmp_path):
    """The recorder's monitoring tool id leaves the profiler's free: python -m cProfile runs and sites are noted."""
    python = next(p for p, m in pythons() if m)
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    prefix = str(tmp_path / "p")
    run = subprocess.run([python, "-m", "cProfile", str(prog), prefix, "0"], capture_output=True, text=True,
                         timeout=60, env=sites.environment(dict(os.environ), prefix, launcher.library()), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "function calls" in run.stdout  # cProfile's own report
    assert trace.summarize(prefix).by_site


def test_account_names_the_site_whose_calls_grew(tmp_path, capsys):
    base, other = record(tmp_path, "native", 0), record(tmp_path, "cc", 50000)  # tolls far above load noise
    rc = cli.main(["account", base, other, "--out", str(tmp_path / "acc"), "--why"])
    out = capsys.readouterr().out
    assert rc == 0
    # the table names the site within 120 columns; --why gives its whole chain
    assert "by call site" in out and expected(sys.version_info >= (3, 12))[0] in out
    assert max(len(line) for line in out.splitlines()) <= 120
    res = json.loads((tmp_path / "acc" / "result.json").read_text())
    site_rows = [r for r in res["rows"] if r["test"] == "account.site" and r["metric"] == "in_call_delta"]
    top = max(site_rows, key=lambda r: r["median"])
    assert "read_token" in top["params"]["site"] and top["median"] >= 100  # 3 calls, 50 ms toll each
    html = (tmp_path / "acc" / "report.html").read_text()
    assert "Where the time went" in html and "data:image/png;base64," in html  # the plot of the growth
    lines, wall = account.attribute(trace.summarize(base), trace.summarize(other))
    assert lines[0].api == "cuMemcpyDtoHAsync_v2"


def test_a_programs_own_sitecustomize_still_runs(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nos.environ['MINE_RAN'] = '1'\n")
    env = dict(os.environ, PYTHONPATH=str(mine))
    out = subprocess.run([sys.executable, "-c", "import os, sitecustomize; print(os.environ.get('MINE_RAN'), "
                          "sitecustomize.__file__.endswith('mine/sitecustomize.py'))"], capture_output=True,
                         text=True, env=sites.environment(env, str(tmp_path / "x"), launcher.library()), timeout=60)
    assert out.stdout.strip() == "1 True", out.stderr


def test_frames_in_torch_and_the_stdlib_are_not_sites():
    from ccbridge.emulate.siteboot import ccbridge_sites as rec

    import json as stdlib_module

    assert not rec._is_site(stdlib_module.__file__) and not rec._is_site(rec.__file__)
    assert not rec._is_site("<frozen importlib._bootstrap>")
    assert rec._is_site("<string>") and rec._is_site(account.__file__)
    torch = pytest.importorskip("torch")
    assert not rec._is_site(torch.__file__)
    transformers = pytest.importorskip("transformers")
    assert rec._is_site(transformers.__file__)  # installed, but outside torch: the issuing frame people read


def test_damaged_sites_files_are_clear_errors(tmp_path):
    prefix = record(tmp_path, "t", 0)
    path = next(tmp_path.glob("t.*.sites.json"))
    path.write_text("{broken")
    with pytest.raises(ResultFileError, match="unreadable call sites .*sites.json"):
        trace.summarize(prefix)
    path.write_text(json.dumps({"schema": 99}))
    with pytest.raises(ResultFileError, match="schema 99"):
        trace.summarize(prefix)
    path.write_text(json.dumps({"schema": 1, "pid": 1, "cwd": "/", "sites": [["a.py", 1, "f", "g"]] * 64}))
    with pytest.raises(ResultFileError, match="written by process 1, not .* different runs"):
        trace.summarize(prefix)



def test_an_import_hook_is_never_a_site(tmp_path, monkeypatch):
    """setuptools' _distutils_hack (a sys.meta_path finder from a .pth file) runs Python on every import: a CUDA
    call made by code an import runs (torch's lazy submodules) was charged to the hook's line."""
    import importlib.util

    (tmp_path / "somehook.py").write_text("class Finder:\n    def find_spec(self, *a):\n        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import somehook

    monkeypatch.setattr(sys, "meta_path", [somehook.Finder()] + sys.meta_path)
    spec = importlib.util.spec_from_file_location("ccbridge_sites_fresh", sites.recorder.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)  # as the sitecustomize loads it: after .pth files installed their hooks
    assert not fresh._is_site(somehook.__file__)
    (tmp_path / "prog.py").write_text("x = 1\n")
    assert fresh._is_site(str(tmp_path / "prog.py"))  # the program's own code still is


def test_the_recorder_and_the_binding_name_the_same_library_variable():
    """The call-site hook imports no ccbridge (its interpreter may lack it), so it writes the variable's name
    itself: held to bindings/emu.py's, the one `ccbridge run` sets and ccbridge.mark reads."""
    from ccbridge.bindings import emu

    assert sites.recorder.LIB_ENV == emu.LIB_ENV
