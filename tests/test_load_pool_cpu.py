"""A loader pool after close(): every use is a LoadError naming the cause, never a crash.

The pool's handle was set to None on close and passed on to C as NULL: the
process died with a segfault. Each sequence runs in a child interpreter, so
that a regression fails its test rather than killing pytest.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import ckpt_util

torch = pytest.importorskip("torch", reason="the loader tests need torch (CI installs the CPU wheel)")
pytest.importorskip("safetensors", reason="safetensors writes the test checkpoint")

CLOSED = "LoadError: the loader pool is closed: prewarm() a new one"
PRELUDE = """\
import sys
from ccbridge.load import LoadError, iter_safetensors, load_safetensors, prewarm
D = sys.argv[1]
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    ckpt_util.write(torch, d, seed=3)
    return d


def run_child(code: str, *args) -> subprocess.CompletedProcess:
    """Run code in a child interpreter that prints a LoadError it catches; its exit status and output."""
    body = PRELUDE + "try:\n" + textwrap.indent(textwrap.dedent(code), "    ") + \
        '\nexcept LoadError as e:\n    print(f"LoadError: {e}")\n'
    # the ccbridge this interpreter imports (CI's is installed, with its native core; the source tree has none)
    return subprocess.run([sys.executable, "-c", body, *map(str, args)], capture_output=True, text=True, timeout=120)


SEQUENCES = {
    "load-after-close": """
        pool = prewarm("cpu", workers=2)
        pool.close()
        pool.close()  # a second close is a no-op
        load_safetensors(D, "cpu", pool=pool)
        """,
    "stats-after-with": """
        with prewarm("cpu", workers=2) as p:
            pass
        p.stats()
        """,
    "load-after-background-close": """
        p = prewarm("cpu", workers=2)
        p.close(background=True)
        assert p.join() >= 0  # still the teardown time
        load_safetensors(D, "cpu", pool=p)
        """,
    "iter-closed-half-way": """
        p = prewarm("cpu", workers=2, chunk_bytes=4096)
        it = iter_safetensors(D, "cpu", pool=p)
        while next(it)[1].numel() == 0:  # past the empty tensors: the load's pool.next() path
            pass
        p.close()
        next(it)
        """,
    "iter-closed-at-an-empty-tensor": """
        p = prewarm("cpu", workers=2, chunk_bytes=4096)
        it = iter_safetensors(D, "cpu", pool=p)
        next(it)  # the empty tensors come before the load starts
        p.close()
        list(it)
        """,
}


@pytest.mark.parametrize("name", SEQUENCES)
def test_a_closed_pool_refuses_with_load_error(ckpt, name):
    r = run_child(SEQUENCES[name], ckpt)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.strip() == CLOSED


def test_close_ends_a_next_blocked_on_another_thread(tmp_path):
    """A load whose destinations are not published blocks its next(); close() on another thread cancels it:
    that next() ends with LoadError (not -2, a load that looks complete), and only then is the pool freed."""
    (tmp_path / "blob").write_bytes(os.urandom(6 << 16))
    r = run_child("""
        import ctypes, os, threading, time
        from ccbridge.load.engine import File, Item, Pool, PoolConfig
        pool = Pool(PoolConfig(-1, 3, 0, "pinned", 64 << 10, 2))
        pool.ready()
        fd = os.open(sys.argv[2], os.O_RDONLY)
        dests = [(ctypes.c_uint8 * (64 << 10))() for _ in range(6)]
        items = (Item * 6)(*[Item(ctypes.addressof(d), i * (64 << 10), 64 << 10, 0, i) for i, d in enumerate(dests)])
        remaining, doneq, out = (ctypes.c_int32 * 6)(), (ctypes.c_int32 * 6)(), (ctypes.c_int32 * 6)()
        pool.submit((File * 1)(File(fd, 0, 0)), items, remaining, doneq, ready=0)
        got = []
        def wait():
            try:
                got.append(pool.next(out, 60.0))
            except LoadError as e:
                got.append(e)
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)  # in next(), waiting for destinations nobody publishes
        start = time.perf_counter()
        pool.close()
        t.join(10)
        print(f"closed in {time.perf_counter() - start:.1f} s, next gave {got!r}")
        assert not t.is_alive() and isinstance(got[0], LoadError)
        raise got[0]
        """, tmp_path, tmp_path / "blob")  # argv[1], D, is unused here
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-2000:]}"
    assert r.stdout.splitlines()[-1] == CLOSED


def test_close_while_a_load_on_another_thread_is_between_steps(ckpt):
    """The load's thread is in the caller's progress callback when another thread closes the pool: its next
    step is LoadError, and the pool it held is freed without waiting for it."""
    r = run_child("""
        import threading
        p = prewarm("cpu", workers=2, chunk_bytes=4096)
        p.ready()
        inside, go, got = threading.Event(), threading.Event(), []
        def progress(done, total):
            inside.set()
            go.wait(30)
        def load():
            try:
                load_safetensors(D, "cpu", pool=p, progress=progress)
                got.append("loaded")
            except LoadError as e:
                got.append(e)
        t = threading.Thread(target=load)
        t.start()
        assert inside.wait(30)
        p.close()
        go.set()
        t.join(30)
        raise got[0]
        """, ckpt)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.strip() == CLOSED
