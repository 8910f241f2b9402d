"""The session handshake of a SecureGroup: fresh keys every session, agreed by
all ranks, authenticated under the long-term secret before any data moves.

    1. every rank draws 32 fresh random bytes and all ranks all-gather them;
    2. each rank hashes its transcript: the protocol version, the group's
       identity (world size, global ranks, name) and every contribution, its
       own taken from its memory, not from the wire;
    3. each rank all-gathers a confirmation, HMAC(K, rank | transcript hash)
       with K = HKDF(secret, transcript hash, "confirm"), and checks every
       other rank's against its own transcript.

A rank whose view differs from anyone else's in any byte (a replayed or
altered contribution, another group, another key) fails step 3 on both sides
of the difference, so an attacker on the links can make the handshake fail
but not make any rank accept a transcript it did not take part in. (An
attacker who alters only a confirmation on one link makes only its receiver
refuse; the others then fail at their first collective, within the deadline.) The
transcript hash is the session: every key is derived from it
(keys.KeyProvider), so a session's keys depend on every rank's fresh bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from ccbridge.errors import HandshakeError
from ccbridge.secure.keys import hkdf

PROTOCOL = b"ccbridge/secure/v2"
CONTRIB_BYTES = 32
CONFIRM_BYTES = 32


def fresh() -> bytes:
    return os.urandom(CONTRIB_BYTES)


def identity(ranks: list[int], name: str) -> bytes:
    """The group's identity: world size, the global rank of each member, its name."""
    nb = name.encode("utf-8")
    return struct.pack("<I", len(ranks)) + struct.pack(f"<{len(ranks)}I", *ranks) + struct.pack("<I", len(nb)) + nb


def transcript(ident: bytes, contributions: list[bytes]) -> bytes:
    """The session: SHA-256 over the protocol, the group identity and every contribution."""
    if any(len(c) != CONTRIB_BYTES for c in contributions):
        raise HandshakeError("a handshake contribution has the wrong length (truncated or padded)")
    return hashlib.sha256(PROTOCOL + b"/transcript" + ident + b"".join(contributions)).digest()


def confirmation(secret: bytes, session: bytes, rank: int) -> bytes:
    key = hkdf(secret, session, PROTOCOL + b"/confirm")
    return hmac.new(key, PROTOCOL + b"/confirm" + struct.pack("<I", rank) + session, hashlib.sha256).digest()


def verify(expected: list[bytes], confirmations: list[bytes], me: int) -> None:
    """HandshakeError unless every other rank's confirmation is the one this
    rank expects from its own transcript (expected[r] = confirmation(secret,
    session, r); the caller computes them, so no secret sits in this frame)."""
    bad = [r for r, (c, e) in enumerate(zip(confirmations, expected)) if r != me and not hmac.compare_digest(c, e)]
    if bad:
        raise HandshakeError(
            f"rank {me}: session handshake refused: the confirmation of rank(s) {', '.join(map(str, bad))} does not "
            "match this rank's transcript (a replayed or altered handshake, a different group, or ranks holding "
            "different keys); no data was sent")
