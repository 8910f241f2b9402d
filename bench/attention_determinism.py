"""Does a bf16 decode give the same tokens run to run, per attention backend? (why the decode and kv
benches run with cuDNN's attention off)

    python3 bench/attention_determinism.py

For each backend set (PyTorch's default, which may pick cuDNN; flash + memory-efficient + math; math
only), in a process of its own: llama-1b with seeded random weights, three greedy sync decodes of 64
tokens after a 128-token prompt at batch 8 and 32 (eager) and 8 (CUDA graphs); whether the runs agree bit
for bit, how many sequences parted at near ties of the reference's logits (bench decode's judge), and the
GPU memory allocated before and after judging. One JSON line per backend set. Needs a CUDA GPU.
"""

import json
import os
import subprocess
import sys

BACKENDS = {"default": "", "no_cudnn": "FLASH_ATTENTION,EFFICIENT_ATTENTION,MATH", "math": "MATH"}


def child(backends: str) -> dict:
    import contextlib

    import torch

    from ccbridge.serve import decode, judge as judging

    def ctx():
        if not backends:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, n) for n in backends.split(",")])

    gib = lambda: round(torch.cuda.memory_allocated() / 2**30, 3)  # noqa: E731
    out = {}
    m = decode.build("llama-1b", torch.device("cuda"), 0)
    for b, graphs in ((8, False), (32, False), (8, True)):
        ids = decode.prompts(decode.PRESETS["llama-1b"]["vocab_size"], b, 128, 0)
        with ctx(), torch.no_grad():
            runs = [decode.decode(m, ids, 64, "sync", graphs=graphs).tokens for _ in range(3)]
            before, judge = gib(), judging.Judge(m, ids)
            verdicts = [judge(runs[0], r) for r in runs[1:]]
            out[f"batch {b}{' graphs' if graphs else ''}"] = {
                "runs_equal": [bool(torch.equal(runs[0], r)) for r in runs[1:]],
                "wrong": [w for w, _ in verdicts], "near_ties": [len(t) for _, t in verdicts],
                "gib_before_judge": before, "gib_after_judge": gib()}
    return out


def main() -> None:
    for name, backends in BACKENDS.items():
        p = subprocess.run([sys.executable, __file__, "--child", backends], capture_output=True, text=True,
                           env=dict(os.environ))
        got = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-600:]}
        print(json.dumps({"backends": name, **got}), flush=True)


if __name__ == "__main__":
    if "--child" in sys.argv:
        print(json.dumps(child(sys.argv[sys.argv.index("--child") + 1] if len(sys.argv) > 2 else "")))
    else:
        main()
