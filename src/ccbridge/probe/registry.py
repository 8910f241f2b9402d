"""The one registry of probe tests and the runner that walks it.

A test is a function from a ProbeContext to rows. It declares what it needs
(a GPU, torch, several GPUs); the runner skips it with the reason when the
machine lacks that, and records (never raises) any failure, so one broken
family never costs the rest of the run.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ccbridge import environ, gputimer
from ccbridge.bindings import core
from ccbridge.errors import GpuError, UsageError
from ccbridge.results import Result, Row
from ccbridge.textfit import cut

NEEDS = ("gpu", "torch", "multi_gpu")
FAMILIES = ("compute", "transfer", "semantics", "smallcopy", "concurrency", "launch", "toll", "framework", "lifecycle",
            "hostcrypto", "peer")  # the modules of ccbridge.probe that register tests, in report order


@dataclass(frozen=True)
class Test:
    name: str  # "family.test"
    title: str
    needs: tuple[str, ...]
    fn: Callable[["ProbeContext"], Iterable[Row]]
    ahead: Callable[["Settings"], Any] | None = None  # starts its slow start-up early (see prestart())
    last: bool = False  # runs after the others: what it started ends in the background (see test())

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


REGISTRY: dict[str, Test] = {}


def test(name: str, title: str, needs: tuple[str, ...] = (), ahead: Callable[["Settings"], Any] | None = None,
         last: bool = False):
    """Register a probe test under a unique dotted name. ahead(settings), if given, starts what the test would
    otherwise start at its turn (interpreters, imports) while the run starts up, touching no GPU and measuring
    nothing; it returns a handle with close() (or None), which the test finds as ctx.ahead. last: the test's
    processes end after its rows, in the background (their GPU contexts going away): it runs after every other
    test, so that no measurement shares the machine with that end."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"unknown needs {unknown}")

    def wrap(fn):
        if name in REGISTRY:
            raise ValueError(f"probe test {name} registered twice")
        REGISTRY[name] = Test(name, title, tuple(needs), fn, ahead, last)
        return fn

    return wrap


def select(spec: str | None) -> list[Test]:
    """Tests named by a comma list of test or family names (all when None; an empty list is refused)."""
    load_families()
    if spec is None:
        return list(REGISTRY.values())
    listed = "`ccbridge probe --list` names them"  # the names themselves take hundreds of columns
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if not words:
        raise UsageError(f"--tests {cut(spec, 20)!r} names no test; {listed}")
    chosen: list[Test] = []
    for word in words:
        hits = [t for t in REGISTRY.values() if t.name == word or t.family == word]
        if not hits:
            close = difflib.get_close_matches(word, {t.family for t in REGISTRY.values()} | set(REGISTRY), n=1)
            raise UsageError(f"no probe test or family named {cut(word, 20)!r}"
                             + (f" (did you mean {close[0]}?)" if close else f"; {listed}"))
        chosen += [t for t in hits if t not in chosen]
    return chosen


def check_device(device: int) -> None:
    """Refuse a device index the machine does not have, before a run. Device 0 on a
    machine without a GPU is the CPU-only run (the GPU families are skipped)."""
    if device < 0:
        raise UsageError(f"--device {device}: a device index is 0 or more")
    if device == 0:
        return
    try:
        count, why = core.device_count(), ""
    except GpuError as e:
        count, why = 0, f" (no usable GPU: {e})"
    if device >= count:
        raise UsageError(cut(f"--device {device}: {count} GPU(s) visible{why}", 100))


@dataclass
class Settings:
    device: int = 0
    quick: bool = False
    tests: str | None = None
    timer: str = "events"  # the GPU timer of every GPU-time row (gputimer.choose(): events or globaltimer)

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


def briefly(reason: str) -> str:
    """A skip reason in a few words, for the console; the result and its reports keep it whole. The driver's loader
    failure ran to 150 columns and named libcuda.so.1 three times."""
    if "cannot load the CUDA driver library" in reason:
        return f"no NVIDIA driver ({core.DRIVER_SONAME} did not load)"
    return cut(reason.removeprefix("no usable GPU: "), 70)


@dataclass
class Machine:
    """What the runner found, with the reason for each missing capability. Whether torch can use CUDA is asked
    when a test first needs torch (check_torch): its import takes seconds, which the tests without it hide."""
    gpu_count: int = 0
    missing: dict[str, str] = field(default_factory=dict)
    torch_checked: bool = False

    @classmethod
    def detect(cls, device: int, torch_now: bool = True) -> "Machine":
        m = cls()
        try:
            m.gpu_count = core.device_count()
        except GpuError as e:
            m.missing["gpu"] = f"no usable GPU: {e}"
        if m.gpu_count and device >= m.gpu_count:
            m.missing["gpu"] = f"--device {device} asked, but only {m.gpu_count} GPU(s) visible"
        elif "gpu" not in m.missing and m.gpu_count == 0:
            m.missing["gpu"] = "the CUDA driver sees no GPU"
        if m.gpu_count < 2:
            m.missing["multi_gpu"] = f"needs 2+ GPUs, {m.gpu_count} visible"
        if torch_now:
            m.check_torch()
        return m

    def check_torch(self) -> None:
        if self.torch_checked:
            return
        self.torch_checked = True
        try:
            import torch  # deferred: torch, an optional dependency (seconds of import)

            if not torch.cuda.is_available():
                self.missing["torch"] = "torch cannot use CUDA here"
        except ImportError:
            self.missing["torch"] = "torch is not installed (pip install 'ccbridge[torch]')"


class ProbeContext:
    def __init__(self, settings: Settings, machine: Machine, on_step: Callable[[str], None] | None = None,
                 ahead: Any = None):
        self.settings = settings
        self.machine = machine
        self.ahead = ahead  # what the test's ahead() started, or None
        self._on_step = on_step or (lambda msg: None)
        self.steps: list[tuple[str, float]] = []  # (what, when it began): where a test's seconds went

    def step_seconds(self, t_start: float, t_end: float) -> list[dict]:
        """Each step's seconds, to the next step or t_end, after the test's own lead-in from t_start (the result's
        settings.steps: where a test's seconds went)."""
        steps = [("(before its first step)", t_start)] + self.steps
        ends = [t for _, t in steps[1:]] + [t_end]
        return [{"step": msg, "s": round(end - t, 3)} for (msg, t), end in zip(steps, ends)]

    @property
    def device(self) -> int:
        return self.settings.device

    def pick(self, full: Any, quick: Any) -> Any:
        return self.settings.pick(full, quick)

    def step(self, msg: str) -> None:
        self.steps.append((msg, time.perf_counter()))
        self._on_step(msg)


def load_families() -> None:
    """Import every family module, whose @test decorators fill REGISTRY, in report order."""
    # By name, at select time: the family modules import this registry (for test()), so an import of them here
    # would be a cycle; the registry stays below its families, and FAMILIES is their one list.
    for name in FAMILIES:
        importlib.import_module(f"ccbridge.probe.{name}")


def prestart(settings: Settings) -> dict[str, Any]:
    """The selected tests' ahead() handles by test name: call it first thing, so that their start-up overlaps the
    run's own (torch's import, the environment stamp), and close them after run() (and after anything that may
    hide their ends: the probe's reports). Without them, run() starts and closes its own."""
    started = {}
    for t in select(settings.tests):
        if t.ahead is not None:
            try:
                started[t.name] = t.ahead(settings)
            except Exception:  # noqa: BLE001 - nothing lost: the test starts its work itself at its turn
                started[t.name] = None
    return started


_torch_import: threading.Thread | None = None  # import_torch_early's thread, which _host_quiet waits for
_torch_import_lock = threading.Lock()
# The interpreter's switch interval while torch imports (Python's default: 5 ms). A test's native call returns to
# wait for the interpreter's lock while the import holds it: up to the interval each time where the import runs
# Python (its long native sections hold it longer). On one H200 the quick run's semantics steps took up to 0.24 s
# for 0.07 s of work while torch imported, and 0.15 s for 0.15 s in the full run, where it was over.
IMPORT_SWITCH_S = 0.0005


def import_torch_early() -> threading.Thread:
    """torch's import (seconds) on a thread of its own, started first thing: run() takes the tests that need no
    torch first (their timing is the native core's, in C, which a busy interpreter thread does not move), and the
    first test that needs torch finds it imported. Only a host-only test waits for it (_host_quiet). Meanwhile the
    interpreter's lock changes hands every IMPORT_SWITCH_S (the import's own long native sections still hold it).
    Called again while it imports, it gives the same thread (a second would restore the short interval)."""
    global _torch_import
    with _torch_import_lock:
        if _torch_import is not None and _torch_import.is_alive():
            return _torch_import
        was = sys.getswitchinterval()

        def work():
            try:
                import torch  # noqa: F401 - deferred: torch, whose import is the point of this thread
            except ImportError:
                pass  # check_torch says so, in its words, when a test needs it
            finally:
                sys.setswitchinterval(was)

        sys.setswitchinterval(IMPORT_SWITCH_S)
        th = _torch_import = threading.Thread(target=work, name="ccbridge-import-torch", daemon=True)
        th.start()
        return th


def _host_quiet() -> None:
    """A host-only measurement (the CPU's own rates) waits for torch's import: that would share what it measures."""
    if _torch_import is not None:
        _torch_import.join()


def run(settings: Settings, env: dict[str, Any], progress=None, started: dict[str, Any] | None = None) -> Result:
    """Run the selected tests; progress is an optional ui.Progress-like object, started what prestart() gave. The
    tests that need no torch run first, with this device's primary context held for them all (one context for the
    families that share it, as torch's held it for them when torch's tests ran first), those marked last after
    every other; the result lists everything in the selection's order. The caller closes what it started."""
    t_start = time.perf_counter()
    tests = select(settings.tests)
    own = started is None
    started = prestart(settings) if own else started
    try:
        machine = Machine.detect(settings.device, torch_now=False)
        result = Result(kind="probe", env=env, settings={"device": settings.device, "quick": settings.quick,
                                                         "tests": [t.name for t in tests], "missing": machine.missing,
                                                         "timer": settings.timer, "seconds": {}, "steps": {}})
        # the run's GPU timer for every GPU-time measurement of the run, its peer ranks too
        with environ.setting({gputimer.ENV_VAR: settings.timer}), _primary_context(settings.device, machine, tests):
            _run_tests(sorted(tests, key=lambda t: (t.last, "torch" in t.needs)), settings, machine, result, progress,
                       started)
        machine.check_torch()  # the result's list of what was missing, whether or not a test needed torch
    finally:
        for handle in started.values() if own else ():
            if handle is not None:
                handle.close()
    _selection_order(result, [t.name for t in tests])
    result.duration_s = round(time.perf_counter() - t_start, 2)
    return result


@contextmanager
def _primary_context(device: int, machine: Machine, tests):
    """The device's primary context retained for the run (no test's session makes and destroys it anew)."""
    session = None
    if "gpu" not in machine.missing and any("gpu" in t.needs for t in tests):
        try:
            session = core.Session(device, "pinned", 64)
        except GpuError:
            session = None  # each test meets the failure itself, in its own words
    try:
        yield
    finally:
        if session is not None:
            session.close()


def _selection_order(result: Result, names: list[str]) -> None:
    """Rows, errors, skips and seconds in the order the tests were selected (they ran torch's last)."""
    at = {n: i for i, n in enumerate(names)}
    result.rows.sort(key=lambda r: at.get(r.test, len(at)))
    result.errors.sort(key=lambda e: at.get(e["test"], len(at)))
    result.skipped.sort(key=lambda e: at.get(e["test"], len(at)))
    for key in ("seconds", "steps"):
        per = result.settings[key]
        result.settings[key] = {n: per[n] for n in names if n in per}


def _run_tests(tests, settings: Settings, machine: Machine, result: Result, progress, started: dict) -> None:
    for t in tests:
        if "torch" in t.needs:
            machine.check_torch()
        if "gpu" not in t.needs:
            _host_quiet()
        lacking = [machine.missing[n] for n in t.needs if n in machine.missing]
        if lacking:
            result.skipped.append({"test": t.name, "reason": lacking[0]})
            if progress:
                progress.skipped(t, briefly(lacking[0]))
            continue
        if progress:
            progress.begin(t)
        ctx = ProbeContext(settings, machine, on_step=(lambda m, t=t: progress.step(t, m)) if progress else None,
                           ahead=started.get(t.name))
        t0 = time.perf_counter()
        try:
            rows = list(t.fn(ctx))
            result.rows += rows
            status = f"{len(rows)} rows"
        except Exception as e:  # recorded, reported, and the run goes on
            result.errors.append({"test": t.name, "error": f"{type(e).__name__}: {e}",
                                  "traceback": traceback.format_exc(limit=6)})
            status = f"error: {e}"
        seconds = time.perf_counter() - t0
        result.settings["seconds"][t.name] = round(seconds, 2)
        if ctx.steps:
            result.settings["steps"][t.name] = ctx.step_seconds(t0, t0 + seconds)
        if progress:
            progress.end(t, status, seconds)
