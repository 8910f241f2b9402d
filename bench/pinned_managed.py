"""What pinned memory typed managed (CC drivers: TensorRT PR #4740, vLLM PRs #50671/#57404) does to frameworks.

Run natively and under an emulator profile (pinned_reports_managed=1 in b300/h200):
    python bench/pinned_managed.py > native.json
    ccbridge run --profile b300 -- python bench/pinned_managed.py > b300.json
Each case prints one JSON object per line, then a table on stderr:
- is_pinned: torch.empty(n, pin_memory=True).is_pinned();
- pin_memory_copies: t.pin_memory() on a pinned tensor makes a new tensor (a host copy and a pinned allocation);
- dataloader: DataLoader(pin_memory=True) batches: is_pinned, and ms per batch;
- non_blocking_ms: a 64 MiB pinned H2D .to(non_blocking=True): time the call held the thread;
- cupy: a cupyx pinned array's type, where CuPy is installed;
- engine_view: vLLM's pattern, a device view of a host tensor gated on is_pinned (get_accelerator_view_from_cpu_tensor):
  pinned -> the driver's mapping (live), else a one-time copy; the host then writes; does the GPU side see it?
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import torch

N = 1 << 20


def _cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    return lib


def engine_view():
    """A host tensor's accelerator view as an engine takes it (gated on is_pinned), written by the host after."""
    host = torch.arange(16, dtype=torch.int64).pin_memory()
    lib = _cuda()
    if host.is_pinned():  # the engine's branch: a live view through the driver's mapping of pinned memory
        ptr = ctypes.c_uint64()
        assert lib.cuMemHostGetDevicePointer_v2(ctypes.byref(ptr), host.data_ptr(), 0) == 0
        read = lambda: _read(lib, ptr.value, host.numel())  # noqa: E731
        how = "view"
    else:  # "not pinned": a one-time copy, detached from the host tensor
        copy = host.to("cuda")
        read = lambda: copy.cpu()  # noqa: E731
        how = "copy"
    host.fill_(7)  # the host writes after the view was taken
    torch.cuda.synchronize()
    return {"case": "engine_view", "taken_as": how, "sees_later_write": bool((read() == 7).all())}


def _read(lib, dptr: int, n: int) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.int64)
    assert lib.cuMemcpyDtoH_v2(out.data_ptr(), dptr, out.numel() * 8) == 0
    return out


def dataloader():
    data = torch.utils.data.TensorDataset(torch.randn(64, 1 << 14))
    dl = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True)
    t = time.perf_counter()
    pinned = [b[0].is_pinned() for b in dl]
    return {"case": "dataloader", "batches_pinned": sum(pinned), "batches": len(pinned),
            "ms_per_batch": (time.perf_counter() - t) * 1e3 / len(pinned)}


def main():
    out = []
    t = torch.empty(N, dtype=torch.uint8, pin_memory=True)
    out.append({"case": "is_pinned", "value": t.is_pinned()})
    p = t.pin_memory()
    out.append({"case": "pin_memory_copies", "value": p.data_ptr() != t.data_ptr()})
    out.append(dataloader())
    src = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device="cuda")
    dst.copy_(src)
    torch.cuda.synchronize()
    s = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    held = time.perf_counter() - s
    torch.cuda.synchronize()
    out.append({"case": "non_blocking_ms", "value": held * 1e3, "exact": bool(torch.equal(dst.cpu(), src))})
    try:
        import cupyx  # noqa: F401 - present on some machines only

        arr = cupyx.empty_pinned((N,), dtype="uint8")
        import cupy

        attrs = cupy.cuda.runtime.pointerGetAttributes(arr.ctypes.data)
        out.append({"case": "cupy", "type": int(attrs.type)})
    except ImportError:
        out.append({"case": "cupy", "skipped": "CuPy is not installed"})
    out.append(engine_view())
    for o in out:
        print(json.dumps(o))
    for o in out:
        print(f"{o['case']:<20} " + ", ".join(f"{k}={v}" for k, v in o.items() if k != "case"), file=sys.stderr)


if __name__ == "__main__":
    main()
