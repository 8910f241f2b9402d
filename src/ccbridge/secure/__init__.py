"""Encrypted collectives: AES-256-GCM on the GPU (or OpenSSL on CPU ranks)
around ring collectives on torch.distributed, and a DDP comm hook.

    from ccbridge import secure
    group = secure.SecureGroup(keys=secure.EnvKey())
    ddp.register_comm_hook(group, secure.allreduce_hook)
"""

from ccbridge.errors import HandshakeError, IntegrityError, KeyMaterialError, PeerError, SecureError
from ccbridge.secure.keys import EnvKey, FileKey, KeyProvider, StaticKey

__all__ = ["SecureError", "IntegrityError", "HandshakeError", "PeerError", "KeyMaterialError",
           "KeyProvider", "StaticKey", "FileKey", "EnvKey",
           "SecureGroup", "SecureWork", "allreduce_hook"]


def __getattr__(name):
    if name in ("SecureGroup", "SecureWork", "allreduce_hook"):
        from ccbridge.secure import group  # deferred: torch, which the collectives need (the format and keys do not)

        return getattr(group, name)
    raise AttributeError(f"module 'ccbridge.secure' has no attribute {name!r}")
