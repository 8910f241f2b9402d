import os
import random

import pytest

AESGCM = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead", reason="test extra 'cryptography' not installed").AESGCM

from ccbridge import libcrypto
from ccbridge.libcrypto import IntegrityError

# AES-256 cases 13, 14 and 16 of the GCM specification (McGrew & Viega), as NIST's CAVS vectors use.
VECTORS = [
    ("00" * 32, "00" * 12, "", "", "", "530f8afbc74536b9a963b4f1c4cb738b"),
    ("00" * 32, "00" * 12, "00" * 16, "", "cea7403d4d606b6e074ec5d3baf39d18", "d0d1c8a799996bf0265b98b5d48ab919"),
    ("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888",
     "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
     "feedfacedeadbeeffeedfacedeadbeefabaddad2",
     "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
     "76fc6ece0f4e1768cddf8853bb2d551b"),
]


@pytest.mark.parametrize("k,iv,p,a,c,t", VECTORS)
def test_gcm_spec_vectors(k, iv, p, a, c, t):
    k, iv, p, a, c, t = map(bytes.fromhex, (k, iv, p, a, c, t))
    ct, tag = libcrypto.encrypt(k, iv, p, a)
    assert (ct, tag) == (c, t)
    assert libcrypto.decrypt(k, iv, c, t, a) == p


def test_random_lengths_match_cryptography():
    rng = random.Random(7)
    for n in [1, 15, 16, 17, 4095, 65536 + 3] + [rng.randrange(1, 1 << 20) for _ in range(5)]:
        k, iv, p, a = os.urandom(32), os.urandom(12), os.urandom(n), os.urandom(rng.randrange(0, 40))
        ct, tag = libcrypto.encrypt(k, iv, p, a)
        assert ct + tag == AESGCM(k).encrypt(iv, p, a or None)
        assert libcrypto.decrypt(k, iv, ct, tag, a) == p


def test_memoryview_and_bytearray_inputs():
    k, iv, p = os.urandom(32), os.urandom(12), os.urandom(1000)
    out = bytearray(1000)
    tag = libcrypto.encrypt_into(k, iv, memoryview(p), out)
    assert bytes(out) + tag == AESGCM(k).encrypt(iv, p, None)


def test_tamper_wrong_key_and_aad_fail_and_release_nothing():
    k, iv, p = os.urandom(32), os.urandom(12), os.urandom(4096)
    ct, tag = libcrypto.encrypt(k, iv, p, b"hdr")
    bad = bytearray(ct)
    bad[1234] ^= 0x01
    cases = [(k, bytes(bad), tag, b"hdr"), (os.urandom(32), ct, tag, b"hdr"), (k, ct, tag, b"HDR"),
             (k, ct, bytes([tag[0] ^ 0x80]) + tag[1:], b"hdr")]
    for key, c, t, a in cases:
        out = bytearray(b"\xaa" * len(c))
        with pytest.raises(IntegrityError):
            libcrypto.decrypt_into(key, iv, c, t, out, a)
        assert out == bytes(len(c))  # zeroed, no plaintext of a failed message


def test_bad_parameters():
    with pytest.raises(ValueError, match="32-byte key"):
        libcrypto.encrypt(b"short", b"\0" * 12, b"x")
    with pytest.raises(IntegrityError, match="16 bytes"):
        libcrypto.decrypt(b"\0" * 32, b"\0" * 12, b"x", b"short")
    with pytest.raises(ValueError, match="output buffer"):
        libcrypto.encrypt_into(b"\0" * 32, b"\0" * 12, b"abc", bytearray(2))
