"""What a tenant can see of its NVLink fabric from inside the guest: per GPU, NVML's fabric info
(state, status, cluster UUID, clique ID, health bits), NVLink state and NVLink peers; and the
partition shape those give (GPUs per clique).

All of it is the driver's word, read through NVML: nothing here is signed, and the Fabric Manager
and the NVSwitch routing tables that made the partition are outside it (attest.CANNOT_VOUCH).
Every function takes the NVML module (pynvml, or tests/fake_nvml.py) and an initialised NVML.
"""

from __future__ import annotations

import ctypes
import uuid
from typing import Any

from ccbridge import nvml

STATES = {"NOT_SUPPORTED": "not-supported", "NOT_STARTED": "not-started", "IN_PROGRESS": "in-progress",
          "COMPLETED": "completed"}

# The health mask's fields, NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH}_<FIELD>, and what their values say.
# A value NVML names *_NOT_SUPPORTED reads "not-supported"; a field this binding lacks is left out.
_YES_NO = {1: True, 2: False}
HEALTH_FIELDS = {
    "DEGRADED_BW": _YES_NO,
    "ROUTE_RECOVERY": _YES_NO,  # a route recovery is in progress
    "ROUTE_UNHEALTHY": _YES_NO,
    "ACCESS_TIMEOUT_RECOVERY": _YES_NO,
    "INCORRECT_CONFIGURATION": {1: "none", 2: "incorrect-sysguid", 3: "incorrect-chassis-sn", 4: "no-partition",
                                5: "insufficient-nvlinks", 6: "incompatible-gpu-fw", 7: "invalid-location",
                                8: "gpu-state-invalid"},
    "PARTITION_ASSIGNED": _YES_NO,
    "GFM_STATE": {1: "connected", 2: "disconnected"},  # the global Fabric Manager, as the GPU last saw it
}
# The answer each field has when all is well; any other read value is a problem worth showing.
HEALTHY = {"degraded_bw": False, "route_recovery": False, "route_unhealthy": False, "access_timeout_recovery": False,
           "incorrect_configuration": "none", "partition_assigned": True, "gfm_state": "connected"}


def decode_health(nv, mask: int) -> dict[str, Any]:
    out = {}
    for field, meanings in HEALTH_FIELDS.items():
        shift = getattr(nv, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{field}", None)
        width = getattr(nv, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{field}", None)
        if shift is None or width is None:
            continue
        value = (mask >> shift) & width
        out[field.lower()] = "not-supported" if value == 0 else meanings.get(value, f"unknown({value})")
    return out


def health_problems(health: dict[str, Any]) -> list[str]:
    """The health fields that read something other than healthy ('not-supported' is not a problem)."""
    return [f"{k}={v}" for k, v in health.items() if k in HEALTHY and v != "not-supported" and v != HEALTHY[k]]


def _fabric_struct(nv, handle):
    """The newest fabric-info struct this driver takes: v3 (health summary), v2 (health mask), else the
    unversioned v1 call (no health). Returns (struct, None) or (None, the driver's reason)."""
    last = None
    for cls, version in (("c_nvmlGpuFabricInfo_v3_t", "nvmlGpuFabricInfo_v3"),
                         ("c_nvmlGpuFabricInfo_v2_t", "nvmlGpuFabricInfo_v2")):
        if not (hasattr(nv, cls) and hasattr(nv, version) and hasattr(nv, "nvmlDeviceGetGpuFabricInfoV")):
            continue
        info = getattr(nv, cls)()
        info.version = getattr(nv, version)
        try:  # the binding passes its argument through unchecked: a pointer, or the driver reads garbage
            nv.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            return info, None
        except Exception as e:  # an older driver: try the older struct; any other answer is the answer
            last = f"{type(e).__name__}: {e}"
            if getattr(e, "value", None) not in (nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                                                 nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None, last
    if hasattr(nv, "nvmlDeviceGetGpuFabricInfo"):
        info = nv.c_nvmlGpuFabricInfo_t()
        _, err = nvml.call(nv.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info))
        return (info, None) if err is None else (None, err)
    return None, last or "this nvidia-ml-py has no GPU fabric info call"


def gpu_fabric(nv, handle) -> dict[str, Any]:
    """stamp["nvml"]["gpus"][i]["fabric"]: NVML's GPU fabric info, decoded; or {"error": reason}."""
    info, err = _fabric_struct(nv, handle)
    if info is None:
        return {"error": err}
    state = {getattr(nv, f"NVML_GPU_FABRIC_STATE_{k}"): v for k, v in STATES.items()}
    out: dict[str, Any] = {
        "state": state.get(info.state, f"unknown({info.state})"),
        "status": "success" if info.status == nv.NVML_SUCCESS else nvml.constant_name(nv, "NVML_ERROR_", info.status),
        "cluster_uuid": str(uuid.UUID(bytes=bytes(info.clusterUuid))),
        "clique_id": int(info.cliqueId),
    }
    if hasattr(info, "healthMask"):
        out["health_mask"] = int(info.healthMask)
        out["health"] = decode_health(nv, info.healthMask)
    else:
        out["health_error"] = "the driver answered the unversioned fabric info call, which has no health mask"
    if hasattr(info, "healthSummary"):
        summary = {getattr(nv, f"NVML_GPU_FABRIC_HEALTH_SUMMARY_{k}", -1 - i): k.lower().replace("_", "-")
                   for i, k in enumerate(("NOT_SUPPORTED", "HEALTHY", "UNHEALTHY", "LIMITED_CAPACITY"))}
        out["health_summary"] = summary.get(info.healthSummary, f"unknown({info.healthSummary})")
    return out


def nvlink_state(nv, handle) -> dict[str, Any]:
    """How many NVLinks this GPU has and how many are up; the driver's reason where it has none."""
    states = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        active, err = nvml.call(nv.nvmlDeviceGetNvLinkState, handle, link)
        if err is not None:  # past the GPU's last link the driver answers an error: the count ends there
            if not states:
                return {"error": err}
            break
        states.append(active == nv.NVML_FEATURE_ENABLED)
    return {"links": len(states), "active": sum(states)}


def nvlink_peers(nv, handles: list) -> list[dict[str, Any]]:
    """Per GPU, the other visible GPUs NVML says it reaches peer-to-peer over NVLink."""
    out = []
    for i, h in enumerate(handles):
        peers, errors = [], []
        for j, other in enumerate(handles):
            if i == j:
                continue
            status, err = nvml.call(nv.nvmlDeviceGetP2PStatus, h, other, nv.NVML_P2P_CAPS_INDEX_NVLINK)
            if err is not None:
                errors.append(f"{j}: {err}")
            elif status == nv.NVML_P2P_STATUS_OK:
                peers.append(j)
        out.append({"nvlink": peers, **({"errors": errors} if errors else {})})
    return out


def add_to_gpus(nv, handles: list, gpus: list[dict[str, Any]]) -> None:
    """Fill each GPU's fabric, nvlink and peers entries of the stamp."""
    for h, g in zip(handles, gpus):
        g["fabric"] = gpu_fabric(nv, h)
        g["nvlink"] = nvlink_state(nv, h)
    for peers, g in zip(nvlink_peers(nv, handles), gpus):
        g["peers"] = peers


def partition(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """stamp["nvml"]["fabric"]: the cliques this tenant sees, from the GPUs whose fabric registration
    completed (a clique is the set of GPUs sharing a cluster UUID and clique ID)."""
    cliques: dict[tuple[str, int], list[int]] = {}
    for g in gpus:
        f = g.get("fabric") or {}
        if f.get("state") == "completed":
            cliques.setdefault((f["cluster_uuid"], f["clique_id"]), []).append(g["index"])
    out = [{"cluster_uuid": u, "clique_id": c, "gpus": idx} for (u, c), idx in sorted(cliques.items())]
    return {"cliques": out, "gpus_per_clique": [len(c["gpus"]) for c in out], "gpus": len(gpus)}


def summary(info: dict[str, Any]) -> str:
    """One line for a person: the partition shape, then what is off (states not completed, health problems)."""
    fab = info.get("fabric") or {}
    if "error" in fab:
        return f"unreadable ({fab['error']})"
    gpus = info.get("gpus") or []
    if not fab.get("cliques"):
        said = sorted({(g.get("fabric") or {}).get("state") or (g.get("fabric") or {}).get("error", "unread")
                       for g in gpus})
        return f"not on an NVLink fabric (GPU fabric info: {', '.join(said) or 'no GPU'})"
    parts = [f"clique {c['clique_id']} of cluster {c['cluster_uuid'][:8]}: GPUs {','.join(map(str, c['gpus']))}"
             for c in fab["cliques"]]
    text = f"{len(fab['cliques'])} clique(s), GPUs per clique {fab['gpus_per_clique']} of {fab['gpus']}; " + "; ".join(parts)
    off = [f"GPU {g['index']} {(g.get('fabric') or {}).get('state', 'unreadable')}" for g in gpus
           if (g.get("fabric") or {}).get("state") != "completed"]
    sick = [f"GPU {g['index']} {' '.join(health_problems(g['fabric'].get('health', {})))}" for g in gpus
            if health_problems((g.get("fabric") or {}).get("health", {}))]
    return text + "".join(f"; {x}" for x in off + sick)
