"""The few helpers every NVML reader shares (env's stamp, fabric's NVLink view, attest's evidence): the
binding itself where installed, a call that answers its error instead of raising, and names of NVML values.

Every function takes the NVML module (pynvml, or tests/fake_nvml.py); none initialises NVML.
"""

from __future__ import annotations


def load():
    """The NVML binding (pynvml), or None where nvidia-ml-py is not installed."""
    try:
        import pynvml  # deferred: nvidia-ml-py, an optional dependency
    except ImportError:
        return None
    return pynvml


def call(fn, *args):
    """Call an NVML function; return (value, None) or (None, error text)."""
    try:
        return fn(*args), None
    except Exception as e:  # NVMLError subclasses, missing symbols in old drivers
        return None, f"{type(e).__name__}: {e}"


def constant_name(nv, prefix: str, value: int) -> str:
    """The NVML constant's name for a value, e.g. NVML_ERROR_NOT_READY for a status code."""
    names = [k for k in dir(nv) if k.startswith(prefix) and getattr(nv, k) == value and not k.endswith("_")]
    return min(names, key=len) if names else f"{prefix}{value}"


def text(v):
    """A string NVML answered as bytes (older bindings), as str; anything else as it is."""
    return v.decode() if isinstance(v, bytes) else v
