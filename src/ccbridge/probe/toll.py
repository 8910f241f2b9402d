"""Toll: the PyTorch idiom pin_memory().to(non_blocking=True) against copy_ into persistent tensors.

A fresh pinned allocation per step pays the allocation (and, under CC, the
bridge's staging setup) every time; a persistent staging tensor pays it once.
"""

from __future__ import annotations

import time

from ccbridge.probe.registry import test
from ccbridge.results import Row

SIZES = (4 << 10, 1 << 20, 16 << 20)


@test("toll.h2d_idioms", "fresh pin_memory().to() vs copy_ into a persistent tensor", needs=("gpu", "torch"))
def h2d_idioms(ctx):
    import torch  # deferred: torch, which the registry must not need to list the tests

    dev = torch.device("cuda", ctx.device)
    torch.cuda.set_device(dev)
    reps = ctx.pick(40, 15)
    rows = []
    for size in ctx.pick(SIZES, SIZES[:2]):
        src = torch.randint(0, 255, (size,), dtype=torch.uint8)
        pinned = src.pin_memory()
        dst = torch.empty(size, dtype=torch.uint8, device=dev)

        def fresh():
            return src.pin_memory().to(dev, non_blocking=True)

        def persistent_pinned():
            return dst.copy_(pinned, non_blocking=True)

        def persistent_pageable():
            return dst.copy_(src, non_blocking=True)

        for idiom, fn in (("fresh-pinned", fresh), ("persistent-pinned", persistent_pinned),
                          ("persistent-pageable", persistent_pageable)):
            ctx.step(f"{idiom} {size} B")
            out = fn()
            torch.cuda.synchronize()
            if not torch.equal(out.cpu(), src):
                raise RuntimeError(f"{idiom} copy is not byte-exact")
            samples = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                samples.append((time.perf_counter() - t0) * 1e6)
            row = Row.of("toll.h2d_idioms", "time", "us", samples, idiom=idiom, bytes=size)
            row.extra["headline"] = size == SIZES[0]
            rows.append(row)
    return rows
