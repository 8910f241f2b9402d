"""AES-256-GCM reference data shared by the CPU and GPU tests (no imports needing extras)."""

from ccbridge.secure import gcm

# AES-256 cases 13-16 of the GCM specification (McGrew & Viega), as NIST's CAVS vectors use
VECTORS = [
    ("00" * 32, "00" * 12, "", "", "", "530f8afbc74536b9a963b4f1c4cb738b"),
    ("00" * 32, "00" * 12, "00" * 16, "", "cea7403d4d606b6e074ec5d3baf39d18", "d0d1c8a799996bf0265b98b5d48ab919"),
    ("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888",
     "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b1"
     "6aedf5aa0de657ba637b391aafd255", "",
     "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838"
     "c5f61e6393ba7a0abcc9f662898015ad", "b094dac5d93471bdec1a502270e3cc6c"),
    ("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888",
     "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b1"
     "6aedf5aa0de657ba637b39", "feedfacedeadbeeffeedfacedeadbeefabaddad2",
     "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838"
     "c5f61e6393ba7a0abcc9f662", "76fc6ece0f4e1768cddf8853bb2d551b"),
]


def tampered(wire: bytes, n: int, chunk: int) -> dict:
    """A message's wire altered three ways: a ciphertext bit, a tag bit, chunks 0 and 1 swapped."""
    w = bytearray(wire)
    toff = gcm.tags_offset(n)
    flip_ct = bytearray(w)
    flip_ct[n // 2] ^= 0x04
    flip_tag = bytearray(w)
    flip_tag[toff + 5] ^= 0x80
    swapped = bytearray(w)
    swapped[:chunk], swapped[chunk:2 * chunk] = w[chunk:2 * chunk], w[:chunk]
    swapped[toff:toff + 16], swapped[toff + 16:toff + 32] = w[toff + 16:toff + 32], w[toff:toff + 16]
    return {"ciphertext bit": bytes(flip_ct), "tag bit": bytes(flip_tag), "reordered chunks": bytes(swapped)}
