"""The GPU AES-256-GCM kernels against OpenSSL, and the encrypted collectives
on 2+ GPUs (NCCL, NCCL on sockets, Gloo with GPU tensors)."""

import os
import random

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from ccbridge.secure import gcm  # noqa: E402
from ccbridge.secure.gcm import Ident  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU (runs through scripts/device-check)")]

from gcm_vectors import VECTORS, tampered  # noqa: E402


def _u8(b: bytes):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).cuda() if b else torch.empty(0, dtype=torch.uint8, device="cuda")


def _bytes(t) -> bytes:
    return t.cpu().numpy().tobytes()


@pytest.fixture(scope="module")
def rnd():
    return random.Random(11)


def test_kernels_match_openssl_on_random_lengths(rnd):
    sizes = [0, 1, 15, 16, 17, 4095, 4096, 4097, 65537, 1 << 20, 3 * (1 << 20) + 5] + [rnd.randrange(1, 1 << 22) for _ in range(8)]
    for n in sizes:
        k, p, ident = os.urandom(32), os.urandom(n), Ident(os.urandom(8), os.urandom(32))
        c = gcm.GpuCipher(k, "cuda")
        wire = torch.full((gcm.wire_len(n),), 0xAA, dtype=torch.uint8, device="cuda")  # stale bytes must not go out
        c.encrypt(ident, _u8(p), wire)
        assert _bytes(wire) == bytes(gcm.cpu_encrypt(k, ident, p)), f"encrypt of {n} bytes differs from OpenSSL"
        out, fail = torch.full((n,), 0xAA, dtype=torch.uint8, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
        c.decrypt(ident, wire, out, fail)
        assert int(fail) == 0 and _bytes(out) == p


def test_kernels_past_2_16_blocks_in_a_chunk():
    """Each thread's counter cache is remade where the block counter's high half changes (> 1 MiB chunks)."""
    n, chunk = (1 << 20) + 4096 + 7, 2 << 20
    k, p, ident = os.urandom(32), os.urandom(n), Ident(os.urandom(8), os.urandom(32))
    c = gcm.GpuCipher(k, "cuda")
    wire = torch.empty(gcm.wire_len(n, chunk), dtype=torch.uint8, device="cuda")
    c.encrypt(ident, _u8(p), wire, chunk)
    assert _bytes(wire) == bytes(gcm.cpu_encrypt(k, ident, p, chunk))
    out, fail = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
    c.decrypt(ident, wire, out, fail, chunk)
    assert int(fail) == 0 and _bytes(out) == p


def test_kernels_on_unaligned_buffers():
    """Segments of a tensor can start at any multiple of the element size."""
    n = 3 * 4096 + 24
    k, p, ident = os.urandom(32), os.urandom(n), Ident(os.urandom(8), os.urandom(32))
    c = gcm.GpuCipher(k, "cuda")
    big = torch.zeros(n + 64, dtype=torch.uint8, device="cuda")
    plain = big[8:8 + n]
    plain.copy_(_u8(p))
    wbig = torch.zeros(gcm.wire_len(n) + 64, dtype=torch.uint8, device="cuda")
    wire = wbig[4:4 + gcm.wire_len(n)]
    c.encrypt(ident, plain, wire)
    assert _bytes(wire) == bytes(gcm.cpu_encrypt(k, ident, p))
    out, fail = big[24:24 + n], torch.zeros(1, dtype=torch.int32, device="cuda")
    c.decrypt(ident, wire, out, fail)
    assert int(fail) == 0 and _bytes(out) == p


@pytest.mark.parametrize("k,iv,p,a,c,t", VECTORS)
def test_kernels_on_gcm_spec_vectors(k, iv, p, a, c, t):
    k, iv, p, a, c, t = map(bytes.fromhex, (k, iv, p, a, c, t))
    g = gcm.GpuCipher(k, "cuda")
    out, tag = torch.empty(len(p), dtype=torch.uint8, device="cuda"), torch.empty(16, dtype=torch.uint8, device="cuda")
    g.raw(iv, a, _u8(p), out, tag)
    assert (_bytes(out), _bytes(tag)) == (c, t)
    fail = torch.zeros(1, dtype=torch.int32, device="cuda")
    g.raw(iv, a, _u8(c), out, _u8(t), fail)
    assert int(fail) == 0 and _bytes(out) == p
    g.raw(iv, a, _u8(c), out, _u8(bytes([t[0] ^ 1]) + t[1:]), fail)
    assert int(fail) == 1 and _bytes(out) == bytes(len(p))


def test_kernel_raw_random_matches_openssl(rnd):
    from ccbridge import libcrypto

    for _ in range(10):
        n, al = rnd.randrange(0, 100000), rnd.randrange(0, 100)
        k, iv, p, a = os.urandom(32), os.urandom(12), os.urandom(n), os.urandom(al)
        g = gcm.GpuCipher(k, "cuda")
        out, tag = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(16, dtype=torch.uint8, device="cuda")
        g.raw(iv, a, _u8(p), out, tag)
        assert (_bytes(out), _bytes(tag)) == libcrypto.encrypt(k, iv, p, a)


def test_kernel_tamper_reorder_replay_wrong_key():
    n = 3 * 4096 + 100
    k, p, ident = os.urandom(32), os.urandom(n), Ident(os.urandom(8), os.urandom(32))
    g = gcm.GpuCipher(k, "cuda")
    wire = gcm.cpu_encrypt(k, ident, p)
    fail = torch.zeros(1, dtype=torch.int32, device="cuda")
    cases = tampered(bytes(wire), n, gcm.chunk_for(n))
    for name, w in cases.items():
        out = torch.full((n,), 0xAA, dtype=torch.uint8, device="cuda")
        fail.zero_()
        g.decrypt(ident, _u8(w), out, fail)
        assert int(fail) > 0, name
        assert bytes(p) not in _bytes(out) and _bytes(out).count(0) >= 4096, f"{name}: failed chunk not zeroed"
    for who, (cipher, idt) in {"wrong key": (gcm.GpuCipher(os.urandom(32), "cuda"), ident),
                               "replayed under another identity": (g, Ident(ident.prefix, os.urandom(32)))}.items():
        out = torch.empty(n, dtype=torch.uint8, device="cuda")
        fail.zero_()
        cipher.decrypt(idt, _u8(bytes(wire)), out, fail)
        assert int(fail) == gcm.nchunks(n, gcm.chunk_for(n)) and _bytes(out) == bytes(n), who
    with pytest.raises(gcm.IntegrityError):  # truncated: the length check refuses before any kernel
        g.decrypt(ident, _u8(bytes(wire[:-16])), torch.empty(n, dtype=torch.uint8, device="cuda"), fail)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8"])
def test_fused_reduce_hop_matches_openssl_composition(dtype):
    td = getattr(torch, dtype)
    k = os.urandom(32)
    g = gcm.GpuCipher(k, "cuda")
    for numel in [1, 9, 5000, 300001]:
        gen = torch.Generator().manual_seed(numel)
        a = (torch.randn(numel, generator=gen) * 8).to(td) if td.is_floating_point else torch.randint(0, 100, (numel,), generator=gen).to(td)
        b = (torch.randn(numel, generator=gen) * 8).to(td) if td.is_floating_point else torch.randint(0, 100, (numel,), generator=gen).to(td)
        ab, bb = a.view(torch.uint8), b.view(torch.uint8)
        n = ab.numel()
        i_in, i_out = Ident(os.urandom(8), os.urandom(32)), Ident(os.urandom(8), os.urandom(32))
        win = _u8(bytes(gcm.cpu_encrypt(k, i_in, ab.numpy().tobytes())))
        plain = torch.empty(n, dtype=torch.uint8, device="cuda")
        wout = torch.full((gcm.wire_len(n),), 0xAA, dtype=torch.uint8, device="cuda")  # stale bytes must not go out
        fail = torch.zeros(1, dtype=torch.int32, device="cuda")
        g.reduce(dtype, i_in, win, bb.cuda(), fail, plain=plain, ident_out=i_out, wire_out=wout)
        assert int(fail) == 0
        want = (a.cuda() + b.cuda()).view(torch.uint8)  # torch's own add on the GPU: the same rounding
        assert torch.equal(plain, want), f"{dtype} x{numel}: sum differs"
        assert _bytes(wout) == bytes(gcm.cpu_encrypt(k, i_out, _bytes(want))), f"{dtype} x{numel}: re-encryption differs from OpenSSL"


def test_fused_reduce_poisons_what_it_forwards():
    k, n = os.urandom(32), 4096 * 3
    g = gcm.GpuCipher(k, "cuda")
    i_in, i_out = Ident(os.urandom(8), os.urandom(32)), Ident(os.urandom(8), os.urandom(32))
    w = bytearray(gcm.cpu_encrypt(k, i_in, os.urandom(n)))
    w[5000] ^= 1  # chunk 1 of the incoming message
    plain = torch.empty(n, dtype=torch.uint8, device="cuda")
    wout = torch.empty(gcm.wire_len(n), dtype=torch.uint8, device="cuda")
    fail = torch.zeros(1, dtype=torch.int32, device="cuda")
    g.reduce("uint8", i_in, _u8(bytes(w)), torch.ones(n, dtype=torch.uint8, device="cuda"), fail, plain=plain,
             ident_out=i_out, wire_out=wout)
    assert int(fail) == 1 and _bytes(plain)[4096:8192] == bytes(4096)
    assert gcm.cpu_decrypt_chunks(k, i_out, _bytes(wout), bytearray(n)) == [1]


def test_missing_gpu_kernels_say_so(monkeypatch, tmp_path):
    monkeypatch.setattr(gcm, "fatbin_path", lambda: tmp_path / "_gcm.fatbin")
    gcm._image.cache_clear()
    try:
        with pytest.raises(gcm.GpuError, match="not built"):
            gcm.GpuCipher(os.urandom(32), "cuda")
    finally:
        gcm._image.cache_clear()


# ---- several GPUs ----

NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
multi = pytest.mark.skipif(NGPU < 2, reason=f"needs 2 or more GPUs, this machine has {NGPU}")


@multi
@pytest.mark.parametrize("n", sorted({2, NGPU}))
def test_nccl_collectives_match_plaintext_and_fail_together(n):
    import secure_workers

    secure_workers.spawn(n, "nccl", "cuda", ["correctness", "integrity", "sessions", "transport", "rotation", "ddp"])


@multi
@pytest.mark.parametrize("attack", ["drop", "duplicate", "truncate", "reorder", "dead_rank"])
def test_nccl_every_rank_detects_wire_attacks_within_a_deadline(attack, tmp_path):
    import secure_workers

    secure_workers.run_attack(2, "nccl", "cuda", attack, tmp_path, timeout_s=10.0)


@multi
def test_nccl_on_sockets():
    import secure_workers

    secure_workers.spawn(NGPU, "nccl", "cuda", ["correctness", "integrity"],
                         env={"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket"})


@multi
def test_gloo_with_gpu_tensors():
    import secure_workers

    secure_workers.spawn(NGPU, "gloo", "cuda", ["correctness", "integrity"])
