"""Where a trace was recorded: <prefix>.env.json beside its files, the env stamp of the machine that ran the
program and what the program ran under, written by the launcher as the run starts. An account made from traces
elsewhere (a laptop, CI, the samples in examples/traces) stamps its result with the machine that recorded them,
not the one that read them."""

from __future__ import annotations

import contextlib
import datetime as _dt
import glob
import json
import os
from pathlib import Path

from ccbridge import env as envmod, environ
from ccbridge.errors import EmulatorError, ResultFileError
from ccbridge.resultschema import STAMP
from ccbridge.schema import STRING, Schema, record
from ccbridge.textfit import json_why

SUFFIX = ".env.json"
# what the child reads of its run (env.emulation_info): the launcher's stamp is taken with these as the child has them
_RUN_VARS = (envmod.EMULATION_VAR, envmod.CONFIG_VAR, "CCBRIDGE_PROJECTION")
DOC = Schema(record({"created": STRING, "env": STAMP}, required=("created", "env"), closed=True))


def write(prefix: str, child: dict[str, str]) -> None:
    """Stamp the trace at prefix with this machine and the run the child environment describes. torch is left out:
    only the child's own interpreter could name its torch (and asking here would start CUDA in the launcher)."""
    with environ.setting({k: child[k] for k in _RUN_VARS if k in child}):
        stamp = envmod.stamp(with_torch=False)
    stamp["emulation"]["interposer_loaded"] = None  # the launcher's own maps say nothing of its child's
    doc = {"created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "env": stamp}
    try:
        Path(prefix + SUFFIX).write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as e:
        raise EmulatorError(f"cannot write the trace's stamp {prefix}{SUFFIX}: {e.strerror or e}") from None


def drop_if_alone(prefix: str) -> None:
    """Take the stamp away again where the program left no trace beside it (it made no driver call): a stamp
    names where a trace was recorded, and an empty run leaves nothing behind (ui.made_folder takes its folder)."""
    if not glob.glob(f"{glob.escape(prefix)}.[0-9]*.*"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(prefix + SUFFIX)


def read(prefix: str) -> dict | None:
    """The stamp beside the trace at prefix ({"created", "env"}); None where there is none (a trace recorded before
    ccbridge wrote them); ResultFileError naming the field for one ccbridge did not write."""
    path = prefix + SUFFIX
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ResultFileError(f"unreadable trace stamp {path}: {json_why(e)}") from None
    DOC.check(doc, f"trace stamp {path}", ResultFileError)
    return doc


def machine(stamp: dict) -> str:
    """A recorded machine in a few words: its host, its first GPU (and how many), when."""
    e = stamp["env"]
    gpus = len(e.get("nvml", {}).get("gpus") or [])
    return (f"host {e.get('host', '?')} ({envmod.gpu_name(e)}{f' x{gpus}' if gpus > 1 else ''}), "
            f"{stamp['created'][:16].replace('T', ' ')} UTC")


def same_machine(a: dict, b: dict) -> bool:
    """Two stamps of one machine: its host and its GPUs (by UUID where NVML gave them, else by name)."""
    def key(s: dict) -> tuple:
        e = s["env"]
        return e.get("host"), tuple(g.get("uuid") or g.get("name") for g in e.get("nvml", {}).get("gpus") or [])
    return key(a) == key(b)
