"""ccbridge: measure, emulate and recover the CPU<->GPU bridge of GPU confidential computing."""

from ccbridge.marks import mark, window  # noqa: F401 - ccbridge.mark("begin"), a program's steady-state marks
from ccbridge.version import __version__  # noqa: F401 - the package's version, as ccbridge.__version__


def __getattr__(name):
    # ccbridge.load_safetensors, as the loader's docs write it: the package's __init__ runs before every
    # `import ccbridge.x`, which must not load the loader and its native pool
    if name in ("load_safetensors", "iter_safetensors"):
        from ccbridge import load  # deferred: the loader (its native pool), until the attribute is asked for

        return getattr(load, name)
    raise AttributeError(f"module 'ccbridge' has no attribute {name!r}")
