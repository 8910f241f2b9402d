"""A loader pool after close(): every use is a LoadError naming the cause, never a crash.

The pool's handle was set to None on close and passed on to C as NULL: the
process died with a segfault. Each sequence runs in a child interpreter, so
that a regression fails its test rather than killing pytest.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ckpt_util

torch = pytest.importorskip("torch", reason="the loader tests need torch (CI installs the CPU wheel)")
pytest.importorskip("safetensors", reason="safetensors writes the test checkpoint")

HERE = Path(__file__).resolve().parent
LOADER = HERE.parent / "src" / "ccbridge" / "native" / "loader"
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


@pytest.fixture(scope="module")
def fake_loader(tmp_path_factory):
    """load.c on tests/fake_cuda_loader.c as a shared library: a device pool without a GPU, whose prewarm steps
    (a context, a staging buffer) take ccbt_prewarm_delay_ms each."""
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("gcc is not here")
    so = tmp_path_factory.mktemp("fake") / "libfakeloader.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-std=gnu11", f"-I{LOADER}", str(LOADER / "load.c"),
                    str(HERE / "fake_cuda_loader.c"), str(LOADER.parent / "common" / "err.c"), "-lpthread",
                    "-o", str(so)], check=True)
    return so


ON_FAKE = """
    import ctypes, threading, time
    from ccbridge.bindings import declare, loader
    from ccbridge.load.engine import File, Item, Pool, PoolConfig
    fake = declare(ctypes.CDLL(sys.argv[2]), loader.FUNCTIONS)
    ctypes.c_int.in_dll(fake, "ccbt_prewarm_delay_ms").value = 1000  # 8 staging buffers: 8 s and more of prewarm
    loader.lib = lambda: fake  # device 0 is the fake's
"""


def on_fake(code: str) -> str:
    """code for run_child, after ON_FAKE: the loader's native calls go to the fake (its path in argv[2])."""
    return textwrap.dedent(ON_FAKE) + textwrap.dedent(code)


@pytest.mark.parametrize("contexts", [0, 1], ids=["primary", "own-context"])
def test_close_ends_a_ready_wait_during_the_prewarm(fake_loader, contexts):
    """A server that prewarms at start-up and is told to stop: ready() waits on one thread, close() comes on
    another. The close ends that wait (ready raises the closed error, not "not ready after 600 s") and stops the
    prewarm at each worker's current step (1 s here), so it returns in about a second where it waited for the
    whole prewarm (and, ready() being one of the calls it waits for, up to ready's 600 s)."""
    r = run_child(on_fake(f"""
        pool = Pool(PoolConfig(0, 2, {contexts}, "pinned", 64 << 10, 8))
        got = []
        def wait():
            try:
                got.append(pool.ready())
            except LoadError as e:
                got.append(e)
        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(0.3)  # in ready(), the workers at their first steps
        start = time.perf_counter()
        closer = threading.Thread(target=pool.close, daemon=True)
        closer.start()
        closer.join(5)  # bounded: a close that waits for the prewarm fails here rather than hangs
        waiter.join(1)
        print(f"close: {{time.perf_counter() - start:.1f}} s, {{'not done' if closer.is_alive() else 'done'}}; "
              f"ready gave {{got!r}}")
        assert not closer.is_alive() and got and pool.teardown_s < 3
        raise got[0]
        """), "-", fake_loader)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-2000:]}"
    assert r.stdout.splitlines()[-1] == CLOSED


def test_a_closing_native_pool_ends_every_wait_and_starts_no_load(fake_loader):
    """ccb_pool_close, as close() calls it while other threads may be inside calls on the pool: ready and next
    end at once however long they were told to wait, a submit that slipped in is refused, and the free after
    does not wait for the rest of the prewarm."""
    r = run_child(on_fake("""
        p = fake.ccb_pool_new(0, 2, 0, 0, 64 << 10, 8)
        fake.ccb_pool_close(p)
        t = time.perf_counter()
        out, rem, dq = (ctypes.c_int32 * 1)(), (ctypes.c_int32 * 1)(), (ctypes.c_int32 * 1)()
        rc = (fake.ccb_pool_wait_ready(p, 600.0), fake.ccb_pool_next(p, out, 1, 600.0),
              fake.ccb_pool_submit(p, (File * 1)(File(0, 0, 0)), 1, (Item * 1)(Item(1, 0, 1, 0, 0)), 1, 1, rem, dq, 1))
        fake.ccb_pool_free(p)
        print(rc, f"{time.perf_counter() - t:.1f} s")
        """), "-", fake_loader)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    rc, took, _ = r.stdout.rsplit(" ", 2)
    assert rc == "(-2, -2, -1)" and float(took) < 3, r.stdout
