"""The bridge emulator: CC-on behaviour of the CPU<->GPU bridge on any NVIDIA GPU.

The work is done by a native interposer (native/emu/) preloaded in front of
the CUDA driver; this package holds its profiles, the launcher that starts a
program under it, the calibration against published figures, and the reader
of its traces. Importing ccbridge never loads the interposer.
"""
