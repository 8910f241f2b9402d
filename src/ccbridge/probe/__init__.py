"""ccbridge probe: one registry of tests over the CPU<->GPU bridge (see registry.py)."""
