"""ccbridge: measure, emulate and recover the CPU<->GPU bridge of GPU confidential computing."""

from ccbridge.version import __version__  # noqa: F401 - the package's version, as ccbridge.__version__


def __getattr__(name):
    # The loader needs torch; `import ccbridge` must not.
    if name in ("load_safetensors", "iter_safetensors"):
        from ccbridge import load

        return getattr(load, name)
    raise AttributeError(f"module 'ccbridge' has no attribute {name!r}")
