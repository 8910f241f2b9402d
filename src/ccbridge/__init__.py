"""ccbridge: measure, emulate and recover the CPU<->GPU bridge of GPU confidential computing."""

__version__ = "0.1.0"


def __getattr__(name):
    # The loader needs torch; `import ccbridge` must not.
    if name in ("load_safetensors", "iter_safetensors"):
        from ccbridge import load

        return getattr(load, name)
    if name in ("mark", "window"):  # a program's steady-state marks for `ccbridge account` (emulate/trace.py)
        from ccbridge.emulate import trace

        return getattr(trace, name)
    raise AttributeError(f"module 'ccbridge' has no attribute {name!r}")
