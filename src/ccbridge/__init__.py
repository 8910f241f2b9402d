"""ccbridge: measure, emulate and recover the CPU<->GPU bridge of GPU confidential computing."""

__version__ = "0.1.0"
