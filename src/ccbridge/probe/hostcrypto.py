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


def _measure(op: str, threads: int, seconds: float) -> list[float]:
    """Rounds of `threads` threads each sealing (or opening) one buffer: GB/s per round."""
    key, iv = os.urandom(32), os.urandom(12)
    plain = [os.urandom(BUF_BYTES) for _ in range(threads)]
    sealed = [libcrypto.encrypt(key, iv, p) for p in plain]
    outs = [bytearray(BUF_BYTES) for _ in range(threads)]

    def one(i):
        if op == "encrypt":
            libcrypto.encrypt_into(key, iv, plain[i], outs[i])
        else:
            libcrypto.decrypt_into(key, iv, sealed[i][0], sealed[i][1], outs[i])

    samples, t_end = [], time.perf_counter() + seconds
    one(0)  # warm
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


def run_variant(variant: str, op: str, threads: int, seconds: float) -> dict:
    """Run one measurement in a fresh interpreter with the variant's mask."""
    env = dict(os.environ)
    env.pop("OPENSSL_ia32cap", None)
    if VARIANTS[variant]:
        env["OPENSSL_ia32cap"] = VARIANTS[variant]
    cmd = [sys.executable, "-m", "ccbridge.probe.hostcrypto", "--op", op, "--threads", str(threads), "--seconds", str(seconds)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"cipher worker ({variant}) failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


@test("hostcrypto.aes256gcm", "CPU AES-256-GCM GB/s (OpenSSL), default and with AES-NI / wide-vector paths masked")
def aes256gcm(ctx):
    seconds = ctx.pick(0.6, 0.25)
    cores = os.cpu_count() or 1
    plan = [(v, "encrypt", 1) for v in VARIANTS] + [("default", "decrypt", 1)]
    if cores > 1:
        plan.append(("default", "encrypt", cores))
    rows = []
    for variant, op, threads in plan:
        ctx.step(f"{variant} {op} x{threads}")
        out = run_variant(variant, op, threads, seconds)
        row = Row.of("hostcrypto.aes256gcm", "throughput", "GB/s", out["samples"], variant=variant, op=op, threads=threads)
        row.extra.update(ia32cap=VARIANTS[variant], openssl=out["openssl"])
        row.extra["headline"] = threads == 1 and op == "encrypt"
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="one AES-256-GCM throughput measurement (internal worker)")
    ap.add_argument("--op", choices=("encrypt", "decrypt"), required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0.5)
    a = ap.parse_args(argv)
    print(json.dumps({"samples": _measure(a.op, a.threads, a.seconds), "openssl": libcrypto.openssl_version()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
