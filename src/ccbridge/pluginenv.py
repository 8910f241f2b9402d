"""Where the NCCL net plugin (libnccl-net-ccbridge.so) lives, and the environment that turns it on.

NCCL loads `libnccl-net-${NCCL_NET_PLUGIN}.so` from the library path (or
the library NCCL_NET_PLUGIN names, in the environment or NCCL's settings
files: status(), nccl_settings()), so a job sets
NCCL_NET_PLUGIN=ccbridge and puts `path()` on LD_LIBRARY_PATH; every
byte NCCL sends between ranks over the network then travels as AES-256-GCM
records keyed from $CCBRIDGE_KEY or $CCBRIDGE_KEY_FILE (the formats of
ccbridge.secure.keys). The sources are in ccbridge/native/ncclnet; the plugin
driven from Python: ccbridge.secure.netplugin. Files and the environment only:
the stamp (env) reads status() without NCCL, torch or the secure package.
"""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path

NAME = "libnccl-net-ccbridge.so"
BOUND = "ccbridge-net-bound"  # the plugin's uncoupled bound, a program beside it (native/netbound/bound.c)
# net.h's: a lane's threads take turns at its socket unless CCBRIDGE_NET_TURNS is 0 or 1 (then the stage pipeline)
DEFAULT_TURNS, MAX_TURNS, DEFAULT_PIPELINE, MAX_PIPELINE = 2, 8, 2, 8
MAX_LANES, DEFAULT_LANES = 16, 8  # net.h's: sockets a connection may have (CCBRIDGE_NET_LANES is held to it)
# net.h's and conn.c's spin_ns: lane 0's polling before it sleeps (CCBRIDGE_NET_SPIN_US; unset or empty: the default
# on machines of 8+ cores, else 0), held to 0..MAX_SPIN_US
DEFAULT_SPIN_US, SPIN_CORES, MAX_SPIN_US = 50, 8, 100000
ETC_CONF = "/etc/nccl.conf"  # NCCL's settings file for the machine, read after the user's
NCCL_KEYS = ("NCCL_NET_PLUGIN", "NCCL_NET")  # what status() reads as NCCL does: the environment, then the files
# NCCL's settings files as status() reads them (param.cc: ~ is $HOME, a line's trailing CR is stripped, lines come
# in fgets's pieces of at most 4095 bytes), and as the releases before read them (~ the password database's home,
# the CR kept, whole lines): ccbridge cannot know which NCCL a job loads, so it reads as the newer and says where
# the older would read otherwise (status()'s "older_nccl")
NEWER_NCCL, OLDER_NCCL = "NCCL 2.30.3 and later", "NCCL 2.29 and earlier"
LINE_BYTES = 4096  # NEWER_NCCL's line buffer: fgets reads at most 4095 bytes of a line at a time


def path() -> Path:
    """The folder holding the plugin (for LD_LIBRARY_PATH)."""
    return Path(__file__).resolve().parent / "lib"


def bound_program() -> Path:
    """`bench net`'s reference program; FileNotFoundError if the package was installed without building it."""
    prog = path() / BOUND
    if not os.access(prog, os.X_OK):
        raise FileNotFoundError(f"{prog} is not built (pip install . builds it; or python setup.py build_ext --inplace)")
    return prog


def library() -> Path:
    """The plugin itself; FileNotFoundError if the package was installed without building it."""
    lib = path() / NAME
    if not lib.exists():
        raise FileNotFoundError(f"{lib} is not built (pip install . builds it; or python setup.py build_ext --inplace)")
    return lib


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with NCCL_NET_PLUGIN=ccbridge and the plugin's folder first on LD_LIBRARY_PATH."""
    out = dict(os.environ if base is None else base)
    folder = str(library().parent)
    out["NCCL_NET_PLUGIN"] = "ccbridge"
    out["LD_LIBRARY_PATH"] = os.pathsep.join([folder] + [p for p in out.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    return out


def status(environ: dict[str, str] | None = None, files: list[str] | None = None) -> dict:
    """Will NCCL load the plugin in this environment? For `ccbridge env` and every result's stamp.

    Selected: the first library NCCL tries for NCCL_NET_PLUGIN is this one (plugin_first()). A name ("ccbridge",
    whose library is libnccl-net-ccbridge.so, or that file name itself) is looked up on the library path, so it
    loads where this folder is on LD_LIBRARY_PATH; a path (any name with a "/") is opened as it is, from this
    process's working folder where relative, so it loads where it is this plugin's file, whatever the library
    path. (NCCL 2.27.3 takes no path: it makes libnccl-net-<path>.so of one; 2.27.5 and later open it. The NCCL
    version is not known here: a path is counted as those later releases read it.)
    Required: NCCL_NET names it (compared without case, as NCCL compares it with the plugin's name).
    Both are read as NCCL reads them, from the environment, else its settings files (nccl_settings(); files: those
    files, default conf_files()); "nccl_settings" says where each was set, "conf_files" which files NCCL reads.
    The files are read as NEWER_NCCL (2.30.3 and later) reads them; where OLDER_NCCL (2.29 and earlier) would read
    other values (its ~ is the password database's home, not $HOME; it keeps a value's trailing CR), "older_nccl"
    holds its reading: nccl_settings, conf_files, selected, will_load and required as it would have them, and
    "why" (those causes, in words).
    LD_LIBRARY_PATH is the environment's alone: the loader takes the library path once, as the process starts."""
    e = os.environ if environ is None else environ
    lib = path() / NAME
    on_path = str(path()) in [str(Path(x).resolve()) for x in e.get("LD_LIBRARY_PATH", "").split(os.pathsep) if x]
    out = {"built": lib.exists(), "path": str(lib), "on_library_path": on_path, **_reading(e, files, lib, on_path),
           "lane_mode": lane_mode(e), "lanes": lanes(e), "spin_us": spin_us(e)}
    older = _reading(e, files, lib, on_path, older=True)
    if _values(older["nccl_settings"]) != _values(out["nccl_settings"]):
        out["older_nccl"] = {"why": _why_older(out, older), **older}
    return out


def _why_older(newer: dict, older: dict) -> list[str]:
    """Why OLDER_NCCL reads the settings otherwise than NEWER_NCCL: its ~, its CR, its whole lines."""
    why = []
    if newer["conf_files"] != older["conf_files"]:
        home = _password_home()
        why.append(f"their ~ is the password database's home, {home}, not $HOME" if home is not None else
                   "no user of this uid in the password database: no ~/.nccl.conf")
    if any(v["value"].endswith("\r") for v in older["nccl_settings"].values()):
        why.append("they keep a value's trailing CR")
    return why or ["they read a line of more than 4095 bytes whole"]


def _reading(e: dict[str, str], files: list[str] | None, lib: Path, on_path: bool, older: bool = False) -> dict:
    """status()'s fields that NCCL's settings files decide, as NEWER_NCCL (or, older, OLDER_NCCL) reads them."""
    files = conf_files(e, older=older) if files is None else files
    nccl = nccl_settings(e, files, older=older)
    first = plugin_first(_values(nccl))
    by_path = first is not None and "/" in first
    selected = _same_file(first, lib) if by_path else first in ("ccbridge", NAME)
    return {"selected": selected, "will_load": lib.exists() and selected and (by_path or on_path),
            # without it NCCL falls back to plaintext if the plugin fails
            "required": nccl.get("NCCL_NET", {}).get("value", "").lower() == "ccbridge",
            "nccl_settings": nccl, "conf_files": [str(f) for f in files]}


def _values(nccl: dict[str, dict[str, str]]) -> dict[str, str]:
    return {k: v["value"] for k, v in nccl.items()}


def conf_files(environ: dict[str, str] | None = None, home: str | None = None, etc: str = ETC_CONF,
               older: bool = False) -> list[str]:
    """The settings files NCCL reads, in its order (param.cc initEnv): the file $NCCL_CONF_FILE names where it is
    set and not empty, else ~/.nccl.conf, then `etc` (/etc/nccl.conf) in either case. A missing file is read as
    none. ~/.nccl.conf is home + "/.nccl.conf" (home "" is "/.nccl.conf"), home by default $HOME of `environ`, as
    NEWER_NCCL (2.30.3 and later) takes it; older: the password database's home for this uid, as OLDER_NCCL (2.29
    and earlier) takes it (getpwuid). No home (HOME unset; no user of this uid): no user file."""
    e = os.environ if environ is None else environ
    if e.get("NCCL_CONF_FILE"):
        return [e["NCCL_CONF_FILE"], etc]
    if home is None:
        home = _password_home() if older else e.get("HOME")
    return [etc] if home is None else [f"{home}/.nccl.conf", etc]


def _password_home() -> str | None:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # no user of this uid
        return None


def read_conf(file: str | os.PathLike, older: bool = False) -> dict[str, str]:
    """KEY=VALUE settings of one of NCCL's files, as param.cc setEnvFile reads them: a line starting with '#' is a
    comment, one without '=' is passed over, KEY is all before the first '=' and VALUE all after it, neither
    stripped (`KEY = v` sets "KEY " to " v"), each cut at 1023 bytes and at a NUL. A key's first line holds
    (setenv without overwriting). A file that cannot be read is no settings, no error.
    As NEWER_NCCL (2.30.3 and later) reads it: a line's trailing CR is stripped (with its LF), and a line of more
    than 4095 bytes is read in pieces of that many (fgets into 4096 bytes), each read as a line of its own.
    older: as OLDER_NCCL (2.29 and earlier) reads it: whole lines (getline), a trailing CR kept in VALUE."""
    try:
        data = Path(file).read_bytes()
    except OSError:  # missing, unreadable or a folder: NCCL's fopen or its read fails and it reads nothing
        return {}
    out: dict[str, str] = {}
    for line in data.split(b"\n") if older else _pieces(data):
        line = line.split(b"\0", 1)[0]
        if line.startswith(b"#") or b"=" not in line:
            continue
        key, value = (os.fsdecode(w[:1023]) for w in line.split(b"=", 1))
        if key:  # setenv refuses an empty name
            out.setdefault(key, value)
    return out


def _pieces(data: bytes) -> list[bytes]:
    """data's lines as NEWER_NCCL's fgets loop hands them on: at most LINE_BYTES - 1 bytes each (a longer line in
    several), up to a NUL (strlen), without a trailing LF and then without a trailing CR."""
    out, at = [], 0
    while at < len(data):
        lf = data.find(b"\n", at, at + LINE_BYTES - 1)
        end = lf + 1 if lf >= 0 else min(at + LINE_BYTES - 1, len(data))
        piece = data[at:end].split(b"\0", 1)[0]
        at = end
        piece = piece[:-1] if piece.endswith(b"\n") else piece
        out.append(piece[:-1] if piece.endswith(b"\r") else piece)
    return out


def nccl_settings(environ: dict[str, str] | None = None, files: list[str] | None = None,
                  keys: tuple[str, ...] = NCCL_KEYS, older: bool = False) -> dict[str, dict[str, str]]:
    """Each of `keys` that NCCL sees set, {"value": ..., "from": "environment" or the file}: NCCL's initEnv sets
    each file's settings without overwriting (setenv(..., 0)), so the environment wins over every file, and the
    first file (conf_files(): $NCCL_CONF_FILE or ~/.nccl.conf) over /etc/nccl.conf. The files read as NEWER_NCCL
    reads them (older: OLDER_NCCL; read_conf). (An env plugin, NCCL 2.28's NCCL_ENV_PLUGIN, may answer otherwise:
    it is not asked here.)"""
    e = os.environ if environ is None else environ
    out = {k: {"value": e[k], "from": "environment"} for k in keys if k in e}
    for f in conf_files(e, older=older) if files is None else files:
        if len(out) == len(keys):
            break
        for k, v in read_conf(f, older).items():
            if k in keys and k not in out:
                out[k] = {"value": v, "from": str(f)}
    return out


def settings_text(status_: dict) -> str | None:
    """Where NCCL_NET_PLUGIN and NCCL_NET come from, for `ccbridge env`, with the NCCL releases that read the files
    so: "NCCL_NET_PLUGIN='ccbridge' (environment); NCCL_NET unset (not in the environment, /root/.nccl.conf or
    /etc/nccl.conf), as NCCL 2.30.3 and later read their files", each value as Python writes it (a CR a file left
    in it shows); then, where NCCL 2.29 and earlier would read other values (status()'s "older_nccl"), theirs:
    ". NCCL 2.29 and earlier (they keep a value's trailing CR): NCCL_NET_PLUGIN='ccbridge\\r' (/root/.nccl.conf)".
    None for a stamp from before status() said."""
    if "nccl_settings" not in status_:
        return None
    said = f"{_said(status_)}, as {NEWER_NCCL} read their files"
    older = status_.get("older_nccl")
    return f"{said}. {OLDER_NCCL} ({'; '.join(older['why'])}): {_said(older)}" if older else said


def _said(reading: dict) -> str:
    *first, last = ["the environment", *reading.get("conf_files", [])]
    nowhere = f"not in {', '.join(first)} or {last}" if first else f"not in {last}"
    got = reading["nccl_settings"]
    said = [f"{k}={got[k]['value']!r} ({got[k]['from']})" for k in NCCL_KEYS if k in got]
    unset = [k for k in NCCL_KEYS if k not in got]
    return "; ".join(said + ([f"{' and '.join(unset)} unset ({nowhere})"] if unset else []))


def status_text(status_: dict | None, key: str | None = None) -> str:
    """The plugin's row of `ccbridge env` and of a report's machine table, from status() (or a result's stamp of
    it): what NCCL will do with the plugin, one consequence, as status()'s selected, will_load and required say.
    key: what the plugin's init will make of the key here, "taken", "none" or "refused" (`ccbridge env` checks it;
    a result's stamp does not hold it: None). NCCL tries the next network where the plugin's init fails (its own
    IB or sockets, unencrypted), unless NCCL_NET names the plugin: then it stops with an error (net.cc
    ncclNetInit). Where NCCL 2.29 and earlier read the settings files otherwise ("older_nccl") to another
    consequence, theirs follows."""
    if not status_:
        return "n/a"
    if not status_.get("built"):
        return "not built"
    said, used = _consequence(status_, key)
    older = status_.get("older_nccl")
    theirs = _consequence({**status_, **older}, key)[0] if older else said
    note = "" if theirs == said else f"; {OLDER_NCCL}: {theirs}"
    if used:  # and how it runs each lane
        said += (f"; {settings(status_)}" if status_.get("lanes") else
                 f"; lanes: {status_['lane_mode']}" if status_.get("lane_mode") else "")  # (stamps before them)
    return said + note


def _consequence(p: dict, key: str | None) -> tuple[str, bool]:
    """status_text's words, and whether NCCL will send through the plugin."""
    nccl = p.get("nccl_settings", {})
    if not p.get("selected"):
        return "built, not selected: needs NCCL_NET_PLUGIN=ccbridge" + \
            ("" if p.get("on_library_path") else " and its folder on LD_LIBRARY_PATH"), False
    if not p.get("will_load"):  # selected by name: the loader looks for it on the library path
        where = nccl.get("NCCL_NET_PLUGIN", {}).get("from")
        where = "" if where is None else f" ({where})" if where == "environment" else f" (file {where})"
        return f"selected{where}; will not load: add {Path(p['path']).parent} to LD_LIBRARY_PATH", False
    net = nccl.get("NCCL_NET")
    if net is not None and not p.get("required"):  # NCCL initialises only the network NCCL_NET names
        return f"NCCL will load it but not use it: NCCL_NET={net['value']!r} ({net['from']}) is not ccbridge", False
    if key in ("none", "refused"):
        fails = "NCCL will load it, but its init " + ("fails without a key" if key == "none" else "refuses the key")
        return fails + (": NCCL_NET=ccbridge, so NCCL stops with an error" if p.get("required") else
                        ": NCCL falls back to plaintext IB or sockets unless NCCL_NET=ccbridge"), False
    return "NCCL will load it" + (" (NCCL_NET=ccbridge: required)" if p.get("required") else
                                  "; set NCCL_NET=ccbridge so NCCL fails rather than falls back to plaintext"), True


def plugin_first(environ: dict[str, str] | None = None) -> str | None:
    """The library NCCL tries first for NCCL_NET_PLUGIN, as NCCL 2.27 and later read it (net.cc
    initPluginLibsOnceFunc, plugin_open.cc openPluginLib): unset, libnccl-net.so; "none" (in any case), empty or
    only commas, none; else the first of its comma-separated names, whole. NCCL tries the next only where that
    one fails to load or start, so a later name is not counted as selected."""
    e = os.environ if environ is None else environ
    value = e.get("NCCL_NET_PLUGIN")
    if value is None:
        return "libnccl-net.so"
    names = [] if value.lower() == "none" else [n for n in value.split(",") if n]
    return names[0] if names else None


def _same_file(name: str, lib: Path) -> bool:
    """dlopen(name) opens lib: the same file (a link to it counts), or where either is missing, the same path."""
    try:
        return os.path.samefile(name, lib)
    except OSError:
        return os.path.realpath(name) == os.path.realpath(lib)


def lanes(environ: dict[str, str] | None = None) -> int:
    """Sockets a connection this side listens for will have, read as conn.c's lanes_wanted reads
    CCBRIDGE_NET_LANES: unset, empty, 0, negative or not a number: 8; above 16: 16 (the receiving side's choice)."""
    e = os.environ if environ is None else environ
    n = _atoi(e.get("CCBRIDGE_NET_LANES"), 0)
    return DEFAULT_LANES if n < 1 else min(n, MAX_LANES)


def spin_us(environ: dict[str, str] | None = None) -> int:
    """Microseconds lane 0 polls before it sleeps, read as conn.c's spin_ns reads CCBRIDGE_NET_SPIN_US (atol):
    unset or empty: 50 on machines of 8+ cores, else 0; negative or not a number: 0; above 100000: 100000."""
    e = os.environ if environ is None else environ
    cores = os.sysconf("SC_NPROCESSORS_ONLN") if hasattr(os, "sysconf") else os.cpu_count()
    us = _atoi(e.get("CCBRIDGE_NET_SPIN_US"), DEFAULT_SPIN_US if (cores or 1) >= SPIN_CORES else 0, bits=64)
    return max(0, min(us, MAX_SPIN_US))


def settings(status_: dict) -> str:
    """What the plugin runs with, from status() (or a result's stamp of it), in the words of its own line in NCCL's
    log: "lanes 8, turns 2, spin 50 us"."""
    return f"lanes {status_['lanes']}, {status_['lane_mode']}, spin {status_['spin_us']} us"


def lane_mode(environ: dict[str, str] | None = None) -> str:
    """How the plugin runs each lane in this environment, read as conn.c reads it (turns_wanted, pipeline_wanted):
    "turns T", T threads taking turns at the lane's socket (CCBRIDGE_NET_TURNS, unset or empty: 2; at most 8), or,
    where CCBRIDGE_NET_TURNS is 0 or 1 (or not a number), "pipeline D": the stage pipeline, D records apart
    (CCBRIDGE_NET_PIPELINE, default 2, 1 read as 2, at most 8; two threads a lane), "pipeline 0" one thread a lane."""
    e = os.environ if environ is None else environ
    turns = _atoi(e.get("CCBRIDGE_NET_TURNS"), DEFAULT_TURNS)
    if turns >= 2:
        return f"turns {min(turns, MAX_TURNS)}"
    depth = _atoi(e.get("CCBRIDGE_NET_PIPELINE"), DEFAULT_PIPELINE)
    return f"pipeline {0 if depth < 1 else max(2, min(depth, MAX_PIPELINE))}"


def crypto_threads(environ: dict[str, str] | None = None) -> int:
    """How many of a lane's threads seal (open) its records at once under lane_mode: T taking turns; one in the
    stage pipeline (the lane thread seals while its stage writes; the stage opens what the lane thread read) and
    in the serial lane."""
    mode, n = lane_mode(environ).split()
    return int(n) if mode == "turns" else 1


def _atoi(text: str | None, default: int, bits: int = 32) -> int:
    """C's atoi (bits=64: atol) where text is set and not empty (leading blanks, a sign, the digits; 0 where none),
    else default."""
    if not text:
        return default
    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", text)
    if not m:
        return 0
    v = max(min(int(m.group(1)), 2**63 - 1), -2**63)  # glibc's atoi: strtol's long, then cut to int
    return v if bits == 64 else (v + 2**31) % 2**32 - 2**31
