"""Compute parity: bf16 matmul, a chain of matmuls in one CUDA graph, device-memory copy.

Under CC these should not move: compute and HBM are inside the trusted
package. They are the control group for every crossing-taxed figure.
"""

from __future__ import annotations

from ccbridge.gputimer import device_copy_gbps, time_ms as gpu_time_ms
from ccbridge.probe.registry import test
from ccbridge.results import Row


@test("compute.parity", "bf16 matmul TFLOP/s, graph of chained matmuls, device copy GB/s", needs=("gpu", "torch"))
def parity(ctx):
    import torch  # deferred: torch, which the registry must not need to list the tests

    dev = torch.device("cuda", ctx.device)
    torch.cuda.set_device(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []

    ctx.step("bf16 matmul 8192^3")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    for _ in range(3):
        torch.mm(a, b)
    ms = gpu_time_ms(torch, lambda: torch.mm(a, b), reps=ctx.pick(10, 5), inner=5)
    row = Row.of("compute.parity", "matmul_bf16", "TFLOP/s", [2 * n**3 / (t * 1e-3) / 1e12 for t in ms], n=n)
    row.extra["headline"] = True
    rows.append(row)
    del a, b

    length, m = ctx.pick(1000, 300), 2048
    ctx.step(f"graph of {length} chained matmuls")
    w = torch.randn(m, m, device=dev, dtype=torch.bfloat16, generator=g) / m**0.5
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16, generator=g)
    stream = torch.cuda.Stream(device=dev)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            torch.mm(x, w)  # warm cuBLAS on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(length):
            y = torch.mm(y, w)
    graph.replay()
    torch.cuda.synchronize()
    if not torch.isfinite(y).all():
        raise RuntimeError("chained matmul produced non-finite values")
    row = Row.of("compute.parity", "graph_replay_time", "ms", gpu_time_ms(torch, graph.replay, reps=ctx.pick(10, 5)),
                 matmuls=length, n=m)
    row.extra["headline"] = True
    rows.append(row)
    del graph, x, w, y

    ctx.step("device-to-device copy 1 GiB")
    nbytes = 1 << 30
    row = Row.of("compute.parity", "device_copy", "GB/s",
                 device_copy_gbps(torch, dev, ctx.pick(10, 5), inner=3, nbytes=nbytes, generator=g), bytes=nbytes)
    row.extra["headline"] = True
    rows.append(row)
    return rows
