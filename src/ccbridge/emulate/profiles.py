"""Emulator profiles: published CC-on figures as parameters of the interposer.

A profile is a JSON file in emulate/profiles/: each parameter's value with the
source it comes from, and the published targets `ccbridge calibrate` checks.
What each parameter means is defined once, here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ccbridge.errors import ProfileError  # noqa: F401 - part of this module's API

# name -> (unit, what it is); the interposer's config.c knows the same names.
PARAMS: dict[str, tuple[str, str]] = {
    "emulate": ("0/1", "1: emulate the CC bridge; 0: hooks on, every call passed straight to the driver"),
    "h2d_pinned_gbps": ("GB/s", "one channel's (context's) bandwidth, H2D from pinned memory"),
    "d2h_pinned_gbps": ("GB/s", "one channel's bandwidth, D2H to pinned memory"),
    "h2d_pageable_gbps": ("GB/s", "one channel's bandwidth, H2D from pageable memory"),
    "d2h_pageable_gbps": ("GB/s", "one channel's bandwidth, D2H to pageable memory"),
    "h2d_system_gbps": ("GB/s", "machine-wide H2D ceiling shared by every context and process"),
    "d2h_system_gbps": ("GB/s", "machine-wide D2H ceiling shared by every context and process"),
    "h2d_toll_us": ("us", "fixed cost of one H2D crossing (staging set-up)"),
    "d2h_toll_us": ("us", "fixed cost of one D2H crossing"),
    "launch_ratio": ("x", "a kernel or graph launch costs this many times its native submission"),
    "sync_toll_us": ("us", "added to each stream, event or context synchronize"),
    "ctx_create_s": ("s", "added to each context creation (secure context set-up)"),
    "ctx_destroy_s": ("s", "added to each context destruction"),
    "host_alloc_toll_us": ("us", "added to each pinned host allocation"),
    "refuse_host_register": ("0/1", "cuMemHostRegister returns CUDA_ERROR_NOT_SUPPORTED, as under CC"),
    "lanes": ("threads", "CPU threads that share one crossing's staging and AES-GCM work"),
    "chunk_bytes": ("bytes", "bounce-buffer chunk for pageable staging (the lanes seal it in 256 KiB slices)"),
}


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

    @property
    def emulates(self) -> bool:
        return bool(self.params["emulate"].value)

    def config_text(self, trace: str | None = None) -> str:
        """The key=value text the interposer reads (CCBRIDGE_EMU_CONFIG)."""
        lines = [f"profile={self.name}"]
        for key in PARAMS:
            v = self.params[key].value
            lines.append(f"{key}={int(v) if float(v).is_integer() else v}")
        if trace:
            lines.append(f"trace={trace}")
        return "\n".join(lines) + "\n"


def _dir():
    return resources.files("ccbridge.emulate") / "profiles"


def names() -> list[str]:
    return sorted(p.name[:-5] for p in _dir().iterdir() if p.name.endswith(".json"))


def parse(text: str, origin: str) -> Profile:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{origin}: not valid JSON ({e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("params"), dict):
        raise ProfileError(f"{origin}: expected an object with 'name', 'title', 'params' and 'targets'")
    params: dict[str, Param] = {}
    for key, entry in d["params"].items():
        if key not in PARAMS:
            raise ProfileError(f"{origin}: unknown parameter {key!r} (known: {', '.join(PARAMS)})")
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), (int, float)) or entry["value"] < 0:
            raise ProfileError(f"{origin}: parameter {key} needs a non-negative number 'value'")
        if not str(entry.get("source", "")).strip():
            raise ProfileError(f"{origin}: parameter {key} needs a 'source' saying where its value comes from")
        params[key] = Param(float(entry["value"]), entry["source"])
    missing = [k for k in PARAMS if k not in params]
    if missing:
        raise ProfileError(f"{origin}: missing parameters {', '.join(missing)}")
    if params["lanes"].value < 1 or params["launch_ratio"].value < 1 or params["chunk_bytes"].value < 4096:
        raise ProfileError(f"{origin}: lanes and launch_ratio must be >= 1, chunk_bytes >= 4096")
    targets = {}
    for key, t in (d.get("targets") or {}).items():
        try:
            targets[key] = Target(float(t["value"]), t["source"], float(t.get("tolerance", 0.15)))
        except (KeyError, TypeError, ValueError):
            raise ProfileError(f"{origin}: target {key} needs 'value' and 'source'") from None
    return Profile(d.get("name") or Path(origin).stem, d.get("title", ""), params, targets, origin)


def load(name_or_path: str) -> Profile:
    """A shipped profile by name, or a profile file by path."""
    p = Path(name_or_path)
    if p.suffix == ".json" and p.exists():
        return parse(p.read_text(), str(p))
    f = _dir() / f"{name_or_path}.json"
    if not f.is_file():
        raise ProfileError(f"unknown profile {name_or_path!r}; known: {', '.join(names())} (or a path to a .json profile)")
    return parse(f.read_text(), f"{name_or_path}.json")
