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
 * live bit (at most 8 terms meet in a 4-bit slot). That serves the few
 * multiplies per chunk; the per-block one (by the fixed H^T) goes by table
 * (gcm_mul_tab), on blocks kept in memory order.
 */
#ifndef CCB_GCM_H
#define CCB_GCM_H
#include <stdint.h>
#include <string.h>

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

/* All a key needs on the device; built on the host (ccb_gcm_key). New fields go at the end: kernels built from
 * an older gcm.h still run on it (bench/gcm_variants.py --legacy). */
typedef struct {
    uint32_t rk[60];                  /* AES-256 round keys, big-endian words */
    uint32_t te0[256];                /* T-table; Te1..3 are its rotations, the S-box a byte of it */
    gcm_u128 hpow[GCM_THREADS + 1];   /* hpow[k] = H^(k+1) */
    uint8_t ghtab[32 * 256];          /* x -> x * hpow[GCM_THREADS - 1] by nibbles (gcm_mul_tab) */
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
    uint32_t rk[60];           /* the key's round keys: a kernel parameter, so rounds read them as constants */
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

/* __byte_perm: byte i of the result is byte (sel >> 4i) & 7 of b:a (a's bytes 0-3, b's 4-7). */
GCM_FN uint32_t gcm_perm(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, sel);
#else
    uint64_t ab = ((uint64_t)b << 32) | a;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((ab >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
#endif
}

/* Byte k (0 = least significant) of x: one byte permute on the GPU (ptxas keeps it one instruction, where a
 * shift and a mask become two once scaled into an address). */
GCM_FN uint32_t gcm_byte(uint32_t x, int k) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, 0, 0x4440 + k);
#else
    return (x >> (8 * k)) & 0xff;
#endif
}

#ifdef __CUDA_ARCH__
#define GCM_UNROLL _Pragma("unroll")
#else
#define GCM_UNROLL
#endif

/* AES-256 by T-table. The table is read through gcm_te: entry x at byte offset x << S of T. The kernels keep
 * one copy per shared-memory bank (S = 7, T offset by 4 * lane id) so a warp's lookups never conflict; the host
 * reads one plain copy (S = 2). Te0[x] = (2s, s, s, 3s) (s = S-box of x); Te1..3 are its rotations. State words
 * are big-endian; the last round writes the keystream in memory order (little-endian words of the block's
 * bytes), so it XORs into loaded data as it is. */
#ifdef __CUDA_ARCH__
typedef uint32_t gcm_addr; /* a shared-memory address: the kernels read their tables by explicit address */
#else
typedef const uint8_t *gcm_addr;
#endif

typedef struct {
    gcm_addr T;
    int S;
} gcm_tab;

/* T + (x << S), one multiply-add; on the GPU kept whole (asm), so a constant offset added after it folds into
 * the load instead of being reassociated into the index arithmetic. */
GCM_FN gcm_addr gcm_at(gcm_addr T, uint32_t x, int S) {
#ifdef __CUDA_ARCH__
    uint32_t a;
    asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(a) : "r"(x), "r"(1u << S), "r"(T));
    return a;
#else
    return T + ((size_t)x << S);
#endif
}

/* The kernels read the paired layout below; the host model reads Te0 plainly (and takes Te2 as its rotation). */
#if defined(__CUDA_ARCH__)
#define GCM_PAIR_DEV 1
#else
#define GCM_PAIR_DEV 0
#endif

/* The paired layout's dynamic shared memory (gcm.cu's cta_state): Te0 and Te2 = ror16(Te0) interleaved, entry x
 * of lane l's copy at x * 256 + 4l (Te0) and + 128 (Te2): 64 KiB, so an entry's address is one byte permute
 * ((x << 8) | 4l); the GHASH table; the CTA's partial sums. gcm_host.c launches with GCM_SMEM_BYTES. */
#define GCM_SMEM_TE 65536
#define GCM_SMEM_BYTES (GCM_SMEM_TE + 32 * 256 + 8 * 16 + 16)

#if GCM_PAIR_DEV
extern __shared__ __align__(16) uint8_t gcm_smem[];
#endif

/* The 32-bit word at a (shared memory in the kernels: their tables are constant once loaded), read by plain
 * loads at offsets into gcm_smem (a constant base that ptxas folds into the load). */
GCM_FN uint32_t gcm_ld32(gcm_addr a) {
#if GCM_PAIR_DEV
    return *reinterpret_cast<const uint32_t *>(gcm_smem + a);
#else
    uint32_t v;
    memcpy(&v, a, 4);
    return v;
#endif
}

/* Te0[byte k of s]; in the paired layout t.T is the lane's 4l and the address one byte permute. */
GCM_FN uint32_t gcm_te(gcm_tab t, uint32_t s, int k) {
#if GCM_PAIR_DEV
    return gcm_ld32(__byte_perm(t.T, s, 0x1100 | ((4 + k) << 4)));
#else
    return gcm_ld32(gcm_at(t.T, gcm_byte(s, k), t.S));
#endif
}

/* Te2[byte k of s] = ror16(Te0[...]): its own lookup in the paired layout, a rotation otherwise. */
GCM_FN uint32_t gcm_te2(gcm_tab t, uint32_t s, int k) {
#if GCM_PAIR_DEV
    return gcm_ld32(128 + __byte_perm(t.T, s, 0x1100 | ((4 + k) << 4)));
#else
    return gcm_ror(gcm_te(t, s, k), 16);
#endif
}

/* One full round with round key k, in place: Te0[a] ^ ror8(Te0[b]) ^ ror16(Te0[c]) ^ ror24(Te0[d]) ^ k, taken
 * as Te0[a] ^ Te2[c] ^ ror8(Te0[b] ^ Te2[d]) ^ k (one rotation; the model too). */
GCM_FN void gcm_round(gcm_tab t, const uint32_t *k, uint32_t s[4]) {
    uint32_t r[4];
    GCM_UNROLL
    for (int j = 0; j < 4; j++)
        r[j] = gcm_te(t, s[j], 3) ^ gcm_te2(t, s[(j + 2) & 3], 1) ^
               gcm_ror(gcm_te(t, s[(j + 1) & 3], 2) ^ gcm_te2(t, s[(j + 3) & 3], 0), 8) ^ k[j];
    GCM_UNROLL
    for (int j = 0; j < 4; j++) s[j] = r[j];
}

/* Rounds r0..13 and the last (S-box only, its bytes picked out of Te0 entries by byte permutes), from state s
 * (already through rounds < r0); out in memory order. */
GCM_FN void gcm_aes_from(gcm_tab t, const uint32_t *rk, int r0, uint32_t s[4], uint32_t out[4]) {
    GCM_UNROLL
    for (int r = r0; r < 14; r++) gcm_round(t, rk + 4 * r, s);
    GCM_UNROLL
    for (int j = 0; j < 4; j++) {
        uint32_t p = gcm_perm(gcm_te(t, s[j], 3), gcm_te(t, s[(j + 1) & 3], 2), 0x0051);
        uint32_t q = gcm_perm(gcm_te(t, s[(j + 2) & 3], 1), gcm_te(t, s[(j + 3) & 3], 0), 0x0051);
        out[j] = gcm_perm(p, q, 0x5410) ^ gcm_bswap32(rk[56 + j]);
    }
}

/* AES-256 of one block given as big-endian words; out in memory order. */
GCM_FN void gcm_aes(gcm_tab t, const uint32_t *rk, const uint32_t in[4], uint32_t out[4]) {
    uint32_t s[4] = {in[0] ^ rk[0], in[1] ^ rk[1], in[2] ^ rk[2], in[3] ^ rk[3]};
    gcm_aes_from(t, rk, 1, s, out);
}

/* Counter-mode caching (Bernstein and Schwabe): a thread's counter blocks differ only in their last word, and
 * from one block to its next (256 blocks on) only in that word's byte 1 while the other bytes hold. With y the
 * last word after AddRoundKey, round 1 then changes only word 1 (c1 ^ ror16(Te0[byte 1 of y])) and round 2
 * only that word's contributions (d ^ gcm_ctr_mix(t1)): 5 lookups instead of 32. The cache is remade when
 * another byte of y changes (a chunk past 2^16 blocks). */
typedef struct {
    uint32_t y, c1, d[4];
} gcm_ctr_cache;

/* Round 2's terms that read word 1 of round 1's output, XORed into base. */
GCM_FN void gcm_ctr_mix(gcm_tab t, const uint32_t base[4], uint32_t t1, uint32_t out[4]) {
    out[0] = base[0] ^ gcm_ror(gcm_te(t, t1, 2), 8);
    out[1] = base[1] ^ gcm_te(t, t1, 3);
    out[2] = base[2] ^ gcm_ror(gcm_te(t, t1, 0), 24);
    out[3] = base[3] ^ gcm_te2(t, t1, 1);
}

/* x: the chunk's first three counter words XOR rk[0..2]; y: the last word XOR rk[3]. */
GCM_FN void gcm_ctr_fill(gcm_tab t, const uint32_t *rk, const uint32_t x[3], uint32_t y, gcm_ctr_cache *cc) {
    uint32_t s[4] = {x[0], x[1], x[2], y};
    gcm_round(t, rk + 4, s);
    uint32_t t1 = s[1];
    cc->c1 = t1 ^ gcm_te2(t, y, 1);
    gcm_round(t, rk + 8, s);
    gcm_ctr_mix(t, s, t1, cc->d); /* XOR cancels t1's terms out */
    cc->y = y;
}

/* The keystream of counter word ctr (memory order), through the cache. */
GCM_FN void gcm_ctr_aes(gcm_tab t, const uint32_t *rk, const uint32_t x[3], gcm_ctr_cache *cc, uint32_t ctr,
                        uint32_t out[4]) {
    uint32_t y = ctr ^ rk[3], s[4];
    if ((y ^ cc->y) & 0xffff00ffu) gcm_ctr_fill(t, rk, x, y, cc);
    gcm_ctr_mix(t, cc->d, cc->c1 ^ gcm_te2(t, y, 1), s);
    gcm_aes_from(t, rk, 3, s, out);
}

/* GHASH's in-loop multiply is by the fixed hT = H^GCM_THREADS, a GF(2)-linear map: x * hT is the XOR over x's
 * 32 nibbles of a per-key table entry, no multiply or reduction. Blocks stay in memory order (words w[0..3] of
 * the block's bytes, little-endian): nibble j is bits 4(j & 7).. of w[j >> 3]. gcm_key.ghtab holds, for each
 * j, 16 entries of the product's first 8 bytes, then 16 of its last 8 (each run 128 bytes: one shared-memory
 * bank row, so a warp's 64-bit lookups never conflict). */
#define GCM_GH_BYTES (32 * 256)

/* o[0..1] ^= the 64 bits at a. */
GCM_FN void gcm_xor64(gcm_addr a, uint32_t *o) {
#if GCM_PAIR_DEV
    uint2 v = *reinterpret_cast<const uint2 *>(gcm_smem + a);
    o[0] ^= v.x;
    o[1] ^= v.y;
#elif defined(__CUDA_ARCH__)
    uint32_t x, y;
    asm("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(x), "=r"(y) : "r"(a));
    o[0] ^= x;
    o[1] ^= y;
#else
    o[0] ^= gcm_ld32(a);
    o[1] ^= gcm_ld32(a + 4);
#endif
}

/* o = w * hT (both in memory order) through the table at G. */
GCM_FN void gcm_mul_tab(gcm_addr G, const uint32_t w[4], uint32_t o[4]) {
    o[0] = o[1] = o[2] = o[3] = 0;
    GCM_UNROLL
    for (int q = 0; q < 4; q++) {
        /* each byte's low and high nibble, times 8 (an entry's offset): one byte permute per lookup */
        uint32_t nib[2] = {(w[q] << 3) & 0x78787878u, (w[q] >> 1) & 0x78787878u};
        GCM_UNROLL
        for (int n = 0; n < 8; n++) {
            gcm_addr a = G + gcm_byte(nib[n & 1], n >> 1);
            gcm_xor64(a + 256 * (8 * q + n), o);
            gcm_xor64(a + 256 * (8 * q + n) + 128, o + 2);
        }
    }
}

/* A block in memory order as a GCM value. */
GCM_FN gcm_u128 gcm_from_raw(const uint32_t w[4]) {
    uint32_t b[4] = {gcm_bswap32(w[0]), gcm_bswap32(w[1]), gcm_bswap32(w[2]), gcm_bswap32(w[3])};
    return gcm_from_words(b);
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

/* The tag of chunk c, given the XOR of the threads' lifted shares (S) and E_K(J0) (memory order). */
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
    return gcm_xor(S, gcm_from_raw(ej0));
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
