"""`ccbridge advise` for multi-GPU work: collectives, the tensor-parallel degree, and NVLink multicast.

Under GPU-CC every cross-GPU operation pays a per-operation toll set up by the
GPU's secure firmware, whatever its size (bridge law, section 6): tensor
parallelism pays it twice per layer per token, so a narrower split keeps more;
fewer, larger collectives dilute it (DDP buckets, a fused all-reduce); CUDA
graphs that capture the collectives drop their launch tolls, not theirs; and
where the CC mode has no NVLink multicast (NVLS: off on B300 in the NVLE mode),
engines that want a multicast workspace must be told to do without.
"""

from __future__ import annotations

from ccbridge import advise as _a
from ccbridge.errors import CCBridgeError
from ccbridge.results import Row
from ccbridge.ui import approx_bytes

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

DDP_DEFAULT_MB = 25  # torch DDP's bucket_cap_mb default
DDP_BUCKET_MB = 100  # where to start instead: 4x fewer all-reduces, each 4x larger


def multicast(inp: "_a.Input") -> tuple[bool | None, str]:
    """Whether the input's CC mode keeps NVLink multicast, and what says so (None: nothing does)."""
    emu = inp.env.get("emulation") or {}
    value = (emu.get("params") or {}).get(NVLS_PARAM) if emu.get("active") else None
    name = emu.get("profile") if emu.get("active") else None
    if value is None and inp.kind == "account" and inp.result.settings.get("profile"):
        from ccbridge.emulate import profiles

        name = inp.result.settings["profile"]
        try:
            p = profiles.load(name).params.get(NVLS_PARAM)
        except CCBridgeError:
            p = None
        value = p.value if p else None
    if value is not None:
        return str(value).strip() not in ("0", "0.0"), f"profile {name}: {NVLS_PARAM} = {value}"
    mode = ((inp.env.get("nvml") or {}).get("cc") or {}).get("multi_gpu_mode")
    if mode in MULTICAST_BY_MODE and _a._env.cc_mode(inp.env) == "on":
        return MULTICAST_BY_MODE[mode], f"NVML multi-GPU CC mode {mode}"
    return None, ""


def no_multicast(inp: "_a.Input", add, because: str, *rows: Row) -> None:
    """The engine settings that avoid a multicast workspace, where the input's CC mode has none."""
    has, said = multicast(inp)
    if has is False:
        for stack, setting in NO_MULTICAST:
            add(stack, setting, f"{_a._state(inp)}; {said}: no NVLink multicast (NVLS) in this CC mode; {because}",
                *rows, brief=f"{said.split(': ')[-1]}, no NVLS")


def from_collectives(inp: "_a.Input", add, shares: list[Row], total: Row | None) -> None:
    """Account rows of collectives (kind collective) that explain MIN_SHARE of the slowdown: fewer, larger
    collectives (DDP buckets, a fused all-reduce), graphs that capture them, a narrower TP degree."""
    res = inp.result
    for r in shares:
        p = r.params
        same = [x for x in res.by_test("account.api") if x.params == p]
        gpu = next((x for x in same if x.metric == "gpu_time"), None)
        size = next((x for x in same if x.metric == "payload_per_op"), None)
        calls = (r.extra.get("calls") or [0, 0])[-1]
        cites = [r] + [x for x in (size, gpu, total) if x]
        per_op = approx_bytes(size.median) if size else "?"
        why = (f"{_a._state(inp)}; {calls} {p['api']} of {per_op} each: {r.median:.0%} of the slowdown"
               + (f" ({total.median * 1e3:.1f} ms)" if total else "")
               + (f"; {gpu.median:.1f} ms of GPU time queued ahead of them" if gpu else "")
               + f"; {r.extra.get('recovery', '')}")
        brief = f"{calls} ops of {per_op}, {r.median:.0%}"
        if size and size.median > (1 << 20):  # bandwidth-bound: per-operation advice dilutes nothing
            add("DDP/torch", "overlap collectives with compute (DDP's default: keep gradient sync in backward)",
                why, *cites, brief=brief)
            add("vLLM/SGLang", "a narrower tensor-parallel degree moves fewer bytes per token (measure with "
                "`ccbridge bench decode` at each degree)", why, *cites, brief=brief)
            continue
        add("DDP", f"DistributedDataParallel(bucket_cap_mb={DDP_BUCKET_MB}): fewer, larger all-reduces than the default "
            f"{DDP_DEFAULT_MB} (sweep with `ccbridge bench ddp --buckets`)", why, *cites, brief=brief)
        add("torch", "fuse a step's small all-reduces into one flat buffer (one ncclAllReduce per step)", why,
            *cites, brief=brief)
        add("vLLM", "CUDA graphs on (no --enforce-eager): captured collectives drop their launch tolls, each "
            "still pays its own", why, *cites, brief=brief)
        add("SGLang", "CUDA graphs on (no --disable-cuda-graph) over the decode batches", why, *cites, brief=brief)
        add("vLLM/SGLang", "a narrower tensor-parallel degree: TP pays two all-reduces per layer per token "
            "(compare degrees with `ccbridge bench decode`)", why, *cites, brief=brief)
    if shares:
        no_multicast(inp, add, "the collectives above run on this fabric", *shares[:1])



def from_tp(inp: "_a.Input", add, tok: dict) -> int:
    """Several TP degrees in one decode result: the narrowest within MARGIN of the best tok/s at the largest
    batch all degrees measured (async where measured: the engines' default), which pays the per-operation
    toll on the fewest GPUs; returns it. tok: {(tp, batch, mode): Row}."""
    tps = sorted({t for t, _, _ in tok})
    batches = set.intersection(*({b for t2, b, _ in tok if t2 == t} for t in tps))
    b = max(batches) if batches else max(b for _, b, _ in tok)
    modes = set.intersection(*({m for t2, bb, m in tok if t2 == t and bb == b} for t in tps))
    mode = "async" if "async" in modes else (sorted(modes) or ["async"])[0]
    at = {t: tok[(t, b, mode)] for t in tps if (t, b, mode) in tok}
    if len(at) < 2:
        return max(tps)
    pick = _a._pick(at, sorted(at), _a._more)
    best = max(at, key=lambda t: at[t].median)
    why = (f"{_a._state(inp)}; batch {b}, {mode}: tok/s " + ", ".join(f"TP {t} {r.median:.0f}" for t, r in at.items())
           + "; every TP all-reduce pays the per-operation toll, twice per layer per token")
    brief = (f"TP {pick} {at[pick].median:.0f} tok/s" + ("" if pick == best else f" vs TP {best} {at[best].median:.0f}"))
    for stack, setting in (("vLLM", f"--tensor-parallel-size {pick}"), ("SGLang", f"--tp-size {pick}"),
                           ("TRT-LLM", f"tensor_parallel_size={pick}")):
        add(stack, setting, why, *at.values(), brief=brief)
    if max(tps) > 1:
        no_multicast(inp, add, f"TP up to {max(tps)} runs its all-reduces on this fabric", *at.values())
    return pick


def tp_kept(native: "_a.Input", cc: "_a.Input", add, tok: list[dict]) -> None:
    """A CC-off and a CC (or emulated) decode result with TP degrees: per degree, the share of native tok/s
    the CC run keeps at the largest batch both measured, async (narrower keeps more: bridge law 6)."""
    common = set(tok[0]) & set(tok[1])
    tps = sorted({t for t, _, _ in common if t is not None})
    if len(tps) < 2:
        return
    b = max(bb for _, bb, m in common if m == "async") if any(m == "async" for *_, m in common) else None
    if b is None:
        return
    kept = {t: (tok[1][(t, b, "async")], tok[0][(t, b, "async")]) for t in tps if (t, b, "async") in common}
    why = (f"{_a._state(cc)} vs {_a.Path(native.path).name}, batch {b}, async: kept "
           + ", ".join(f"TP {t} {c.median / n.median:.2f}" for t, (c, n) in kept.items()))
    for t, (c, n) in kept.items():
        add("all", f"TP {t}: keeps {c.median / n.median:.2f} of native tok/s", why, c, n,
            brief=f"{c.median:.0f} vs {n.median:.0f} tok/s")
