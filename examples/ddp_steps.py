"""A few data-parallel training steps, one process a GPU, small enough to account per rank in seconds:

    ccbridge account --profile b300 -- torchrun --nproc-per-node 2 examples/ddp_steps.py

Each rank reads a batch from host memory, runs a small MLP forward and backward, and DDP all-reduces the gradients
over NCCL. The steps after the warm-up are marked (ccbridge.window), so an account compares each rank over them
only. Its traces from two H200s ship in examples/traces/ddp-h200x2 (accounting them needs no GPU).
"""
import argparse
import os

import torch
import torch.distributed as dist

import ccbridge


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16, help="steps marked as the steady state (default 16)")
    p.add_argument("--warmup", type=int, default=3, help="steps before them (default 3)")
    p.add_argument("--batch", type=int, default=32, help="samples a rank a step (default 32)")
    p.add_argument("--width", type=int, default=2048, help="hidden size (default 2048)")
    a = p.parse_args()
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("ddp_steps: run it under torchrun (torchrun --nproc-per-node N examples/ddp_steps.py)")
    rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.device_count() <= rank:
        raise SystemExit(f"ddp_steps: rank {rank} needs GPU {rank}; torch sees {torch.cuda.device_count()} GPU(s)")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(a.width, 4 * a.width), torch.nn.GELU(),
                                torch.nn.Linear(4 * a.width, a.width)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)

    def train_step() -> torch.Tensor:
        x = torch.randn(a.batch, a.width, generator=gen)  # the batch, from pageable host memory
        loss = ddp(x.cuda()).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(a.warmup):
        train_step()
    with ccbridge.window():  # the steady state: `ccbridge account` compares each rank between these marks
        for _ in range(a.steps):
            loss = train_step()
        torch.cuda.synchronize()
    dist.all_reduce(loss)
    if dist.get_rank() == 0:
        print(f"{a.warmup} + {a.steps} steps on {dist.get_world_size()} ranks; mean loss "
              f"{loss.item() / dist.get_world_size():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
