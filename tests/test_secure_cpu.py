"""The chunked AES-256-GCM format, the kernels' arithmetic (run on the host),
keys and nonces, and the encrypted collectives on Gloo with CPU ranks."""

import os
import random
from pathlib import Path

import pytest

from ccbridge.secure import gcm, keys
from ccbridge.secure.gcm import Ident, IntegrityError
from gcm_vectors import VECTORS, tampered

AESGCM = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead", reason="test extra 'cryptography' not installed").AESGCM


def _ident():
    return Ident(os.urandom(8), os.urandom(32))


SIZES = [0, 1, 15, 16, 17, 4095, 4096, 4097, 65536 + 5, 300_001]


@pytest.mark.parametrize("n", SIZES)
def test_kernel_model_matches_openssl_and_cryptography(n):
    rng = random.Random(n)
    for chunk in (None, 4096, 16, rng.choice([32, 4112, 65536])):
        k, p, ident = os.urandom(32), os.urandom(n), _ident()
        wire = gcm.model_encrypt(k, ident, p, chunk)
        assert wire == bytes(gcm.cpu_encrypt(k, ident, p, chunk))
        ch = chunk or gcm.chunk_for(n)
        toff = gcm.tags_offset(n)
        for c in range(gcm.nchunks(n, ch)):  # every chunk is ordinary AES-GCM
            a, b = c * ch, min(n, (c + 1) * ch)
            ref = AESGCM(k).encrypt(gcm.chunk_nonce(ident, c), p[a:b], gcm.chunk_aad(ident, n, c, ch))
            assert wire[a:b] + wire[toff + 16 * c: toff + 16 * (c + 1)] == ref
        assert gcm.model_decrypt(k, ident, wire, n, chunk) == p


def test_kernel_model_past_2_16_blocks_in_a_chunk():
    """The counter cache (rounds 1-2 kept per thread) is remade where a block counter's high half changes: a
    chunk, and a raw message, of more than 2^16 blocks, on random data."""
    n = (1 << 20) + 4096 + 7
    k, p, ident = os.urandom(32), os.urandom(n), _ident()
    chunk = 2 << 20
    wire = gcm.model_encrypt(k, ident, p, chunk)
    ref = AESGCM(k).encrypt(gcm.chunk_nonce(ident, 0), p, gcm.chunk_aad(ident, n, 0, chunk))
    assert wire[:n] + wire[gcm.tags_offset(n):] == ref
    assert gcm.model_decrypt(k, ident, wire, n, chunk) == p
    iv, a = os.urandom(12), os.urandom(20)
    ct, tag = gcm.model_raw(k, iv, a, p)
    assert ct + tag == AESGCM(k).encrypt(iv, p, a)


@pytest.mark.parametrize("k,iv,p,a,c,t", VECTORS)
def test_kernel_model_on_gcm_spec_vectors(k, iv, p, a, c, t):
    k, iv, p, a, c, t = map(bytes.fromhex, (k, iv, p, a, c, t))
    assert gcm.model_raw(k, iv, a, p) == (c, t)
    assert gcm.model_raw(k, iv, a, c, t)[0] == p
    with pytest.raises(IntegrityError):
        gcm.model_raw(k, iv, a, c, bytes([t[0] ^ 1]) + t[1:])


def test_model_raw_random_lengths_match_cryptography():
    rng = random.Random(3)
    for _ in range(20):
        n, al = rng.randrange(0, 5000), rng.randrange(0, 80)
        k, iv, p, a = os.urandom(32), os.urandom(12), os.urandom(n), os.urandom(al)
        ct, tag = gcm.model_raw(k, iv, a, p)
        assert ct + tag == AESGCM(k).encrypt(iv, p, a or None)


@pytest.mark.parametrize("path", ["model", "openssl"])
def test_tamper_reorder_truncate_replay_wrong_key_fail(path):
    n, chunk = 3 * 4096 + 100, 4096
    k, p, ident = os.urandom(32), os.urandom(n), _ident()
    wire = gcm.model_encrypt(k, ident, p, chunk)

    def dec(key, idt, w, nbytes=n):
        if path == "model":
            return gcm.model_decrypt(key, idt, w, nbytes, chunk)
        out = bytearray(nbytes)
        gcm.cpu_decrypt_into(key, idt, w, out, chunk)
        return bytes(out)

    assert dec(k, ident, wire) == p
    cases = tampered(wire, n, chunk)
    for name, w in cases.items():
        with pytest.raises(IntegrityError):
            dec(k, ident, w)
    with pytest.raises(IntegrityError):  # wrong key
        dec(os.urandom(32), ident, wire)
    with pytest.raises(IntegrityError):  # replayed under another message identity (e.g. a later step)
        dec(k, Ident(ident.prefix[:-1] + bytes([ident.prefix[-1] ^ 1]), ident.id), wire)
    with pytest.raises(IntegrityError):  # same nonce, another message id
        dec(k, Ident(ident.prefix, bytes(32)), wire)
    truncated = wire[:2 * chunk] + wire[gcm.tags_offset(n):gcm.tags_offset(n) + 32]
    with pytest.raises(IntegrityError):  # the receiver expects n bytes
        dec(k, ident, truncated)
    with pytest.raises(IntegrityError):  # cut to a shorter message: its length is in every chunk's AAD
        dec(k, ident, truncated, 2 * chunk)


def test_failed_chunks_are_zeroed_not_released():
    n, chunk = 4 * 4096, 4096
    k, p, ident = os.urandom(32), os.urandom(n), _ident()
    wire = bytearray(gcm.cpu_encrypt(k, ident, p, chunk))
    wire[4096 + 7] ^= 1  # chunk 1
    out = bytearray(b"\xaa" * n)
    assert gcm.cpu_decrypt_chunks(k, ident, wire, out, chunk) == [1]
    assert out[4096:8192] == bytes(4096) and out[:4096] == p[:4096] and out[8192:] == p[8192:]


def test_chunk_size_is_a_function_of_length_only():
    assert gcm.chunk_for(0) == gcm.MIN_CHUNK
    assert gcm.chunk_for(1 << 30) == gcm.MAX_CHUNK
    for n in (1 << 20, 10 << 20, 100 << 20):
        c = gcm.chunk_for(n)
        assert gcm.MIN_CHUNK <= c <= gcm.MAX_CHUNK and c % 16 == 0
        assert gcm.nchunks(n, c) <= 2 * gcm.TARGET_CHUNKS or c == gcm.MAX_CHUNK


def test_hkdf_rfc5869_case1():
    okm = keys.hkdf(bytes([0x0B] * 22), bytes(range(13)), bytes(range(0xF0, 0xFA)), 42)
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                         "34007208d5b887185865")


def test_key_providers(tmp_path, monkeypatch):
    secret = os.urandom(32)
    f = tmp_path / "key"
    f.write_text(secret.hex() + "\n")
    f.chmod(0o600)
    assert keys.FileKey(f).secret() == secret
    f.chmod(0o644)
    with pytest.raises(keys.KeyMaterialError, match="readable by group or others"):
        keys.FileKey(f).secret()
    f.chmod(0o600)
    f.write_text("abcd")
    with pytest.raises(keys.KeyMaterialError, match="expected 64 hex digits"):
        keys.FileKey(f).secret()
    with pytest.raises(keys.KeyMaterialError, match="No such file"):
        keys.FileKey(tmp_path / "missing").secret()
    with pytest.raises(keys.KeyMaterialError, match="not a regular file"):
        keys.FileKey(tmp_path).secret()
    raw = tmp_path / "raw"
    raw.write_bytes(secret)
    raw.chmod(0o600)
    assert keys.FileKey(raw, raw=True).secret() == secret
    with pytest.raises(keys.KeyMaterialError, match="64 hex digits"):  # raw bytes only when the caller says so
        keys.FileKey(raw).secret()
    monkeypatch.delenv(keys.ENV_VAR, raising=False)
    monkeypatch.delenv("CCBRIDGE_KEY_FILE", raising=False)
    with pytest.raises(keys.KeyMaterialError, match="CCBRIDGE_KEY"):
        keys.default_provider()
    monkeypatch.setenv(keys.ENV_VAR, secret.hex())
    assert keys.default_provider().secret() == secret
    monkeypatch.setenv(keys.ENV_VAR, "zz" * 32)
    with pytest.raises(keys.KeyMaterialError, match="hex"):
        keys.EnvKey().secret()


WEAK = {
    "all zero": bytes(32),
    "one repeated byte": b"a" * 32,
    "a 32-character password": b"correct horse battery staple!!42",
    "32 hex digits read as ASCII": os.urandom(16).hex().encode(),
    "a counting pattern": bytes(range(32)),
    "a short period": bytes([1, 2, 3, 4, 5, 6, 7, 8] * 4),
    "two equal halves": bytes.fromhex("8f3a91c2d45e67b0193f2ac8e57d0b64") * 2,
    "a counting run after random bytes": bytes.fromhex("9c1e77a05b3fd2686e41c8") + bytes(range(40, 61)),
    "bytes rising by two": bytes(range(0, 64, 2)),
    "a password and its newline": b"correct-horse-battery-staple-42\n",
    "text with a tab": b"my\tsecret passphrase for the job",
    "a UTF-8 passphrase": "geheimes Passwort für Jöbs!!!".encode(),
}


PACKAGE = Path(keys.__file__).resolve().parents[1]  # src/ccbridge, wherever the checkout lives


def in_package(filename: str) -> bool:
    """A frame of ccbridge's own code: under the installed package's folder, not any folder named ccbridge
    (a checkout cloned as `ccbridge/` holds the tests too)."""
    return Path(filename).resolve().is_relative_to(PACKAGE)


def test_frame_filter_sees_the_package_not_a_folder_name(tmp_path):
    assert in_package(keys.__file__) and in_package(gcm.__file__)
    assert not in_package(__file__)  # this test is not library code, whatever its checkout is called
    assert not in_package(str(tmp_path / "ccbridge" / "tests" / "test_x.py"))
    assert not in_package(str(tmp_path / "ccbridge" / "src" / "ccbridge" / "keys.py"))


@pytest.mark.parametrize("what", list(WEAK))
def test_weak_or_ambiguous_key_material_is_refused_and_never_quoted(what, tmp_path, monkeypatch):
    m = WEAK[what]
    f = tmp_path / "k"
    f.write_bytes(m)
    f.chmod(0o600)
    hexf = tmp_path / "khex"
    hexf.write_text(m.hex())
    hexf.chmod(0o600)
    monkeypatch.setenv("CCB_TEST_KEY", m.hex())
    attempts = [lambda: keys.StaticKey(m), lambda: keys.StaticKey(m.hex()), lambda: keys.FileKey(f).secret(),
                lambda: keys.FileKey(f, raw=True).secret(), lambda: keys.FileKey(hexf).secret(),
                lambda: keys.EnvKey("CCB_TEST_KEY").secret()]
    if all(0x20 <= b < 0x7F for b in m):  # the text itself as $VAR (a password typed into the variable)
        monkeypatch.setenv("CCB_TEST_PW", m.decode())
        attempts.append(lambda: keys.EnvKey("CCB_TEST_PW").secret())
    for attempt in attempts:
        with pytest.raises(keys.KeyMaterialError) as e:
            attempt()
        msg = str(e.value)
        for form in (m.hex(), m.hex().upper(), m.decode("latin-1"), repr(m)):
            assert form not in msg, f"{what}: the error quotes the key material"
        # nor do the locals of ccbridge's frames it passed through (a traceback printed with its locals)
        tb = e.tb
        while tb is not None:
            for name, v in tb.tb_frame.f_locals.items() if in_package(tb.tb_frame.f_code.co_filename) else ():
                if isinstance(v, (bytes, bytearray, str)) and len(v) >= 16:
                    assert bytes(v.encode("latin-1") if isinstance(v, str) else v) not in (m, m.hex().encode()), \
                        f"{what}: the material is in local {name!r} of {tb.tb_frame.f_code.co_name}"
            tb = tb.tb_next


def test_key_material_never_reaches_reprs_env_stamp_or_reports(monkeypatch):
    from ccbridge import env

    secret = os.urandom(32)
    monkeypatch.setenv(keys.ENV_VAR, secret.hex())
    for prov in (keys.StaticKey(secret), keys.EnvKey()):
        assert secret.hex() not in repr(prov) and secret.hex() not in str(prov)
    stamp = repr(env.stamp())
    assert secret.hex() not in stamp.lower()


def test_random_keys_pass_the_strength_check():
    for _ in range(2000):
        k = os.urandom(32)
        assert keys.StaticKey(k).secret() == k and keys.StaticKey(k.hex()).secret() == k


# ---- the session handshake (secure/handshake.py) ----

def test_handshake_agrees_only_on_one_transcript():
    from ccbridge.secure import handshake as hs

    secret = os.urandom(32)
    ident = hs.identity([0, 1, 2], "job")
    contribs = [hs.fresh() for _ in range(3)]
    session = hs.transcript(ident, contribs)
    confirms = [hs.confirmation(secret, session, r) for r in range(3)]
    for me in range(3):
        hs.verify(confirms, confirms, me)
    # a replayed contribution, another group's ranks or name: refused, naming who
    stale = hs.transcript(ident, [hs.fresh()] + contribs[1:])
    for other in (stale, hs.transcript(hs.identity([0, 1, 3], "job"), contribs),
                  hs.transcript(hs.identity([0, 1, 2], "job2"), contribs)):
        assert other != session
        theirs = [hs.confirmation(secret, other, r) for r in range(3)]
        with pytest.raises(hs.HandshakeError, match=r"rank\(s\) 0, 2 does not match"):
            hs.verify(confirms, [theirs[0], confirms[1], theirs[2]], 1)
    with pytest.raises(hs.HandshakeError):  # the same transcript under another key
        hs.verify(confirms, [hs.confirmation(os.urandom(32), session, r) for r in range(3)], 0)
    with pytest.raises(hs.HandshakeError):  # a rank's confirmation reflected as another's
        hs.verify(confirms, [confirms[0], confirms[0], confirms[2]], 0)
    with pytest.raises(hs.HandshakeError, match="wrong length"):
        hs.transcript(ident, [contribs[0][:-1]] + contribs[1:])
    assert len({hs.transcript(ident, [hs.fresh() for _ in range(3)]) for _ in range(100)}) == 100


def test_derived_keys_differ_by_session_epoch_and_direction():
    p = keys.StaticKey(os.urandom(32))
    s1, s2 = os.urandom(32), os.urandom(32)
    ks = {p.group_key(s1, 0), p.group_key(s1, 1), p.group_key(s2, 0), p.p2p_key(s1, 0, 1, 0), p.p2p_key(s1, 1, 0, 0),
          p.p2p_key(s1, 0, 1, 1)}
    assert len(ks) == 6 and all(len(k) == 32 for k in ks)


def test_nonce_fields_are_range_checked():
    assert keys.prefix(3, 7, 1) == bytes([0, 3, 0, 0, 0, 7, 0, 1])
    for bad in [(keys.MAX_RANKS, 0, 0), (0, keys.MAX_SEQ, 0), (0, 0, keys.MAX_STEPS), (-1, 0, 0)]:
        with pytest.raises(ValueError):
            keys.prefix(*bad)


# ---- collectives on Gloo, CPU ranks ----

torch = pytest.importorskip("torch", reason="the collectives need torch")


@pytest.mark.parametrize("n", [2, 3])
def test_gloo_cpu_collectives_match_plaintext(n):
    import secure_workers

    secure_workers.spawn(n, "gloo", "cpu", ["correctness", "ddp"])


@pytest.mark.parametrize("n", [2, 3])
def test_gloo_cpu_integrity_sessions_rotation(n):
    """Bit flips, replays within and across sessions, reordered chunks, a wrong key: every rank raises."""
    import secure_workers

    secure_workers.spawn(n, "gloo", "cpu", ["integrity", "sessions", "rotation"])


def test_gloo_cpu_no_key_nonce_pair_twice_across_sessions_and_restarts(tmp_path):
    """Two runs of the same job (a restart), each with two sessions: every
    (key, nonce) pair and every key is used in one run only."""
    import secure_workers

    runs = []
    for run in range(2):
        log = tmp_path / f"run{run}.log"
        secure_workers.spawn(2, "gloo", "cpu", ["transport"], env={"CCB_KEYLOG": str(log)})
        runs.append([tuple(line.split()) for line in log.read_text().splitlines()])
    assert all(len(r) >= 20 for r in runs), "too few encryptions logged"
    assert not set(runs[0]) & set(runs[1]), "a (key, nonce) pair was used again after a restart"
    assert not {k for k, _ in runs[0]} & {k for k, _ in runs[1]}, "a restarted job reused a key"


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("attack", ["drop", "duplicate", "truncate", "reorder", "dead_rank"])
def test_gloo_cpu_every_rank_detects_wire_attacks_within_a_deadline(attack, n, tmp_path):
    import secure_workers

    secure_workers.run_attack(n, "gloo", "cpu", attack, tmp_path)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_collectives_bench_checks_each_result_against_the_exact_value(op, monkeypatch):
    # the bench's `#wrong` columns count elements differing from a result computed without any
    # collective; three Gloo ranks on the CPU (uneven splits) must show none
    from ccbridge.secure import bench

    monkeypatch.setenv("CCBRIDGE_PROGRESS", "0")
    res = bench.launch(bench._collectives_rank, 3, op, [8, 4096 + 4, 1 << 20], "float", 1, 0, "gloo", False)
    assert [r["wrong_plain"] for r in res["rows"]] == [0, 0, 0]
    # and the reference is not trivially satisfied: it is every rank's data, not one rank's
    import torch

    want = bench._expected(op, 4096, 3, torch.float32, torch.device("cpu"), 1)
    own = bench._buffers(op, 4096, 3, torch.float32, torch.device("cpu"), 1)[0][: want.numel()]
    assert want.numel() and not torch.equal(want, own)


@pytest.mark.parametrize("named", [None, "", "file"])
def test_launch_draws_a_benchmark_key_only_where_the_user_named_none(named, monkeypatch, tmp_path):
    # a $CCBRIDGE_KEY_FILE was overridden by the ranks' random $CCBRIDGE_KEY (which wins over the file), so a key
    # file the real job would refuse passed here; an empty $CCBRIDGE_KEY is unset, as the net plugin reads it
    from ccbridge.secure import bench

    got = {}
    monkeypatch.setattr(bench.ranks, "run", lambda n, *a, env, **k: got.update(env) or [None])
    for var in ("RANK", "WORLD_SIZE", "CCBRIDGE_KEY", "CCBRIDGE_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    if named == "file":
        monkeypatch.setenv("CCBRIDGE_KEY_FILE", str(tmp_path / "key"))
    elif named == "":
        monkeypatch.setenv("CCBRIDGE_KEY", "")
    bench.launch(print, 2)
    assert ("CCBRIDGE_KEY" in got) == (named != "file")
    assert named == "file" or len(bytes.fromhex(got["CCBRIDGE_KEY"])) == 32


@pytest.mark.parametrize("cmd", [["collectives", "--backend", "gloo", "-g", "2", "-e", "1K"],
                                 ["bench", "ddp", "--models", "resnet50"]])
def test_collectives_and_ddp_refuse_a_named_key_the_ranks_would_refuse_in_one_line(cmd, tmp_path):
    import subprocess
    import sys

    f = tmp_path / "key"
    f.write_text(os.urandom(32).hex() + "\n")
    f.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k != "CCBRIDGE_KEY"} | {"CCBRIDGE_KEY_FILE": str(f)}
    p = subprocess.run([sys.executable, "-m", "ccbridge", *cmd], capture_output=True, text=True, timeout=120, env=env)
    want = f"ccbridge {cmd[0] if cmd[0] != 'bench' else 'bench ddp'}: key file {f} is readable by group or others " \
           f"(mode 644); chmod 600 it\n"
    assert (p.returncode, p.stderr) == (2, want)


def test_ranks_that_do_not_fit_the_machine_are_refused_before_any_starts(monkeypatch):
    """NCCL wants a GPU a rank, Gloo's ranks at most RANKS_PER_CPU a CPU, the ddp bench one GPU a rank, the largest
    size's buffers the memory they go to: each a UsageError (the CLI's one line, exit 2) before a rank starts."""
    import torch

    from ccbridge.errors import UsageError
    from ccbridge.secure import bench

    started = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: started.append(a) or {"rows": []})
    monkeypatch.setattr(bench, "_ddp", lambda models, nproc, *a: started.append(nproc) or {"nranks": nproc,
                                                                                              "rows": []})
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 80 << 30}))
    with pytest.raises(UsageError, match="3 ranks: NCCL needs a GPU for each and this machine has 2"):
        bench._collectives("all_reduce", 8, 8, 2, "float", 1, 0, 3, "nccl", "default", None)
    bench._collectives("all_reduce", 8, 8, 2, "float", 1, 0, 3, "gloo", "default", None)  # Gloo shares the GPUs
    with pytest.raises(UsageError, match="5 ranks: at most 4 a CPU, and this process may use 1 CPU$"):
        bench._collectives("all_reduce", 8, 8, 2, "float", 1, 0, 5, "gloo", "default", None)  # GPUs or none
    with pytest.raises(UsageError, match=r"size 16.0 GiB: a rank needs 144.0 GiB \(~9 buffers of it\), a GPU holds "
                                         r"80 GiB"):
        bench._collectives("all_reduce", 8, 16 << 30, 2, "float", 1, 0, 2, "nccl", "default", None)
    with pytest.raises(UsageError, match="--ngpus 4: the ddp bench runs 2 to this machine's 2 GPUs"):
        bench.ddp(["resnet50"], [2, 4], [25])
    assert len(started) == 1  # the Gloo collectives alone; the ddp bench checked every size before the first
    started.clear()
    assert bench.ddp(["resnet50"], None, [25]).settings["ngpus"] == [2] and started == [2]  # the default that fits
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match="the ddp bench runs a rank on each of 2 or more GPUs, and this machine has 1"):
        bench.ddp(["resnet50"], None, [25])
    started.clear()
    bench._collectives("all_reduce", 8, 8, 2, "float", 1, 0, None, "gloo", "default", None)  # one GPU: Gloo on 2
    assert started[0][1] == 2
    # CPU ranks: every one of this host's in this machine's memory, with torch's own
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(bench.hostmem, "available_bytes", lambda: 20 << 30)
    with pytest.raises(UsageError, match=r"size 2.0 GiB: 2 ranks x 18.5 GiB \(~9 buffers of it, and torch\), "
                                         r"20.0 GiB free"):
        bench._collectives("all_reduce", 8, 2 << 30, 2, "float", 1, 0, 2, "gloo", "default", None)
    with pytest.raises(UsageError, match=r"size 1.0 GiB: 2 ranks x 15.5 GiB \(~15 buffers"):  # uint8: int64 draws
        bench._collectives("all_reduce", 8, 1 << 30, 2, "uint8", 1, 0, 2, "gloo", "default", None)
    bench._collectives("all_reduce", 8, 512 << 20, 2, "float", 1, 0, 2, "gloo", "default", None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # torchrun across hosts: this host's ranks alone
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    bench._collectives("all_reduce", 8, 1 << 30, 2, "float", 1, 0, None, "gloo", "default", None)
    assert len(started) == 3
    # sizes as whole elements, each once: -b 1 -e 2 of float is one size of 4 B
    bench._collectives("all_gather", 1, 16, 2, "float", 1, 0, 2, "gloo", "default", None)
    assert started[-1][3] == [8, 16]  # (fn, nproc, op, sizes, ...): 1, 2, 4 and 8 B gather 2 floats; 16 B 4


@pytest.mark.parametrize("progress", ["1", "0"])
def test_collectives_prints_each_row_once_after_its_header(progress, tmp_path):
    """nccl-tests' way: the header, then each size's row as it is measured, once; without progress, the table at
    the end."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "ccbridge", "collectives", "--backend", "gloo", "-g", "2", "-e", "1K",
                        "-f", "32", "-n", "1", "-w", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CCBRIDGE_PROGRESS": progress})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    sizes = [ln.split()[0] for ln in lines if ln.split() and ln.split()[0].isdigit()]
    assert lines[0].startswith("# ccbridge collectives: all_reduce on 2 ") and sizes == ["8", "256"], lines
    assert not [ln for ln in lines if ln != ln.rstrip()]  # no trailing spaces (the header's centred titles had)


def test_a_secure_group_takes_torchs_reduce_ops_as_well_as_their_names():
    """A SecureGroup stands in for torch.distributed: all_reduce(t, op=dist.ReduceOp.SUM) must not be refused as
    `not RedOpType.SUM` (a stranger's review, session 24); any other reduction is refused, named."""
    import torch.distributed as dist

    from ccbridge.secure import tensorops

    assert [tensorops.reduce_op(op, "all_reduce") for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, "sum", "avg")] == \
        ["sum", "avg", "sum", "avg"]
    assert tensorops.reduce_op(dist.ReduceOp(dist.ReduceOp.SUM), "all_reduce") == "sum"
    for bad in (dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT, "max", [1]):
        with pytest.raises(NotImplementedError, match="encrypted reduce_scatter supports sum and avg, not"):
            tensorops.reduce_op(bad, "reduce_scatter")
