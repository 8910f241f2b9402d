"""Device-to-host readbacks on a worker thread.

Under GPU-CC a D2H copy holds the thread that issues it until the stream has
reached the copy and the bytes are decrypted (bridge law, property 2). A
serving loop that reads step N's tokens on its scheduler thread therefore
cannot prepare step N+1 meanwhile: async scheduling buys nothing. A
DrainWorker takes the readback off that thread: submit() records where the
compute stream is and returns a Future at once; the worker waits for that
point on a stream of its own, copies, and completes the Future. The published
root-cause work closed up to 92% of the high-concurrency decode gap this way.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

import torch

from ccbridge.errors import GpuError, UsageError

_STOP = object()


class DrainWorker:
    """Readbacks of device tensors into host memory, in submission order, on one worker thread.

        drain = DrainWorker()
        fut = drain.submit(next_tokens)      # returns at once; next_tokens may be reused after fut is done
        ...launch step N+1...
        tokens = fut.result()                # a CPU tensor

    max_pending bounds the readbacks in flight (submit waits for room, up to
    timeout seconds, then raises). A failed readback sets its Future's
    exception; the worker goes on. close() (or leaving a `with` block) waits
    for every readback submitted and stops the thread; submit() after close
    raises.
    """

    def __init__(self, max_pending: int = 8, pin: bool = True, timeout: float = 60.0):
        if not isinstance(max_pending, int) or max_pending < 1:
            raise UsageError(f"max_pending must be a whole number >= 1, not {max_pending!r}")
        self.pin, self.timeout = pin, timeout
        self._q: queue.Queue = queue.Queue(max_pending)
        self._closed = False
        self._lock = threading.Lock()
        self._streams: dict = {}
        self._thread = threading.Thread(target=self._run, name="ccbridge-drain", daemon=True)
        self._thread.start()

    def submit(self, t: torch.Tensor) -> Future:
        """Read t back once the work the current stream has queued so far is done: a Future of a CPU tensor.
        UsageError for anything but a tensor or after close(); GpuError where max_pending readbacks are still
        pending after timeout seconds (the worker is stuck: a GPU that stopped)."""
        if not isinstance(t, torch.Tensor):
            raise UsageError(f"DrainWorker.submit takes a tensor, not {type(t).__name__}")
        fut: Future = Future()
        event = None
        if t.is_cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(t.device))
        with self._lock:
            if self._closed:
                raise UsageError("DrainWorker is closed")
            try:
                self._q.put((t, event, fut), timeout=self.timeout)
            except queue.Full:
                raise GpuError(f"DrainWorker: {self._q.maxsize} readbacks still pending after {self.timeout:g} s; "
                               "is the worker blocked on a GPU that stopped?") from None
        return fut

    def _stream(self, device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def _read(self, t: torch.Tensor, event) -> torch.Tensor:
        if not t.is_cuda:
            return t.detach().clone()
        s = self._stream(t.device)
        s.wait_event(event)
        with torch.cuda.stream(s):
            out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin)
            out.copy_(t, non_blocking=True)
        s.synchronize()
        return out

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            t, event, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self._read(t, event))
            except BaseException as e:  # noqa: BLE001 - handed to the Future's waiter
                fut.set_exception(e)

    def close(self) -> None:
        """Wait for every submitted readback, then stop the worker (idempotent). GpuError where the worker takes
        no readback for timeout seconds (a GPU that stopped): the readbacks still queued fail with it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._q.put(_STOP, timeout=self.timeout)
            except queue.Full:  # as submit: the worker has not taken a readback for timeout seconds
                self._give_up()
        while self._thread.is_alive():
            pending = self._q.qsize()
            self._thread.join(self.timeout)
            if self._thread.is_alive() and self._q.qsize() >= pending:  # nothing taken for timeout seconds
                with self._lock:
                    self._give_up()

    def _give_up(self) -> None:
        """The worker is stuck: every queued readback fails, and the worker leaves once it gets free."""
        err = GpuError(f"DrainWorker: no readback taken for {self.timeout:g} s at close ({self._q.qsize()} queued); "
                       "is the worker blocked on a GPU that stopped?")
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and item[2].set_running_or_notify_cancel():
                item[2].set_exception(err)
        self._q.put(_STOP)  # room now: the worker stops once the readback it is stuck in returns
        raise err

    def __enter__(self) -> "DrainWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
