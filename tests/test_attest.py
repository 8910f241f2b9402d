"""`ccbridge attest`'s bundle, driven by the fake NVML, a fake configfs-tsm tree and a fake SDK."""

import base64
import json
import subprocess
import sys
import types

import pynvml
import pytest

import fake_nvml
from fake_nvml import GPU, Scenario
from ccbridge import attest, env

NONCE = bytes(range(32))
TDX = {"kind": "tdx", "evidence": ["cpu flag tdx_guest"]}
NONE = {"kind": "none", "evidence": []}


def tsm_tree(root, provider="tdx_guest", outblob=b"QUOTE", auxblob=None):
    """A configfs-tsm report entry as the kernel shows one (configfs fills a new entry's files; a plain
    folder cannot, so the tests hand the collector an entry that is there already, as a shared one is)."""
    entry = root / "report" / "t"
    entry.mkdir(parents=True)
    (entry / "provider").write_text(provider + "\n")
    (entry / "generation").write_text("3\n")
    (entry / "outblob").write_bytes(outblob)
    if auxblob is not None:
        (entry / "auxblob").write_bytes(auxblob)
    return root / "report"


def make(sc: Scenario, tee=TDX, tmp_path=None, sdk=None, **tsm):
    nv = fake_nvml.make(sc)
    stamp = {"tee": tee, "nvml": env.nvml_info(nv)}
    root = tsm_tree(tmp_path, **tsm) if tmp_path is not None else attest.Path("/nonexistent/tsm")
    return attest.bundle(NONCE, nv=nv, sdk=sdk, tsm_root=root, tsm_name="t", stamp=stamp), nv


def test_a_protected_tenant_bundle_binds_each_gpus_evidence_and_the_cpu_report_to_the_nonce(tmp_path):
    b, nv = make(fake_nvml.b300_tenant(2), tmp_path=tmp_path)
    assert b["format"] == attest.FORMAT and b["nonce"] == NONCE.hex()
    assert b["protection"] == {"cvm": True, "tee": "tdx", "gpu_cc": "on", "protected": True, "why": [],
                               "evidence_bound": ["GPU 0", "GPU 1", "CPU report (tdx_guest)"]}
    gpu = b["gpu_evidence"]
    assert gpu["collector"] == "nvml" and gpu["gpus"] == [0, 1] and gpu["errors"] == []
    assert [c for c in nv.calls if c[0] == "report"] == [("report", 0, NONCE), ("report", 1, NONCE)]
    for e in gpu["evidences"]:  # nvattest collect-evidence's per-device fields
        assert set(e) == {"version", "arch", "nonce", "vbios_version", "driver_version", "evidence", "certificate"}
        assert e["arch"] == "BLACKWELL" and e["nonce"] == NONCE.hex() and e["driver_version"] == "580.159.04"
        assert base64.b64decode(e["evidence"])[4:36] == NONCE
        assert base64.b64decode(e["certificate"]).startswith(b"-----BEGIN CERTIFICATE-----")
    cpu = b["cpu_report"]
    assert cpu["provider"] == "tdx_guest" and base64.b64decode(cpu["outblob"]) == b"QUOTE" and "auxblob" not in cpu
    assert bytes.fromhex(cpu["inblob"]) == NONCE + bytes(32)
    assert (tmp_path / "report" / "t" / "inblob").read_bytes() == NONCE + bytes(32)
    assert (tmp_path / "report" / "t").exists()  # an entry that was there stays
    assert b["env"]["nvml"]["cc"]["multi_gpu_mode"] == "nvle" and b["env"]["nvml"]["fabric"]["gpus_per_clique"] == [2]
    assert any("Fabric Manager" in x for x in b["cannot_vouch_for"])
    assert any("routing" in x for x in b["cannot_vouch_for"])
    json.dumps(b)  # one JSON document


def test_the_h100_as_lent_says_cc_off_and_not_a_cvm():
    b, _ = make(fake_nvml.h100_cc_off(), tee=NONE)
    p = b["protection"]
    assert p["protected"] is False and p["cvm"] is False and p["gpu_cc"] == "off"
    assert p["why"][0].startswith("not a CVM") and "GPU CC is off" in p["why"]
    assert b["gpu_evidence"]["evidences"] == [] and "NotSupported" in b["gpu_evidence"]["errors"][0]["error"]
    assert "configfs-tsm report interface" in b["cpu_report"]["error"]
    assert b["env"]["nvml"]["gpus"][0]["fabric"] == {"error": "NVMLError_NotSupported: Not Supported"}


def test_a_cvm_with_cc_on_but_no_evidence_is_not_protected(tmp_path):
    """The TEE kind and the CC mode are unsigned readings: without the nonce-bound evidence beside them the bundle
    says not protected (and the command exits non-zero), whatever they read."""
    b, _ = make(Scenario(gpus=[GPU(), GPU(echo_nonce=False)]), tmp_path=tmp_path)  # GPU 1's report is refused
    p = b["protection"]
    assert p["gpu_cc"] == "on" and p["cvm"] and not p["protected"]
    assert p["why"] == ["GPU evidence for 1 of 2 visible GPU(s)"] and p["evidence_bound"][0] == "GPU 0"
    b, _ = make(fake_nvml.b300_tenant(2))  # no configfs-tsm report
    assert not b["protection"]["protected"]
    assert b["protection"]["why"] == ["no CPU TEE report bound to the nonce"]


def test_devtools_is_not_protected():
    b, _ = make(Scenario(cc="devtools"))
    assert b["protection"]["gpu_cc"] == "devtools" and not b["protection"]["protected"]


def test_a_report_without_the_nonce_in_its_request_is_refused_not_bundled():
    b, _ = make(Scenario(gpus=[GPU(), GPU(echo_nonce=False)]))
    assert b["gpu_evidence"]["gpus"] == [0]
    assert b["gpu_evidence"]["errors"][0]["index"] == 1
    assert "does not carry the nonce" in b["gpu_evidence"]["errors"][0]["error"]


def test_no_nvml_is_said_in_the_bundle(tmp_path):
    sc = Scenario(init=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    b, _ = make(sc, tee=TDX)
    assert not b["protection"]["protected"] and b["protection"]["why"][0].startswith("no NVML")
    assert b["gpu_evidence"]["evidences"] == [] and b["gpu_evidence"]["errors"]


def test_sev_snp_report_with_its_certificates(tmp_path):
    b, _ = make(Scenario(), tee={"kind": "sev-snp", "evidence": []}, tmp_path=tmp_path, provider="sev_guest",
                outblob=b"R" * 1184, auxblob=b"CERTS")
    assert b["cpu_report"]["provider"] == "sev_guest" and base64.b64decode(b["cpu_report"]["auxblob"]) == b"CERTS"


def test_a_report_changed_under_us_is_refused(tmp_path):
    root = tsm_tree(tmp_path)
    gen = root / "t" / "generation"

    class Racing(type(root)):  # another writer bumps the generation as the provider is read
        def read_text(self, *a, **k):
            if self.name == "provider":
                gen.write_text("4\n")
            return super().read_text(*a, **k)

    assert "another writer changed the report" in attest.cpu_report(NONCE, Racing(root), "t")["error"]


def test_a_new_entry_is_made_and_removed(tmp_path):
    (tmp_path / "report").mkdir()
    out = attest.cpu_report(NONCE, tmp_path / "report", "fresh")
    assert "configfs-tsm report" in out["error"]  # a plain folder is no configfs: no generation file appears
    assert not (tmp_path / "report" / "fresh" / "generation").exists()


@pytest.mark.parametrize("text, fragment", [("zz", "not hex"), ("00", "expected 32 bytes (64 hex digits), got 1"),
                                            ("ab" * 33, "got 33"), ("a" * 65, "an odd number of hex digits (65)")])
def test_bad_nonces(text, fragment):
    with pytest.raises(attest.UsageError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        attest.parse_nonce(text)
    assert attest.parse_nonce("0x" + NONCE.hex().upper()) == NONCE


def fake_sdk(result=True, raises=None):
    """The SDK's attestation module as ccbridge uses it: a process-wide client, a nonce, one verifier."""
    seen = {}

    class Attestation:
        def reset(self): seen.clear()
        def clear_verifiers(self): pass
        def set_name(self, name): seen["name"] = name
        def set_nonce(self, nonce): seen["nonce"] = nonce
        def add_verifier(self, dev, where, url, evidence): seen["verifier"] = (dev, where, url)

        def get_evidence(self, options=None):
            seen["options"] = options
            return [{"certificate": "Q0VSVA==", "evidence": "RVZJ", "arch": "HOPPER"}]

        def attest(self, evidence):
            if raises:
                raise raises
            seen["attested"] = evidence
            return result

        def get_token(self): return '[["JWT", "x"], {}]'

    sdk = types.SimpleNamespace(Attestation=Attestation, Devices=types.SimpleNamespace(GPU=2),
                                Environment=types.SimpleNamespace(LOCAL=2, REMOTE=5))
    return sdk, seen


def test_with_the_sdk_it_collects_and_its_remote_verifier_gets_the_bundles_evidence():
    sdk, seen = fake_sdk()
    b, _ = make(Scenario(multi_gpu=pynvml.NVML_CC_SYSTEM_MULTIGPU_PROTECTED_PCIE), sdk=sdk)
    assert b["gpu_evidence"]["collector"] == "nv-attestation-sdk" and seen["options"] == {"ppcie_mode": True}
    assert b["gpu_evidence"]["evidences"][0] == {"version": "1.0", "arch": "HOPPER", "nonce": NONCE.hex(),
                                                 "evidence": "RVZJ", "certificate": "Q0VSVA=="}
    v = attest.verify(sdk, NONCE, b["gpu_evidence"], "remote", "https://verifier.example")
    assert v["result"] is True and v["verifier"] == "nv-attestation-sdk remote" and v["token"]
    assert seen["nonce"] == NONCE.hex() and seen["verifier"] == (2, 5, "https://verifier.example")
    assert seen["attested"] == [{"arch": "HOPPER", "evidence": "RVZJ", "certificate": "Q0VSVA=="}]


def test_the_sdks_verdict_is_recorded_as_given():
    sdk, seen = fake_sdk(result=False)
    gpu = {"evidences": []}
    local = attest.verify(sdk, NONCE, gpu, "local", None)
    assert local["result"] is False and seen["verifier"][1] == 2 and "local verifier" in local["evidence"]
    sdk, _ = fake_sdk(raises=RuntimeError("NRAS unreachable"))
    failed = attest.verify(sdk, NONCE, gpu, "remote", None)
    assert failed["result"] is False and failed["error"] == "RuntimeError: NRAS unreachable"


def test_without_the_sdk_verify_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nv_attestation_sdk", None)  # an import that fails
    assert attest.load_sdk(required=False) is None
    with pytest.raises(attest.UsageError, match=r"ccbridge\[attest\]"):
        attest.load_sdk(required=True)


def test_the_summary_fits_120_columns():
    b, _ = make(fake_nvml.h100_cc_off(), tee=NONE)
    b["verification"] = {"verifier": "nv-attestation-sdk remote", "result": False, "error": "x" * 300}
    lines = attest.summary(b)
    assert all(len(line) <= 120 for line in lines) and "protected by its own readings: NO" in lines[0]


def test_a_protected_bundle_says_its_yes_is_unverified(tmp_path):
    """'protected: yes' read as attested (exit 0): it is the machine's own readings with the evidence for them
    collected, which NVIDIA's and the CPU vendor's verifiers judge (a stranger's review, session 24)."""
    b, _ = make(fake_nvml.b300_tenant(2), tmp_path=tmp_path)
    lines = attest.summary(b)
    assert "protected by its own readings: yes" in lines[0] and lines[1].startswith("  unverified here")
    assert all(len(line) <= 120 for line in lines)


@pytest.mark.parametrize("hexed", ["00" * 32, "ff" * 32, "0x" + "ab" * 32])
def test_a_nonce_of_one_repeated_byte_is_refused(hexed):
    with pytest.raises(attest.UsageError, match="no fresh challenge"):
        attest.parse_nonce(hexed)


def test_the_command_exits_non_zero_when_unprotected_unless_allowed(tmp_path):
    """This CPU machine is no CVM and has no NVML: the bundle says so; exit 1, or 0 with --allow-unprotected."""
    argv = [sys.executable, "-m", "ccbridge.cli", "attest", "--nonce", NONCE.hex(), "--out", str(tmp_path / "b.json")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    b = json.loads((tmp_path / "b.json").read_text())
    if b["protection"]["protected"]:
        pytest.skip("this machine is a CVM with GPU CC on")
    assert r.returncode == 1 and r.stderr.startswith("ccbridge attest: not protected (")
    assert len(r.stderr.splitlines()) == 1 and b["protection"]["unprotected_allowed"] is False
    argv[-1] = str(tmp_path / "b2.json")  # (an existing --out file is refused: the first bundle is kept)
    r = subprocess.run(argv + ["--allow-unprotected"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == ""
    assert json.loads((tmp_path / "b2.json").read_text())["protection"]["unprotected_allowed"] is True


@pytest.mark.gpu
def test_on_the_lent_h100_the_bundle_says_cc_off_not_a_cvm_with_nvmls_fabric_state(tmp_path, need_gpu):
    out = tmp_path / "b.json"
    r = subprocess.run([sys.executable, "-m", "ccbridge.cli", "attest", "--nonce", NONCE.hex(), "--out", str(out),
                        "--allow-unprotected"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    b = json.loads(out.read_text())
    assert b["nonce"] == NONCE.hex() and b["env"]["nvml"]["available"]
    if b["protection"]["protected"]:
        pytest.skip("this GPU machine is a CVM with CC on: the lead's H100 check is for the non-CVM one")
    assert b["protection"]["cvm"] is False and b["protection"]["gpu_cc"] == "off"
    for g in b["env"]["nvml"]["gpus"]:
        assert "state" in g["fabric"] or "error" in g["fabric"]  # NVML's answer, whichever it is
    assert set(b["env"]["nvml"]["fabric"]) >= {"cliques"} or "error" in b["env"]["nvml"]["fabric"]


@pytest.mark.gpu
def test_on_a_gpu_env_reads_the_multi_gpu_mode_or_names_the_drivers_reason(need_gpu):
    cc = env.nvml_info()["cc"]
    assert cc.get("multi_gpu_mode") in ("none", "protected-pcie", "nvle") or cc["settings_error"]
    assert "version mismatch" not in cc.get("settings_error", "").lower()  # the struct now goes by pointer
