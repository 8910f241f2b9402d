"""The NCCL net plugin (libnccl-net-ccbridge.so) driven from Python as NCCL's proxy thread drives it: its
v11 API, for the net bench and the tests. Where the plugin lives and the environment that turns it on for
NCCL: ccbridge.pluginenv."""

from __future__ import annotations

import ctypes
import os
import time
import weakref

from ccbridge import environ, pluginenv
from ccbridge.bindings import ncclnet
from ccbridge.errors import SecureError


def idle(pause: float) -> None:
    """After a poll that found nothing: sleep `pause` s, or at 0 yield the core as NCCL's proxy thread does
    (proxy.cc: `if (idle) sched_yield();`)."""
    if pause:
        time.sleep(pause)
    else:
        os.sched_yield()


class NetError(SecureError):
    """A plugin call returned an NCCL error code (the plugin logged why)."""

    def __init__(self, where: str, rc: int, why: str = ""):
        why = why.removeprefix("NET/ccbridge: ")  # the plugin's log prefix: the message is about the plugin already
        super().__init__(f"{where}: {why}" if why else f"{where} returned NCCL error {rc}")  # (rc: self.rc)
        self.where, self.rc = where, rc


# The plugin keeps the last logger it was given for the life of the process (plugin.c), so every Net hands it the
# same callback, made once and never freed; a message goes to the newest Net still alive. (Each Net's own callback
# was freed with it while the plugin still called it: bench net's up-front check dropped one.)
_LISTENERS: list[weakref.ref] = []


def _dispatch(lvl, flags, file, line, fmt, msg) -> None:
    while _LISTENERS:
        net = _LISTENERS[-1]()
        if net is not None:
            net.logs.append((lvl, (msg or b"").decode()))
            return
        _LISTENERS.pop()


_LOG = ncclnet.LOGGER(_dispatch)


class Net:
    """One process's plugin and its v11 context, with blocking helpers that
    poll like NCCL's proxy thread does, each bounded by a deadline. The key
    comes from $CCBRIDGE_KEY / $CCBRIDGE_KEY_FILE as for NCCL."""

    def __init__(self, lib_path: str | None = None):
        self.lib, self.t = ncclnet.load(str(lib_path or pluginenv.library()))
        self.logs: list[tuple[int, str]] = []
        _LISTENERS.append(weakref.ref(self))
        self.ctx = ctypes.c_void_p()
        self.rc = self.t.init(ctypes.byref(self.ctx), 7, None, ctypes.cast(_LOG, ctypes.c_void_p), None)

    def why(self) -> str:
        return self.logs[-1][1] if self.logs else ""

    def check(self, where: str, rc: int) -> None:
        if rc != 0:
            raise NetError(where, rc, self.why())

    def listen(self):
        handle = ctypes.create_string_buffer(ncclnet.HANDLE_BYTES)
        lcomm = ctypes.c_void_p()
        self.check("listen", self.t.listen(self.ctx, 0, handle, ctypes.byref(lcomm)))
        return handle, lcomm

    def poll(self, where: str, fn, deadline: float):
        out = ctypes.c_void_p()
        while not out.value:
            self.check(where, fn(ctypes.byref(out)))
            if time.monotonic() > deadline:
                raise TimeoutError(where)
            if not out.value:
                time.sleep(0.001)
        return out

    def connect(self, handle: bytes, deadline: float):
        buf = ctypes.create_string_buffer(bytes(handle), ncclnet.HANDLE_BYTES)
        return self.poll("connect", lambda o: self.t.connect(self.ctx, 0, buf, o, None), deadline)

    def accept(self, lcomm, deadline: float):
        return self.poll("accept", lambda o: self.t.accept(lcomm, o, None), deadline)

    def pair(self, deadline: float, lanes: int | None = None):
        """Both ends of one connection in this process: a listen (its handle carrying `lanes`, the
        listener's choice, where given), then connect and accept polled in turn, since neither completes
        without the other; (listen comm, send comm, recv comm)."""
        with environ.setting({} if lanes is None else {"CCBRIDGE_NET_LANES": str(lanes)}):
            handle, lcomm = self.listen()
        buf = ctypes.create_string_buffer(bytes(handle), ncclnet.HANDLE_BYTES)
        s, r = ctypes.c_void_p(), ctypes.c_void_p()
        while not (s.value and r.value):
            if not s.value:
                self.check("connect", self.t.connect(self.ctx, 0, buf, ctypes.byref(s), None))
            if not r.value:
                self.check("accept", self.t.accept(lcomm, ctypes.byref(r), None))
            if time.monotonic() > deadline:
                raise TimeoutError("connect/accept")
            time.sleep(0.001)
        return lcomm, s, r

    def isend(self, comm, buf, n: int, deadline: float):
        return self.poll("isend", lambda o: self.t.isend(comm, buf, n, 0, None, None, o), deadline)

    def irecv(self, comm, buf, n: int, deadline: float):
        data, size = (ctypes.c_void_p * 1)(ctypes.cast(buf, ctypes.c_void_p)), (ctypes.c_size_t * 1)(n)
        tag = (ctypes.c_int * 1)(0)
        return self.poll("irecv", lambda o: self.t.irecv(comm, 1, data, size, tag, None, None, o), deadline)

    def done(self, req) -> int | None:
        """The received size once req completed, else None (raises NetError on failure)."""
        done, size = ctypes.c_int(0), ctypes.c_int(-1)
        self.check("test", self.t.test(req, ctypes.byref(done), ctypes.byref(size)))
        return size.value if done.value else None

    def wait(self, req, deadline: float, pause: float = 0.0002) -> int:
        """Poll req until it completes; between polls sleep `pause` s, or at 0 yield the core (NCCL's proxy)."""
        while True:
            got = self.done(req)
            if got is not None:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError("test")
            idle(pause)
