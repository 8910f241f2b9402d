"""The environment stamp carried by every result: what machine, which CC state.

Nothing here is fatal: a missing NVML, GPU, torch or permission is recorded
as an error string in the stamp and the rest is still filled in.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import socket
from pathlib import Path
from typing import Any, Iterator

from ccbridge import fabric, libcrypto, nvml, pluginenv
from ccbridge.bindings import core
from ccbridge.version import __version__

CRYPTO_FLAGS = ("aes", "pclmulqdq", "vaes", "vpclmulqdq", "avx2", "avx512f", "sha_ni")
# What the emulator's launcher hands a program it starts, which the stamp reads back (emulation_info):
EMULATION_VAR = "CCBRIDGE_EMULATION_PROFILE"  # the profile's name
CONFIG_VAR = "CCBRIDGE_EMU_CONFIG"  # the path of the key=value configuration the interposer reads
OVERRIDE_MARK = "#was "  # a configuration line: a parameter set on the command line, with the profile's own value
HOST_MARK = "#host "  # a configuration line: a fact of this machine that programs plan by (native_floor.host_facts)


def cpu_info(cpuinfo_text: str | None = None) -> dict[str, Any]:
    if cpuinfo_text is None:
        try:
            cpuinfo_text = Path("/proc/cpuinfo").read_text()
        except OSError as e:
            return {"error": f"cannot read /proc/cpuinfo: {e}", "cores": os.cpu_count()}
    model, flags = None, set()
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {
        "model": model or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "flags": {f: f in flags for f in CRYPTO_FLAGS},
        "hypervisor": "hypervisor" in flags,
    }


def tee_guest(root: str = "/", cpu_flags: set[str] | None = None) -> dict[str, Any]:
    """Which CPU TEE this guest runs in, with the evidence for it."""
    r = Path(root)
    if cpu_flags is None:
        try:
            text = (r / "proc/cpuinfo").read_text()
            cpu_flags = next((set(l.partition(":")[2].split()) for l in text.splitlines() if l.startswith("flags")), set())
        except OSError:
            cpu_flags = set()
    evidence = []
    for dev in ("dev/tdx_guest", "dev/tdx-guest"):
        if (r / dev).exists():
            evidence.append(f"/{dev} present")
    if "tdx_guest" in cpu_flags:
        evidence.append("cpu flag tdx_guest")
    if evidence:
        return {"kind": "tdx", "evidence": evidence}
    if (r / "dev/sev-guest").exists():
        evidence.append("/dev/sev-guest present")
    snp = "sev_snp" in cpu_flags and "hypervisor" in cpu_flags
    if snp:
        evidence.append("cpu flags sev_snp + hypervisor")
    if evidence:
        return {"kind": "sev-snp", "evidence": evidence}
    if "sev" in cpu_flags and "hypervisor" in cpu_flags:
        return {"kind": "sev", "evidence": ["cpu flags sev + hypervisor"]}
    return {"kind": "none", "evidence": []}


def _settings(nv) -> tuple[Any, str | None]:
    """nvmlSystemGetConfComputeSettings with the versioned struct, passed by pointer: the binding hands
    its argument to the driver unchecked, and a struct passed by value reaches the driver as garbage,
    which it answers 25 (argument version mismatch). Returns (settings, None) or (None, the reason)."""
    if not hasattr(nv, "c_nvmlSystemConfComputeSettings_v1_t"):
        return None, "this nvidia-ml-py has no nvmlSystemConfComputeSettings_v1 struct"
    settings = nv.c_nvmlSystemConfComputeSettings_v1_t()
    settings.version = nv.nvmlSystemConfComputeSettings_v1
    rc, err = nvml.call(nv.nvmlSystemGetConfComputeSettings, ctypes.byref(settings))
    if err is not None:
        return None, err
    if rc != nv.NVML_SUCCESS:
        return None, f"nvmlSystemGetConfComputeSettings returned {rc}: {nvml.text(nv.nvmlErrorString(rc))}"
    return settings, None


def cc_state(nv) -> dict[str, Any]:
    """The confidential-computing state from NVML, every call's outcome kept."""
    out: dict[str, Any] = {}
    st, err = nvml.call(nv.nvmlSystemGetConfComputeState)
    if st is not None:
        out["state"] = {
            "environment": {nv.NVML_CC_SYSTEM_ENVIRONMENT_PROD: "prod", nv.NVML_CC_SYSTEM_ENVIRONMENT_SIM: "sim"}.get(st.environment, "unavailable"),
            "cc_feature": "enabled" if st.ccFeature == nv.NVML_CC_SYSTEM_FEATURE_ENABLED else "disabled",
            "devtools_mode": "on" if st.devToolsMode == nv.NVML_CC_SYSTEM_DEVTOOLS_MODE_ON else "off",
        }
    else:
        out["state_error"] = err
    settings, err = _settings(nv)
    mode = {nv.NVML_CC_SYSTEM_MULTIGPU_NONE: "none", nv.NVML_CC_SYSTEM_MULTIGPU_PROTECTED_PCIE: "protected-pcie",
            getattr(nv, "NVML_CC_SYSTEM_MULTIGPU_NVLE", -1): "nvle"}.get(settings.multiGpuMode) if settings else None
    if mode is not None:
        out["multi_gpu_mode"] = mode
    else:  # never a guessed mode: the reason, or the value the binding cannot name
        out["settings_error"] = err or f"multiGpuMode {settings.multiGpuMode} is not a mode this nvidia-ml-py knows"
    ready, err = nvml.call(nv.nvmlSystemGetConfComputeGpusReadyState)
    if ready is not None:
        out["gpus_ready"] = bool(ready == nv.NVML_CC_ACCEPTING_CLIENT_REQUESTS_TRUE)
    else:
        out["gpus_ready_error"] = err
    caps, err = nvml.call(nv.nvmlSystemGetConfComputeCapabilities)
    if caps is not None:
        out["capabilities"] = {
            "cpu": {nv.NVML_CC_SYSTEM_CPU_CAPS_NONE: "none", nv.NVML_CC_SYSTEM_CPU_CAPS_AMD_SEV: "amd-sev",
                    nv.NVML_CC_SYSTEM_CPU_CAPS_INTEL_TDX: "intel-tdx",
                    getattr(nv, "NVML_CC_SYSTEM_CPU_CAPS_AMD_SEV_SNP", -1): "amd-sev-snp",
                    getattr(nv, "NVML_CC_SYSTEM_CPU_CAPS_AMD_SNP_VTOM", -2): "amd-snp-vtom"}.get(caps.cpuCaps, f"unknown({caps.cpuCaps})"),
            "gpus": "cc-capable" if caps.gpusCaps == nv.NVML_CC_SYSTEM_GPUS_CC_CAPABLE else "not-cc-capable",
        }
    else:
        out["capabilities_error"] = err
    feature = out.get("state", {}).get("cc_feature")
    out["mode"] = {"enabled": "on", "disabled": "off"}.get(feature, "unknown")
    return out


def cc_label(cc: dict[str, Any]) -> str:
    """'on', 'off', 'devtools' (CC on with the GPU open to debugging tools) or 'unknown', from cc_state."""
    if cc.get("mode") == "on" and cc.get("state", {}).get("devtools_mode") == "on":
        return "devtools"
    return cc.get("mode", "unknown")


def nvml_info(nv=None) -> dict[str, Any]:
    """NVML's view: driver, GPUs (with their fabric), CC state and the fabric partition. nv: the NVML
    module (default pynvml); NVML is initialised here and shut down after."""
    nv = nv or nvml.load()
    if nv is None:
        return {"available": False, "error": "nvidia-ml-py is not installed"}
    try:
        nv.nvmlInit()
    except Exception as e:
        return {"available": False, "error": f"NVML unavailable ({type(e).__name__}: {e}); no NVIDIA driver?"}
    try:
        info: dict[str, Any] = {"available": True}
        info["driver"], _ = nvml.call(lambda: nvml.text(nv.nvmlSystemGetDriverVersion()))
        cuda, _ = nvml.call(nv.nvmlSystemGetCudaDriverVersion_v2)
        info["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        gpus, handles = [], []
        count, err = nvml.call(nv.nvmlDeviceGetCount)
        for i in range(count or 0):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            g = {"index": i}
            for key, fn in (("name", nv.nvmlDeviceGetName), ("uuid", nv.nvmlDeviceGetUUID),
                            ("pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration),
                            ("pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth),
                            ("pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration),
                            ("pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth)):
                v, e = nvml.call(fn, h)
                g[key] = nvml.text(v) if v is not None else None
            mem, _ = nvml.call(nv.nvmlDeviceGetMemoryInfo, h)
            g["memory_gib"] = round(mem.total / 2**30, 1) if mem else None
            gpus.append(g)
        fabric.add_to_gpus(nv, handles, gpus)
        info["gpus"] = gpus
        if err:
            info["device_count_error"] = err
            info["fabric"] = {"error": f"no GPU list: {err}"}
        else:
            info["fabric"] = fabric.partition(gpus)
        info["cc"] = cc_state(nv)
        return info
    finally:
        nvml.call(nv.nvmlShutdown)


def torch_info() -> dict[str, Any]:
    try:
        import torch  # deferred: torch, an optional dependency (seconds of import)
    except ImportError:
        return {"available": False, "error": "torch is not installed"}
    info = {"available": True, "version": torch.__version__, "cuda": torch.version.cuda}
    try:
        info["cuda_available"] = torch.cuda.is_available()
        if info["cuda_available"]:
            info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as e:
        info["cuda_available"] = False
        info["error"] = f"{type(e).__name__}: {e}"
    return info


def openssl_info() -> dict[str, Any]:
    try:
        return {"version": libcrypto.openssl_version(), "ia32cap": os.environ.get("OPENSSL_ia32cap")}
    except libcrypto.CryptoUnavailable as e:
        return {"version": None, "error": str(e)}


def emulation_info() -> dict[str, Any]:
    """Whether this process runs under the emulator (active: a profile that emulates; a passthrough or
    record-only run has its profile named but is not active), with its parameters and the evidence."""
    profile = os.environ.get(EMULATION_VAR)
    info: dict[str, Any] = {"active": bool(profile), "profile": profile or None}
    if not profile:
        return info
    try:  # `ccbridge run --project`: the run is the target GPU's in dilated time (emulate/targets.py)
        projection = json.loads(os.environ.get("CCBRIDGE_PROJECTION", "null"))
    except ValueError:
        projection = None
    if isinstance(projection, dict):
        info["projection"] = projection
    try:
        text = Path(os.environ.get(CONFIG_VAR, "")).read_text()
        info["params"] = dict(l.split("=", 1) for l in text.splitlines() if "=" in l and not l.startswith("#"))
        # hooks on without emulating (passthrough, `ccbridge run --record`): the figures are the machine's own,
        # native or real CC-on, and must not be labelled EMULATED
        info["active"] = info["params"].get("emulate", "1").strip() != "0"
        overrides = _overrides(text, info["params"])
        host = _host_facts(text)
        if host:
            info["host"] = host
        if overrides:
            info["overrides"] = overrides
    except OSError as e:
        info["params_error"] = f"cannot read the emulator configuration: {e}"
    try:
        info["interposer_loaded"] = "_emu_native" in Path("/proc/self/maps").read_text()
    except OSError:
        info["interposer_loaded"] = None
    if (info["active"] or "projection" in info) and (why := core.driver_missing()):
        # the interposer hooks the CUDA driver: without one it emulates and dilates nothing, the figures are native
        info["active"], info["no_driver"] = False, why
        info.pop("projection", None)
    return info


def _marked(config_text: str, mark: str) -> Iterator[tuple[str, float]]:
    """(KEY, VALUE) of each `MARK KEY=VALUE` comment line of a configuration whose value is a finite number."""
    for line in config_text.splitlines():
        if line.startswith(mark):
            key, _, value = line[len(mark):].partition("=")
            try:
                v = float(value)
            except ValueError:
                continue
            if math.isfinite(v):
                yield key, v


def _overrides(config_text: str, params: dict[str, str]) -> dict[str, dict[str, float]]:
    """The parameters a what-if run set on the command line (profiles.override writes them into
    the configuration as `#was KEY=VALUE` lines): {key: {"value": now, "was": the profile's}}."""
    out = {}
    for key, was in _marked(config_text, OVERRIDE_MARK):
        try:
            now = float(params[key])
        except (KeyError, ValueError):  # a hand-written configuration: not a what-if
            continue
        if math.isfinite(now):
            out[key] = {"value": now, "was": was}
    return out


def _host_facts(config_text: str) -> dict[str, float]:
    """The `#host KEY=VALUE` lines of a configuration (the launcher's measurements for planning)."""
    return {key: v for key, v in _marked(config_text, HOST_MARK) if key}


def emulation_label(emu: dict[str, Any]) -> str:
    """`b300`, or `b300 with --set launch_toll_us=0 (was 18.6)` for a what-if run."""
    sets = [f"{k}={v['value']:g} (was {v['was']:g})" for k, v in (emu.get("overrides") or {}).items()]
    return f"{emu.get('profile')}" + (f" with --set {', '.join(sets)}" if sets else "")


def emulated_banner(emu: dict[str, Any]) -> str | None:
    """The line every emulated (or projected) figure's output carries, or None for a native run."""
    proj = emu.get("projection") if isinstance(emu.get("projection"), dict) else None
    what = f"; PROJECTED to {proj.get('target')}, time x{proj.get('r', 0):.3g} (a model)" if proj else ""
    if not emu.get("active"):
        return f"CC-off run{what}" if proj else None
    return f"EMULATED CC bridge (profile {emulation_label(emu)}): not a CC hardware measurement{what}"


def stamp(nv=None, with_torch: bool = True) -> dict[str, Any]:
    """The full stamp; tolerant of every missing piece. nv: the NVML module (default pynvml). with_torch=False
    leaves "torch" out, for a caller that fills it in later (torch_info) rather than wait for its import now."""
    cpu = cpu_info()
    return {
        "ccbridge": __version__,
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu": cpu,
        "tee": tee_guest(),
        "openssl": openssl_info(),
        "nvml": nvml_info(nv),
        "torch": torch_info() if with_torch else {},
        "emulation": emulation_info(),
        "nccl_net_plugin": pluginenv.status(),
    }


def cc_mode(env: dict[str, Any]) -> str:
    """'on', 'off' or 'unknown' from a stamp."""
    return env.get("nvml", {}).get("cc", {}).get("mode", "unknown")


def gpu_name(env: dict[str, Any], index: int = 0) -> str:
    gpus = env.get("nvml", {}).get("gpus") or []
    if index < len(gpus):
        return gpus[index].get("name") or "unknown GPU"
    devs = env.get("torch", {}).get("devices") or []
    return devs[index] if index < len(devs) else "no GPU"
