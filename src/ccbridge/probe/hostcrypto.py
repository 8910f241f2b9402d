"""Host crypto: CPU AES-256-GCM GB/s through the system OpenSSL, with code paths masked.

OpenSSL reads OPENSSL_ia32cap once, when libcrypto initialises, so each
variant runs in a fresh interpreter with the mask set. This family needs no
GPU: it is the cipher half of the bridge's cost, repeatable inside a CVM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from ccbridge import libcrypto
from ccbridge.probe.registry import test
from ccbridge.results import Row

# Bit positions from OpenSSL's OPENSSL_ia32cap(3): word 0 bit 57 AES-NI, bit 33
# PCLMULQDQ; word 1 bit 41 VAES, bit 42 VPCLMULQDQ.
_WIDE = 0x60000000000
_AESNI = 0x200000200000000
VARIANTS = {
    "default": None,
    "no-wide-vector": f":~{_WIDE:#x}",
    "no-aes-ni": f"~{_AESNI:#x}:~{_WIDE:#x}",
}
BUF_BYTES = 16 << 20


def _prepare(op: str, threads: int):
    """The buffers of `threads` threads each sealing (or opening) one buffer, and a round of them."""
    key, iv = os.urandom(32), os.urandom(12)
    plain = [os.urandom(BUF_BYTES) for _ in range(threads)]
    sealed = [libcrypto.encrypt(key, iv, p) for p in plain]
    outs = [bytearray(BUF_BYTES) for _ in range(threads)]

    def one(i):
        if op == "encrypt":
            libcrypto.encrypt_into(key, iv, plain[i], outs[i])
        else:
            libcrypto.decrypt_into(key, iv, sealed[i][0], sealed[i][1], outs[i])

    one(0)  # warm

    def measure(seconds: float) -> list[float]:
        """Rounds for `seconds` (at least 3): GB/s per round."""
        samples, t_end = [], time.perf_counter() + seconds
        while len(samples) < 3 or time.perf_counter() < t_end:
            ths = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
            t0 = time.perf_counter()
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            samples.append(threads * BUF_BYTES / (time.perf_counter() - t0) / 1e9)
        if op == "decrypt" and bytes(outs[0]) != plain[0]:
            raise RuntimeError("decryption did not restore the plaintext")
        return samples

    return measure


def _plan() -> list[tuple[str, str, int]]:
    """(variant, op, threads) of each measurement, in order."""
    cores = os.cpu_count() or 1
    plan = [(v, "encrypt", 1) for v in VARIANTS] + [("default", "decrypt", 1)]
    return plan + ([("default", "encrypt", cores)] if cores > 1 else [])


class Workers:
    """One interpreter per measurement, each with its variant's mask (OpenSSL reads it once, at start-up), started
    ahead of the family's turn: each imports, keys and fills its buffers, says it is ready, then waits for its go on
    stdin, so the measurements still run one at a time and the start-ups cost the run nothing. The first go waits
    until every one is ready: a measurement shares no core with another's start-up (on a machine of two cores the
    headline rate moved 0.65-5.3 GB/s while they started beside it)."""

    def __init__(self, plan: list[tuple[str, str, int]], seconds: float):
        self.seconds = seconds
        self.plan = plan
        self.procs = [self._spawn(v, op, threads) for v, op, threads in self.plan]
        self.ready_at: list[float | None] | None = None  # when each said it was ready (None: it ended first)

    def _spawn(self, variant: str, op: str, threads: int) -> subprocess.Popen:
        env = dict(os.environ)
        env.pop("OPENSSL_ia32cap", None)
        if VARIANTS[variant]:
            env["OPENSSL_ia32cap"] = VARIANTS[variant]
        cmd = [sys.executable, "-m", "ccbridge.probe.hostcrypto", "--op", op, "--threads", str(threads),
               "--seconds", str(self.seconds), "--gated"]
        return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def _wait_ready(self) -> None:
        """Every worker's ready line (or its end), read once, before the first go."""
        if self.ready_at is None:
            self.ready_at = [None] * len(self.procs)
            for k, p in enumerate(self.procs):
                word, _, when = p.stdout.readline().partition(" ")
                if word == "ready":
                    self.ready_at[k] = float(when)

    def result(self, i: int) -> dict:
        """Measurement i of the plan, run now (once every worker is ready)."""
        self._wait_ready()
        p, (variant, _, _) = self.procs[i], self.plan[i]
        try:
            p.stdin.write("go\n")
            p.stdin.flush()
        except OSError:
            pass  # it ended early: its error is on stderr
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"cipher worker ({variant}) failed: {err.strip().splitlines()[-1:]}")
        return json.loads(out)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.stdin.close()  # end of input: a waiting worker leaves without measuring
                except OSError:
                    pass
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def run_variant(variant: str, op: str, threads: int, seconds: float) -> dict:
    """One measurement in a fresh interpreter with the variant's mask, now."""
    workers = Workers([(variant, op, threads)], seconds)
    try:
        return workers.result(0)
    finally:
        workers.close()


def _workers(settings) -> Workers:
    return Workers(_plan(), settings.pick(0.4, 0.25))


@test("hostcrypto.aes256gcm", "CPU AES-256-GCM GB/s (OpenSSL), default and with AES-NI / wide-vector paths masked",
      ahead=_workers)
def aes256gcm(ctx):
    workers = ctx.ahead if isinstance(ctx.ahead, Workers) else _workers(ctx.settings)
    rows = []
    try:
        for i, (variant, op, threads) in enumerate(workers.plan):
            ctx.step(f"{variant} {op} x{threads}")
            out = workers.result(i)
            row = Row.of("hostcrypto.aes256gcm", "throughput", "GB/s", out["samples"], variant=variant, op=op,
                         threads=threads)
            row.extra.update(ia32cap=VARIANTS[variant], openssl=out["openssl"])
            row.extra["headline"] = threads == 1 and op == "encrypt"
            rows.append(row)
    finally:
        workers.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="one AES-256-GCM throughput measurement (internal worker)")
    ap.add_argument("--op", choices=("encrypt", "decrypt"), required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--gated", action="store_true", help="prepare, then measure on a line 'go' on stdin (EOF: leave)")
    a = ap.parse_args(argv)
    measure = _prepare(a.op, a.threads)
    if a.gated:
        print(f"ready {time.time()}", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 0
    started = time.time()
    print(json.dumps({"samples": measure(a.seconds), "openssl": libcrypto.openssl_version(), "started": started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
