"""An encrypted collective in flight: what SecureGroup's collectives return (wait() raises on every rank if any
message failed authentication)."""

from __future__ import annotations

import torch


class SecureWork:
    """An encrypted collective in flight. wait() blocks until it is done and
    raises IntegrityError (on every rank) if anything failed to verify. group: the
    SecureGroup that ran it, whose deadline bounds the wait and whose failure rules apply."""

    def __init__(self, group, what: str, fail: torch.Tensor, result=None):
        self.group, self.what, self.result_ = group, what, result
        if fail.is_cuda:
            self._host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            self._host.copy_(fail, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host, self._event = fail, None
        self._checked = None

    def is_completed(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self, timeout=None) -> bool:
        """timeout: seconds (default: the group's); PeerError when it passes."""
        if self._checked is None:
            if self._event is not None:
                self.group.check_usable()  # a group broken earlier: its streams may never reach this event
                self.group.poll(self._event.query, self.what, timeout)
            self._checked = int(self._host[0])
        if self._checked:
            self.group.fail_integrity(f"{self.what}: {self._checked} chunk(s) or status message(s) failed "
                                      "authentication (tampered, replayed, reordered or truncated traffic, or "
                                      "mismatched keys)")
        return True

    def result(self):
        self.wait()
        return self.result_
