"""Checkpoints for the loader tests, written by safetensors itself (the reference).

Every dtype torch and safetensors share, random bytes (bools 0/1), a 0-dim
and an empty tensor, odd byte counts, one tensor larger than the chunk size
the tests use, split over two shards with a Hugging Face index.
"""

import json
from pathlib import Path

TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
                "bfloat16", "float32", "float64", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]


def random_tensor(torch, g, dtype, shape):
    n = 1
    for d in shape:
        n *= d
    size = n * torch.empty((), dtype=dtype).element_size()
    if dtype == torch.bool:
        raw = torch.randint(0, 2, (size,), dtype=torch.uint8, generator=g)
    else:
        raw = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def tensors(torch, seed=0, big_elems=300_000):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, name in enumerate(TORCH_DTYPES):
        dt = getattr(torch, name)
        out[f"t.{name}.matrix"] = random_tensor(torch, g, dt, [3 + i % 4, 5])
        if name != "float4_e2m1fn_x2":  # a 0-dim F4 would be half a byte: not representable
            out[f"t.{name}.scalar"] = random_tensor(torch, g, dt, [])
        out[f"t.{name}.empty"] = random_tensor(torch, g, dt, [0, 4])
    out["t.odd_bytes"] = random_tensor(torch, g, torch.uint8, [4097])
    out["t.big"] = random_tensor(torch, g, torch.float32, [big_elems])
    return out


def write(torch, d: Path, seed=0, shards=2, big_elems=300_000) -> dict:
    """Write the tensors over `shards` files plus an index; return them (the expected values)."""
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    ts = tensors(torch, seed, big_elems)
    names = list(ts)
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {}
    for i, f in enumerate(files):
        part = {n: ts[n] for n in names[i::shards]}
        save_file(part, str(d / f))
        weight_map.update({n: f for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return ts


def same_bytes(torch, a, b) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.reshape(-1).view(torch.uint8).cpu(), b.reshape(-1).view(torch.uint8).cpu())


def assert_truncation_mid_load_raises(torch, d: Path, cut: int, big_elems: int, device: str, **opts) -> None:
    """Write a one-shard checkpoint, start loading it, cut `cut` bytes off its end
    after the headers were accepted: LoadError, and the call's pool is torn down."""
    import os

    import pytest

    from ccbridge.load import LoadError, LoadStats, iter_safetensors

    write(torch, d, seed=5, shards=1, big_elems=big_elems)
    f = next(d.glob("*.safetensors"))
    st = LoadStats()
    it = iter_safetensors(d, device=device, stats=st, **opts)
    next(it)  # the empty tensors come first, before any read: the headers were valid
    os.truncate(f, f.stat().st_size - cut)
    with pytest.raises(LoadError, match="file ended"):
        for _ in it:
            pass
    assert st.join_teardown() is not None


def publish_rig(tmp_path, device: int, n: int = 6, size: int = 64 << 10, **pool_opts):
    """A file of n random ranges of `size` bytes, one per chunk, and a pool for them; (pool, file, bytes)."""
    import os

    from ccbridge.load.engine import Pool, PoolConfig

    data = os.urandom(n * size)
    f = tmp_path / "blob"
    f.write_bytes(data)
    cfg = dict(device=device, workers=3, contexts=0, staging="pinned", chunk_bytes=size, buffers=2) | pool_opts
    return Pool(PoolConfig(**cfg)), f, data


def run_published_in_steps(torch, pool, f, data, dests, size: int, mapped: int = 0) -> None:
    """Submit with no destination published: nothing lands; publish two, then the rest: exactly those land."""
    import ctypes
    import os

    from ccbridge.load.engine import File, Item

    n = len(dests)
    fd = os.open(f, os.O_RDONLY)
    try:
        files = (File * 1)(File(fd, 0, mapped))
        items = (Item * n)(*[Item(dests[i].data_ptr(), i * size, size, 0, i) for i in range(n)])
        remaining, doneq, out = (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)()
        pool.ready()
        load = pool.submit(files, items, remaining, doneq, ready=0)
        assert pool.next(out, 0.3) == 0  # read ahead, but no copy before its destination is published
        assert all(int(d.count_nonzero()) == 0 for d in dests)
        pool.publish(load, 2)
        done = set()
        while len(done) < 2:
            k = pool.next(out, 5.0)
            assert k > 0, pool.error()
            done.update(out[:k])
        assert done == {0, 1} and pool.next(out, 0.2) == 0
        assert all(int(d.count_nonzero()) == 0 for d in dests[2:])
        pool.publish(load, n + 5)  # past the end: clamped
        while (k := pool.next(out, 5.0)) != -2:
            assert k > 0, pool.error()
            done.update(out[:k])
        assert done == set(range(n))
        got = b"".join(d.cpu().numpy().tobytes() for d in dests)
        assert got == data
    finally:
        os.close(fd)

