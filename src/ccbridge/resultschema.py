"""The schemas of what results.py reads back: the env stamp (env.stamp(), `ccbridge env --json`) and a result
of each kind, with that kind's settings and rows.

Each field a reader uses is typed, so a malformed file is refused at read with its field path instead of
failing later in a report. Objects stay open to fields a newer ccbridge adds, except a result's top level
and the settings of each kind: one shape per kind.
"""

from __future__ import annotations

from ccbridge.choices import DECODE_MODES
from ccbridge.schema import (BOOL, COUNT, INTEGER, NUMBER, POSITIVE, SCALAR, STRING, Schema, array, mapping,
                             nullable, record)

STRINGS = array(STRING)
MAYBE_STRING = nullable(STRING)
MAYBE_COUNT = nullable(COUNT)

# ---- the env stamp ----

_GPU = record({
    "index": COUNT, "name": MAYBE_STRING, "uuid": MAYBE_STRING, "memory_gib": nullable(NUMBER),
    **{k: MAYBE_COUNT for k in ("pcie_gen_max", "pcie_width_max", "pcie_gen", "pcie_width")},
    "fabric": record({"state": STRING, "status": STRING, "error": STRING, "cluster_uuid": STRING,
                      "clique_id": INTEGER, "health_mask": INTEGER, "health": mapping(SCALAR),
                      "health_summary": STRING, "health_error": STRING}),
    "nvlink": record({"links": COUNT, "active": COUNT, "error": STRING}),
    "peers": record({"nvlink": array(COUNT), "errors": STRINGS}),
}, required=("index",))

_CLIQUE = record({"cluster_uuid": STRING, "clique_id": INTEGER, "gpus": array(INTEGER)},
                 required=("cluster_uuid", "clique_id", "gpus"))

_CC = record({
    "mode": {"enum": ["on", "off", "unknown"]},
    "state": record({"environment": STRING, "cc_feature": STRING, "devtools_mode": STRING},
                    required=("environment", "cc_feature", "devtools_mode")),
    "multi_gpu_mode": STRING, "gpus_ready": BOOL, "capabilities": record({"cpu": STRING, "gpus": STRING}),
    **{k: STRING for k in ("state_error", "settings_error", "gpus_ready_error", "capabilities_error")},
})

_EMULATION = {
    **record({"active": BOOL, "profile": MAYBE_STRING, "params": mapping(STRING), "params_error": STRING,
              "overrides": mapping(record({"value": NUMBER, "was": NUMBER}, required=("value", "was"))),
              "interposer_loaded": nullable(BOOL),
              "no_driver": STRING,  # why a profile that emulates emulated nothing (no CUDA driver here)
              # `ccbridge run --project`: the target GPU and the time dilation (emulate/targets.py)
              "projection": record({"target": STRING, "local": MAYBE_STRING, "by": STRING, "r": NUMBER,
                                    "hbm_ratio": nullable(NUMBER), "flops_ratio": nullable(NUMBER)},
                                   required=("target", "r"))}),
    # an emulated run names its profile
    "if": record({"active": {"const": True}}, required=("active",)),
    "then": record({"profile": STRING}, required=("profile",)),
}

_PLUGIN = record({k: BOOL for k in ("built", "selected", "on_library_path", "will_load", "required")} | {
    "path": STRING, "lane_mode": STRING, "lanes": POSITIVE, "spin_us": COUNT,
    # where NCCL_NET_PLUGIN and NCCL_NET were set ("environment", or one of NCCL's settings files), and those files
    "nccl_settings": mapping(record({"value": STRING, "from": STRING}, required=("value", "from"))),
    "conf_files": STRINGS})

STAMP = record({
    "ccbridge": STRING, "host": STRING, "os": STRING, "python": STRING,
    "cpu": record({"model": MAYBE_STRING, "cores": MAYBE_COUNT, "flags": mapping(BOOL), "hypervisor": BOOL,
                   "error": STRING}),
    "tee": record({"kind": STRING, "evidence": STRINGS}),
    "openssl": record({"version": MAYBE_STRING, "ia32cap": MAYBE_STRING, "error": STRING}),
    "nvml": record({
        "available": BOOL, "error": STRING, "driver": MAYBE_STRING, "cuda_driver": MAYBE_STRING,
        "gpus": array(_GPU), "device_count_error": STRING, "cc": _CC,
        "fabric": record({"error": STRING, "cliques": array(_CLIQUE), "gpus_per_clique": array(COUNT),
                          "gpus": COUNT}),
    }),
    "torch": record({"available": BOOL, "version": STRING, "cuda": MAYBE_STRING, "cuda_available": BOOL,
                     "devices": STRINGS, "error": STRING}),
    "emulation": _EMULATION,
    "nccl_net_plugin": nullable(_PLUGIN),
})

# ---- results: one shape of settings and rows per kind ----

_DECODE_SETTINGS = {
    "model": STRING, "device": STRING, "checkpoint": MAYBE_STRING, "dtype": STRING, "prompt": POSITIVE,
    "output": POSITIVE, "batches": array(POSITIVE), "modes": array({"enum": list(DECODE_MODES)}),
    "iters": POSITIVE, "warmup": COUNT, "graphs": BOOL, "seed": COUNT, "transformers": STRING, "drain_lag": COUNT,
    "host_prep_us": NUMBER, "cudnn_attention": BOOL, "timer": MAYBE_STRING,
}
_KV_SETTINGS = {
    **{k: STRING for k in ("model", "device", "dtype", "transformers")},
    **{k: POSITIVE for k in ("prefixes", "prefix_len", "suffix_len", "requests", "block_tokens", "block_bytes",
                             "device_blocks", "host_blocks", "iters", "cpu_threads")},
    **{k: COUNT for k in ("churn", "warmup", "seed", "checked")},
    **{k: NUMBER for k in ("zipf", "host_fraction", "gpu_fraction")},
    "thresholds": array(POSITIVE), "modes": array({"enum": ["sync", "async"]}), "cudnn_attention": BOOL,
}


def _nested(kind: str, fields: dict) -> dict:
    """bench decode [--tp] and bench kv keep their settings under their kind's name."""
    return record({kind: record(fields)}, required=(kind,), closed=True)


SETTINGS = {
    "probe": record({"device": COUNT, "quick": BOOL, "tests": STRINGS, "missing": mapping(STRING),
                     "timer": MAYBE_STRING, "seconds": mapping(NUMBER),
                     "steps": mapping(array(record({"step": STRING, "s": NUMBER}, required=("step", "s"))))},
                    closed=True),
    "decode": _nested("decode", _DECODE_SETTINGS),
    "decode_tp": _nested("decode_tp", {**_DECODE_SETTINGS, "degrees": array(POSITIVE), "backend": STRING,
                                       "all_reduces_per_step": COUNT, "replicated": STRING, "reference": STRING,
                                       "engine": STRING, "fused_gemv": STRING, "logits_tolerance": NUMBER,
                                       "gemv_tiles": mapping(mapping(array(POSITIVE)))}),
    "kv": _nested("kv", _KV_SETTINGS),
    "account": record({"base": STRING, "other": STRING, "profile": MAYBE_STRING, "overrides": nullable(STRINGS),
                       "command": nullable(STRINGS), "ranks": array(INTEGER),
                       "projection": nullable({"type": "object"}), "runs": array(STRINGS),
                       # traces given: where each was recorded, BASE first (emulate/recorded.py entry(); machine
                       # None: no stamp beside it)
                       "recorded": array(record({"trace": STRING, "machine": MAYBE_STRING, "cc": MAYBE_STRING,
                                                 "driver": MAYBE_STRING},
                                                required=("trace", "machine", "cc", "driver"), closed=True))},
                      closed=True),
    "net": record({"bench": {"const": "net"}, "inflight": POSITIVE, "total_bytes": POSITIVE, "repeat": POSITIVE,
                   "spin_us": MAYBE_STRING, "pipeline": MAYBE_STRING, "turns": MAYBE_STRING, "lane_mode": STRING,
                   "interface": STRING, "link_gbits": NUMBER},
                  closed=True),
    "ddp": record({"models": STRINGS, "ngpus": array(POSITIVE), "buckets": array(POSITIVE), "iters": POSITIVE,
                   "warmup": COUNT, "backend": STRING, "net": MAYBE_STRING, "wrap": {"enum": ["ddp", "fsdp"]}},
                  closed=True),
    "cipher": record({"device": STRING, "iters": POSITIVE}, closed=True),
    "collectives": record({"op": STRING, "nranks": POSITIVE, "backend": STRING, "transport": STRING,
                           "encrypted": STRING, "nets": {"type": ["object", "array"]}, "env": mapping(STRING),
                           "dtype": STRING, "minbytes": POSITIVE, "maxbytes": POSITIVE, "stepfactor": POSITIVE,
                           "iters": POSITIVE, "warmup": COUNT, "net": MAYBE_STRING}, closed=True),
}

# ccbridge load --bench (load/benchresult.py): the checkpoint, the pools, the check, and the bound's inputs
_POOL = {"workers": POSITIVE, "contexts": COUNT, "staging": STRING, "chunk_bytes": POSITIVE, "buffers": POSITIVE,
         "device": INTEGER}
_POOL_NEEDS = ("workers", "contexts", "staging", "chunk_bytes")
SETTINGS["load"] = record({
    "device": STRING, "gpu": STRING, "files": POSITIVE, "bytes": POSITIVE, "repeat": POSITIVE,
    "page_cache_read_gbps": nullable(NUMBER), "why": STRING, "verified": MAYBE_STRING, "emulation": MAYBE_STRING,
    "ceiling_gbps": nullable(NUMBER), "error": STRING,
    "pool": record({**_POOL, "prewarm_s": NUMBER, "teardown_s": nullable(NUMBER)}, required=_POOL_NEEDS),
    "cold_pool": nullable(record({**_POOL, "why": STRING}, required=(*_POOL_NEEDS, "why"))),
    "bound": record({**{k: POSITIVE for k in ("readers", "buffers", "streams", "issuers", "chunk_bytes", "bytes",
                                              "copy_bytes", "chunks", "repeat")},
                     "contexts": COUNT, "staging": STRING, "overlap_warning": MAYBE_STRING},
                    required=("readers", "streams", "contexts", "issuers", "chunk_bytes", "staging"), closed=True),
}, required=("device", "gpu", "files", "bytes", "repeat", "pool", "why", "verified"), closed=True)


def _serving(test: str, by: str, modes, metric: str, tp: bool = False) -> dict:
    """bench decode/kv rows: a positive integer batch or threshold, a known mode (and a TP degree), a positive
    median for the headline metric."""
    params = record({by: POSITIVE, "mode": {"enum": list(modes)}, **({"tp": POSITIVE} if tp else {})},
                    required=(by, "mode", *(("tp",) if tp else ())))
    return {"properties": {"test": {"const": test}, "params": params},
            "if": record({"metric": {"const": metric}}, required=("metric",)),
            "then": record({"median": {"exclusiveMinimum": 0, "message": "must be positive"}})}


_ROW_TESTS = {
    "probe": {"properties": {"test": {"pattern": r"^[a-z0-9_]+\.[a-z0-9_]+$"}}},
    "decode": _serving("decode", "batch", DECODE_MODES, "tok_per_s"),
    "decode_tp": _serving("decode_tp", "batch", DECODE_MODES, "tok_per_s", tp=True),
    "kv": _serving("kv", "threshold", ("sync", "async"), "ttft_ms"),
    "account": {"properties": {"test": {"pattern": r"^account\."}}},
    "net": {"properties": {"test": {"const": "net_loopback"}}},
    "ddp": {"properties": {"test": {"const": "ddp"}}},
    "cipher": {"properties": {"test": {"const": "cipher"}}},
    "collectives": {"properties": {"test": {"const": "collectives"}}},
    # a loader's row names it; a bound's figure has no parameters
    "load": {"properties": {"test": {"enum": ["load", "load_bound"]}, "unit": {"const": "GB/s"}},
             "if": record({"test": {"const": "load"}}, required=("test",)),
             "then": record({"params": record({"loader": STRING}, required=("loader",), closed=True),
                             "extra": record({"gbps": NUMBER, "seconds": array(NUMBER)},
                                             required=("gbps", "seconds"))}),
             "else": record({"extra": record({"best": NUMBER, "repeats": array(NUMBER)},
                                             required=("best", "repeats"))})},
}

_ROW = record({
    "test": STRING, "metric": STRING, "unit": STRING, "params": mapping(SCALAR),
    **{k: NUMBER for k in ("median", "p10", "p90", "min", "max")}, "n": POSITIVE, "extra": {"type": "object"},
}, required=("test", "metric", "unit", "params", "median", "p10", "p90", "min", "max", "n"))


def _result(kind: str) -> dict:
    return record({
        "schema": {"const": "ccbridge.result"}, "version": INTEGER, "kind": {"const": kind},
        "created": STRING, "duration_s": NUMBER, "env": STAMP, "settings": SETTINGS[kind],
        "rows": array({"allOf": [_ROW, _ROW_TESTS[kind]]}),
        "skipped": array(record({"test": STRING, "reason": STRING}, required=("test", "reason"))),
        "errors": array(record({"test": STRING, "error": STRING, "traceback": STRING}, required=("test", "error"))),
    }, required=("schema", "version", "kind", "env", "settings"), closed=True)


RESULTS = {kind: Schema(_result(kind)) for kind in SETTINGS}
STAMP_SCHEMA = Schema(STAMP)
