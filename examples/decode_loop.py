"""A token-at-a-time serving loop, small enough to account in seconds: each step sends the last token ids from
host memory, runs a few layers and reads the sampled tokens back (a blocking copy), as a decode loop does.

    ccbridge account --profile b300 -- python3 examples/decode_loop.py

Building the weights and the warm-up steps run with the trace paused, so an account compares the steady steps
only. Its traces from one H200 ship in examples/traces/decode-h200 (accounting them needs no GPU).
"""
import argparse

import torch

from ccbridge.emulate import trace


def step(tokens: torch.Tensor, embed: torch.Tensor, layers: list[torch.Tensor]) -> torch.Tensor:
    """One decode step: the ids in from host memory, the layers, the next ids back (the step's one blocking read)."""
    h = embed[tokens.to(embed.device)]
    for w in layers:
        h = torch.nn.functional.silu(h @ w) + h
    return (h @ embed.T).argmax(-1).cpu()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=128, help="decode steps recorded (default 128)")
    p.add_argument("--warmup", type=int, default=8, help="steps before them, not recorded (default 8)")
    p.add_argument("--batch", type=int, default=8, help="sequences decoded at once (default 8)")
    p.add_argument("--width", type=int, default=2048, help="hidden size (default 2048)")
    p.add_argument("--layers", type=int, default=4, help="layers (default 4)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary (default 32000)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_loop: torch sees no CUDA GPU")
    tokens = torch.randint(0, a.vocab, (a.batch,), generator=torch.Generator().manual_seed(0))  # pageable
    with trace.paused(required=False):  # outside `ccbridge run --record` it does nothing
        gen = torch.Generator(device="cuda").manual_seed(0)
        embed = torch.randn(a.vocab, a.width, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
        layers = [torch.randn(a.width, a.width, device="cuda", dtype=torch.bfloat16, generator=gen) * a.width ** -0.5
                  for _ in range(a.layers)]
        for _ in range(a.warmup):
            tokens = step(tokens, embed, layers)
    for _ in range(a.steps):
        tokens = step(tokens, embed, layers)
    print(f"decoded {a.warmup} + {a.steps} steps x {a.batch} sequences; last tokens {tokens[:4].tolist()}")


if __name__ == "__main__":
    main()
