"""Sessions of the native core opened side by side, for the families that hold several.

Nothing is measured while sessions open, and what each open does (a context, its buffers, a pinned buffer
filled, the round trip checked) is the driver's and the core's with the interpreter's lock let go: one thread
each, a session is made while another is, instead of after it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ccbridge.bindings import core


def open_all(device: int, specs: list[tuple[str, int, bool]], at_once: int | None = None) -> list[core.Session]:
    """One session of each (memory kind, buffer bytes, own context) on `device`, in order, opened side by side,
    at most `at_once` at a time (all where None). All or none: should one fail, those that opened are closed and
    the first failure raised."""
    with ThreadPoolExecutor(min(len(specs), at_once or len(specs)), thread_name_prefix="ccbridge-open") as pool:
        futures = [pool.submit(core.Session, device, mem, nbytes, own_context=own) for mem, nbytes, own in specs]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        close_all([f.result() for f in futures if f.exception() is None])
        raise failed[0]
    return [f.result() for f in futures]


def close_all(sessions: list[core.Session]) -> None:
    for s in sessions:
        s.close()
