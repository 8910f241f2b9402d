"""The GPU AES-256-GCM kernels' design choices side by side on this machine's GPU (issue 35).

gcm.cu fixes its open choices at compile time (GCM_CRYPT_CTAS, GCM_REDUCE_CTAS: see its header; the design
choices measured against each other on 2026-11-26 are folded into it, bench/RESULTS.md session 10; an older
design is measured with --legacy). This
builds gcm.cu once per variant with nvcc (setup.py's flags, for this GPU's architecture only) and, per variant,
in a fresh process pointed at that fatbin (ccbridge.bindings.gcm.FATBIN, read once and
lazily by secure.gcm): checks the kernels (encrypt of random data == `cryptography`'s AESGCM chunk by chunk,
also past 2^16 blocks in a chunk; the decrypt round trip; a tampered byte caught and its chunk zeroed; the
fused reduce hop == decrypt, add, encrypt), then times encrypt, decrypt and the reduce hop with `ccbridge
bench cipher`'s own code (secure.bench.cipher). Variants run in alternating order over --rounds rounds; the
table gives each one's median.

    pip install --no-deps --no-build-isolation -e .
    python bench/gcm_variants.py --out gcm_variants.json [--legacy DIR]

--legacy DIR adds a variant built from an older gcm.cu and gcm.h put in DIR (e.g. `git show
main:src/ccbridge/native/gcm/gcm.cu > DIR/gcm.cu`, the same for gcm.h): gcm_key and gcm_msg only grow at their
ends, so earlier kernels run on today's host side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GCM_DIR = Path(__file__).resolve().parents[1] / "src" / "ccbridge" / "native" / "gcm"
# name -> -D macros; the first is gcm.cu's default build
VARIANTS = {
    "default": {},
    "reduce2": {"GCM_REDUCE_CTAS": 2},
    "crypt2": {"GCM_CRYPT_CTAS": 2},
}


def nvcc() -> str:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home, "bin", "nvcc").exists():
            return str(Path(home, "bin", "nvcc"))
    found = shutil.which("nvcc")
    if not found:
        sys.exit("gcm_variants: nvcc not found (CUDA_HOME, PATH)")
    return found


def build(name: str, src: Path, macros: dict, arch: str, out_dir: Path) -> dict:
    """One variant's fatbin, with ptxas's registers, spills and shared memory per kernel."""
    dest = out_dir / f"{re.sub(r'[^A-Za-z0-9]', '_', name)}.fatbin"
    cmd = [nvcc(), "-fatbin", "-O3", "-std=c++17", "-o", str(dest), str(src), "-Xptxas", "-v",
           "-gencode", f"arch=compute_{arch},code=sm_{arch}"] + [f"-D{k}={v}" for k, v in macros.items()]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"gcm_variants: building {name} failed:\n{p.stderr[-3000:]}")
    ptxas, fn = {}, None
    for line in p.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            fn = ptxas.setdefault(m.group(1), {})
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and fn is not None:
            fn.update(spill_stores=int(m.group(1)), spill_loads=int(m.group(2)))
        m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
        if m and fn is not None:
            fn.update(registers=int(m.group(1)), smem=int(m.group(2)))
    return {"fatbin": str(dest), "macros": macros, "source": str(src), "ptxas": ptxas}


# ---- in the child: one variant's checks and timings ----

def _check(torch, gcm, size_chunks) -> list[str]:
    """What went wrong (empty: all right)."""
    bad = []
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # deferred: the optional test extra
    except ImportError:
        AESGCM = None
        print("gcm_variants: `cryptography` not installed: checking against OpenSSL (gcm.cpu_encrypt)", file=sys.stderr)
    key = os.urandom(32)
    c = gcm.GpuCipher(key, "cuda")
    ident, ident2 = (gcm.Ident(os.urandom(8), os.urandom(32)) for _ in range(2))
    fail = torch.zeros(1, dtype=torch.int32, device="cuda")
    for n, chunk in size_chunks:
        chunk = chunk or gcm.chunk_for(n)
        p = os.urandom(n)
        x = torch.frombuffer(bytearray(p), dtype=torch.uint8).cuda()
        w = torch.full((gcm.wire_len(n, chunk),), 0xAA, dtype=torch.uint8, device="cuda")
        c.encrypt(ident, x, w, chunk)
        wire, toff = w.cpu().numpy().tobytes(), gcm.tags_offset(n)
        if AESGCM is None and wire != bytes(gcm.cpu_encrypt(key, ident, p, chunk)):
            bad.append(f"encrypt of {n} bytes (chunk {chunk}) differs from OpenSSL")
        for k in range(gcm.nchunks(n, chunk) if AESGCM else 0):
            a, b = k * chunk, min(n, (k + 1) * chunk)
            ref = AESGCM(key).encrypt(gcm.chunk_nonce(ident, k), p[a:b], gcm.chunk_aad(ident, n, k, chunk))
            if wire[a:b] + wire[toff + 16 * k:toff + 16 * (k + 1)] != ref:
                bad.append(f"encrypt of {n} bytes (chunk {chunk}): chunk {k} differs from cryptography")
                break
        y = torch.empty_like(x)
        fail.zero_()
        c.decrypt(ident, w, y, fail, chunk)
        if int(fail) or not torch.equal(x, y):
            bad.append(f"decrypt of {n} bytes (chunk {chunk}): {int(fail)} failed chunks or wrong bytes")
        if n > chunk:  # one flipped ciphertext byte in chunk 1: that chunk fails and is zeroed, the others not
            w[chunk + 7] ^= 1
            fail.zero_()
            c.decrypt(ident, w, y, fail, chunk)
            zeroed = not y[chunk:2 * chunk].any()
            if int(fail) != 1 or not zeroed or not torch.equal(x[:chunk], y[:chunk]):
                bad.append(f"tamper in {n} bytes: {int(fail)} failed chunks, chunk zeroed {zeroed}")
            w[chunk + 7] ^= 1
        if n % 4 == 0:  # the fused hop on float32 small integers (exact sums) against decrypt, add, encrypt
            a_ = torch.randint(-8, 9, (n // 4,), device="cuda", dtype=torch.float32)
            b_ = torch.randint(-8, 9, (n // 4,), device="cuda", dtype=torch.float32)
            wa, wo = (torch.empty(gcm.wire_len(n, chunk), dtype=torch.uint8, device="cuda") for _ in range(2))
            c.encrypt(ident, a_.view(torch.uint8), wa, chunk)
            fail.zero_()
            c.reduce("float32", ident, wa, b_.view(torch.uint8), fail, ident_out=ident2, wire_out=wo, chunk=chunk)
            got = bytearray(n)
            try:
                gcm.cpu_decrypt_into(key, ident2, wo.cpu().numpy().tobytes(), got, chunk)
            except gcm.IntegrityError:
                got = b""
            if int(fail) or bytes(got) != (a_ + b_).view(torch.uint8).cpu().numpy().tobytes():
                bad.append(f"reduce hop of {n} bytes (chunk {chunk}) differs from decrypt, add, encrypt")
    return bad


def child(fatbin: str, size: int, iters: int) -> None:
    import torch  # deferred: torch, needed only in the measuring child

    from ccbridge.bindings import gcm as gcm_host

    gcm_host.FATBIN = Path(fatbin)  # before secure.gcm first reads it
    from ccbridge.secure import bench, gcm

    bad = _check(torch, gcm, [(3 * (1 << 20) + 8, None), ((1 << 20) + 4096 + 8, 2 << 20), (4096 * 5 + 12, 4096)])
    res = bench.cipher([size], iters)
    got = {r.params["op"]: r.median for r in res.rows}
    print(json.dumps({"device": res.settings["device"], "bad": bad, **got}))


# ---- the parent ----

def run_child(fatbin: str, size: int, iters: int) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", fatbin, "--size", str(size), "--iters", str(iters)],
                       capture_output=True, text=True)
    if p.returncode:
        return {"bad": [f"child exit {p.returncode}: {p.stderr.strip().splitlines()[-1:] or ''}"],
                "stderr": p.stderr[-3000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=False, help="JSON results to this path")
    ap.add_argument("--size", type=int, default=1 << 30, help="bytes per timed message (default 1 GiB)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="rounds over the variants, alternating their order")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--legacy", type=Path, help="a folder with an older gcm.cu and gcm.h, built as variant 'legacy'")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.size, a.iters)

    import torch  # deferred: torch, for the GPU's architecture

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    names = [v for v in a.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"gcm_variants: unknown variants {unknown} (known: {', '.join(VARIANTS)})")
    plan = {n: (GCM_DIR / "gcm.cu", VARIANTS[n]) for n in names}
    if a.legacy:
        plan["legacy"] = (a.legacy / "gcm.cu", {})
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(4) as pool:
        builds = dict(zip(plan, pool.map(lambda n: build(n, plan[n][0], plan[n][1], arch, Path(tmp)), plan)))
        runs: dict[str, list[dict]] = {n: [] for n in plan}
        order = list(plan)
        for r in range(a.rounds):
            for n in order if r % 2 == 0 else order[::-1]:
                print(f"# round {r + 1}: {n}", file=sys.stderr, flush=True)
                runs[n].append(run_child(builds[n]["fatbin"], a.size, a.iters))
    ops = ("encrypt", "decrypt", "reduce_hop")
    rows = []
    for n in plan:
        got = runs[n]
        row = {"variant": n, "macros": builds[n]["macros"], "ptxas": builds[n]["ptxas"], "runs": got,
               "ok": all(not g.get("bad") for g in got), "bad": sorted({b for g in got for b in g.get("bad", [])})}
        for op in ops:
            vals = [g[op] for g in got if op in g]
            row[op] = statistics.median(vals) if vals else None
        rows.append(row)
    device = next((g["device"] for r in rows for g in r["runs"] if "device" in g), "?")
    print(f"AES-256-GCM kernel variants on {device}, {a.size} bytes, median of {a.rounds} runs x {a.iters} iters "
          "(GB/s)")
    print(f"{'variant':<14} {'encrypt':>8} {'decrypt':>8} {'hop':>8} {'ok':>4}  regs crypt/reduce, spill bytes")
    for r in rows:
        p = r["ptxas"]
        regs = "/".join(str(p.get(k, {}).get("registers", "?")) for k in ("ccb_gcm_crypt", "ccb_gcm_reduce"))
        spill = "/".join(str(p.get(k, {}).get("spill_stores", "?")) for k in ("ccb_gcm_crypt", "ccb_gcm_reduce"))
        nums = " ".join(f"{r[op]:>8.1f}" if r[op] is not None else f"{'-':>8}" for op in ops)
        print(f"{r['variant']:<14} {nums} {'yes' if r['ok'] else 'NO':>4}  {regs}, {spill}")
        for b in r["bad"]:
            print(f"    {r['variant']}: {b}"[:120])
    if a.out:
        Path(a.out).write_text(json.dumps({"device": device, "arch": arch, "size": a.size, "iters": a.iters,
                                           "rounds": a.rounds, "variants": rows}, indent=1))
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
