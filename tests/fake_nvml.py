"""A fake NVML module for the CPU tests: the real binding's constants, structs and error classes
(pure ctypes, no driver), with the calls that reach the driver answered from a scenario.

The fake answers the way the driver does where ccbridge once got it wrong: nvmlSystemGetConfComputeSettings
and nvmlDeviceGetGpuFabricInfoV take a pointer to a struct of a version the driver knows, and answer
NVML_ERROR_ARGUMENT_VERSION_MISMATCH to anything else (a struct passed by value, another version).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pynvml

SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
VERSION_MISMATCH = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def health_mask(**fields: int) -> int:
    """A fabric health mask from field values, e.g. health_mask(degraded_bw=1, gfm_state=2). A field this
    nvidia-ml-py lacks (older bindings have no GFM_STATE) is left out, as fabric.decode_health leaves it out: a
    module that builds a scenario at import still loads there (the lent machines' binding is older than CI's)."""
    mask = 0
    for name, value in fields.items():
        shift = getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{name.upper()}", None)
        mask |= 0 if shift is None else value << shift
    return mask


@dataclass
class Fabric:
    state: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = SUCCESS
    cluster: bytes = bytes(range(16))
    clique: int = 7
    health: int = 0
    summary: int = 0  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*, in the v3 struct


@dataclass
class GPU:
    name: str = "NVIDIA H100 80GB HBM3"
    arch: int = pynvml.NVML_DEVICE_ARCH_HOPPER
    fabric: Fabric | int = NOT_SUPPORTED  # a Fabric, or the NVML error the driver answers
    fabric_versions: tuple = ("nvmlGpuFabricInfo_v3", "nvmlGpuFabricInfo_v2")  # the structs it takes
    nvlinks: list | int = NOT_SUPPORTED  # per link 1 (up) / 0 (down), or the NVML error
    nvlink_peers: set = field(default_factory=set)  # indices reached peer-to-peer over NVLink
    evidence: int = SUCCESS  # or the NVML error the attestation report call answers
    echo_nonce: bool = True  # False: a driver that leaves the caller's nonce out of the report's request
    cert: bytes = b"-----BEGIN CERTIFICATE-----\nMIIfake\n-----END CERTIFICATE-----\n"


@dataclass
class Scenario:
    gpus: list = field(default_factory=lambda: [GPU()])
    cc: str = "on"  # on, off, devtools; "raise": the state call is not supported
    multi_gpu: int = pynvml.NVML_CC_SYSTEM_MULTIGPU_NONE
    settings: int = SUCCESS  # or the code nvmlSystemGetConfComputeSettings returns
    settings_versions: tuple = ("nvmlSystemConfComputeSettings_v1",)
    ready: bool = True
    cpu_caps: int = pynvml.NVML_CC_SYSTEM_CPU_CAPS_INTEL_TDX
    init: int = SUCCESS  # or the error nvmlInit raises
    driver: str = "580.159.04"


def _err(code: int):
    return pynvml.NVMLError(code)


def _pointee(arg, versions: tuple):
    """The struct a pointer argument points to if its version is one the driver takes, else None."""
    obj = getattr(arg, "_obj", None)  # ctypes.byref(...) gives a CArgObject holding the struct
    if obj is None or type(arg).__name__ != "CArgObject":
        return None
    return obj if obj.version in {getattr(pynvml, v) for v in versions} else None


def make(sc: Scenario) -> types.ModuleType:
    nv = types.ModuleType("fake_pynvml")
    # the binding's constants, structs and error classes; none of its calls (a call the fake lacks is missing)
    nv.__dict__.update({k: v for k, v in vars(pynvml).items()
                        if not (k.startswith("nvml") and isinstance(v, types.FunctionType))})
    nv.calls = []  # what ccbridge asked, for the tests that check it asked once

    def init():
        if sc.init != SUCCESS:
            raise _err(sc.init)

    def handle(i):
        return sc.gpus[i]

    def state():
        if sc.cc == "raise":
            raise _err(NOT_SUPPORTED)
        s = pynvml.c_nvmlConfComputeSystemState_t()
        s.environment = pynvml.NVML_CC_SYSTEM_ENVIRONMENT_PROD
        s.ccFeature = pynvml.NVML_CC_SYSTEM_FEATURE_ENABLED if sc.cc != "off" else pynvml.NVML_CC_SYSTEM_FEATURE_DISABLED
        s.devToolsMode = pynvml.NVML_CC_SYSTEM_DEVTOOLS_MODE_ON if sc.cc == "devtools" else 0
        return s

    def settings(arg):
        s = _pointee(arg, sc.settings_versions)
        if s is None:
            return VERSION_MISMATCH
        if sc.settings == SUCCESS:
            s.multiGpuMode = sc.multi_gpu
        return sc.settings

    def fabric_v(g, arg):
        info = _pointee(arg, g.fabric_versions)
        if info is None:
            raise _err(VERSION_MISMATCH)
        if not isinstance(g.fabric, Fabric):
            raise _err(g.fabric)
        f = g.fabric
        info.state, info.status, info.cliqueId, info.healthMask = f.state, f.status, f.clique, f.health
        info.clusterUuid[:] = list(f.cluster)
        if hasattr(info, "healthSummary"):
            info.healthSummary = f.summary

    def nvlink(g, link):
        if not isinstance(g.nvlinks, list):
            raise _err(g.nvlinks)
        if link >= len(g.nvlinks):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.nvlinks[link]

    def p2p(a, b, index):
        assert index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        ok = sc.gpus.index(b) in a.nvlink_peers
        return pynvml.NVML_P2P_STATUS_OK if ok else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def report(g, nonce):
        nv.calls.append(("report", sc.gpus.index(g), bytes(nonce)))
        if g.evidence != SUCCESS:
            raise _err(g.evidence)
        r = pynvml.c_nvmlConfComputeGpuAttestationReport_t()
        # an SPDM GET_MEASUREMENTS request (version, code, param1, param2, 32-byte nonce, slot) and a response
        body = bytes([0x11, 0xE0, 0x01, 0xFF]) + (bytes(nonce) if g.echo_nonce else bytes(32)) + b"\x00" + b"RESP" * 8
        r.attestationReportSize = len(body)
        r.attestationReport[:len(body)] = list(body)
        return r

    def cert(g):
        c = pynvml.c_nvmlConfComputeGpuCertificate_t()
        c.attestationCertChainSize = len(g.cert)
        c.attestationCertChain[:len(g.cert)] = list(g.cert)
        return c

    nv.__dict__.update(
        nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: len(sc.gpus),
        nvmlDeviceGetHandleByIndex=handle, nvmlSystemGetDriverVersion=lambda: sc.driver,
        nvmlSystemGetCudaDriverVersion_v2=lambda: 13000,
        nvmlDeviceGetName=lambda g: g.name, nvmlDeviceGetUUID=lambda g: f"GPU-fake-{sc.gpus.index(g)}",
        nvmlDeviceGetMaxPcieLinkGeneration=lambda g: 5, nvmlDeviceGetMaxPcieLinkWidth=lambda g: 16,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda g: 5, nvmlDeviceGetCurrPcieLinkWidth=lambda g: 16,
        nvmlDeviceGetMemoryInfo=lambda g: types.SimpleNamespace(total=80 * 2**30),
        nvmlDeviceGetArchitecture=lambda g: g.arch, nvmlDeviceGetVbiosVersion=lambda g: "96.00.9F.00.04",
        nvmlSystemGetConfComputeState=state, nvmlSystemGetConfComputeSettings=settings,
        nvmlErrorString=lambda rc: pynvml.NVMLError._errcode_to_string.get(rc, "Argument version mismatch").encode(),
        nvmlSystemGetConfComputeGpusReadyState=lambda: int(sc.ready),
        nvmlSystemGetConfComputeCapabilities=lambda: types.SimpleNamespace(
            cpuCaps=sc.cpu_caps, gpusCaps=pynvml.NVML_CC_SYSTEM_GPUS_CC_CAPABLE),
        nvmlDeviceGetGpuFabricInfoV=fabric_v, nvmlDeviceGetNvLinkState=nvlink, nvmlDeviceGetP2PStatus=p2p,
        nvmlDeviceGetConfComputeGpuAttestationReport=report, nvmlDeviceGetConfComputeGpuCertificate=cert,
    )
    return nv


def h100_cc_off() -> Scenario:
    """The lent H100 as it is: one PCIe GPU, CC off, no NVLink, no fabric."""
    return Scenario(cc="off", gpus=[GPU(evidence=NOT_SUPPORTED)])


def b300_tenant(n: int = 2, clique: int = 7) -> Scenario:
    """An n-GPU confidential tenant of a B300 HGX: NVLink encryption, every GPU in one clique, healthy."""
    healthy = health_mask(degraded_bw=2, route_recovery=2, route_unhealthy=2, access_timeout_recovery=2,
                          incorrect_configuration=1, partition_assigned=1, gfm_state=1)
    gpus = [GPU(name="NVIDIA B300", arch=pynvml.NVML_DEVICE_ARCH_BLACKWELL, fabric=Fabric(clique=clique, health=healthy),
                nvlinks=[1] * 18, nvlink_peers=set(range(n)) - {i}) for i in range(n)]
    return Scenario(gpus=gpus, multi_gpu=pynvml.NVML_CC_SYSTEM_MULTIGPU_NVLE)
