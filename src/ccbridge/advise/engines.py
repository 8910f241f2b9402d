"""What a recovery or a decode scheduling mode means in the engines people run: the setting per stack."""

from __future__ import annotations


def stacks(recovery: str) -> list[tuple[str, str]]:
    """The per-stack settings an account row's recovery calls for."""
    r = recovery
    if "CUDA graphs" in r:
        return [("vLLM", "CUDA graphs on (no --enforce-eager)"), ("SGLang", "CUDA graphs on (no --disable-cuda-graph)"),
                ("TRT-LLM", "cuda_graph_config enabled"),
                ("torch", "torch.cuda.CUDAGraph / torch.compile(mode=\"reduce-overhead\")")]
    if "DrainWorker" in r:
        return [("vLLM", "--async-scheduling with readbacks on a ccbridge.serve.DrainWorker, else scheduling sync"),
                ("SGLang", "sampled tokens read back on a DrainWorker, else --disable-overlap-schedule"),
                ("TRT-LLM", "readbacks on a DrainWorker, else disable_overlap_scheduler=True"),
                ("torch", "ccbridge.serve.DrainWorker for readbacks and synchronizes")]
    if "small readbacks" in r:
        return [("vLLM/SGLang/TRT-LLM",
                 "one D2H per step for all sampled tokens and logprobs (gathered on the device)"),
                ("torch", "torch.cat a step's small results on the device, then one .to(\"cpu\") per step")]
    if "StagedH2D" in r:
        return [("vLLM/SGLang/TRT-LLM", "per-step metadata (positions, slot mappings, sampling params) through one "
                 "ccbridge.serve.StagedH2D"), ("torch", "ccbridge.serve.StagedH2D: packed inputs on an idle stream")]
    if "create contexts once" in r:
        return [("all", "create CUDA contexts once per process and keep them (no context per request or per worker "
                 "restart)")]
    if "pinned buffers once" in r:
        return [("torch", "allocate pinned host buffers once and reuse them (no fresh pin_memory() per step)"),
                ("vLLM", "keep swap / KV-offload space allocated at startup (its default), not per request")]
    if "contexts" in r:
        return [("loader", "ccbridge load --contexts N --workers N (a context pool)"),
                ("torch", "H2D from several processes or contexts")]
    if "fewer crossings" in r:
        return [("DDP", "larger buckets (bucket_cap_mb 100+; sweep with `ccbridge bench ddp --buckets`)"),
                ("torch", "batch copies: one large crossing instead of many")]
    return [("all", r)]


# What each decode scheduling mode means in the engines people run (bench decode's modes, ccbridge.serve.decode).
MODE_STACKS = {
    "sync": [("vLLM", "scheduling sync: leave --async-scheduling off"),
             ("SGLang", "--disable-overlap-schedule"), ("TRT-LLM", "disable_overlap_scheduler=True"),
             ("torch", "read step N's tokens before preparing step N+1")],
    "async": [("vLLM/SGLang/TRT-LLM", "async / overlap scheduling on (the engine default)"),
              ("torch", "launch step N+1 before reading step N")],
    "staged": [("vLLM/SGLang/TRT-LLM", "async scheduling, with per-step inputs (positions, slot mappings) through "
                "one ccbridge.serve.StagedH2D"),
               ("torch", "ccbridge.serve.StagedH2D: packed inputs on an idle stream")],
    "drain": stacks("DrainWorker") + [("torch", "per-step inputs through ccbridge.serve.StagedH2D as well")],
}
