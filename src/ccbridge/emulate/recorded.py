"""Where a trace was recorded: <prefix>.env.json beside its files, the env stamp of the machine that ran the
program and what the program ran under, written by the launcher as the run starts. An account made from traces
elsewhere (a laptop, CI, the samples in examples/traces) stamps its result with the machine that recorded them,
not the one that read them. A stamp holds what every result's stamp holds (host name, GPU UUIDs, paths): a trace
shared carries it."""

from __future__ import annotations

import datetime as _dt
import json
import os

from ccbridge import env as envmod, environ, pluginenv, results, ui
from ccbridge.errors import EmulatorError, ResultFileError
from ccbridge.resultschema import STAMP
from ccbridge.schema import Schema, record
from ccbridge.textfit import cut_start, json_why

SUFFIX = ".env.json"
MAX_BYTES = 1 << 20  # a stamp is a few KiB
SHOWN = 40  # columns of a stamp's path in a one-line refusal: its end
# what the child reads of its run (env.emulation_info): the launcher's stamp is taken with these as the child has them
_RUN_VARS = (envmod.EMULATION_VAR, envmod.CONFIG_VAR, "CCBRIDGE_PROJECTION")
_UTC = {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", "message": "must be a UTC time"}
DOC = Schema(record({"created": _UTC, "env": {**STAMP, "required": ["host", "nvml", "emulation"]}},
                    required=("created", "env"), closed=True))


def write(prefix: str, child: dict[str, str]) -> None:
    """Stamp the trace at prefix with this machine and the run the child environment describes. torch is left out:
    only the child's own interpreter could name its torch (and asking here would start CUDA in the launcher).
    The file is made new (a link or a file there is refused: launcher.refuse_old_trace names it first)."""
    with environ.setting({k: child[k] for k in _RUN_VARS if k in child}):
        stamp = envmod.stamp(with_torch=False)
    stamp["emulation"]["interposer_loaded"] = None  # the launcher's own maps say nothing of its child's
    stamp["nccl_net_plugin"] = pluginenv.status(child)  # as the child's NCCL will read its environment
    text = json.dumps({"created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "env": stamp},
                      indent=1) + "\n"
    path = prefix + SUFFIX
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        except BaseException:  # a half-written stamp (a full disk, Ctrl-C) would refuse the next run at this prefix
            os.unlink(path)
            raise
    except OSError as e:
        raise EmulatorError(f"cannot write the trace's stamp {path}: {e.strerror or e}") from None


def drop(prefix: str) -> None:
    """Take the stamp away again (the launcher, where the program left no trace beside it: no driver call)."""
    try:
        os.unlink(prefix + SUFFIX)
    except FileNotFoundError:
        pass


def read(prefix: str) -> dict | None:
    """The stamp beside the trace at prefix ({"created", "env"}); None where there is none (a trace recorded before
    ccbridge wrote them, or copied without it); ResultFileError naming the field for one ccbridge did not write."""
    path = prefix + SUFFIX
    try:
        doc = json.loads(ui.read_small(path, MAX_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ResultFileError(f"unreadable trace stamp {cut_start(path, SHOWN)}: {json_why(e)}") from None
    DOC.check(doc, f"trace stamp {cut_start(path, SHOWN)}", ResultFileError)
    return doc


def machine(stamp: dict, when: bool = True) -> str:
    """A recorded machine in a few words: its host, its first GPU (and how many), when (when=True)."""
    e = stamp["env"]
    gpus = len(e["nvml"].get("gpus") or [])
    return (f"host {e['host']} ({envmod.gpu_name(e)}{f' x{gpus}' if gpus > 1 else ''})"
            + (f", {stamp['created'][:16].replace('T', ' ')} UTC" if when else ""))


def entry(name: str, stamp: dict | None) -> dict:
    """Where one trace of an account was recorded, as its result keeps it (settings "recorded"): its machine in a
    few words and its CC mode by NVML (both None: no stamp beside it)."""
    if stamp is None:
        return {"trace": name, "machine": None, "cc": None, "driver": None}
    e = stamp["env"]
    return {"trace": name, "machine": machine(stamp, when=False), "cc": envmod.cc_mode(e),
            "driver": e["nvml"].get("driver")}


def differ(entries: list[dict]) -> str | None:
    """A note where the traces of an account were not all recorded on one machine in one CC mode and driver, or
    some carry no stamp; None where all agree."""
    if not any(x["machine"] for x in entries):
        return "no trace says where it was recorded (no stamp beside any): the result's stamp is this machine's"
    if len({(x["machine"], x["cc"], x["driver"]) for x in entries}) == 1:
        return None
    return f"the traces were not all recorded alike: {results.recorded_text(entries)}"
