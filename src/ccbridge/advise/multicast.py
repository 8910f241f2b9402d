"""NVLink multicast under CC: whether the input's CC mode keeps it, and the settings that keep engines off it.

Where the CC mode has no NVLink multicast (NVLS: off on B300 in the NVLE mode), engines that want a
multicast workspace must be told to do without (bridge law, section 6).
"""

from __future__ import annotations

from ccbridge import env as envmod
from ccbridge.advise.core import Add, Input, state
from ccbridge.emulate import profiles
from ccbridge.errors import CCBridgeError
from ccbridge.results import Row

# The profile parameter that says whether the emulated CC mode keeps NVLink multicast (1) or not (0).
NVLS_PARAM = "nvls"
# NVML's multi-GPU CC modes (env.nvml_info) and whether multicast survives them: NVLE (B300) turns NVLS off,
# protected PCIe (H200, the switch inside the boundary) keeps it (bridge law, section 6).
MULTICAST_BY_MODE = {"nvle": False, "protected-pcie": True}

# The settings that keep an engine off NVLink multicast, each as documented by its project:
# - NCCL_NVLS_ENABLE=0: NCCL's environment variable for NVLink SHARP; NCCL's own warning when binding NVLS
#   multicast memory fails says "Disable NVLS (NCCL_NVLS_ENABLE=0)" (transport/nvls.cc).
# - TORCH_SYMM_MEM_DISABLE_MULTICAST=1: torch/csrc/distributed/c10d/symm_mem, device_has_multicast_support()
#   answers false when it is set (torch symmetric memory then maps peers without a multicast object).
# - VLLM_ALLREDUCE_USE_SYMM_MEM=0: vllm/envs.py; vLLM's SymmMemCommunicator
#   (distributed/device_communicators/symm_mem.py) runs multimem (multicast) all-reduce at TP 4/6/8 on sm90/sm100.
#   (--disable-custom-all-reduce turns off vLLM's IPC all-reduce, which needs no multicast: not this.)
# - SGLang --enable-nccl-nvls: server_args, off by default ("Enable NCCL NVLS for prefill heavy requests").
# - TRT-LLM allreduce_strategy: tensorrt_llm/llmapi/llm_args.py TorchLlmArgs, Literal AUTO, NCCL, UB,
#   MINLATENCY, ONESHOT, TWOSHOT, LOWPRECISION, MNNVL (default AUTO); MNNVL's all-reduce takes a multicast
#   buffer (flashinfer.comm.trtllm_mnnvl_ar), NCCL follows NCCL_NVLS_ENABLE.
NO_MULTICAST = [("all", "NCCL_NVLS_ENABLE=0 (NCCL runs ring/tree over P2P instead of NVLink SHARP)"),
                ("torch", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (symmetric memory without a multicast object)"),
                ("vLLM", "VLLM_ALLREDUCE_USE_SYMM_MEM=0 (its symmetric-memory all-reduce is multimem); "
                         "--disable-custom-all-reduce is not needed for this"),
                ("SGLang", "leave --enable-nccl-nvls off (its default)"),
                ("TRT-LLM", "allreduce_strategy: NCCL (not MNNVL, nor AUTO, which may pick it)")]


def multicast(inp: Input) -> tuple[bool | None, str]:
    """Whether the input's CC mode keeps NVLink multicast, and what says so (None: nothing does)."""
    emu = inp.env.get("emulation") or {}
    value = (emu.get("params") or {}).get(NVLS_PARAM) if emu.get("active") else None
    name = emu.get("profile") if emu.get("active") else None
    if value is None and inp.kind == "account" and inp.result.settings.get("profile"):
        name = inp.result.settings["profile"]
        try:
            p = profiles.load(name).params.get(NVLS_PARAM)
        except CCBridgeError:
            p = None
        value = p.value if p else None
    if value is not None:
        return str(value).strip() not in ("0", "0.0"), f"profile {name}: {NVLS_PARAM} = {value}"
    mode = ((inp.env.get("nvml") or {}).get("cc") or {}).get("multi_gpu_mode")
    if mode in MULTICAST_BY_MODE and envmod.cc_mode(inp.env) == "on":
        return MULTICAST_BY_MODE[mode], f"NVML multi-GPU CC mode {mode}"
    return None, ""


def no_multicast(inp: Input, add: Add, because: str, *rows: Row) -> None:
    """The engine settings that avoid a multicast workspace, where the input's CC mode has none."""
    has, said = multicast(inp)
    if has is False:
        for stack, setting in NO_MULTICAST:
            add(stack, setting, f"{state(inp)}; {said}: no NVLink multicast (NVLS) in this CC mode; {because}",
                *rows, brief=f"{said.split(': ')[-1]}, no NVLS")
