"""`ccbridge attest`: one JSON bundle of a confidential tenant's evidence, bound to a caller's nonce.

It holds the GPU evidence of each visible GPU in the format NVIDIA's `nvattest collect-evidence` writes
(base64 SPDM attestation report, base64 certificate chain, architecture, the nonce), collected by
NVIDIA's attestation SDK where it is installed, else through NVML directly; the CPU TEE report the
guest's configfs-tsm interface gives for the same nonce (TDX quote or SEV-SNP report); the CC settings
and fabric state as NVML gives them (the environment stamp); and what none of it can vouch for.

ccbridge collects, bundles and hands over. Verification is NVIDIA's (the SDK's local verifier or its
remote service, through --verify) and the CPU vendor's; ccbridge writes no verifier of its own.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
from pathlib import Path
from typing import Any

from ccbridge import env as envmod
from ccbridge import nvml
from ccbridge.errors import UsageError
from ccbridge.textfit import cut

FORMAT = "ccbridge-attest/1"
NONCE_BYTES = 32  # what the GPU's SPDM request carries (NVML_CC_GPU_CEC_NONCE_SIZE), as nvattest takes it
REPORT_DATA_BYTES = 64  # the TDX REPORTDATA and SEV-SNP REPORT_DATA the configfs-tsm inblob fills
TSM_REPORTS = Path("/sys/kernel/config/tsm/report")
SDK_EXTRA = "pip install 'ccbridge[attest]' (NVIDIA's nv-attestation-sdk)"
CVM_KINDS = ("tdx", "sev-snp")  # CPU TEEs GPU CC runs in

CANNOT_VOUCH = [
    "the Fabric Manager: it runs on the host, outside the CVM, and activated this partition; nothing here is its evidence",
    "the NVSwitch routing tables and switch state: set by the host, in none of the GPU evidence "
    "(NVSwitch evidence, where a protected-PCIe system offers it, is `nvattest collect-evidence --device nvswitch`'s)",
    "the fabric state, health bits, NVLink state and peers shown: the driver's word through NVML, not signed",
    "the CC settings shown: read through NVML, not signed (the GPU's signed state is inside its evidence)",
    "any verdict: ccbridge verifies nothing; the GPU evidence is NVIDIA's to verify (SDK local verifier or "
    "remote service), the CPU report the CPU vendor's (Intel TDX quote, AMD SEV-SNP report)",
]


def parse_nonce(text: str) -> bytes:
    """--nonce: exactly NONCE_BYTES bytes as hex, the verifier's fresh challenge."""
    t = text.strip().lower().removeprefix("0x")  # (a 0x prefix, as verifiers print nonces, is taken)
    if len(t) % 2:
        raise UsageError(f"an odd number of hex digits ({len(t)}): a nonce is whole bytes, "
                         f"{2 * NONCE_BYTES} hex digits")
    try:
        nonce = bytes.fromhex(t)
    except ValueError:
        raise UsageError(f"not hex: {text!r:.80}") from None
    if len(nonce) != NONCE_BYTES:
        raise UsageError(f"expected {NONCE_BYTES} bytes ({2 * NONCE_BYTES} hex digits), got {len(nonce)}")
    if len(set(nonce)) == 1:  # 00...00, ff...ff: no verifier's fresh challenge, and a replayable binding
        raise UsageError(f"a nonce of one repeated byte ({nonce[:1].hex()}...) is no fresh challenge: "
                         "take the verifier's")
    return nonce


def load_sdk(required: bool):
    """NVIDIA's attestation SDK (its `attestation` module); where it is not installed, None, or (required:
    --verify asked for it) a UsageError naming the extra to install."""
    try:
        from nv_attestation_sdk import attestation  # deferred: nv attestation sdk, an optional dependency
    except ImportError:
        if not required:
            return None
        raise UsageError(f"--verify needs NVIDIA's attestation SDK: {SDK_EXTRA}") from None
    return attestation


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _request_nonce(report: bytes) -> bytes:
    """The nonce in the report's SPDM GET_MEASUREMENTS request (4 header bytes, then the nonce)."""
    return report[4:4 + NONCE_BYTES]


def _gpu_evidence_nvml(nv, handle, nonce: bytes, driver: str | None) -> dict[str, Any]:
    """One GPU's evidence through NVML, in nvattest's per-device format."""
    rep = nv.nvmlDeviceGetConfComputeGpuAttestationReport(handle, nonce)
    report = bytes(rep.attestationReport[:rep.attestationReportSize])
    if _request_nonce(report) != nonce:  # the driver did not put this nonce in the request it signed
        raise RuntimeError("the attestation report's request does not carry the nonce: not bound to it")
    cert = nv.nvmlDeviceGetConfComputeGpuCertificate(handle)
    vbios, _ = nvml.call(nv.nvmlDeviceGetVbiosVersion, handle)
    arch, _ = nvml.call(nv.nvmlDeviceGetArchitecture, handle)
    return {
        "version": "1.0",
        "arch": nvml.constant_name(nv, "NVML_DEVICE_ARCH_", arch).removeprefix("NVML_DEVICE_ARCH_") if arch is not None
        else "UNKNOWN",
        "nonce": nonce.hex(),
        "vbios_version": vbios,
        "driver_version": driver,
        "evidence": _b64(report),
        "certificate": _b64(bytes(cert.attestationCertChain[:cert.attestationCertChainSize])),
    }


def gpu_evidence_nvml(nv, nonce: bytes, driver: str | None) -> dict[str, Any]:
    """Every visible GPU's evidence through NVML (initialised by the caller): {"collector", "evidences",
    "gpus": the GPU index of each evidence, "errors": [{"index", "error"}]}."""
    out: dict[str, Any] = {"collector": "nvml", "evidences": [], "gpus": [], "errors": []}
    count, err = nvml.call(nv.nvmlDeviceGetCount)
    if err:
        out["errors"].append({"index": None, "error": err})
    for i in range(count or 0):
        try:
            out["evidences"].append(_gpu_evidence_nvml(nv, nv.nvmlDeviceGetHandleByIndex(i), nonce, driver))
            out["gpus"].append(i)
        except Exception as e:  # CC off, not supported, no permission: the driver's reason, per GPU
            out["errors"].append({"index": i, "error": f"{type(e).__name__}: {e}"})
    return out


def _sdk_client(sdk, nonce: bytes, where: str, url: str | None):
    client = sdk.Attestation()
    if hasattr(client, "reset"):  # the SDK's client is one per process, its settings class-wide
        client.reset()
    client.clear_verifiers()
    client.set_name("ccbridge")
    client.set_nonce(nonce.hex())
    env = sdk.Environment.LOCAL if where == "local" else sdk.Environment.REMOTE
    client.add_verifier(sdk.Devices.GPU, env, url or "", "")
    return client


def gpu_evidence_sdk(sdk, nonce: bytes, ppcie: bool) -> dict[str, Any]:
    """Every visible GPU's evidence through the SDK's collector (the form its remote verifier takes)."""
    got = _sdk_client(sdk, nonce, "remote", None).get_evidence(options={"ppcie_mode": ppcie})
    evidences = [{"version": "1.0", "arch": e.get("arch", "UNKNOWN"), "nonce": nonce.hex(),
                  "evidence": e["evidence"], "certificate": e["certificate"]} for e in got or []]
    errors = [] if evidences else [{"index": None, "error": "the SDK collected no GPU evidence (see its log)"}]
    return {"collector": "nv-attestation-sdk", "evidences": evidences, "gpus": list(range(len(evidences))),
            "errors": errors}


def verify(sdk, nonce: bytes, gpu: dict[str, Any], where: str, url: str | None, ppcie: bool = False) -> dict[str, Any]:
    """The SDK's verdict on the GPU evidence: `remote` sends the bundle's evidence to NVIDIA's service
    (url: another one); `local` runs the SDK's local verifier, which collects its own evidence for the
    same nonce, in the same multi-GPU mode as the bundle's collection (ppcie). Recorded as given: the result and the
    SDK's token."""
    out: dict[str, Any] = {"verifier": f"nv-attestation-sdk {where}", "url": url}
    try:
        client = _sdk_client(sdk, nonce, where, url)
        if where == "remote":
            evidence = [{"arch": e["arch"], "evidence": e["evidence"], "certificate": e["certificate"]}
                        for e in gpu["evidences"]]
        else:
            evidence = client.get_evidence(options={"ppcie_mode": ppcie})
            out["evidence"] = "collected by the SDK's local verifier for the same nonce"
        out["result"] = bool(client.attest(evidence))
        out["token"] = client.get_token()
    except Exception as e:  # the SDK's own failure: recorded, and the command fails on it
        out["result"] = False
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _read(path: Path, binary: bool = False):
    return path.read_bytes() if binary else path.read_text().strip()


def cpu_report(nonce: bytes, root: Path = TSM_REPORTS, name: str | None = None) -> dict[str, Any]:
    """The CPU TEE's report for the nonce through configfs-tsm: the nonce, zero-padded to the 64 report-data
    bytes, written to <entry>/inblob; the report read from outblob; provider (tdx_guest, sev_guest);
    generation, read before and after, so that a report another writer changed under us is refused;
    auxblob (SEV-SNP's certificates) where there is one. The entry is made here (and removed after) unless
    it is there already: configfs-tsm entries may be shared, which is what the generation guards."""
    if not root.is_dir():
        return {"error": f"{root} is not there: no configfs-tsm report interface (not a TDX or SEV-SNP guest, "
                         "a kernel before 6.7, or configfs not mounted)"}
    entry = root / (name or f"ccbridge-{os.getpid()}")
    made = not entry.exists()
    inblob = nonce.ljust(REPORT_DATA_BYTES, b"\0")
    try:
        if made:
            entry.mkdir()
        (entry / "inblob").write_bytes(inblob)
        gen = _read(entry / "generation")
        outblob = _read(entry / "outblob", binary=True)
        provider = _read(entry / "provider")
        aux = entry / "auxblob"
        auxblob = _read(aux, binary=True) if aux.exists() else b""
        if _read(entry / "generation") != gen:
            return {"error": f"{entry}: another writer changed the report while it was read (generation moved "
                             f"from {gen}); try again"}
    except OSError as e:
        return {"error": f"configfs-tsm report {entry}: {e.strerror or e}"}
    finally:
        if made:
            try:
                entry.rmdir()
            except OSError:
                pass
    out = {"interface": "configfs-tsm", "provider": provider, "generation": int(gen) if gen.isdigit() else gen,
           "inblob": inblob.hex(), "inblob_is": f"the nonce, zero-padded to {REPORT_DATA_BYTES} bytes",
           "outblob": _b64(outblob)}
    if auxblob:
        out["auxblob"] = _b64(auxblob)
    return out


def protection(stamp: dict[str, Any], gpu: dict[str, Any] | None = None, cpu: dict[str, Any] | None = None) -> dict[str, Any]:
    """Whether this tenant runs protected (a TDX or SEV-SNP guest with GPU CC on) and the bundle holds the evidence
    for it (every visible GPU's report and the CPU TEE report, each bound to the nonce), and if not, why. The CC
    state and TEE kind are the machine's own unsigned readings: without the signed evidence beside them a bundle
    says "not protected", never "yes" on their word alone; with it, "yes" still verifies nothing (the evidence is
    collected, not checked: NVIDIA's and the CPU vendor's verifiers judge it). evidence_bound names the pieces
    that carry the nonce."""
    tee = stamp.get("tee", {}).get("kind", "none")
    seen = stamp.get("nvml", {})
    cc = envmod.cc_label(seen.get("cc", {})) if seen.get("available") else "unknown"
    why = []
    if tee not in CVM_KINDS:
        why.append(f"not a CVM: the CPU TEE guest is {tee!r}, not TDX or SEV-SNP")
    if not seen.get("available"):
        why.append(f"no NVML: {seen.get('error', 'unavailable')}")
    elif not seen.get("gpus"):
        why.append("no GPU visible")
    if cc == "off":
        why.append("GPU CC is off")
    elif cc == "devtools":
        why.append("GPU CC is in devtools mode: the GPU is open to debugging tools, not for production")
    elif cc != "on" and seen.get("available"):
        why.append(f"GPU CC state unknown ({seen.get('cc', {}).get('state_error', 'unread')})")
    bound = [f"GPU {i}" for i in (gpu or {}).get("gpus", [])]
    if cpu and "provider" in cpu:
        bound.append(f"CPU report ({cpu['provider']})")
    if gpu is not None:
        n = len(seen.get("gpus") or [])
        if len(gpu.get("evidences", [])) < n:
            why.append(f"GPU evidence for {len(gpu.get('evidences', []))} of {n} visible GPU(s)")
    if cpu is not None and "provider" not in cpu and tee in CVM_KINDS:
        why.append("no CPU TEE report bound to the nonce")
    return {"cvm": tee in CVM_KINDS, "tee": tee, "gpu_cc": cc, "protected": not why, "why": why,
            "evidence_bound": bound}


def bundle(nonce: bytes, nv=None, sdk=None, tsm_root: Path = TSM_REPORTS, tsm_name: str | None = None,
           stamp: dict[str, Any] | None = None) -> dict[str, Any]:
    """The evidence bundle for a nonce. nv: the NVML module (default pynvml); sdk: the SDK's attestation
    module (None: NVML collects the GPU evidence); stamp: the environment stamp (default: read now)."""
    nv = nv or nvml.load()
    stamp = stamp if stamp is not None else envmod.stamp(nv)
    seen = stamp.get("nvml", {})
    if sdk is not None:
        try:
            gpu = gpu_evidence_sdk(sdk, nonce, seen.get("cc", {}).get("multi_gpu_mode") == "protected-pcie")
        except Exception as e:
            gpu = {"collector": "nv-attestation-sdk", "evidences": [], "gpus": [],
                   "errors": [{"index": None, "error": f"{type(e).__name__}: {e}"}]}
    elif nv is None or not seen.get("available"):
        gpu = {"collector": "nvml", "evidences": [], "gpus": [],
               "errors": [{"index": None, "error": seen.get("error", "nvidia-ml-py is not installed")}]}
    else:
        nv.nvmlInit()
        try:
            gpu = gpu_evidence_nvml(nv, nonce, seen.get("driver"))
        finally:
            nvml.call(nv.nvmlShutdown)
    cpu = cpu_report(nonce, tsm_root, tsm_name)
    return {
        "format": FORMAT,
        "nonce": nonce.hex(),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "protection": protection(stamp, gpu, cpu),
        "gpu_evidence": gpu,
        "cpu_report": cpu,
        "cannot_vouch_for": CANNOT_VOUCH,
        "env": stamp,
    }


def summary(b: dict[str, Any]) -> list[str]:
    """What a person reads: one line each, within 120 columns."""
    p, gpu, cpu = b["protection"], b["gpu_evidence"], b["cpu_report"]
    n = len(b["env"].get("nvml", {}).get("gpus") or [])
    # "yes" is the machine's own readings with the evidence for them in the bundle: nothing here verified it
    lines = [f"nonce {b['nonce'][:16]}...; protected by its own readings: {'yes' if p['protected'] else 'NO'} "
             f"(CPU TEE {p['tee']}, GPU CC {p['gpu_cc']})"]
    if p["protected"]:
        lines.append("  unverified here: the evidence is for NVIDIA's and the CPU vendor's verifiers")
    lines += [cut(f"  not protected: {w}", 120) for w in p["why"]]
    lines.append(f"GPU evidence: {len(gpu['evidences'])} of {n} GPU(s), collected by {gpu['collector']}")
    lines += [cut(f"  GPU {e['index'] if e['index'] is not None else '-'}: {e['error']}", 120) for e in gpu["errors"]]
    lines.append(cut(f"CPU report: {cpu['provider'] + ' via configfs-tsm' if 'provider' in cpu else cpu['error']}", 120))
    if "verification" in b:
        v = b["verification"]
        lines.append(cut(f"verification ({v['verifier']}): {'passed' if v['result'] else 'FAILED'}"
                         + (f" ({v['error']})" if v.get("error") else ""), 120))
    lines.append(f"cannot vouch for: Fabric Manager, NVSwitch routing; {len(b['cannot_vouch_for'])} items in the bundle")
    return lines
