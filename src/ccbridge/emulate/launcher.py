"""Start a program under the emulator: LD_PRELOAD the interposer with a profile."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ccbridge.env import EMULATION_VAR
from ccbridge.errors import EmulatorError  # noqa: F401 - part of this module's API
from ccbridge.emulate.profiles import Profile

CONFIG_VAR = "CCBRIDGE_EMU_CONFIG"


def library() -> str:
    spec = importlib.util.find_spec("ccbridge._emu_native")
    if spec is None or not spec.origin:
        raise EmulatorError("the emulator library is not built; reinstall with `pip install .` (needs a C compiler)")
    return spec.origin


def check_libcrypto() -> None:
    import ctypes

    try:
        ctypes.CDLL("libcrypto.so.3")
    except OSError as e:
        raise EmulatorError(f"the emulator's AES-GCM needs OpenSSL 3 (libcrypto.so.3): {e}") from None


def environment(profile: Profile, config_path: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    lib = library()
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = lib + (":" + preload if preload and lib not in preload else "")
    env[CONFIG_VAR] = config_path
    env["CCBRIDGE_EMU_LIB"] = lib  # lets tools in the child read the interposer's counters
    env[EMULATION_VAR] = profile.name
    return env


def run(profile: Profile, cmd: list[str], trace: str | None = None) -> int:
    """Run cmd under the emulator; its exit status."""
    if not cmd:
        raise EmulatorError("no command given: ccbridge run --profile NAME -- CMD [ARGS...]")
    if profile.emulates:
        check_libcrypto()
    if trace:
        trace = str(Path(trace).resolve())
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ccbridge-emu-") as tmp:
        cfg = Path(tmp) / "profile.conf"
        cfg.write_text(profile.config_text(trace))
        try:
            return subprocess.call(cmd, env=environment(profile, str(cfg)))
        except FileNotFoundError:
            raise EmulatorError(f"command not found: {cmd[0]}") from None
        except KeyboardInterrupt:
            return 130


def banner(profile: Profile) -> str:
    what = "EMULATED CC bridge" if profile.emulates else "interposer on, no costs (passthrough)"
    return f"ccbridge run: {what}, profile {profile.name} ({profile.title}); figures are not CC hardware measurements"


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ccbridge", *args]
