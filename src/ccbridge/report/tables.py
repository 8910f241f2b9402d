"""The report's content as plain data: sections of tables, shared by Markdown and HTML."""

from __future__ import annotations

from dataclasses import dataclass, field

from ccbridge import env as envmod
from ccbridge import fabric, pluginenv
from ccbridge.probe import registry
from ccbridge.results import KINDS, Result, Row, machine_name, recorded, recorded_text
from ccbridge.ui import human_bytes


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


def num(x: float) -> str:
    """Three significant digits, no exponent for everyday magnitudes."""
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.01:
        return f"{x:.3g}" if a < 1 else f"{x:.2f}"
    return f"{x:.2e}"


def fmt_params(params: dict) -> str:
    return ", ".join(f"{k}={human_bytes(v) if k == 'bytes' else v}" for k, v in params.items())


def row_cells(r: Row) -> list[str]:
    cells = [fmt_params(r.params), r.metric, num(r.median), f"{num(r.p10)} – {num(r.p90)}", str(r.n), r.unit]
    cells.append(r.extra.get("verdict", ""))
    return cells


ROW_HEADERS = ["parameters", "metric", "median", "p10 – p90", "n", "unit", "verdict"]


def command(res: Result) -> str:
    """The command that wrote a result, from its kind: probe, account, bench decode, collectives, ..."""
    return KINDS[res.kind].removeprefix("ccbridge ")


def title(res: Result) -> str:
    base = f"ccbridge {command(res)} — {machine_name(res)} — {res.created[:10]}"
    if res.kind == "account" and res.settings.get("profile"):  # its stamp may be OTHER's, emulated: BASE was not
        base += f" — OTHER EMULATED (profile {res.settings['profile']})"
    elif res.emulated:
        base += f" — EMULATED (profile {envmod.emulation_label(res.env['emulation'])})"
    return base


def run_line(res: Result) -> str:
    s = res.settings
    if res.kind == "account":
        total = {r.metric: r for r in res.rows if r.test == "account.total"}
        phases = {r.params.get("phase"): r.median for r in res.rows if r.test == "account.phase"}
        ms = lambda m: f"{total[m].median * 1e3:+.1f} ms" if m in total else "?"
        where = ""
        if "share_base" in total:
            where = (f" Slowdown {ms('wall_slowdown')}"
                     + (" (" + ", ".join(f"{k} {v * 1e3:+.1f} ms" for k, v in phases.items()) + ")" if phases else "")
                     + f"; the shares below are of {total['share_base'].extra.get('of', 'the slowdown')} "
                     f"({ms('share_base')}), of which the driver calls' net change holds {ms('net_in_calls')}.")
        return (f"Account: BASE {s.get('base')} vs OTHER {s.get('other')}"
                + (f" (OTHER ran under the emulator, profile {s['profile']})" if s.get("profile") else "")
                + f"; {len(res.rows)} rows, created {res.created}" + _recorded(res) + "." + where)
    if res.kind != "probe":
        return f"Run: {len(res.rows)} rows in {res.duration_s:.0f} s, created {res.created}."
    mode = "quick" if s.get("quick") else "full"
    tests = s.get("tests")
    which = f"{len(tests)} test{'s' * (len(tests) != 1)} of the {mode} suite" if tests else f"{mode} suite"
    # a machine without a usable GPU ran on no device, whatever --device named
    where = "without a usable GPU" if s.get("missing", {}).get("gpu") else f"on device {s.get('device', 0)}"
    # the tests' own seconds: the probe's stdout line adds its start-up and reports, settings.seconds each test's
    return (f"Run: {which} {where}, tests {res.duration_s:.1f} s, {len(res.rows)} rows, created {res.created}.")


def _recorded(res: Result) -> str:
    """Where an account's traces were recorded, for its run line (an account that ran CMD: here, nothing said)."""
    rec = recorded(res)
    if rec is None:
        return ""
    if not any(x["machine"] for x in rec):
        return " (no trace says where it was recorded: the machine below read them)"
    return f" ({recorded_text(rec)}; the machine below: OTHER's, else BASE's)"


def emulation_banner(res: Result) -> str:
    if res.kind == "account" and res.settings.get("profile"):  # BASE ran natively: its figures are the machine's
        return (f"EMULATED: OTHER's figures here were produced by the ccbridge emulator (profile "
                f"{res.settings['profile']}), not measured on confidential-computing hardware; BASE's are the "
                "machine's own.")
    if not res.emulated:
        return ""
    return (f"EMULATED: every GPU figure here was produced by the ccbridge emulator (profile "
            f"{envmod.emulation_label(res.env['emulation'])}), not measured on confidential-computing hardware.")


def machine_table(env: dict, plugin_key: str | None = None) -> Table:
    """plugin_key: what the NCCL net plugin's init will make of the key here (pluginenv.status_text's key;
    `ccbridge env` checks it, a result's stamp does not hold it)."""
    nv, tee, cpu, tor, ssl = env.get("nvml", {}), env.get("tee", {}), env.get("cpu", {}), env.get("torch", {}), env.get("openssl", {})
    gpus = "; ".join(f"{g['index']}: {g.get('name')} ({g.get('memory_gib')} GiB, PCIe gen {g.get('pcie_gen')} x{g.get('pcie_width')})"
                     for g in nv.get("gpus", [])) or nv.get("error", "none")
    cc = nv.get("cc", {})
    cc_text = envmod.cc_label(cc)
    if cc.get("state"):
        cc_text += f" (feature {cc['state']['cc_feature']}, environment {cc['state']['environment']}, devtools {cc['state']['devtools_mode']})"
    if "multi_gpu_mode" in cc:
        cc_text += f"; multi-GPU mode {cc['multi_gpu_mode']}"
    elif "settings_error" in cc:
        cc_text += f"; multi-GPU mode unreadable ({cc['settings_error']})"
    if "gpus_ready" in cc:
        cc_text += f"; GPUs ready: {cc['gpus_ready']}"
    flags = cpu.get("flags", {})
    t = Table("Machine", ["what", "value"])
    t.rows = [
        ["GPUs", gpus],
        ["driver / CUDA", f"{nv.get('driver')} / {nv.get('cuda_driver')}" if nv.get("available") else "n/a"],
        ["GPU CC mode (NVML)", cc_text if nv.get("available") else "n/a (no NVML)"],
        ["NVLink fabric (NVML)", fabric.summary(nv) if nv.get("available") else "n/a (no NVML)"],
        ["CPU TEE guest", f"{tee.get('kind')} {('(' + ', '.join(tee.get('evidence', [])) + ')') if tee.get('evidence') else ''}".strip()],
        ["CPU", f"{cpu.get('model')} x{cpu.get('cores')}; " + " ".join(f"{k}{'+' if v else '-'}" for k, v in flags.items())],
        ["OpenSSL", ssl.get("version") or ssl.get("error", "n/a")],
        # a trace's stamp holds none: the launcher cannot name the torch of the program it starts (emulate/recorded)
        ["torch", f"{tor.get('version')} (CUDA {tor.get('cuda')})" if tor.get("available") else
         tor.get("error", "n/a" if tor else "not recorded (a trace's stamp names no torch)")],
        ["emulation", _emulation_text(env.get("emulation") or {})],
        ["host / OS / Python", f"{env.get('host')} / {env.get('os')} / {env.get('python')}"],
        ["NCCL net plugin (encrypted)", pluginenv.status_text(env.get("nccl_net_plugin"), plugin_key)],
    ]
    return t


def _emulation_text(emu: dict) -> str:
    if emu.get("active"):
        return f"ACTIVE, profile {envmod.emulation_label(emu)}"
    if emu.get("no_driver"):  # run under a profile where no CUDA driver loads: nothing was hooked
        return f"off (native): profile {emu.get('profile')} emulated nothing here, {emu['no_driver']}"
    return "off (native)"


def headline_table(res: Result) -> Table:
    t = Table("Headline figures", ["test"] + ROW_HEADERS)
    t.rows = [[r.test] + row_cells(r) for r in res.rows if r.extra.get("headline")]
    return t


def test_tables(res: Result) -> list[Table]:
    registry.load_families()
    out = []
    for name in dict.fromkeys(r.test for r in res.rows):
        t = registry.REGISTRY.get(name)
        tab = Table(f"{name}: {t.title}" if t else name, ROW_HEADERS)
        tab.rows = [row_cells(r) for r in res.by_test(name)]
        out.append(tab)
    return out


def skipped_table(res: Result) -> Table:
    t = Table("Skipped", ["test", "reason"])
    # a reason once; the rows after it that share it say so (the console's way: 16 GPU tests, one missing driver)
    t.rows = [[s["test"], "(same reason)" if i and s["reason"] == res.skipped[i - 1]["reason"] else s["reason"]]
              for i, s in enumerate(res.skipped)]
    return t


def errors_table(res: Result) -> Table:
    t = Table("Errors", ["test", "error"])
    t.rows = [[e["test"], e["error"]] for e in res.errors]
    return t
