"""Python call sites for ccbridge traces: which line of a traced Python program issued each driver call.

Loaded into the program by this folder's sitecustomize when CCBRIDGE_SITES names
a trace prefix (`ccbridge run --record T --sites`, `ccbridge account --profile
P -- CMD`); standalone, because the program's interpreter need not have
ccbridge. A profile hook notes each call made from a frame outside torch and the
standard library in the interposer's per-thread site slot (ccbemu_site_slot),
as an id for that frame's file, line and function and the callee's name (the
torch op where the callee is one). The interposer writes the slot into every
trace line the thread makes, so each driver call carries the innermost frame
outside torch that led to it. The table of ids is written at exit to
<prefix>.<pid>.sites.json.
"""

import atexit
import ctypes
import importlib.util
import json
import os
import sys
import sysconfig
import threading

SCHEMA = 1
ENV = "CCBRIDGE_SITES"
LIB_ENV = "CCBRIDGE_EMU_LIB"
_PACKAGES = ("site-packages", "dist-packages")

_prefix = _cwd = None
_user = {}       # code object -> issued from a frame that counts as a site (outside torch and the stdlib)
_ids = {}        # (code, line, callee key) -> site id
_sites = []      # site id -> [file, line, function, callee]
_slot_of = None  # the interposer's ccbemu_site_slot: this thread's slot


def _skipped():
    """Folders whose frames are never a site: torch (found without importing it), the stdlib, this folder."""
    spec = importlib.util.find_spec("torch")
    torch_dirs = list(spec.submodule_search_locations or []) if spec else []
    paths = sysconfig.get_paths()
    stdlib = [paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)]
    norm = lambda ds: tuple(os.path.realpath(d) + os.sep for d in ds)  # noqa: E731
    return norm(torch_dirs + [os.path.dirname(os.path.abspath(__file__))]), norm(stdlib)


_SKIP, _STDLIB = _skipped()


def _is_site(filename):
    if filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):  # python -c, exec'd strings: the program's own
        return True
    path = os.path.realpath(filename)
    if path.startswith(_SKIP):
        return False
    return not (path.startswith(_STDLIB) and not any(p in path for p in _PACKAGES))


class _Thread(threading.local):
    def __init__(self):
        self.slot = _slot_of()
        self.last = -1


_here = None  # this thread's _Thread, once started


def _profile(frame, event, arg):
    """sys.setprofile hook (before Python 3.12): every call and C call pays it."""
    if event == "call":  # frame: the callee's
        caller, callee, describe = frame.f_back, frame.f_code, _frame_name
        if caller is None:
            return
    elif event == "c_call":  # frame: the caller's; arg: the C function
        caller, callee, describe = frame, getattr(arg, "__qualname__", None) or type(arg).__name__, None
    else:
        return
    code = caller.f_code
    site = _user.get(code)
    if site is None:
        site = _user[code] = _is_site(code.co_filename)
    if site:
        _note(code, caller.f_lineno, callee, describe or str, frame if describe else callee)


def _on_call(code, offset, callable_, arg0):
    """sys.monitoring CALL (Python 3.12+): a call location outside the sites is switched off for good."""
    site = _user.get(code)
    if site is None:
        site = _user[code] = _is_site(code.co_filename)
    if not site:
        return _DISABLE
    line = _lines.get((code, offset))
    if line is None:
        line = _lines[(code, offset)] = next((ln for a, b, ln in code.co_lines() if a <= offset < b), None) or 0
    func = getattr(callable_, "__func__", callable_)  # bound methods are new objects on every call
    _note(code, line, getattr(func, "__code__", None) or getattr(func, "__qualname__", None) or type(func).__name__,
          _callable_name, func)


def _note(code, line, callee, describe, what):
    """This thread's slot says site (code, line, callee) from now on; describe(what) names a new callee."""
    key = (code, line, callee)
    sid = _ids.get(key)
    if sid is None:
        sid = _ids[key] = len(_sites)
        _sites.append([code.co_filename, line, getattr(code, "co_qualname", code.co_name), describe(what)])
    t = _here
    if sid != t.last:
        t.last = t.slot[0] = sid


def _frame_name(frame):
    """A called Python function as module.function."""
    mod = frame.f_globals.get("__name__", "")
    return f"{mod}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"


def _callable_name(func):
    mod, name = getattr(func, "__module__", None), getattr(func, "__qualname__", None) or type(func).__name__
    return f"{mod}.{name}" if mod and mod != "builtins" else name


_lines = {}
_DISABLE = getattr(getattr(sys, "monitoring", None), "DISABLE", None)


def _write():
    if _prefix is None:
        return
    mon = getattr(sys, "monitoring", None)
    if mon is not None and mon.get_tool(mon.PROFILER_ID) == "ccbridge call sites":
        mon.set_events(mon.PROFILER_ID, 0)
    else:
        sys.setprofile(None)
        threading.setprofile(None)
    doc = {"schema": SCHEMA, "pid": os.getpid(), "cwd": _cwd, "sites": _sites}
    path = f"{_prefix}.{os.getpid()}.sites.json"
    try:
        with open(path, "w") as f:
            json.dump(doc, f)
    except OSError as e:  # the trace still stands without its sites
        print(f"ccbridge: could not write call sites to {path}: {e}", file=sys.stderr)


def start(prefix):
    """Note sites for the trace at prefix; a warning and nothing more where the interposer is not loaded."""
    global _prefix, _cwd, _slot_of, _here
    if _prefix is not None:
        return
    try:
        fn = ctypes.CDLL(os.environ[LIB_ENV]).ccbemu_site_slot
    except (KeyError, OSError, AttributeError) as e:
        print(f"ccbridge: call sites off: the interposer's site slot is not there ({LIB_ENV}: {e})", file=sys.stderr)
        return
    fn.restype, fn.argtypes = ctypes.POINTER(ctypes.c_int), []
    _slot_of = fn
    _here = _Thread()
    _prefix, _cwd = prefix, os.getcwd()  # sites' relative file names are relative to where the program began
    atexit.register(_write)
    mon = getattr(sys, "monitoring", None)
    if mon is not None and mon.get_tool(mon.PROFILER_ID) is None:  # 3.12+: locations outside the sites cost nothing
        mon.use_tool_id(mon.PROFILER_ID, "ccbridge call sites")
        mon.register_callback(mon.PROFILER_ID, mon.events.CALL, _on_call)
        mon.set_events(mon.PROFILER_ID, mon.events.CALL)
    else:
        threading.setprofile(_profile)
        sys.setprofile(_profile)
