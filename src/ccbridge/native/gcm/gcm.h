/*
 * AES-256-GCM arithmetic shared by the CUDA kernels (gcm.cu) and their host
 * model (gcm_host.c), so the CPU-only CI checks the kernels' math against
 * OpenSSL; at the end, the host side's C interface.
 *
 * Chunked format (one message = nbytes split into chunks of chunk_bytes, each
 * chunk an ordinary AES-256-GCM message, so any GCM implementation can check it):
 *   nonce(c) = prefix[8] || be32(c)
 *   aad(c)   = id[32] || le64(nbytes) || le32(c) || le32(chunk_bytes)
 * Chunks are tagged independently so they authenticate in parallel; the AAD
 * binds each chunk to its message, position and the message's length, so
 * chunks can be neither moved, reordered nor cut off.
 *
 * Inside a chunk GHASH is spread over GCM_THREADS threads: thread t takes
 * blocks t, t+T, t+2T, ... and runs Horner with H^T; its sum is then lifted by
 * H^(m+1-last) and all threads' sums XOR together (GHASH is linear). The
 * AAD's share needs H^(m+2), which the host computes per launch.
 *
 * Blocks are held as big-endian 128-bit values (hi, lo): GCM's bit order is
 * reflected, and in this representation carry-less products follow the Intel
 * CLMUL white paper (Gueron and Kounavis): product, shift left by one, reduce.
 * The GPU has no carry-less multiply: clmul32 uses integer multiplies on
 * operands with holes (one bit in four), whose sums never carry into the next
 * live bit (at most 8 terms meet in a 4-bit slot).
 */
#ifndef CCB_GCM_H
#define CCB_GCM_H
#include <stdint.h>

#ifdef __CUDACC__
#define GCM_FN __host__ __device__ static __forceinline__
#else
#define GCM_FN static inline
#endif

#define GCM_THREADS 256
#define GCM_ID_BYTES 32
#define GCM_PREFIX_BYTES 8
#define GCM_TAG_BYTES 16

typedef struct {
    uint64_t hi, lo;
} gcm_u128;

/* All a key needs on the device; built on the host (ccb_gcm_key). */
typedef struct {
    uint32_t rk[60];                  /* AES-256 round keys, big-endian words */
    uint32_t te0[256];                /* T-table; Te1..3 are its rotations, the S-box a byte of it */
    gcm_u128 hpow[GCM_THREADS + 1];   /* hpow[k] = H^(k+1) */
} gcm_key;

/* One message for one launch. A "raw" message is plain AES-GCM with a 96-bit
 * nonce (prefix || ctr_base) and any AAD, whose GHASH the host precomputed:
 * one chunk, for checking the kernels on published test vectors. */
typedef struct {
    uint64_t nbytes;
    uint32_t chunk_bytes, nchunks;
    uint8_t prefix[GCM_PREFIX_BYTES];
    uint8_t id[GCM_ID_BYTES];
    gcm_u128 hm_full, hm_last; /* H^(m+2) for a full chunk and for the last one */
    uint32_t raw, ctr_base;
    uint64_t aad_bits;
    gcm_u128 aad_hash;         /* raw: Horner of the AAD blocks with H */
} gcm_msg;

GCM_FN uint32_t gcm_bswap32(uint32_t x) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, 0, 0x0123);
#else
    return __builtin_bswap32(x);
#endif
}

GCM_FN uint32_t gcm_ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

GCM_FN uint64_t gcm_clmul32(uint32_t x, uint32_t y) {
    uint32_t x0 = x & 0x11111111u, x1 = x & 0x22222222u, x2 = x & 0x44444444u, x3 = x & 0x88888888u;
    uint32_t y0 = y & 0x11111111u, y1 = y & 0x22222222u, y2 = y & 0x44444444u, y3 = y & 0x88888888u;
#define M_(a, b) ((uint64_t)(a) * (uint64_t)(b))
    uint64_t z0 = M_(x0, y0) ^ M_(x1, y3) ^ M_(x2, y2) ^ M_(x3, y1);
    uint64_t z1 = M_(x0, y1) ^ M_(x1, y0) ^ M_(x2, y3) ^ M_(x3, y2);
    uint64_t z2 = M_(x0, y2) ^ M_(x1, y1) ^ M_(x2, y0) ^ M_(x3, y3);
    uint64_t z3 = M_(x0, y3) ^ M_(x1, y2) ^ M_(x2, y1) ^ M_(x3, y0);
#undef M_
    return (z0 & 0x1111111111111111ull) | (z1 & 0x2222222222222222ull) | (z2 & 0x4444444444444444ull) |
           (z3 & 0x8888888888888888ull);
}

/* 64x64 -> 128 carry-less, Karatsuba over 32-bit halves. */
GCM_FN gcm_u128 gcm_clmul64(uint64_t a, uint64_t b) {
    uint32_t a0 = (uint32_t)a, a1 = (uint32_t)(a >> 32), b0 = (uint32_t)b, b1 = (uint32_t)(b >> 32);
    uint64_t l = gcm_clmul32(a0, b0), h = gcm_clmul32(a1, b1);
    uint64_t m = gcm_clmul32(a0 ^ a1, b0 ^ b1) ^ l ^ h;
    gcm_u128 r = {h ^ (m >> 32), l ^ (m << 32)};
    return r;
}

/* x * y in GF(2^128) with GCM's polynomial and bit order. */
GCM_FN gcm_u128 gcm_mul(gcm_u128 x, gcm_u128 y) {
    gcm_u128 L = gcm_clmul64(x.lo, y.lo), H = gcm_clmul64(x.hi, y.hi);
    gcm_u128 M = gcm_clmul64(x.lo ^ x.hi, y.lo ^ y.hi);
    M.hi ^= L.hi ^ H.hi;
    M.lo ^= L.lo ^ H.lo;
    uint64_t X0 = L.lo, X1 = L.hi ^ M.lo, X2 = H.lo ^ M.hi, X3 = H.hi;
    /* the product of reflected values is the reflected product shifted right by one */
    X3 = (X3 << 1) | (X2 >> 63);
    X2 = (X2 << 1) | (X1 >> 63);
    X1 = (X1 << 1) | (X0 >> 63);
    X0 <<= 1;
    /* reduce modulo x^128 + x^7 + x^2 + x + 1 */
    uint64_t D = X1 ^ (X0 << 63) ^ (X0 << 62) ^ (X0 << 57);
    uint64_t H0 = X0 ^ ((X0 >> 1) | (D << 63)) ^ ((X0 >> 2) | (D << 62)) ^ ((X0 >> 7) | (D << 57));
    uint64_t H1 = D ^ (D >> 1) ^ (D >> 2) ^ (D >> 7);
    gcm_u128 r = {X3 ^ H1, X2 ^ H0};
    return r;
}

GCM_FN gcm_u128 gcm_xor(gcm_u128 a, gcm_u128 b) {
    gcm_u128 r = {a.hi ^ b.hi, a.lo ^ b.lo};
    return r;
}

GCM_FN gcm_u128 gcm_from_words(const uint32_t w[4]) {
    gcm_u128 r = {((uint64_t)w[0] << 32) | w[1], ((uint64_t)w[2] << 32) | w[3]};
    return r;
}

GCM_FN gcm_u128 gcm_load_be(const uint8_t *p) {
    uint64_t hi = 0, lo = 0;
    for (int i = 0; i < 8; i++) {
        hi = (hi << 8) | p[i];
        lo = (lo << 8) | p[8 + i];
    }
    gcm_u128 r = {hi, lo};
    return r;
}

GCM_FN void gcm_store_be(uint8_t *p, gcm_u128 v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v.hi >> (56 - 8 * i));
        p[8 + i] = (uint8_t)(v.lo >> (56 - 8 * i));
    }
}

/* AES-256 of one block (big-endian words, in place). The T-table is read as
 * T[(x << shift) | lane]: the kernels keep one copy per shared-memory bank
 * (shift 5, lane = lane id) so a warp's lookups never conflict; the host reads
 * it plainly (shift 0, lane 0). */
GCM_FN void gcm_aes(const uint32_t *rk, const uint32_t *T, int shift, uint32_t lane, uint32_t s[4]) {
#define TE(x) T[((uint32_t)(x) << shift) | lane]
    uint32_t s0 = s[0] ^ rk[0], s1 = s[1] ^ rk[1], s2 = s[2] ^ rk[2], s3 = s[3] ^ rk[3];
    for (int r = 1; r < 14; r++) {
        const uint32_t *k = rk + 4 * r;
        uint32_t t0 = TE(s0 >> 24) ^ gcm_ror(TE((s1 >> 16) & 0xff), 8) ^ gcm_ror(TE((s2 >> 8) & 0xff), 16) ^
                      gcm_ror(TE(s3 & 0xff), 24) ^ k[0];
        uint32_t t1 = TE(s1 >> 24) ^ gcm_ror(TE((s2 >> 16) & 0xff), 8) ^ gcm_ror(TE((s3 >> 8) & 0xff), 16) ^
                      gcm_ror(TE(s0 & 0xff), 24) ^ k[1];
        uint32_t t2 = TE(s2 >> 24) ^ gcm_ror(TE((s3 >> 16) & 0xff), 8) ^ gcm_ror(TE((s0 >> 8) & 0xff), 16) ^
                      gcm_ror(TE(s1 & 0xff), 24) ^ k[2];
        uint32_t t3 = TE(s3 >> 24) ^ gcm_ror(TE((s0 >> 16) & 0xff), 8) ^ gcm_ror(TE((s1 >> 8) & 0xff), 16) ^
                      gcm_ror(TE(s2 & 0xff), 24) ^ k[3];
        s0 = t0, s1 = t1, s2 = t2, s3 = t3;
    }
    /* last round: S-box only; Te0[x] = (2s, s, s, 3s), so s is any middle byte */
#define SB(a, b, c, d) (((TE(a) << 8) & 0xff000000u) ^ (TE(b) & 0x00ff0000u) ^ (TE(c) & 0x0000ff00u) ^ ((TE(d) >> 8) & 0xffu))
    s[0] = SB(s0 >> 24, (s1 >> 16) & 0xff, (s2 >> 8) & 0xff, s3 & 0xff) ^ rk[56];
    s[1] = SB(s1 >> 24, (s2 >> 16) & 0xff, (s3 >> 8) & 0xff, s0 & 0xff) ^ rk[57];
    s[2] = SB(s2 >> 24, (s3 >> 16) & 0xff, (s0 >> 8) & 0xff, s1 & 0xff) ^ rk[58];
    s[3] = SB(s3 >> 24, (s0 >> 16) & 0xff, (s1 >> 8) & 0xff, s2 & 0xff) ^ rk[59];
#undef SB
#undef TE
}

/* The counter block of block i of chunk c (GCM: J0 = nonce || 1, data from J0 + 1). */
GCM_FN void gcm_counter(const gcm_msg *m, uint32_t c, uint32_t ctr, uint32_t s[4]) {
    const uint8_t *p = m->prefix;
    s[0] = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    s[1] = ((uint32_t)p[4] << 24) | ((uint32_t)p[5] << 16) | ((uint32_t)p[6] << 8) | p[7];
    s[2] = m->ctr_base + c;
    s[3] = ctr;
}

GCM_FN uint64_t gcm_chunk_len(const gcm_msg *m, uint32_t c) {
    uint64_t off = (uint64_t)c * m->chunk_bytes;
    uint64_t left = m->nbytes > off ? m->nbytes - off : 0;
    return left < m->chunk_bytes ? left : m->chunk_bytes;
}

/* A thread's GHASH share, lifted to its place: acc * H^(m+1-last). */
GCM_FN gcm_u128 gcm_lift(const gcm_key *k, gcm_u128 acc, uint32_t m, int64_t last) {
    gcm_u128 z = {0, 0};
    return last < 0 ? z : gcm_mul(acc, k->hpow[m - (uint32_t)last]);
}

/* The tag of chunk c, given the XOR of the threads' lifted shares (S) and E_K(J0). */
GCM_FN gcm_u128 gcm_chunk_tag(const gcm_key *k, const gcm_msg *m, uint32_t c, gcm_u128 S, const uint32_t ej0[4]) {
    uint8_t tail[16];
    uint64_t len = gcm_chunk_len(m, c);
    for (int i = 0; i < 8; i++) tail[i] = (uint8_t)(m->nbytes >> (8 * i));
    for (int i = 0; i < 4; i++) tail[8 + i] = (uint8_t)(c >> (8 * i));
    for (int i = 0; i < 4; i++) tail[12 + i] = (uint8_t)(m->chunk_bytes >> (8 * i));
    gcm_u128 H = k->hpow[0], a = m->aad_hash;
    if (!m->raw) {
        a = gcm_load_be(m->id);
        a = gcm_xor(gcm_mul(a, H), gcm_load_be(m->id + 16));
        a = gcm_xor(gcm_mul(a, H), gcm_load_be(tail));
    }
    S = gcm_xor(S, gcm_mul(a, c + 1 == m->nchunks ? m->hm_last : m->hm_full));
    gcm_u128 L = {m->raw ? m->aad_bits : (uint64_t)(GCM_ID_BYTES + 16) * 8, len * 8};
    S = gcm_xor(S, gcm_mul(L, H));
    return gcm_xor(S, gcm_from_words(ej0));
}

#ifndef __CUDACC__
/*
 * The host side's C interface (gcm_host.c, part of ccbridge._native; not
 * seen by the kernels): key and message setup, the sequential model of the
 * kernels, and their launches. ccbridge/bindings/gcm.py declares exactly
 * these through ctypes (tests/test_bindings_twin.py holds the two to each
 * other); the reason of a failed call is in ccb_error() (core/core.h).
 * gcm_key and gcm_msg travel as opaque buffers of ccb_gcm_key_size() and
 * ccb_gcm_msg_size() bytes.
 */
#include "../common/cudrv.h"

#include <stddef.h>

CCB_API size_t ccb_gcm_key_size(void);
CCB_API size_t ccb_gcm_msg_size(void);
/* The key schedule (round keys, T-table, powers of H) of a 32-byte key. */
CCB_API int ccb_gcm_key(const uint8_t key[32], gcm_key *k);
/* One chunked message; -1 with ccb_error() on a chunk size the format cannot take. */
CCB_API int ccb_gcm_msg(const gcm_key *k, gcm_msg *m, uint64_t nbytes, uint32_t chunk_bytes, const uint8_t prefix[8],
                        const uint8_t id[32]);
/* One plain AES-GCM message (96-bit nonce, any AAD), for the published test vectors. */
CCB_API int ccb_gcm_raw_msg(const gcm_key *k, gcm_msg *m, uint64_t nbytes, const uint8_t iv[12], const uint8_t *aad,
                            uint64_t aad_len);
/* The kernels' computation on the CPU: encrypt, or verify+decrypt (the count of failed chunks). */
CCB_API int ccb_gcm_model(const gcm_key *k, const gcm_msg *m, int decrypt, const uint8_t *in, uint8_t *out,
                          uint8_t *tags);
/* Load the kernels (a fatbin image) into the device's primary context once. */
CCB_API int ccb_gcm_load(int device, const void *image);
/* Encrypt (tags written) or verify+decrypt (failures counted into *fail, the failed chunks' output zeroed);
 * key is the device copy of gcm_key. */
CCB_API int ccb_gcm_crypt(unsigned grid, CUstream stream, CUdeviceptr key, const gcm_msg *m, int decrypt,
                          CUdeviceptr in, CUdeviceptr out, CUdeviceptr tags, CUdeviceptr fail);
/* One reduce-scatter hop: verify+decrypt (min, tin), add local, write the sum to plain (if any) and encrypt
 * it as mout (if out): one pass over the bytes. */
CCB_API int ccb_gcm_reduce(unsigned grid, CUstream stream, CUdeviceptr key, const gcm_msg *min, const gcm_msg *mout,
                           int dtype, CUdeviceptr in, CUdeviceptr tin, CUdeviceptr local, CUdeviceptr plain,
                           CUdeviceptr out, CUdeviceptr tout, CUdeviceptr fail);
#endif

#endif
