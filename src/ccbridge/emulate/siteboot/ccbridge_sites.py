"""Python call sites for ccbridge traces: which line of a traced Python program issued each driver call.

Loaded into the program by this folder's sitecustomize when CCBRIDGE_SITES names
a trace prefix (`ccbridge run --record T --sites`, `ccbridge account --profile
P -- CMD`); standalone, because the program's interpreter need not have
ccbridge. A hook on calls notes each call made from a frame outside torch and
the standard library in the interposer's per-thread site slot
(ccbemu_site_slot), as an id for that frame's file, line and function and the
callee's name (the torch op where the callee is one). The interposer writes the
slot into every trace line the thread makes, so each driver call carries the
innermost call outside torch that led to it. A driver call that no explicit
call leads to (an operator, `if tensor:`) carries the thread's last site. The
table of ids is written at exit to <prefix>.<pid>.sites.json.

Python 3.12+: a sys.monitoring CALL hook under a tool id of its own (the
profiler's stays free for cProfile and the like); a call location outside the
sites, or one calling a Python function that is itself in the sites (whose own
calls are then the sites), is switched off after its first call. Before 3.12:
sys.setprofile, which every call pays and which another profiler replaces.
"""

import atexit
import importlib.util
import json
import os
import sys
import sysconfig
import threading
import types

SCHEMA = 1
ENV = "CCBRIDGE_SITES"
LIB_ENV = "CCBRIDGE_EMU_LIB"  # bindings/emu.py's (this file imports no ccbridge: tests/test_sites.py holds the twin)
TOOL = "ccbridge call sites"
_PACKAGES = ("site-packages", "dist-packages")

_prefix = _cwd = _tool = None
_user = {}       # code object -> issued from a frame that counts as a site (outside torch and the stdlib)
_ids = {}        # location (code, line or offset[, callee]) -> site id
_sites = []      # site id -> [file, line, function, callee]
_new = threading.Lock()  # site ids: two threads seeing new sites at once must not share one
_slot_of = None  # the interposer's ccbemu_site_slot: this thread's slot


def _import_hooks():
    """Source files of the import hooks installed before the program starts (sys.meta_path finders put there by
    .pth files: setuptools' _distutils_hack, editable installs' finders). The import system calls them on every
    import, so a CUDA call made by code an import runs (torch's lazy submodules) would otherwise be charged to
    the hook's line, not to the program's line that caused it."""
    files = []
    for finder in sys.meta_path:
        mod = sys.modules.get(getattr(type(finder), "__module__", ""))
        path = getattr(mod, "__file__", None)
        if path:
            files.append(os.path.realpath(path))
    return tuple(files)


def _skipped():
    """Folders whose frames are never a site: torch (found without importing it), the stdlib, this folder."""
    spec = importlib.util.find_spec("torch")
    torch_dirs = list(spec.submodule_search_locations or []) if spec else []
    paths = sysconfig.get_paths()
    stdlib = [paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)]
    norm = lambda ds: tuple(os.path.realpath(d) + os.sep for d in ds)  # noqa: E731
    return norm(torch_dirs + [os.path.dirname(os.path.abspath(__file__))]), norm(stdlib)


_SKIP, _STDLIB = _skipped()
_HOOKS = _import_hooks()
# the emulator's ctypes binding, loaded by its path: this interpreter may not have ccbridge to import
EMU_BINDING = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "bindings", "emu.py")


def _site_slot_fn(lib):
    """The interposer's ccbemu_site_slot (declared by bindings/emu.py) in the library at lib."""
    spec = importlib.util.spec_from_file_location("ccbridge_sites_emu_binding", EMU_BINDING)
    binding = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(binding)
    return binding.function(lib, "ccbemu_site_slot")


def _is_site(filename):
    if filename.startswith("<frozen"):
        return False
    if filename.startswith("<"):  # python -c, exec'd strings: the program's own
        return True
    path = os.path.realpath(filename)
    if path.startswith(_SKIP) or path in _HOOKS:
        return False
    return not (path.startswith(_STDLIB) and not any(p in path for p in _PACKAGES))


class _Thread(threading.local):
    def __init__(self):
        self.slot = _slot_of()
        self.last = -1


_here = None  # this thread's _Thread, once started


def _is_site_code(code):
    site = _user.get(code)
    if site is None:
        site = _user[code] = _is_site(code.co_filename)
    return site


def _new_site(key, code, line, callee):
    with _new:
        sid = _ids.get(key)
        if sid is None:
            sid = _ids[key] = len(_sites)
            _sites.append([code.co_filename, line, getattr(code, "co_qualname", code.co_name), callee])
    return sid


def _set(sid):
    t = _here
    if sid != t.last:
        t.last = t.slot[0] = sid


def _profile(frame, event, arg):
    """sys.setprofile hook (before Python 3.12): every call and C call pays it."""
    if event == "call":  # frame: the callee's
        caller, callee = frame.f_back, frame.f_code
        if caller is None:
            return
    elif event == "c_call":  # frame: the caller's; arg: the C function
        caller, callee = frame, getattr(arg, "__qualname__", None) or type(arg).__name__
    else:
        return
    code = caller.f_code
    if not _is_site_code(code):
        return
    key = (code, caller.f_lineno, callee)
    sid = _ids.get(key)
    if sid is None:
        name = callee if isinstance(callee, str) else \
            f"{frame.f_globals.get('__name__', '')}.{getattr(callee, 'co_qualname', callee.co_name)}"
        sid = _new_site(key, code, caller.f_lineno, name)
    _set(sid)


# callables whose __module__/__qualname__ are plain slots: Python functions, builtins, classes, and the C
# method descriptors torch's tensor methods are (Tensor.item, .cpu, .to: "TensorBase.item")
_READABLE = (types.FunctionType, types.BuiltinFunctionType, type, types.MethodDescriptorType,
             types.WrapperDescriptorType, types.MethodWrapperType, types.ClassMethodDescriptorType)


def _callee(callable_):
    """(its code where it is a Python function, else None; a name): read off functions, methods, builtins and
    classes only. Any other callable is named by its type: its own attributes may be descriptors or run a
    __getattr__ (a lazy module, types.FunctionType's __code__) and are never touched."""
    func = callable_.__func__ if isinstance(callable_, types.MethodType) else callable_
    if isinstance(func, _READABLE):
        mod, name = getattr(func, "__module__", None), func.__qualname__  # (C descriptors have no module)
        code = func.__code__ if isinstance(func, types.FunctionType) else None
    else:
        mod, name, code = type(func).__module__, type(func).__name__, None
    return code, f"{mod}.{name}" if isinstance(mod, str) and mod != "builtins" else name


def _on_call(code, offset, callable_, arg0):
    """sys.monitoring CALL (Python 3.12+). A location's site is its first callee's; the location is switched
    off where it is outside the sites or calls a Python function in them (that function's calls are sites).
    Never raises into the program: a location whose callee cannot be read is switched off."""
    sid = _ids.get((code, offset))
    if sid is None:
        try:
            if not _is_site_code(code):
                return _DISABLE
            inner, name = _callee(callable_)
            if inner is not None and _is_site_code(inner):
                return _DISABLE
            line = next((ln for a, b, ln in code.co_lines() if a <= offset < b), None) or 0
            sid = _new_site((code, offset), code, line, name)
        except Exception:  # noqa: BLE001 - the hook must not change what the traced program does
            return _DISABLE
    _set(sid)


_DISABLE = getattr(getattr(sys, "monitoring", None), "DISABLE", None)


def _write():
    if _prefix is None:
        return
    mon = getattr(sys, "monitoring", None)
    if _tool is not None:
        mon.set_events(_tool, 0)
    else:
        if sys.getprofile() is not _profile:
            print("ccbridge: another profiler replaced the call-site hook on the main thread; its later driver "
                  "calls carry the last site noted before that", file=sys.stderr)
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
    global _prefix, _cwd, _slot_of, _here, _tool
    if _prefix is not None:
        return
    try:
        _slot_of = _site_slot_fn(os.environ[LIB_ENV])
    except (KeyError, OSError, AttributeError) as e:
        print(f"ccbridge: call sites off: the interposer's site slot is not there ({LIB_ENV}: {e})", file=sys.stderr)
        return
    _here = _Thread()
    _prefix, _cwd = prefix, os.getcwd()  # sites' relative file names are relative to where the program began
    atexit.register(_write)
    mon = getattr(sys, "monitoring", None)
    if mon is not None:  # 3.12+: a tool id the profiler and debugger ids leave free
        free = [i for i in (4, 3) if mon.get_tool(i) is None]
        if free:
            _tool = free[0]
            mon.use_tool_id(_tool, TOOL)
            mon.register_callback(_tool, mon.events.CALL, _on_call)
            mon.set_events(_tool, mon.events.CALL)
            return
    threading.setprofile(_profile)
    sys.setprofile(_profile)
