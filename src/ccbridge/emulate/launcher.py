"""Start a program under the emulator: LD_PRELOAD the interposer with a profile."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ccbridge import ui
from ccbridge.bindings import core, libcrypto
from ccbridge.env import CONFIG_VAR, EMULATION_VAR
from ccbridge.errors import EmulatorError, UsageError
from ccbridge.emulate import coverage as driver_coverage
from ccbridge.emulate import native_floor, recorded
from ccbridge.emulate import sites as siterecorder
from ccbridge.emulate.siteboot import ccbridge_sites
from ccbridge.emulate.profiles import Profile, show
from ccbridge.emulate.targets import ENV_VAR as PROJECTION_VAR, Projection
from ccbridge.emulate.trace import has_trace
from ccbridge.ranks import NVLS_OFF  # what a job sees under a profile without NVLS, as every rank ccbridge starts
from ccbridge.textfit import cut, wrap

TRACE_MAX = 512  # the interposer's trace path buffer (emu.h), with its terminating NUL


def library() -> str:
    spec = importlib.util.find_spec("ccbridge._emu_native")
    if spec is None or not spec.origin:
        raise EmulatorError("the emulator library is not built; reinstall with `pip install .` (needs a C compiler)")
    return spec.origin


def check_libcrypto() -> None:
    try:
        libcrypto.load(libcrypto.SONAME)
    except (OSError, AttributeError) as e:
        raise EmulatorError(f"the emulator's AES-GCM needs OpenSSL 3 (libcrypto.so.3): {e}") from None


def _preload(lib: str, env: dict[str, str]) -> str:
    """env's LD_PRELOAD with the interposer first (once). ld.so splits LD_PRELOAD at spaces and colons: where the
    library's folder holds a space, LD_PRELOAD names the file alone and LD_LIBRARY_PATH (split at colons only)
    leads to its folder; a folder with a colon cannot be named either way."""
    folder, name = os.path.split(lib)
    if ":" in folder:
        raise EmulatorError(f"the emulator library's folder {folder} holds a ':', which the dynamic loader reads as "
                            "a separator: install ccbridge under a path without one")
    entry = lib
    if any(c.isspace() for c in folder):
        entry = name
        paths = env.get("LD_LIBRARY_PATH", "")
        kept = [p for p in paths.split(":") if p != folder] if paths else []
        env["LD_LIBRARY_PATH"] = ":".join([folder] + kept)
    # the interposer's own entries dropped whole (its path holds the separators where its folder has a space)
    rest = re.sub(rf"(^|[:\s]){re.escape(lib)}(?=$|[:\s])", r"\1", env.get("LD_PRELOAD", ""))
    others = [p for p in re.split(r"[:\s]+", rest) if p and p != name]
    return ":".join([entry] + others)


def environment(profile: Profile, config_path: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    lib = library()
    env["LD_PRELOAD"] = _preload(lib, env)
    env[CONFIG_VAR] = config_path
    env[ccbridge_sites.LIB_ENV] = lib  # lets tools in the child reach the interposer (counters, trace switch)
    env[EMULATION_VAR] = profile.name
    if profile.emulates and not profile.params["nvls"].value:
        env.update(NVLS_OFF)  # CC turns multicast off: the program's NCCL, PyTorch and NVSHMEM must not try it
    return env


def check(profile: Profile, cmd: list[str], trace: str | None = None, coverage: str | None = None,
          needs_driver: bool = False) -> None:
    """Everything run() needs, checked before anything starts: a command that can be
    executed, a trace folder, a coverage file to write, the library, libcrypto when
    the profile emulates, and a CUDA driver for the program to call where it records (trace, coverage: the
    interposer sees only the driver's calls, and where none loads there is nothing to record) or needs_driver."""
    if not cmd:
        raise EmulatorError("no command given: put the program after --, as in `-- CMD [ARGS...]`")
    exe = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0])
    if exe is None or not os.path.exists(exe):
        raise EmulatorError(f"command not found: {cmd[0]}")
    if os.path.isdir(exe):
        raise EmulatorError(f"{cmd[0]} is a folder, not a program")
    if not os.access(exe, os.X_OK):
        raise EmulatorError(f"{cmd[0]} is not executable")
    if trace:
        check_trace(trace)
    if coverage:
        ui.writable_file(coverage, "--coverage")
    library()
    if profile.emulates:
        check_libcrypto()
    if (needs_driver or trace or coverage) and (why := core.driver_missing()):
        raise EmulatorError(cut(f"{why}: nothing to {'emulate' if needs_driver else 'record'}", 100))


def refuse_old_trace(trace: str) -> None:
    """UsageError where trace files of an earlier run sit at this prefix: a second run's would fold into them."""
    prefix = str(Path(trace).resolve())
    old = [p for pat in ("csv", "summary.json", "sites.json") for p in glob.glob(f"{glob.escape(prefix)}.*.{pat}")]
    if os.path.lexists(prefix + recorded.SUFFIX):  # a link too: the stamp is never written through one
        old.append(prefix + recorded.SUFFIX)
    if old:
        raise UsageError(f"trace prefix {trace}: {len(old)} file(s) of an earlier run ({Path(old[0]).name}"
                         f"{', ...' if len(old) > 1 else ''}): give another prefix")


def check_trace(trace: str) -> str:
    """The absolute trace prefix; its folder must exist (it is not made) and take files, and hold no trace
    at this prefix already (a second run's files would fold into the first's)."""
    prefix = str(Path(trace).resolve())
    ui.writable_file(prefix, "trace prefix", fresh=False)  # its files are prefix.PID.*: refuse_old_trace
    refuse_old_trace(trace)
    if len(prefix) + len(".4294967295.summary.json") >= TRACE_MAX:
        raise UsageError(f"trace prefix {trace}: longer than the interposer's {TRACE_MAX}-byte limit")
    return prefix


@dataclass
class Ran:
    """A program's run under the emulator: its exit status, when it started and ended (CLOCK_MONOTONIC ns, the
    trace's clock; (0, 0): interrupted), and the coverage report written (None: none asked for, or interrupted)."""
    rc: int
    bounds: tuple[int, int]
    coverage: dict | None = None


def run(profile: Profile, cmd: list[str], trace: str | None = None, coverage: str | None = None,
        sites: bool = False, projection: Projection | None = None) -> int:
    """Run cmd under the emulator; its exit status (launch() has the rest)."""
    return launch(profile, cmd, trace, coverage, sites, projection).rc


def run_timed(profile: Profile, cmd: list[str], trace: str | None = None, coverage: str | None = None,
              sites: bool = False, projection: Projection | None = None) -> tuple[int, tuple[int, int]]:
    """Run cmd under the emulator; its exit status and when it started and ended (launch())."""
    ran = launch(profile, cmd, trace, coverage, sites, projection)
    return ran.rc, ran.bounds


def launch(profile: Profile, cmd: list[str], trace: str | None = None, coverage: str | None = None,
           sites: bool = False, projection: Projection | None = None) -> Ran:
    """Run cmd under the emulator. coverage: the driver coverage report (emulate/coverage.py) of every process
    of the run, written to this file (ui.write_out: a stream such as /dev/stdout is written through, never read
    back) and returned. sites (with trace): every Python process of the run notes its call sites beside the trace.
    projection: run in dilated time, as the projection's target GPU (emulate/targets.py). Its start and end
    leave out the native floor's measurement before it (about 1-2 s), which an account of two runs must not count
    as the program's."""
    check(profile, cmd, trace, coverage)
    with tempfile.TemporaryDirectory(prefix="ccbridge-emu-") as tmp:
        cfg = Path(tmp) / "profile.conf"
        v = {k: profile.params[k].value for k in ("nccl_toll_us", "nvlink_kept")}
        # projected, also a CC-off run dilates its crossings and links: it needs this machine's rates too
        host: dict[str, float] = {}  # what the loaded program plans by (the loader's policy), emulating runs only
        floor = native_floor.measure(collectives=projection is not None or v["nccl_toll_us"] > 0 or
                                     v["nvlink_kept"] < 1, links=projection is not None or v["nvlink_kept"] < 1,
                                     host=host if profile.emulates else None) \
            if profile.emulates or projection else {}
        prefix = check_trace(trace) if trace else None
        text = profile.config_text(prefix, floor, host)
        if projection:
            text += projection.config_lines(floor)
        cov_prefix = str(Path(tmp) / "cov")
        cfg.write_text(text + (f"coverage={cov_prefix}\n" if coverage else ""))
        try:
            env = environment(profile, str(cfg))
            if projection:
                env[PROJECTION_VAR] = json.dumps(projection.as_dict())
            if sites and trace:
                env = siterecorder.environment(env, prefix, library())
            if prefix:  # before the program: a trace it leaves, however it ends, says where it was recorded
                recorded.write(prefix, env)
            t = time.monotonic_ns()
            try:
                rc = subprocess.call(cmd, env=env)
            finally:
                if prefix and not has_trace(prefix):  # no driver call: no trace, so nothing to stamp
                    recorded.drop(prefix)
            bounds = (t, time.monotonic_ns())
        except OSError as e:  # checked above; what is left: it changed since, or exec refused it
            raise EmulatorError(f"cannot run {cmd[0]}: {e.strerror or e}") from None
        except KeyboardInterrupt:
            return Ran(130, (0, 0))
        report = driver_coverage.merge(cov_prefix) if coverage else None
        if coverage:
            ui.write_out(coverage, json.dumps(report, indent=1) + "\n")
        return Ran(rc, bounds, report)


def banner(profile: Profile, projection: Projection | None = None, who: str = "ccbridge run") -> str:
    """One line (more where what-ifs, a projection or `who`, the words it starts with, make it long: 120 columns
    each); the profile's title is `ccbridge profiles`'."""
    what = "EMULATED CC bridge" if profile.emulates else "interposer on, no costs (passthrough)"
    # passthrough adds nothing: on a CC-on machine its figures are that machine's own CC measurements
    whose = "not CC hardware measurements" if profile.emulates else "this machine's own"
    whatif = "".join(f" --set {k}={show(k, profile.params[k].value)}" for k in profile.overrides)
    lines = [f"{who}: {what}, profile {profile.name}{' with' + whatif if whatif else ''} "
             f"({profile.name}.json); figures are {whose}"]
    if projection:
        lines.append(f"{who}: {projection.describe()}; times read / r are the projection (a model, not a measurement)")
    return "\n".join(wrap(lines))


def announce(profile: Profile, projection: Projection | None = None, who: str = "ccbridge run",
             projecting: bool = False) -> str:
    """What a run under profile says first: its banner, or, for a profile that emulates or a projection
    (projecting: one was asked for, even where none could be made) where no CUDA driver loads, that it runs
    natively (the interposer hooks the driver: there is nothing to emulate or dilate, and the child's stamp says
    so: env.emulation_info)."""
    lost = [word for word, asked in (("EMULATED", profile.emulates), ("PROJECTED", projection or projecting)) if asked]
    if lost and (why := core.driver_missing()):
        return "\n".join(wrap([f"{who}: {why}: runs natively, not {' or '.join(lost)}"]))
    return banner(profile, projection, who)


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ccbridge", *args]
