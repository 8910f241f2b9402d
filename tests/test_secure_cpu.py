"""The chunked AES-256-GCM format, the kernels' arithmetic (run on the host),
keys and nonces, and the encrypted collectives on Gloo with CPU ranks."""

import os
import random

import pytest

from ccbridge.secure import gcm, keys
from ccbridge.secure.gcm import Ident, IntegrityError
from gcm_vectors import VECTORS, tampered

AESGCM = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead", reason="test extra 'cryptography' not installed").AESGCM


def _ident():
    return Ident(os.urandom(8), os.urandom(32))


SIZES = [0, 1, 15, 16, 17, 4095, 4096, 4097, 65536 + 5, 300_001]


@pytest.mark.parametrize("n", SIZES)
def test_kernel_model_matches_openssl_and_cryptography(n):
    rng = random.Random(n)
    for chunk in (None, 4096, 16, rng.choice([32, 4112, 65536])):
        k, p, ident = os.urandom(32), os.urandom(n), _ident()
        wire = gcm.model_encrypt(k, ident, p, chunk)
        assert wire == bytes(gcm.cpu_encrypt(k, ident, p, chunk))
        ch = chunk or gcm.chunk_for(n)
        toff = gcm.tags_offset(n)
        for c in range(gcm.nchunks(n, ch)):  # every chunk is ordinary AES-GCM
            a, b = c * ch, min(n, (c + 1) * ch)
            ref = AESGCM(k).encrypt(gcm.chunk_nonce(ident, c), p[a:b], gcm.chunk_aad(ident, n, c, ch))
            assert wire[a:b] + wire[toff + 16 * c: toff + 16 * (c + 1)] == ref
        assert gcm.model_decrypt(k, ident, wire, n, chunk) == p


@pytest.mark.parametrize("k,iv,p,a,c,t", VECTORS)
def test_kernel_model_on_gcm_spec_vectors(k, iv, p, a, c, t):
    k, iv, p, a, c, t = map(bytes.fromhex, (k, iv, p, a, c, t))
    assert gcm.model_raw(k, iv, a, p) == (c, t)
    assert gcm.model_raw(k, iv, a, c, t)[0] == p
    with pytest.raises(IntegrityError):
        gcm.model_raw(k, iv, a, c, bytes([t[0] ^ 1]) + t[1:])


def test_model_raw_random_lengths_match_cryptography():
    rng = random.Random(3)
    for _ in range(20):
        n, al = rng.randrange(0, 5000), rng.randrange(0, 80)
        k, iv, p, a = os.urandom(32), os.urandom(12), os.urandom(n), os.urandom(al)
        ct, tag = gcm.model_raw(k, iv, a, p)
        assert ct + tag == AESGCM(k).encrypt(iv, p, a or None)


@pytest.mark.parametrize("path", ["model", "openssl"])
def test_tamper_reorder_truncate_replay_wrong_key_fail(path):
    n, chunk = 3 * 4096 + 100, 4096
    k, p, ident = os.urandom(32), os.urandom(n), _ident()
    wire = gcm.model_encrypt(k, ident, p, chunk)

    def dec(key, idt, w, nbytes=n):
        if path == "model":
            return gcm.model_decrypt(key, idt, w, nbytes, chunk)
        out = bytearray(nbytes)
        gcm.cpu_decrypt_into(key, idt, w, out, chunk)
        return bytes(out)

    assert dec(k, ident, wire) == p
    cases = tampered(wire, n, chunk)
    for name, w in cases.items():
        with pytest.raises(IntegrityError):
            dec(k, ident, w)
    with pytest.raises(IntegrityError):  # wrong key
        dec(os.urandom(32), ident, wire)
    with pytest.raises(IntegrityError):  # replayed under another message identity (e.g. a later step)
        dec(k, Ident(ident.prefix[:-1] + bytes([ident.prefix[-1] ^ 1]), ident.id), wire)
    with pytest.raises(IntegrityError):  # same nonce, another message id
        dec(k, Ident(ident.prefix, bytes(32)), wire)
    truncated = wire[:2 * chunk] + wire[gcm.tags_offset(n):gcm.tags_offset(n) + 32]
    with pytest.raises(IntegrityError):  # the receiver expects n bytes
        dec(k, ident, truncated)
    with pytest.raises(IntegrityError):  # cut to a shorter message: its length is in every chunk's AAD
        dec(k, ident, truncated, 2 * chunk)


def test_failed_chunks_are_zeroed_not_released():
    n, chunk = 4 * 4096, 4096
    k, p, ident = os.urandom(32), os.urandom(n), _ident()
    wire = bytearray(gcm.cpu_encrypt(k, ident, p, chunk))
    wire[4096 + 7] ^= 1  # chunk 1
    out = bytearray(b"\xaa" * n)
    assert gcm.cpu_decrypt_chunks(k, ident, wire, out, chunk) == [1]
    assert out[4096:8192] == bytes(4096) and out[:4096] == p[:4096] and out[8192:] == p[8192:]


def test_chunk_size_is_a_function_of_length_only():
    assert gcm.chunk_for(0) == gcm.MIN_CHUNK
    assert gcm.chunk_for(1 << 30) == gcm.MAX_CHUNK
    for n in (1 << 20, 10 << 20, 100 << 20):
        c = gcm.chunk_for(n)
        assert gcm.MIN_CHUNK <= c <= gcm.MAX_CHUNK and c % 16 == 0
        assert gcm.nchunks(n, c) <= 2 * gcm.TARGET_CHUNKS or c == gcm.MAX_CHUNK


def test_hkdf_rfc5869_case1():
    okm = keys.hkdf(bytes([0x0B] * 22), bytes(range(13)), bytes(range(0xF0, 0xFA)), 42)
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                         "34007208d5b887185865")


def test_key_providers(tmp_path, monkeypatch):
    secret = os.urandom(32)
    f = tmp_path / "key"
    f.write_text(secret.hex() + "\n")
    f.chmod(0o600)
    assert keys.FileKey(f).secret() == secret
    f.chmod(0o644)
    with pytest.raises(keys.KeyMaterialError, match="readable by group or others"):
        keys.FileKey(f).secret()
    f.chmod(0o600)
    f.write_text("abcd")
    with pytest.raises(keys.KeyMaterialError, match="expected 32 bytes"):
        keys.FileKey(f).secret()
    with pytest.raises(keys.KeyMaterialError, match="No such file"):
        keys.FileKey(tmp_path / "missing").secret()
    monkeypatch.delenv(keys.ENV_VAR, raising=False)
    monkeypatch.delenv("CCBRIDGE_KEY_FILE", raising=False)
    with pytest.raises(keys.KeyMaterialError, match="CCBRIDGE_KEY"):
        keys.default_provider()
    monkeypatch.setenv(keys.ENV_VAR, secret.hex())
    assert keys.default_provider().secret() == secret
    monkeypatch.setenv(keys.ENV_VAR, "zz" * 32)
    with pytest.raises(keys.KeyMaterialError, match="hex"):
        keys.EnvKey().secret()


def test_derived_keys_differ_by_salt_epoch_and_direction():
    p = keys.StaticKey(os.urandom(32))
    s1, s2 = os.urandom(32), os.urandom(32)
    ks = {p.group_key(s1, 0), p.group_key(s1, 1), p.group_key(s2, 0), p.p2p_key(s1, 0, 1, 0), p.p2p_key(s1, 1, 0, 0),
          p.p2p_key(s1, 0, 1, 1)}
    assert len(ks) == 6 and all(len(k) == 32 for k in ks)


def test_nonce_fields_are_range_checked():
    assert keys.prefix(3, 7, 1) == bytes([0, 3, 0, 0, 0, 7, 0, 1])
    for bad in [(keys.MAX_RANKS, 0, 0), (0, keys.MAX_SEQ, 0), (0, 0, keys.MAX_STEPS), (-1, 0, 0)]:
        with pytest.raises(ValueError):
            keys.prefix(*bad)


# ---- collectives on Gloo, CPU ranks ----

torch = pytest.importorskip("torch", reason="the collectives need torch")


@pytest.mark.parametrize("n", [2, 3])
def test_gloo_cpu_collectives_match_plaintext(n):
    import secure_workers

    secure_workers.spawn(n, "gloo", "cpu", ["correctness", "ddp"])


def test_gloo_cpu_integrity_transport_rotation():
    import secure_workers

    secure_workers.spawn(3, "gloo", "cpu", ["integrity", "transport", "rotation"])
