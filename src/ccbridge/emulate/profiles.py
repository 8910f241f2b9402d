"""Emulator profiles: published CC-on figures as parameters of the interposer.

A profile is a JSON file in emulate/profiles/: each parameter's value with the
source it comes from, and the published targets `ccbridge calibrate` checks.
What each parameter means is defined once, here.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from ccbridge import schema
from ccbridge.env import HOST_MARK, OVERRIDE_MARK
from ccbridge.errors import ProfileError  # noqa: F401 - part of this module's API
from ccbridge.textfit import cut

# name -> (unit, what it is); the interposer's config.c knows the same names.
PARAMS: dict[str, tuple[str, str]] = {
    "emulate": ("0/1", "1: emulate the CC bridge; 0: hooks on, every call passed straight to the driver"),
    "h2d_pinned_gbps": ("GB/s", "one channel's (context's) bandwidth, H2D from pinned memory; 0: not paced"),
    "d2h_pinned_gbps": ("GB/s", "one channel's bandwidth, D2H to pinned memory; 0: not paced"),
    "h2d_pageable_gbps": ("GB/s", "one channel's bandwidth, H2D from pageable memory; 0: not paced"),
    "d2h_pageable_gbps": ("GB/s", "one channel's bandwidth, D2H to pageable memory; 0: not paced"),
    "h2d_system_gbps": ("GB/s", "machine-wide H2D ceiling shared by every context and process; 0: none"),
    "d2h_system_gbps": ("GB/s", "machine-wide D2H ceiling shared by every context and process; 0: none"),
    "h2d_toll_us": ("us", "fixed cost of one H2D crossing (staging set-up)"),
    "d2h_toll_us": ("us", "fixed cost of one D2H crossing"),
    "h2d_pinned_ratio": ("x", "published CC-on / CC-off pinned H2D bandwidth: a channel never beats this machine's native times this"),
    "d2h_pinned_ratio": ("x", "published CC-on / CC-off pinned D2H bandwidth (the same floor)"),
    "h2d_pageable_ratio": ("x", "published CC-on / CC-off pageable H2D bandwidth: a crossing lasts at least its native copy over this"),
    "d2h_pageable_ratio": ("x", "published CC-on / CC-off pageable D2H bandwidth: a crossing lasts at least its native copy over this"),
    "launch_toll_us": ("us", "added to each kernel or graph launch (CC-on minus CC-off, framework level)"),
    "mgpu_launch_factor": ("x", "the launch toll's multiple once the process is multi-GPU (a communicator of 2+ ranks, "
                                "peer access enabled, or multi_gpu=1)"),
    "multi_gpu": ("0/1", "1: the system is in multi-GPU CC mode from the start (every launch pays the multi-GPU toll); "
                         "0: from the first communicator of 2+ ranks or peer access on"),
    "nccl_toll_us": ("us", "device-side time per NCCL operation (a group is one per GPU), on its stream before "
                           "it: the secure firmware's per-operation set-up"),
    "nccl_toll_max_bytes": ("bytes", "the per-operation toll applies to operations of at most this many bytes; "
                                     "0: to every one"),
    "nccl_one_rank": ("0/1", "1: operations on a one-rank communicator pay the toll too (they cross no GPU; "
                             "calibration's one-GPU check of the charge); 0: they pay nothing"),
    "nvlink_kept": ("x", "published CC-on / CC-off GPU-GPU bandwidth for large transfers: an operation also pays its "
                         "wire bytes x (1/kept - 1) at this machine's measured NVLink rate"),
    "nvls": ("0/1", "0: NVLink multicast (NVLS) off, as CC turns it off: cuMulticast* refused, the device attribute "
                    "says unsupported, NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and "
                    "NVSHMEM_DISABLE_NVLS=1 in the program's environment; 1: multicast left as the machine has it"),
    "sync_toll_us": ("us", "one host-GPU round trip: added to a synchronize that waits for submitted work, and to every D2H crossing"),
    "ctx_create_s": ("s", "added to each context creation (secure context set-up)"),
    "ctx_destroy_s": ("s", "added to each context destruction"),
    "host_alloc_toll_us": ("us", "added to each pinned host allocation"),
    "refuse_host_register": ("0/1", "cuMemHostRegister returns CUDA_ERROR_NOT_SUPPORTED, as under CC"),
    "pinned_reports_managed": ("0/1", "1: the program's pointer-attribute queries (cuPointerGetAttribute[s]) answer "
                                      "'managed' for pinned host memory, as CC drivers do (torch's is_pinned() is "
                                      "then False); the emulator's own classification still asks the driver"),
    "lanes": ("threads", "CPU threads that share one crossing's staging and AES-GCM work"),
    "chunk_bytes": ("bytes", "a pinned D2H lands in chunks of this size, each sealed as it lands"),
}

# name -> (min, max), inclusive, in the unit above. Every value must also be finite:
# the interposer turns them into nanosecond waits, and a NaN wait never ends.
# config.c refuses the same ranges (tests/test_emulator_cpu.py holds the two together).
RANGES: dict[str, tuple[float, float]] = {
    "emulate": (0, 1),
    "h2d_pinned_gbps": (0, 1e4),  # up to 10 TB/s, beyond any PCIe or C2C link
    "d2h_pinned_gbps": (0, 1e4),
    "h2d_pageable_gbps": (0, 1e4),
    "d2h_pageable_gbps": (0, 1e4),
    "h2d_system_gbps": (0, 1e4),
    "d2h_system_gbps": (0, 1e4),
    "h2d_toll_us": (0, 1e7),  # up to 10 s per call
    "d2h_toll_us": (0, 1e7),
    "h2d_pinned_ratio": (1e-3, 1),  # CC never makes a crossing faster
    "d2h_pinned_ratio": (1e-3, 1),
    "h2d_pageable_ratio": (1e-3, 1),
    "d2h_pageable_ratio": (1e-3, 1),
    "launch_toll_us": (0, 1e7),
    "mgpu_launch_factor": (1, 100),  # CC never makes a launch cheaper
    "multi_gpu": (0, 1),
    "nccl_toll_us": (0, 1e7),
    "nccl_toll_max_bytes": (0, 2 ** 50),
    "nccl_one_rank": (0, 1),
    "nvlink_kept": (1e-3, 1),
    "nvls": (0, 1),
    "sync_toll_us": (0, 1e7),
    "ctx_create_s": (0, 600),
    "ctx_destroy_s": (0, 600),
    "host_alloc_toll_us": (0, 1e7),
    "refuse_host_register": (0, 1),
    "pinned_reports_managed": (0, 1),
    "lanes": (1, 64),  # the interposer's most lane threads
    "chunk_bytes": (4096, 1 << 30),
}
WHOLE = {"emulate", "refuse_host_register", "lanes", "chunk_bytes", "multi_gpu", "nccl_toll_max_bytes", "nvls",
         "nccl_one_rank", "pinned_reports_managed"}  # integers: flags and counts
# Parameters added after profile files were in users' hands: a file without one runs as before they existed.
ADDED = {"nccl_one_rank": (0.0, "not in the profile file: off (one-rank operations pay nothing)"),
         "pinned_reports_managed": (0.0, "not in the profile file: off (the driver's own answer)")}


def show(key: str, value: float) -> str:
    """A parameter's value as a person reads it: whole numbers in full (chunk_bytes 8388608, not 8.38861e+06)."""
    return str(int(value)) if key in WHOLE or float(value).is_integer() else f"{value:g}"


def check_value(key: str, value) -> float:
    """value as the float the interposer gets; ProfileError naming key, value and range otherwise."""
    lo, hi = RANGES[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and lo <= value <= hi and (key not in WHOLE or float(value).is_integer())
    if not ok:
        kind = "a whole number" if key in WHOLE else "a number"
        raise ProfileError(f"parameter {key} = {value!r:.40}: expected {kind} in [{lo:.15g}, {hi:.15g}] "
                           f"({PARAMS[key][0]})")
    return float(value)


@dataclass(frozen=True)
class Param:
    value: float
    source: str


@dataclass(frozen=True)
class Target:
    value: float
    source: str
    tolerance: float = 0.15


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    params: dict[str, Param]
    targets: dict[str, Target]
    path: str
    overrides: dict[str, float] = field(default_factory=dict)  # --set: parameter -> the profile's own value

    @property
    def emulates(self) -> bool:
        return bool(self.params["emulate"].value)

    def config_text(self, trace: str | None = None, native: dict[str, float] | None = None,
                    host: dict[str, float] | None = None) -> str:
        """The key=value text the interposer reads (env.CONFIG_VAR names its file); native:
        this machine's measured bandwidths (native_floor.measure), the floor; host: facts for the programs
        that plan by them (native_floor.host_facts), which the interposer does not read."""
        lines = [f"profile={self.name}"]
        for key, v in [(k, self.params[k].value) for k in PARAMS] + sorted((native or {}).items()):
            lines.append(f"{key}={_num(v)}")
        # the interposer skips comments; the run's env stamp reads these (env.emulation_info)
        lines += [f"{OVERRIDE_MARK}{key}={_num(was)}" for key, was in self.overrides.items()]
        lines += [f"{HOST_MARK}{key}={_num(v)}" for key, v in sorted((host or {}).items())]
        if trace:
            lines.append(f"trace={trace}")
        return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def override(profile: Profile, settings: list[str] | None) -> Profile:
    """The profile with `KEY=VALUE` settings (--set) in place of its parameters: what-if runs.
    Each value is checked as a profile file's is; the profile's own value is kept in
    `overrides` and in the parameter's source, so a result says which what-if made it."""
    params, overrides = dict(profile.params), dict(profile.overrides)
    given: set[str] = set()
    for text in settings or []:
        key, eq, value = (part.strip() for part in text.partition("="))
        if not eq or not key or not value:
            raise ProfileError(f"--set {cut(text, 32)!r}: expected KEY=VALUE, e.g. launch_toll_us=0")
        if key not in PARAMS:
            raise ProfileError(f"--set {cut(text, 32)!r}: {_unknown(key)}")
        try:
            number = float(value)
        except ValueError:
            raise ProfileError(f"--set {cut(text, 32)!r}: {key} needs a number, got {value!r:.40}") from None
        try:
            number = check_value(key, number)
        except ProfileError as e:
            raise ProfileError(f"--set {cut(text, 32)!r}: {e}") from None
        if key in given:  # which one a run used would be a guess
            raise ProfileError(f"--set {key} is given twice")
        given.add(key)
        was = overrides.setdefault(key, profile.params[key].value)
        params[key] = Param(number, f"overridden on the command line (was {was:g})")
    return replace(profile, params=params, overrides=overrides)


def _unknown(key: str) -> str:
    """Why `key` is refused, with the nearest parameter's name (the whole list takes 500 columns)."""
    close = difflib.get_close_matches(key, PARAMS, n=1)
    return f"unknown parameter {cut(key, 24)!r}" + (f" (did you mean {close[0]}?)" if close else
                                                    "; `ccbridge profiles NAME` lists them")


def _dir():
    return resources.files("ccbridge.emulate") / "profiles"


def names() -> list[str]:
    return sorted(p.name[:-5] for p in _dir().iterdir() if p.name.endswith(".json"))


# A profile file: each parameter's value (its range checked by check_value, as --set's) with its source, and
# the published targets calibrate checks. Parameters added later (ADDED) may be absent.
SCHEMA = schema.Schema(schema.record({
    "name": schema.STRING, "title": schema.STRING,
    "params": {"type": "object",
               "propertyNames": {"enum": list(PARAMS),
                                 "message": "is no profile parameter (see `ccbridge profiles b300`)"},
               "additionalProperties": schema.record({"value": {}, "source": schema.TEXT},
                                                     required=("value", "source")),
               "required": [k for k in PARAMS if k not in ADDED]},
    "targets": schema.nullable(schema.mapping(schema.record(
        {"value": schema.NUMBER, "source": schema.STRING, "tolerance": {"type": "number", "exclusiveMinimum": 0}},
        required=("value", "source")))),
}, required=("params",), closed=True))


def parse(text: str, origin: str) -> Profile:
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ProfileError(f"{origin}: not valid JSON ({e})") from None
    SCHEMA.check(d, origin, ProfileError)
    params: dict[str, Param] = {}
    for key, entry in d["params"].items():
        try:
            params[key] = Param(check_value(key, entry["value"]), entry["source"])
        except ProfileError as e:
            raise ProfileError(f"{origin}: {e}") from None
    for key, (value, source) in ADDED.items():
        params.setdefault(key, Param(value, source))
    targets = {key: Target(float(t["value"]), t["source"], float(t.get("tolerance", 0.15)))
               for key, t in (d.get("targets") or {}).items()}
    return Profile(d.get("name") or Path(origin).stem, d.get("title", ""), params, targets, origin)


def load(name_or_path: str) -> Profile:
    """A shipped profile by name, or a profile file by path (ending in .json or naming a folder)."""
    if name_or_path in names():
        return parse((_dir() / f"{name_or_path}.json").read_text(), f"{name_or_path}.json")
    if not (name_or_path.endswith(".json") or "/" in name_or_path):
        raise ProfileError(f"unknown profile {cut(name_or_path, 24)!r}; known: {', '.join(names())} (or a path to a "
                           ".json profile)")
    try:
        text = Path(name_or_path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{name_or_path}: no such profile file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{name_or_path}: cannot read the profile ({getattr(e, 'strerror', None) or e})") from None
    return parse(text, name_or_path)
