import json

import pynvml
import pytest

import fake_nvml
from ccbridge import env

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 aes pclmulqdq avx2 avx512f vaes hypervisor tdx_guest
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2
"""


def test_cpu_info_parses_first_cpu_flags():
    info = env.cpu_info(CPUINFO)
    assert info["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["flags"]["aes"] and info["flags"]["vaes"] and not info["flags"]["vpclmulqdq"]
    assert info["hypervisor"]


def test_tee_detection(tmp_path):
    assert env.tee_guest(str(tmp_path), set())["kind"] == "none"
    assert env.tee_guest(str(tmp_path), {"tdx_guest"})["kind"] == "tdx"
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "sev-guest").touch()
    snp = env.tee_guest(str(tmp_path), set())
    assert snp["kind"] == "sev-snp" and "/dev/sev-guest present" in snp["evidence"]
    (tmp_path / "dev" / "tdx_guest").touch()
    assert env.tee_guest(str(tmp_path), set())["kind"] == "tdx"
    assert env.tee_guest("/nonexistent-root", {"sev", "hypervisor"})["kind"] == "sev"


def test_cc_state_on():
    cc = env.cc_state(fake_nvml.make(fake_nvml.Scenario(multi_gpu=pynvml.NVML_CC_SYSTEM_MULTIGPU_PROTECTED_PCIE)))
    assert cc["mode"] == "on" and env.cc_label(cc) == "on"
    assert cc["state"] == {"environment": "prod", "cc_feature": "enabled", "devtools_mode": "off"}
    assert cc["multi_gpu_mode"] == "protected-pcie" and "settings_error" not in cc
    assert cc["gpus_ready"] is True
    assert cc["capabilities"] == {"cpu": "intel-tdx", "gpus": "cc-capable"}


@pytest.mark.parametrize("mode, name", [(pynvml.NVML_CC_SYSTEM_MULTIGPU_NONE, "none"),
                                        (pynvml.NVML_CC_SYSTEM_MULTIGPU_PROTECTED_PCIE, "protected-pcie"),
                                        (pynvml.NVML_CC_SYSTEM_MULTIGPU_NVLE, "nvle")])
def test_every_multi_gpu_mode_is_read_through_the_versioned_struct(mode, name):
    """The fake driver answers 25 (argument version mismatch) unless it gets a pointer to a v1 struct,
    as the real one did to the by-value call on the lent H100."""
    assert env.cc_state(fake_nvml.make(fake_nvml.Scenario(multi_gpu=mode)))["multi_gpu_mode"] == name


@pytest.mark.parametrize("cc, label", [("off", "off"), ("devtools", "devtools"), ("raise", "unknown")])
def test_cc_off_devtools_and_unanswered(cc, label):
    out = env.cc_state(fake_nvml.make(fake_nvml.Scenario(cc=cc)))
    assert env.cc_label(out) == label
    assert ("state_error" in out) is (cc == "raise")


@pytest.mark.parametrize("scenario, reason", [
    (fake_nvml.Scenario(settings_versions=()), "returned 25"),  # a driver that takes no struct version we have
    (fake_nvml.Scenario(settings=pynvml.NVML_ERROR_NOT_SUPPORTED), "returned 3: Not Supported"),
    (fake_nvml.Scenario(multi_gpu=9), "multiGpuMode 9 is not a mode this nvidia-ml-py knows"),
])
def test_an_unanswered_settings_call_gives_its_reason_never_a_mode(scenario, reason):
    cc = env.cc_state(fake_nvml.make(scenario))
    assert "multi_gpu_mode" not in cc and reason in cc["settings_error"]
    assert cc["mode"] == "on" and cc["gpus_ready"] is True  # the other calls' answers stay


def test_a_binding_without_the_settings_struct_says_so():
    nv = fake_nvml.make(fake_nvml.Scenario())
    del nv.c_nvmlSystemConfComputeSettings_v1_t
    assert "no nvmlSystemConfComputeSettings_v1 struct" in env.cc_state(nv)["settings_error"]


def test_the_stamp_carries_cc_and_fabric_from_the_nvml_it_is_given():
    s = env.stamp(fake_nvml.make(fake_nvml.b300_tenant(2)))
    assert s["nvml"]["cc"]["multi_gpu_mode"] == "nvle"
    assert [g["fabric"]["state"] for g in s["nvml"]["gpus"]] == ["completed", "completed"]
    assert s["nvml"]["fabric"]["gpus_per_clique"] == [2]
    off = env.nvml_info(fake_nvml.make(fake_nvml.Scenario(init=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)))
    assert off["available"] is False and "Driver Not Loaded" in off["error"]


def test_stamp_tolerates_missing_pieces():
    s = env.stamp()
    assert s["ccbridge"] and s["cpu"]["cores"] >= 1
    assert "available" in s["nvml"] and "available" in s["torch"]
    assert s["emulation"] == {"active": False, "profile": None} or s["emulation"]["active"]
    assert env.cc_mode(s) in ("on", "off", "unknown")


def test_emulation_flag_from_environment(monkeypatch, tmp_path, driver_here):
    cfg = tmp_path / "profile.conf"
    cfg.write_text("profile=b300\nh2d_pinned_gbps=11.26\n")
    monkeypatch.setenv(env.EMULATION_VAR, "b300")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(cfg))
    info = env.emulation_info()
    assert info["active"] and info["profile"] == "b300"
    assert info["params"]["h2d_pinned_gbps"] == "11.26"
    from pathlib import Path

    assert info["interposer_loaded"] is ("_emu_native" in Path("/proc/self/maps").read_text())


def test_a_record_only_or_passthrough_run_is_not_emulated(monkeypatch, tmp_path, driver_here):
    """Hooks on, nothing emulated (`ccbridge run --record T`, account's native run, real CC-on machines):
    the profile is named, the figures are not EMULATED."""
    cfg = tmp_path / "profile.conf"
    cfg.write_text("profile=passthrough\nemulate=0\ntrace=/tmp/t\n")
    monkeypatch.setenv(env.EMULATION_VAR, "passthrough")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(cfg))
    info = env.emulation_info()
    assert info["active"] is False and info["profile"] == "passthrough"
    assert env.emulated_banner(info) is None
    cfg.write_text("profile=b300\nemulate=1\n")
    assert env.emulation_info()["active"] is True


def test_a_profile_without_a_cuda_driver_emulates_nothing(monkeypatch, tmp_path):
    """`ccbridge run --profile b300` where no CUDA driver loads runs natively: its figures must not be labelled
    EMULATED, nor the serving defaults taken for emulated CC (a stranger's review, session 24)."""
    from ccbridge.bindings import core
    from ccbridge.load import policy

    cfg = tmp_path / "profile.conf"
    cfg.write_text("profile=b300\nemulate=1\n")
    monkeypatch.setenv(env.EMULATION_VAR, "b300")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(cfg))
    monkeypatch.setattr(core, "driver_missing", lambda: "cannot load the CUDA driver library libcuda.so.1")
    info = env.emulation_info()
    assert info["active"] is False and info["profile"] == "b300" and "libcuda" in info["no_driver"]
    assert env.emulated_banner(info) is None
    assert policy.cc_situation()[0] != "emulated"
    from ccbridge.report.tables import machine_table

    rows = dict(machine_table({**env.stamp(), "emulation": info}).rows)
    assert rows["emulation"].startswith("off (native): profile b300 emulated nothing here")
    # a projection dilates driver calls: none here, so none is stamped (times would be read as the target's)
    cfg.write_text("profile=passthrough\nemulate=0\n")
    monkeypatch.setenv("CCBRIDGE_PROJECTION", json.dumps({"target": "b300", "r": 2.5}))
    info = env.emulation_info()
    assert "projection" not in info and info["no_driver"] and env.emulated_banner(info) is None
    monkeypatch.setattr(core, "driver_missing", lambda: None)
    assert env.emulation_info()["projection"]["r"] == 2.5
    cfg.write_text("profile=b300\nemulate=1\n")
    assert env.emulation_info()["active"] is True and "no_driver" not in env.emulation_info()


def test_no_emulation_without_the_variable(monkeypatch):
    monkeypatch.delenv(env.EMULATION_VAR, raising=False)
    assert env.emulation_info() == {"active": False, "profile": None}


def test_a_what_if_run_is_stamped_with_its_overrides(monkeypatch, tmp_path, driver_here):
    from ccbridge.emulate import profiles

    prof = profiles.override(profiles.load("b300"), ["launch_toll_us=0", "h2d_pinned_gbps=20"])
    cfg = tmp_path / "profile.conf"
    cfg.write_text(prof.config_text(None, {"native_h2d_pinned_gbps": 55.0}))
    monkeypatch.setenv(env.EMULATION_VAR, "b300")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(cfg))
    info = env.emulation_info()
    assert info["overrides"] == {"launch_toll_us": {"value": 0.0, "was": 18.6},
                                 "h2d_pinned_gbps": {"value": 20.0, "was": 11.26}}
    assert info["params"]["launch_toll_us"] == "0" and not any(k.startswith("#") for k in info["params"])
    assert env.emulation_label(info) == "b300 with --set launch_toll_us=0 (was 18.6), h2d_pinned_gbps=20 (was 11.26)"


def test_the_launchers_host_facts_reach_the_stamp_and_not_the_parameters(monkeypatch, tmp_path, driver_here):
    """native_floor.host_facts' measurements ride as `#host` lines: the loader's policy reads them from the stamp,
    a malformed one is dropped, and none is taken for a profile parameter."""
    from ccbridge.emulate import profiles
    from ccbridge.load import policy

    cfg = tmp_path / "profile.conf"
    text = profiles.load("b300").config_text(None, {"native_h2d_pinned_gbps": 55.0}, {"native_h2d_pageable_gbps": 5.8})
    cfg.write_text(text + "#host bad=oops\n#host inf=inf\n")
    monkeypatch.setenv(env.EMULATION_VAR, "b300")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(cfg))
    info = env.emulation_info()
    assert info["host"] == {"native_h2d_pageable_gbps": 5.8} and "native_h2d_pageable_gbps" not in info["params"]
    mode, params = policy.cc_situation()
    assert mode == "emulated" and params["native_h2d_pageable_gbps"] == 5.8
    assert policy.choose(0).config.staging == "pinned"  # 0.78 x 5.8 GB/s per context pageable, 11.26 pinned


def test_a_run_without_overrides_has_none(monkeypatch, tmp_path, driver_here):
    from ccbridge.emulate import profiles

    cfg = tmp_path / "profile.conf"
    cfg.write_text(profiles.load("b300").config_text() + "#was lanes=oops\n#was nosuch=1\n")  # hand-written lines
    monkeypatch.setenv(env.EMULATION_VAR, "b300")
    monkeypatch.setenv("CCBRIDGE_EMU_CONFIG", str(cfg))
    info = env.emulation_info()
    assert "overrides" not in info and env.emulation_label(info) == "b300"


def test_the_stamp_says_whether_nccl_will_load_the_encrypting_plugin(tmp_path):
    import pytest

    from ccbridge.report.tables import machine_table
    from ccbridge import pluginenv

    if not (pluginenv.path() / pluginenv.NAME).exists():
        pytest.skip("the NCCL plugin is not built here")
    off = pluginenv.status({})
    assert off["built"] and not off["selected"] and not off["will_load"]
    on = pluginenv.status(pluginenv.env({"LD_LIBRARY_PATH": str(tmp_path)}))
    assert on["will_load"] and on["on_library_path"] and not on["required"]
    assert pluginenv.status({**pluginenv.env({}), "NCCL_NET": "ccbridge"})["required"]
    assert pluginenv.status({"NCCL_NET_PLUGIN": "ccbridge"})["will_load"] is False  # its folder is not on the path

    def row(p):
        return dict(machine_table({"nccl_net_plugin": p}).rows)["NCCL net plugin (encrypted)"]

    assert "needs NCCL_NET_PLUGIN=ccbridge and its folder on LD_LIBRARY_PATH" in row(off)
    # selected, as the stamp says, where its folder is not on the library path (was "built, not selected: needs
    # its folder on LD_LIBRARY_PATH")
    assert row(pluginenv.status({"NCCL_NET_PLUGIN": "ccbridge"})) == \
        f"selected (environment); will not load: add {pluginenv.path()} to LD_LIBRARY_PATH"
    assert row(on).startswith("NCCL will load it; set NCCL_NET=ccbridge")
    # how the plugin will run each lane: turns unless CCBRIDGE_NET_TURNS is 0 or 1
    # and the lanes a connection it listens for has, and lane 0's polling (both fall back without an error)
    spin = pluginenv.spin_us({})
    assert on["lane_mode"] == "turns 2" and row(on).endswith(f"; lanes 8, turns 2, spin {spin} us")
    assert row({**on, **pluginenv.status({**pluginenv.env({}), "CCBRIDGE_NET_LANES": "99",
                                            "CCBRIDGE_NET_SPIN_US": "abc"})}).endswith("; lanes 16, turns 2, spin 0 us")
    old = {k: v for k, v in on.items() if k not in ("lanes", "spin_us")}  # a stamp from before them
    assert row(old).endswith("; lanes: turns 2")
    assert pluginenv.status({"CCBRIDGE_NET_TURNS": "0"})["lane_mode"] == "pipeline 2"
    assert row({**on, "built": False}) == "not built"


# NCCL_NET_PLUGIN's forms: (value, {lib}: the plugin's file, {tmp}: a test folder; selected, will load without
# LD_LIBRARY_PATH, with the plugin's folder on it)
_PLUGIN_FORMS = [
    ("ccbridge", True, False, True),  # libnccl-net-ccbridge.so, on the library path
    ("libnccl-net-ccbridge.so", True, False, True),  # the file name itself, on the library path
    ("{lib}", True, True, True),  # a path: opened as it is
    ("{tmp}/link.so", True, True, True),  # a link to the plugin
    ("./libnccl-net-ccbridge.so", True, True, True),  # relative to the working folder (the plugin's, here)
    ("ccbridge,other", True, False, True),  # a list: tried in order
    (",{lib}", True, True, True),  # empty names skipped (strtok)
    ("other,ccbridge", False, False, False),  # another first: it is used where it loads
    ("{tmp}/libnccl-net-other.so", False, False, False),  # a path to another file
    ("{tmp}/libnccl-net-ccbridge.so", False, False, False),  # a path to no file
    ("none", False, False, False), ("NONE", False, False, False), ("", False, False, False), (",", False, False, False),
    ("CCBRIDGE", False, False, False),  # libnccl-net-CCBRIDGE.so: file names keep their case
    ("ccbridge.so", False, False, False),  # ccbridge.so, then libnccl-net-ccbridge.so.so
    (None, False, False, False),  # unset: libnccl-net.so
]


@pytest.mark.parametrize("value,selected,bare,on_path", _PLUGIN_FORMS, ids=[str(f[0]) for f in _PLUGIN_FORMS])
def test_the_stamp_reads_nccl_net_plugin_as_nccl_resolves_it(value, selected, bare, on_path, tmp_path, monkeypatch):
    # NCCL (2.28 and later, plugin_open.cc) opens the name as given, then, where it is no path and no lib*.so name,
    # libnccl-net-<name>.so; a comma-separated list is tried in order (net.cc). Only NCCL_NET_PLUGIN=ccbridge
    # counted: a path to the plugin (which needs no LD_LIBRARY_PATH) or its file name read "built, not selected"
    from ccbridge import pluginenv
    from ccbridge.report.tables import machine_table

    lib = pluginenv.path() / pluginenv.NAME
    if not lib.exists():
        pytest.skip("the NCCL plugin is not built here")
    (tmp_path / "libnccl-net-other.so").write_bytes(b"")
    (tmp_path / "link.so").symlink_to(lib)
    monkeypatch.chdir(lib.parent)
    env = {} if value is None else {"NCCL_NET_PLUGIN": value.format(lib=lib, tmp=tmp_path)}
    alone, found = pluginenv.status(env), pluginenv.status({**env, "LD_LIBRARY_PATH": str(pluginenv.path())})
    assert (alone["selected"], alone["will_load"], found["selected"], found["will_load"]) == \
        (selected, bare, selected, on_path)
    said = dict(machine_table({"nccl_net_plugin": alone}).rows)["NCCL net plugin (encrypted)"]
    assert said.startswith("NCCL will load it") == bare


def test_nccl_net_is_read_without_case_as_nccl_compares_it():
    from ccbridge import pluginenv

    # net.cc: strcasecmp(comm->config.netName, ncclNet->name)
    assert pluginenv.status({"NCCL_NET": "CCBridge"})["required"]
    assert not pluginenv.status({"NCCL_NET": "x"})["required"]
    assert pluginenv.plugin_first({}) == "libnccl-net.so" and pluginenv.plugin_first({"NCCL_NET_PLUGIN": ",a,b"}) == "a"


def test_ccbridge_env_says_whether_the_plugin_will_take_the_key(tmp_path, monkeypatch, capsys):
    # "NCCL will load it" said nothing of the key: with none, or a key file others can read, NCCL loaded the plugin
    # and its init failed on every rank. The key is checked here (not in the stamp: a result's key is the bench's);
    # the plugin's row says what follows for NCCL, the key's row where the key comes from (the two rows said "NCCL
    # will load it" and "the plugin's init fails")
    import hashlib

    import pytest

    from ccbridge import pluginenv
    from ccbridge.cli import main
    from ccbridge.cli.checks import plugin_key

    if not (pluginenv.path() / pluginenv.NAME).exists():
        pytest.skip("the NCCL plugin is not built here")
    for k, v in pluginenv.env({"NCCL_NET": "ccbridge"}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("COLUMNS", "200")
    f = tmp_path / "k"
    f.write_text(hashlib.sha256(b"ccbridge env key").hexdigest() + "\n")
    f.chmod(0o644)

    def row(**keys):  # the key's state and row, and the whole table's where it wraps, with the plugin's row
        for k in ("CCBRIDGE_KEY", "CCBRIDGE_KEY_FILE"):
            monkeypatch.setenv(k, keys[k]) if k in keys else monkeypatch.delenv(k, raising=False)
        assert main(["env"]) == 0
        out = capsys.readouterr().out
        assert out.count("NCCL net plugin key") == 1 and all(len(ln) <= 120 for ln in out.splitlines())
        state, text = plugin_key()
        said = pluginenv.status_text(pluginenv.status(), state)
        assert _env_rows(out)["NCCL net plugin (encrypted)"] == said
        assert _env_rows(out)["NCCL net plugin key"] == text
        return state, text, said

    state, text, said = row()
    assert (state, text) == ("none", "none: set $CCBRIDGE_KEY (64 hex digits) or $CCBRIDGE_KEY_FILE")
    assert said == "NCCL will load it, but its init fails without a key: NCCL_NET=ccbridge, so NCCL stops with an error"
    assert row(CCBRIDGE_KEY_FILE=str(f))[:2] == \
        ("refused", f"refused: key file {f} is readable by group or others (mode 644); chmod 600 it")
    f.chmod(0o600)
    state, text, said = row(CCBRIDGE_KEY_FILE=str(f))
    assert (state, text) == ("taken", f"key file {f}: taken") and said.startswith("NCCL will load it (NCCL_NET")
    assert row(CCBRIDGE_KEY="abc", CCBRIDGE_KEY_FILE=str(f))[1] == \
        "refused: $CCBRIDGE_KEY: expected 64 hex digits (32 bytes), got 3 characters"  # read first, as the plugin does
    assert row(CCBRIDGE_KEY=f.read_text(), CCBRIDGE_KEY_FILE="")[:2] == ("taken", "$CCBRIDGE_KEY: taken")
    monkeypatch.setenv("NCCL_NET_PLUGIN", "")  # not selected: no key row
    assert main(["env"]) == 0 and "NCCL net plugin key" not in capsys.readouterr().out


def _env_rows(out: str) -> dict[str, str]:
    """`ccbridge env`'s table as {label: text}, its wrapped lines joined."""
    rows: dict[str, str] = {}
    label = None
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) != 2:
            continue
        if cells[0]:
            label = cells[0]
            rows[label] = cells[1]
        elif label:
            rows[label] += " " + cells[1]
    return rows


def test_the_plugins_row_says_what_nccl_will_do_in_one_row_as_the_stamp_says(tmp_path, monkeypatch, capsys):
    """Selected in a settings file without its folder on LD_LIBRARY_PATH, the table said "built, not selected" and
    the JSON "selected": true; loaded without a key, one row said "NCCL will load it" and the next "the plugin's
    init fails", and nothing that NCCL then falls back to plaintext (NCCL_NET unset) or stops (NCCL_NET=ccbridge);
    with NCCL_NET naming another network NCCL loads it and never starts it (net.cc ncclNetInit)."""
    from ccbridge import pluginenv
    from ccbridge.cli import main

    if not (pluginenv.path() / pluginenv.NAME).exists():
        pytest.skip("the NCCL plugin is not built here")
    f = _confs(tmp_path, conf="NCCL_NET_PLUGIN=ccbridge\n")["conf"]
    for k in ("NCCL_NET_PLUGIN", "NCCL_NET", "LD_LIBRARY_PATH", "CCBRIDGE_KEY", "CCBRIDGE_KEY_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NCCL_CONF_FILE", f)
    assert main(["env", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["nccl_net_plugin"]
    assert st["selected"] and not st["will_load"]
    assert main(["env"]) == 0
    rows = _env_rows(capsys.readouterr().out)
    assert rows["NCCL net plugin (encrypted)"] == \
        f"selected (file {f}); will not load: add {pluginenv.path()} to LD_LIBRARY_PATH"

    def said(key=None, **environ):
        return pluginenv.status_text(pluginenv.status({"LD_LIBRARY_PATH": str(pluginenv.path()), **environ}, [f]), key)

    assert said("none") == \
        "NCCL will load it, but its init fails without a key: NCCL falls back to plaintext IB or sockets unless " \
        "NCCL_NET=ccbridge"
    assert said("refused", NCCL_NET="CCBRIDGE") == \
        "NCCL will load it, but its init refuses the key: NCCL_NET=ccbridge, so NCCL stops with an error"
    for key in (None, "none", "taken"):  # the key does not matter: NCCL does not start it
        assert said(key, NCCL_NET="IB") == \
            "NCCL will load it but not use it: NCCL_NET='IB' (environment) is not ccbridge"
    assert said("taken").startswith("NCCL will load it; set NCCL_NET=ccbridge so NCCL fails rather than falls back")
    assert said(None).startswith("NCCL will load it; set NCCL_NET")  # a result's stamp: no key known
    monkeypatch.setenv("LD_LIBRARY_PATH", str(pluginenv.path()))
    assert main(["env"]) == 0
    rows = _env_rows(capsys.readouterr().out)
    assert rows["NCCL net plugin (encrypted)"] == said("none")
    # where the key comes from, not what follows
    assert rows["NCCL net plugin key"] == "none: set $CCBRIDGE_KEY (64 hex digits) or $CCBRIDGE_KEY_FILE"


def test_where_older_nccl_would_do_otherwise_the_plugins_row_says_what(tmp_path):
    from ccbridge import pluginenv

    if not (pluginenv.path() / pluginenv.NAME).exists():
        pytest.skip("the NCCL plugin is not built here")
    f = _confs(tmp_path, crlf=b"NCCL_NET_PLUGIN=ccbridge\r\n")["crlf"]
    st = pluginenv.status({"LD_LIBRARY_PATH": str(pluginenv.path()), "NCCL_NET": "ccbridge"}, [f])
    assert pluginenv.status_text(st, "taken") == \
        "NCCL will load it (NCCL_NET=ccbridge: required); " + pluginenv.settings(st) + \
        "; NCCL 2.29 and earlier: built, not selected: needs NCCL_NET_PLUGIN=ccbridge"


def _confs(tmp_path, **files):
    """Settings files under tmp_path: name=text."""
    for name, text in files.items():
        (tmp_path / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return {name: str(tmp_path / name) for name in files}


def test_nccl_settings_files_are_read_in_nccls_order_under_the_environment(tmp_path):
    """`ccbridge env` read NCCL_NET_PLUGIN from the environment alone: NCCL also reads $NCCL_CONF_FILE (where set and
    not empty, else ~/.nccl.conf), then /etc/nccl.conf, each setting without overwriting (param.cc initEnv,
    setenv(..., 0)): the environment wins, then the first file, then /etc/nccl.conf."""
    from ccbridge import pluginenv

    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_NET_PLUGIN=user\nNCCL_NET=user\n")
    f = _confs(tmp_path, named="NCCL_NET_PLUGIN=named\n", etc="NCCL_NET_PLUGIN=etc\nNCCL_NET=etc\n")

    def files(environ):
        return pluginenv.conf_files(environ, home=str(home), etc=f["etc"])

    assert files({}) == [str(home / ".nccl.conf"), f["etc"]]
    assert files({"NCCL_CONF_FILE": ""}) == files({})  # empty: as unset
    assert files({"NCCL_CONF_FILE": f["named"]}) == [f["named"], f["etc"]]  # instead of ~/.nccl.conf, not before it

    def got(environ):
        s = pluginenv.nccl_settings(environ, files(environ))
        return {k: (v["value"], v["from"]) for k, v in s.items()}

    assert got({}) == {"NCCL_NET_PLUGIN": ("user", str(home / ".nccl.conf")),
                       "NCCL_NET": ("user", str(home / ".nccl.conf"))}  # ~/.nccl.conf over /etc/nccl.conf
    # $NCCL_CONF_FILE over /etc/nccl.conf, and ~/.nccl.conf not read: NCCL_NET from /etc/nccl.conf
    assert got({"NCCL_CONF_FILE": f["named"]}) == {"NCCL_NET_PLUGIN": ("named", f["named"]),
                                                   "NCCL_NET": ("etc", f["etc"])}
    # the environment over every file, even set empty
    assert got({"NCCL_CONF_FILE": f["named"], "NCCL_NET_PLUGIN": ""}) == {"NCCL_NET_PLUGIN": ("", "environment"),
                                                                          "NCCL_NET": ("etc", f["etc"])}
    assert pluginenv.nccl_settings({}, [f["etc"]]) == {"NCCL_NET_PLUGIN": {"value": "etc", "from": f["etc"]},
                                                       "NCCL_NET": {"value": "etc", "from": f["etc"]}}


def test_the_user_file_is_in_home_as_nccl_2_30_takes_it_and_the_password_databases_as_2_29_did(tmp_path):
    """NCCL 2.30.3 and later's ~ is $HOME (param.cc userHomeDir: getenv), 2.29 and earlier's getpwuid(getuid())'s
    home; ~/.nccl.conf is home + "/.nccl.conf", so an empty home is "/.nccl.conf" (was the relative ".nccl.conf")
    and an unset HOME no user file."""
    import os
    import pwd

    from ccbridge import pluginenv

    mine = pwd.getpwuid(os.getuid()).pw_dir
    assert pluginenv.conf_files({"HOME": str(tmp_path)}) == [f"{tmp_path}/.nccl.conf", "/etc/nccl.conf"]
    assert pluginenv.conf_files({"HOME": str(tmp_path)}, older=True) == [f"{mine}/.nccl.conf", "/etc/nccl.conf"]
    assert pluginenv.conf_files({}) == ["/etc/nccl.conf"]
    assert pluginenv.conf_files({"HOME": ""}) == pluginenv.conf_files({}, home="") == ["/.nccl.conf", "/etc/nccl.conf"]


def test_where_older_nccl_reads_the_users_files_otherwise_the_stamp_and_env_say_so(tmp_path):
    """ccbridge cannot know which NCCL a job loads: it reads the files as 2.30.3 and later do and, where 2.29 and
    earlier would get other values (another ~, a CR kept), says theirs and why ("older_nccl"), not a guess."""
    import os
    import pwd

    from ccbridge import pluginenv

    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_NET_PLUGIN=ccbridge\nNCCL_NET=ccbridge\n")
    mine = pwd.getpwuid(os.getuid()).pw_dir
    st = pluginenv.status({"HOME": str(home)}, None)
    if os.path.exists(f"{mine}/.nccl.conf"):  # (this machine's user has a file of its own: the first case differs)
        pytest.skip(f"{mine}/.nccl.conf exists here")
    assert st["selected"] and st["required"]
    older = st["older_nccl"]
    assert older["why"] == [f"their ~ is the password database's home, {mine}, not $HOME"]
    assert older["conf_files"][0] == f"{mine}/.nccl.conf" and not older["selected"] and not older["required"]
    assert pluginenv.settings_text(st).endswith(
        f", as NCCL 2.30.3 and later read their files. NCCL 2.29 and earlier (their ~ is the password database's "
        f"home, {mine}, not $HOME): NCCL_NET_PLUGIN and NCCL_NET unset (not in the environment, {mine}/.nccl.conf "
        f"or /etc/nccl.conf)")
    f = _confs(tmp_path, crlf="NCCL_NET_PLUGIN=ccbridge\r\n")["crlf"]
    st = pluginenv.status({"NCCL_NET": "ccbridge"}, [f])
    assert st["selected"] and st["older_nccl"]["why"] == ["they keep a value's trailing CR"]
    assert not st["older_nccl"]["selected"] and st["older_nccl"]["required"]  # NCCL_NET from the environment
    assert pluginenv.settings_text(st) == (
        f"NCCL_NET_PLUGIN='ccbridge' ({f}); NCCL_NET='ccbridge' (environment), as NCCL 2.30.3 and later read their "
        f"files. NCCL 2.29 and earlier (they keep a value's trailing CR): NCCL_NET_PLUGIN='ccbridge\\r' ({f}); "
        f"NCCL_NET='ccbridge' (environment)")
    same = _confs(tmp_path, plain="NCCL_NET_PLUGIN=ccbridge\n")["plain"]
    assert "older_nccl" not in pluginenv.status({"HOME": mine}, None)  # one ~ for both
    assert "older_nccl" not in pluginenv.status({}, [same])


def test_a_settings_file_is_read_line_by_line_as_nccl_reads_it(tmp_path):
    """'#' at a line's start is a comment; a line without '=' (a blank one, a word) is passed over; nothing is
    stripped (`KEY = v` is the key "KEY "); a key's first line holds; a NUL ends the line; an empty key is no
    setting. NCCL 2.30.3 and later strip a trailing CR (2.29 and earlier kept it) and read a line in pieces of at
    most 4095 bytes (fgets into 4096), each a line of its own (2.29 and earlier: getline, whole)."""
    from ccbridge import pluginenv

    text = (b"# NCCL_NET_PLUGIN=comment\n\n   \nNCCL_NET_PLUGIN\nNCCL_NET = spaced\n=empty\n"
            b"  # NCCL_DEBUG=INFO\nNCCL_NET_PLUGIN=first\nNCCL_NET_PLUGIN=second\nCR=v\r\nNUL=a\0b\n#x\nLAST=no newline")
    f = _confs(tmp_path, conf=text)["conf"]
    both = {"NCCL_NET ": " spaced", "  # NCCL_DEBUG": "INFO", "NCCL_NET_PLUGIN": "first", "NUL": "a",
            "LAST": "no newline"}
    assert pluginenv.read_conf(f) == {**both, "CR": "v"}
    assert pluginenv.read_conf(f, older=True) == {**both, "CR": "v\r"}
    assert pluginenv.read_conf(_confs(tmp_path, long=b"K=" + b"v" * 2000)["long"])["K"] == "v" * 1023
    s = pluginenv.nccl_settings({}, [f])
    assert s == {"NCCL_NET_PLUGIN": {"value": "first", "from": f}}  # "NCCL_NET " is not NCCL_NET
    # a line of 4095 bytes and more: its rest is a line of its own, where it may set a key
    pieces = _confs(tmp_path, pieces=b"A=" + b"x" * 4093 + b"B=y\r\n" + b"C=" + b"z" * 4093 + b"\n#D=w\nE=v\r\r\n")
    assert pluginenv.read_conf(pieces["pieces"]) == {"A": "x" * 1023, "B": "y", "C": "z" * 1023, "E": "v\r"}
    assert pluginenv.read_conf(pieces["pieces"], older=True) == {"A": "x" * 1023, "C": "z" * 1023, "E": "v\r\r"}
    assert pluginenv.status({}, [pieces["pieces"]]).get("older_nccl") is None  # neither names NCCL_NET_PLUGIN


def test_a_settings_file_that_cannot_be_read_is_none_and_not_an_error(tmp_path):
    """NCCL's fopen (or getline, for a folder) fails and it goes on to the next file."""
    import os

    from ccbridge import pluginenv

    f = _confs(tmp_path, etc="NCCL_NET_PLUGIN=etc\n", locked="NCCL_NET_PLUGIN=locked\n")
    os.chmod(f["locked"], 0)
    bad = [str(tmp_path / "missing"), str(tmp_path)] + ([f["locked"]] if os.getuid() != 0 else [])  # (root reads it)
    for b in bad:
        assert pluginenv.read_conf(b) == {}
        assert pluginenv.nccl_settings({}, [b, f["etc"]]) == {"NCCL_NET_PLUGIN": {"value": "etc", "from": f["etc"]}}
        assert pluginenv.status({"NCCL_CONF_FILE": b}, [b, f["etc"]])["nccl_settings"]["NCCL_NET_PLUGIN"]["from"] == \
            f["etc"]


def test_the_plugin_selected_in_a_settings_file_is_said_with_where(tmp_path, monkeypatch, capsys):
    """status() counts NCCL_NET_PLUGIN and NCCL_NET from NCCL's files (the library path still the environment's);
    `ccbridge env` and its JSON say where each came from."""
    from ccbridge import pluginenv
    from ccbridge.cli import main

    f = _confs(tmp_path, conf="NCCL_NET_PLUGIN=ccbridge\nNCCL_NET=ccbridge\n")["conf"]
    st = pluginenv.status({"LD_LIBRARY_PATH": str(pluginenv.path()), "NCCL_NET": "other"}, [f])
    assert st["selected"] and not st["required"] and st["conf_files"] == [f]
    assert st["will_load"] == (pluginenv.path() / pluginenv.NAME).exists()
    assert st["nccl_settings"] == {"NCCL_NET_PLUGIN": {"value": "ccbridge", "from": f},
                                   "NCCL_NET": {"value": "other", "from": "environment"}}
    files = ", as NCCL 2.30.3 and later read their files"
    assert pluginenv.settings_text(st) == f"NCCL_NET_PLUGIN='ccbridge' ({f}); NCCL_NET='other' (environment){files}"
    assert pluginenv.settings_text(pluginenv.status({}, [f, "/nowhere"])) == \
        f"NCCL_NET_PLUGIN='ccbridge' ({f}); NCCL_NET='ccbridge' ({f}){files}"
    assert pluginenv.settings_text(pluginenv.status({}, ["/nowhere"])) == \
        f"NCCL_NET_PLUGIN and NCCL_NET unset (not in the environment or /nowhere){files}"
    for k in ("NCCL_NET_PLUGIN", "NCCL_NET"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NCCL_CONF_FILE", "conf")  # opened from the working folder, as NCCL's fopen
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["env", "--json"]) == 0
    stamp = json.loads(capsys.readouterr().out)
    assert stamp["nccl_net_plugin"]["nccl_settings"]["NCCL_NET_PLUGIN"] == {"value": "ccbridge", "from": "conf"}
    from ccbridge.resultschema import STAMP_SCHEMA
    STAMP_SCHEMA.check(stamp, "stamp", ValueError)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "NCCL_NET_PLUGIN='ccbridge' (conf); NCCL_NET='ccbridge' (conf)" in out
    assert all(len(line) <= 120 for line in out.splitlines())
