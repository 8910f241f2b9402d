"""Every error ccbridge raises on purpose, in one tree.

A CCBridgeError carries a one-line reason a user can act on; the CLI catches
the base once, prints `ccbridge CMD: reason` and exits 2. Each area has its
own subclass, which also derives from the builtin it refines (ValueError for
bad input, RuntimeError for a failed operation) so callers that catch those
keep working. Anything else escaping the CLI is a bug.
"""


class CCBridgeError(Exception):
    """Base of ccbridge's errors: the message says what went wrong and what to do."""


class UsageError(CCBridgeError, ValueError):
    """A command-line value or API argument that cannot be used (size, count, path, device)."""


class GpuError(CCBridgeError, RuntimeError):
    """The GPU path failed: no driver, no device, or a refused driver call."""


class ResultFileError(CCBridgeError, ValueError):
    """A result file that cannot be read as a ccbridge result."""


class ProfileError(CCBridgeError, ValueError):
    """An emulator profile that is unknown, unreadable or malformed, or a value out of range."""


class EmulatorError(CCBridgeError, RuntimeError):
    """The emulator cannot start: library not built, no libcrypto, bad command."""


class LoadError(CCBridgeError, RuntimeError):
    """A load could not run or failed: no such GPU, a closed or busy pool, a refused CUDA call, a file that changed."""


class CryptoUnavailable(CCBridgeError, RuntimeError):
    """The system libcrypto could not be loaded or lacks what we call."""


class SecureError(CCBridgeError):
    """Encrypted collectives: base of key, integrity and peer failures."""


class KeyMaterialError(SecureError, ValueError):
    """Key material missing, malformed or too weak."""


class IntegrityError(SecureError, ValueError):
    """Authentication failed: tampered ciphertext, wrong tag, key, nonce or associated data."""


class HandshakeError(IntegrityError):
    """A group's session handshake did not verify: a transcript this rank did not
    take part in (replayed or altered contributions), or a different key."""


class PeerError(SecureError, RuntimeError):
    """A peer stopped answering (dead rank, dropped messages) or the transport failed:
    the collective did not complete within its deadline. The group cannot be used again."""


class KVCacheError(CCBridgeError, RuntimeError):
    """The KV cache cannot serve a request: every device block is pinned by a
    request or in flight (the cache is full), or a block in flight did not arrive in time."""
