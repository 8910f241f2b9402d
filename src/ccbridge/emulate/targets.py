"""GPUs a run can be projected to (ccbridge run --project TARGET): each one's datasheet rates, with sources.

A projection runs the program in dilated time (native/emu/config.c, emu_dilate): everything but the GPU runs r
times slower, so this GPU, left at its own speed, stands for one r times faster. r compares datasheet to
datasheet, like for like (the local GPU is looked up in the same table by its NVML name): the HBM bandwidth for
memory-bound work (decode and most serving: the default), dense BF16 throughput for compute-bound work, a mix of
the two for work that is partly either (`hbm:F`: F of this GPU's busy time at its HBM roofline, the rest taken
as scaling with dense BF16 throughput, Amdahl's way; `ccbridge bench decode --tp` measures F as its hbm_share
row), or a number given by hand. The local GPU's measured rates (the probe's compute family) are recorded beside
them to show how far this machine is from its own datasheet.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ccbridge.errors import UsageError

ENV_VAR = "CCBRIDGE_PROJECTION"  # set by `ccbridge run --project` in the program's environment: the projection


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    nvml: str  # a regular expression matched against NVML's device name
    hbm_tbps: float  # memory bandwidth, TB/s
    bf16_tflops: float | None  # dense (no sparsity)
    fp8_tflops: float | None  # dense
    pcie_gen: int
    nvlink_gbps: float | None  # GPU-GPU, per direction (the datasheet's bidirectional figure / 2)
    source: str


_HOPPER = "NVIDIA H100 Tensor Core GPU datasheet (SXM: 3.35 TB/s, BF16 1,979 TFLOPS and FP8 3,958 with sparsity, " \
          "NVLink 900 GB/s; PCIe: 2 TB/s, 1,513 / 3,026, NVLink bridge 600 GB/s; NVL: 3.9 TB/s, 1,671 / 3,341)"
GPUS = {g.key: g for g in (
    Gpu("h100", "H100 SXM", r"H100(?!.*(PCIe|NVL))", 3.35, 989.5, 1979.0, 5, 450.0, _HOPPER),
    Gpu("h100-nvl", "H100 NVL", r"H100.*NVL", 3.9, 835.5, 1670.5, 5, 300.0, _HOPPER),
    Gpu("h100-pcie", "H100 PCIe", r"H100.*PCIe", 2.0, 756.5, 1513.0, 5, 300.0, _HOPPER),
    Gpu("h200", "H200 SXM", r"H200", 4.8, 989.5, 1979.0, 5, 450.0,
        "NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e at 4.8 TB/s; BF16 1,979 and FP8 3,958 TFLOPS with "
        "sparsity (the H100's compute); NVLink 900 GB/s"),
    Gpu("b200", "B200 (HGX)", r"B200", 8.0, 2250.0, 4500.0, 5, 900.0,
        "NVIDIA HGX B200 datasheet: per GPU 8 TB/s HBM3e, 4.5 PFLOPS BF16 and 9 PFLOPS FP8 with sparsity, NVLink 5 "
        "1.8 TB/s (bidirectional); PCIe Gen5"),
    Gpu("b300", "B300 (HGX, Blackwell Ultra)", r"B300", 8.0, 2250.0, 4500.0, 6, 900.0,
        "NVIDIA HGX B300 datasheet: per GPU 288 GB HBM3e at 8 TB/s, 36 PFLOPS BF16 and 72 PFLOPS FP8 with sparsity "
        "per 8 GPUs (2.25 / 4.5 dense each), NVLink 5 1.8 TB/s (bidirectional); PCIe Gen6"),
    Gpu("rtxpro6000", "RTX PRO 6000 Blackwell Server Edition", r"RTX PRO 6000", 1.6, None, None, 5, None,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 96 GB GDDR7 at 1.6 TB/s, PCIe Gen5, no NVLink "
        "(dense BF16/FP8 not given as such: --project-by flops is refused for it)"),
)}
BY = ("hbm", "flops")
DEFAULT_BY = "hbm"  # decode and most serving read weights and KV cache each step: memory-bound


def identify(nvml_name: str) -> Gpu | None:
    """The table's entry for a GPU by its NVML name (None: not in the table)."""
    for g in GPUS.values():
        if re.search(g.nvml, nvml_name or "", re.IGNORECASE):
            return g
    return None


def target(key: str) -> Gpu:
    if key not in GPUS:
        raise UsageError(f"--project: unknown GPU {key[:24]!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


def _rate(g: Gpu, by: str) -> float:
    v = g.hbm_tbps if by == "hbm" else g.bf16_tflops
    if v is None:
        raise UsageError(f"--project-by {by}: no dense BF16 figure in the {g.key} datasheet; use hbm or a number")
    return v


@dataclass(frozen=True)
class Projection:
    target: Gpu
    local: Gpu | None
    by: str  # hbm | flops | hbm:F | given
    r: float

    def describe(self) -> str:
        if self.by == "given":
            return f"PROJECTED to {self.target.name}: time dilated x{self.r:g} (given by hand)"
        if (f := hbm_share(self.by)) is not None:
            return (f"PROJECTED to {self.target.name}: time dilated x{self.r:.3g} = 1 / ({f:g} / "
                    f"{self.ratio('hbm'):.3g} HBM + {1 - f:.2g} / {self.ratio('flops'):.3g} BF16) ({self.local.name}, "
                    f"this GPU; datasheets)")
        unit = "TB/s HBM" if self.by == "hbm" else "TFLOPS dense BF16"
        return (f"PROJECTED to {self.target.name}: time dilated x{self.r:.3g} = {_rate(self.target, self.by):g} / "
                f"{_rate(self.local, self.by):g} {unit} ({self.local.name}, this GPU; datasheets)")

    def as_dict(self) -> dict:
        return {"target": self.target.key, "local": self.local.key if self.local else None, "by": self.by,
                "r": self.r, "hbm_ratio": self.ratio("hbm"), "flops_ratio": self.ratio("flops")}

    def config_lines(self, native: dict[str, float]) -> str:
        """The interposer's configuration lines: the dilation and the target's link rate as this machine measures."""
        link = self.link_gbps(native.get("native_nvlink_gbps", 0.0))
        return f"dilation={self.r!r}\n" + (f"target_nvlink_gbps={link!r}\n" if link else "")

    def ratio(self, by: str) -> float | None:
        """The datasheet ratio for memory- or compute-bound work (None where a figure is missing)."""
        try:
            return _rate(self.target, by) / _rate(self.local, by) if self.local else None
        except UsageError:
            return None

    def link_gbps(self, native_gbps: float) -> float:
        """The target's GPU-GPU rate as this machine would measure it: its measured rate x the datasheets' ratio."""
        t, l = self.target.nvlink_gbps, self.local.nvlink_gbps if self.local else None
        return native_gbps * t / l if t and l and native_gbps > 0 else 0.0


def hbm_share(by: str | float) -> float | None:
    """F of an `hbm:F` ratio (None for any other)."""
    return float(by[4:]) if isinstance(by, str) and by.startswith("hbm:") else None


def parse_by(text: str) -> str | float:
    """--project-by: hbm, flops, hbm:F (0 < F <= 1), or a ratio (a number >= 1)."""
    if text in BY:
        return text
    if text.startswith("hbm:"):
        try:
            f = float(text[4:])
        except ValueError:
            f = math.nan
        if not 0 < f <= 1:
            raise UsageError(f"--project-by hbm:F: F, the GPU time's share at the HBM roofline, is above 0 and at "
                             f"most 1, got {text[4:24]!r}")
        return f"hbm:{f:g}"
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"--project-by: expected hbm, flops, hbm:F or a number, got {text[:24]!r}") from None
    if not math.isfinite(v):
        raise UsageError(f"--project-by: expected a finite number, got {text}")
    if v <= 0:  # not a slower GPU (r < 1, refused by project()): no GPU at all
        raise UsageError(f"--project-by {v:g}: a ratio is above 0 (and 1 or more: a faster target)")
    return v


def mixed_ratio(share: float, hbm: float, flops: float) -> float:
    """r for work that spends `share` of this GPU's busy time at its HBM roofline and the rest bound by compute
    (launch chains and small kernels included: their speed-up taken as the dense BF16 ratio's), Amdahl's way: the
    target's busy time is share / hbm + (1 - share) / flops of this GPU's."""
    return 1 / (share / hbm + (1 - share) / flops)


def project(target_key: str, local_nvml_name: str | None, by: str | float = DEFAULT_BY) -> Projection:
    """The projection of this GPU to the target; a ratio below 1 is refused (a GPU cannot be slowed uniformly
    from the API: kernels would have to be slowed, and nothing between the program and the GPU can do that)."""
    tgt = target(target_key)
    local = identify(local_nvml_name or "")
    if isinstance(by, float):
        r, how = by, "given"
    else:
        if local is None:
            raise UsageError(f"--project: no datasheet for this GPU ({(local_nvml_name or 'none found')[:30]}); "
                             "give the ratio: --project-by R")
        if (f := hbm_share(by)) is not None:
            r = mixed_ratio(f, _rate(tgt, "hbm") / _rate(local, "hbm"), _rate(tgt, "flops") / _rate(local, "flops"))
        else:
            r = _rate(tgt, by) / _rate(local, by)
        how = by
    if not r >= 1:
        raise UsageError(f"--project {target_key}: the ratio is {r:.3g} (< 1): a slower GPU; one cannot be slowed "
                         "uniformly from the API")
    if r > 1000:
        raise UsageError(f"--project-by {r:g}: at most 1000")
    return Projection(tgt, local, how, r)
