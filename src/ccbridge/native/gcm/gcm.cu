/*
 * AES-256-GCM kernels for the chunked format of gcm.h. A CTA of GCM_THREADS
 * threads takes one chunk at a time (grid-stride over chunks); thread t
 * handles blocks t, t+T, ... of it: counter-mode keystream, coalesced 16-byte
 * loads and stores, and its GHASH share. Shares are XOR-reduced across the CTA
 * and thread 0 finishes the tag. The T-table sits in shared memory once per
 * bank so lookups never conflict: Te0 and Te2 interleaved (64 KiB of dynamic
 * shared memory, gcm.h), one rotation per round word instead of three; round
 * keys are read from the launch's parameters (constants); rounds 1-2 of the
 * counter blocks are cached (gcm_ctr_aes); GHASH's per-block multiply by H^T is
 * a nibble table in shared memory (gcm_mul_tab). Each of these was measured
 * against the one it replaced (bench/RESULTS.md, 2026-11-26 session 10: the
 * kernel encrypts 1.83x and runs the fused hop 1.85x as fast as the first one).
 * Occupancy stays a compile-time choice that bench/gcm_variants.py measures:
 *   GCM_CRYPT_CTAS   ccb_gcm_crypt's CTAs per SM for __launch_bounds__ (3: at most 80 registers)
 *   GCM_REDUCE_CTAS  the same for ccb_gcm_reduce (3: 80 registers, no spills; 2: 128)
 *
 * Built by setup.py (nvcc -fatbin) when nvcc is present; loaded and launched
 * through the driver API by gcm_host.c.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gcm.h"

#ifndef GCM_CRYPT_CTAS
#define GCM_CRYPT_CTAS 3
#endif
#ifndef GCM_REDUCE_CTAS
#define GCM_REDUCE_CTAS 3
#endif

#define LANES 32

enum { DT_F32, DT_F16, DT_BF16, DT_F64, DT_I32, DT_I64, DT_U8 };

/* In dynamic shared memory (gcm_smem, GCM_SMEM_BYTES: more than a static array may take), laid out as gcm.h
 * says. */
struct cta_state {
    uint32_t T[GCM_SMEM_TE / 4];
    alignas(16) uint8_t G[GCM_GH_BYTES];
    gcm_u128 part[GCM_THREADS / 32];
    int bad;
};
static_assert(sizeof(cta_state) <= GCM_SMEM_BYTES, "gcm.h's GCM_SMEM_BYTES must hold cta_state");
#define CTA_STATE(s) cta_state &s = *reinterpret_cast<cta_state *>(gcm_smem)

/* Its presence in the module tells gcm_host.c to launch with GCM_SMEM_BYTES of dynamic shared memory. */
extern "C" __global__ void ccb_gcm_dynamic_smem(void) {}

__device__ static void load_key(cta_state &s, const gcm_key *k) {
    for (int i = threadIdx.x; i < GCM_SMEM_TE / 4; i += blockDim.x) {
        uint32_t e = k->te0[i >> 6];
        s.T[i] = i & 32 ? gcm_ror(e, 16) : e; /* row x: 32 copies of Te0[x], then 32 of Te2[x] */
    }
    for (int i = threadIdx.x; i < GCM_GH_BYTES / 16; i += blockDim.x)
        reinterpret_cast<uint4 *>(s.G)[i] = reinterpret_cast<const uint4 *>(k->ghtab)[i];
    __syncthreads();
}

/* What a thread reads its tables by, made once after load_key: its own bank's copy of the T-table and the
 * GHASH table. */
struct tables {
    gcm_tab T;
    gcm_addr G;
};

__device__ static tables tables_of(void) {
    tables tb;
    tb.T.T = 4 * (threadIdx.x & (LANES - 1)); /* offsets into gcm_smem, read by plain loads */
    tb.T.S = 8;
    tb.G = offsetof(cta_state, G);
    return tb;
}

/* One chunk's counter blocks for this thread: the words fixed by the chunk (after AddRoundKey) and the cache. */
struct ctr_state {
    uint32_t x[3];
    gcm_ctr_cache cc;
};

__device__ static ctr_state ctr_begin(const tables &tb, const gcm_msg &m, uint32_t c) {
    ctr_state k;
    uint32_t w[4];
    gcm_counter(&m, c, 0, w);
    for (int j = 0; j < 3; j++) k.x[j] = w[j] ^ m.rk[j];
    gcm_ctr_fill(tb.T, m.rk, k.x, (threadIdx.x + 2) ^ m.rk[3], &k.cc);
    return k;
}

/* The keystream of block i (memory order). */
__device__ static uint4 keystream(const tables &tb, const gcm_msg &m, ctr_state &k, uint32_t i) {
    uint32_t ks[4];
    gcm_ctr_aes(tb.T, m.rk, k.x, &k.cc, i + 2, ks);
    return make_uint4(ks[0], ks[1], ks[2], ks[3]);
}

/* A thread's GHASH share: Horner with H^T (by gcm_mul_tab) over its blocks (memory order). */
typedef uint4 gh_acc;

__device__ static void gh_step(const tables &tb, gh_acc &a, uint4 cb) {
    uint32_t w[4] = {a.x, a.y, a.z, a.w}, o[4];
    gcm_mul_tab(tb.G, w, o);
    a = make_uint4(o[0] ^ cb.x, o[1] ^ cb.y, o[2] ^ cb.z, o[3] ^ cb.w);
}

__device__ static gcm_u128 gh_value(gh_acc a) {
    uint32_t w[4] = {a.x, a.y, a.z, a.w};
    return gcm_from_raw(w);
}

__device__ static gcm_u128 shfl_xor(gcm_u128 v, int d) {
    v.hi = __shfl_xor_sync(0xffffffffu, v.hi, d);
    v.lo = __shfl_xor_sync(0xffffffffu, v.lo, d);
    return v;
}

/* XOR of every thread's v, valid in thread 0. */
__device__ static gcm_u128 cta_xor(cta_state &s, gcm_u128 v) {
    for (int d = 16; d; d >>= 1) v = gcm_xor(v, shfl_xor(v, d));
    if ((threadIdx.x & 31) == 0) s.part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < GCM_THREADS / 32; w++) v = gcm_xor(v, s.part[w]);
    __syncthreads();
    return v;
}

/* Whole 16-byte blocks move as one vector access where the buffer allows it
 * (a segment of a tensor can start anywhere a multiple of its element size). */
__device__ static bool vector_ok(const void *p, uint64_t len, uint32_t i) {
    return 16ull * (i + 1) <= len && ((uintptr_t)p & 15) == 0;
}

/* Block i of a chunk of len bytes: 16 raw bytes (zero-padded past len). */
__device__ static uint4 load_block(const uint8_t *p, uint64_t len, uint32_t i) {
    if (vector_ok(p, len, i)) return *reinterpret_cast<const uint4 *>(p + 16ull * i);
    uint8_t b[16];
    for (int j = 0; j < 16; j++) b[j] = 16ull * i + j < len ? p[16ull * i + j] : 0;
    uint4 r;
    memcpy(&r, b, 16);
    return r;
}

__device__ static void store_block(uint8_t *p, uint64_t len, uint32_t i, uint4 v) {
    if (vector_ok(p, len, i)) {
        *reinterpret_cast<uint4 *>(p + 16ull * i) = v;
        return;
    }
    uint8_t b[16];
    memcpy(b, &v, 16);
    for (int j = 0; j < 16 && 16ull * i + j < len; j++) p[16ull * i + j] = b[j];
}

/* Block i with the bytes past len zeroed, as GHASH pads a partial last block. */
__device__ static uint4 pad_block(uint4 v, uint64_t len, uint32_t i) {
    if (16ull * (i + 1) <= len) return v;
    uint8_t b[16];
    memcpy(b, &v, 16);
    for (int j = (int)(len - 16ull * i); j < 16; j++) b[j] = 0;
    memcpy(&v, b, 16);
    return v;
}

__device__ static uint4 xor4(uint4 a, uint4 b) { return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w); }

/* Finish chunk c's tag in thread 0 (S = XOR of the threads' shares). */
__device__ static gcm_u128 finish_tag(const tables &tb, const gcm_key *k, const gcm_msg *m, uint32_t c, gcm_u128 S) {
    uint32_t j0[4], ej0[4];
    gcm_counter(m, c, 1, j0);
    gcm_aes(tb.T, m->rk, j0, ej0);
    return gcm_chunk_tag(k, m, c, S, ej0);
}

__device__ static void put_tag(uint8_t *tags, uint32_t c, gcm_u128 t) { gcm_store_be(tags + 16ull * c, t); }

__device__ static bool tag_ok(const uint8_t *tags, uint32_t c, gcm_u128 t) {
    gcm_u128 want = gcm_load_be(tags + 16ull * c);
    return ((want.hi ^ t.hi) | (want.lo ^ t.lo)) == 0;
}

__device__ static void zero_chunk(uint8_t *p, uint64_t len) {
    for (uint64_t j = threadIdx.x; j < len; j += blockDim.x) p[j] = 0;
}

/* The wire's pad between ciphertext and tags goes out too: never stale memory. */
__device__ static void zero_pad(uint8_t *wire, const gcm_msg &m, uint32_t c) {
    if (!m.raw && c + 1 == m.nchunks && threadIdx.x < ((16 - (m.nbytes & 15)) & 15)) wire[m.nbytes + threadIdx.x] = 0;
}

extern "C" __global__ void __launch_bounds__(GCM_THREADS, GCM_CRYPT_CTAS)
ccb_gcm_crypt(const gcm_key *key, gcm_msg m, int decrypt, const uint8_t *in, uint8_t *out, uint8_t *tags, int *fail) {
    CTA_STATE(s);
    load_key(s, key);
    const tables tb = tables_of();
    for (uint32_t c = blockIdx.x; c < m.nchunks; c += gridDim.x) {
        uint64_t off = (uint64_t)c * m.chunk_bytes, len = gcm_chunk_len(&m, c);
        uint32_t nb = (uint32_t)((len + 15) / 16);
        ctr_state ctr = ctr_begin(tb, m, c);
        gh_acc acc = {};
        int64_t last = -1;
        for (uint32_t i = threadIdx.x; i < nb; i += GCM_THREADS) {
            uint4 v = load_block(in + off, len, i);
            uint4 o = xor4(v, keystream(tb, m, ctr, i));
            store_block(out + off, len, i, o);
            /* GHASH runs over the ciphertext; load_block already zero-padded v */
            gh_step(tb, acc, decrypt ? v : pad_block(o, len, i));
            last = i;
        }
        gcm_u128 S = cta_xor(s, gcm_lift(key, gh_value(acc), nb, last));
        if (threadIdx.x == 0) {
            gcm_u128 t = finish_tag(tb, key, &m, c, S);
            if (!decrypt) put_tag(tags, c, t);
            s.bad = decrypt && !tag_ok(tags, c, t);
            if (s.bad) atomicAdd(fail, 1);
        }
        if (!decrypt) zero_pad(out, m, c);
        __syncthreads();
        if (s.bad) zero_chunk(out + off, len);
        __syncthreads();
    }
}

/* four packed pairs of 16-bit floats, added with the hardware's rounding */
template <typename T2> __device__ static uint4 add_pairs(uint4 a, uint4 b) {
    uint4 r;
    T2 *x = reinterpret_cast<T2 *>(&a), *y = reinterpret_cast<T2 *>(&b), *z = reinterpret_cast<T2 *>(&r);
    for (int j = 0; j < 4; j++) z[j] = __hadd2(x[j], y[j]);
    return r;
}

/* sum of two 16-byte vectors of dtype */
__device__ static uint4 add16(uint4 a, uint4 b, int dtype) {
    uint4 r;
    switch (dtype) {
    case DT_F32: {
        float4 x = *reinterpret_cast<float4 *>(&a), y = *reinterpret_cast<float4 *>(&b);
        float4 z = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        r = *reinterpret_cast<uint4 *>(&z);
        break;
    }
    case DT_F16:
        r = add_pairs<__half2>(a, b);
        break;
    case DT_BF16:
        r = add_pairs<__nv_bfloat162>(a, b);
        break;
    case DT_F64: {
        double2 x = *reinterpret_cast<double2 *>(&a), y = *reinterpret_cast<double2 *>(&b);
        double2 z = make_double2(x.x + y.x, x.y + y.y);
        r = *reinterpret_cast<uint4 *>(&z);
        break;
    }
    case DT_I32:
        r = make_uint4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        break;
    case DT_I64: {
        ulonglong2 x = *reinterpret_cast<ulonglong2 *>(&a), y = *reinterpret_cast<ulonglong2 *>(&b);
        ulonglong2 z = make_ulonglong2(x.x + y.x, x.y + y.y);
        r = *reinterpret_cast<uint4 *>(&z);
        break;
    }
    default: /* DT_U8: bytewise, wrapping */
        r = make_uint4(__vadd4(a.x, b.x), __vadd4(a.y, b.y), __vadd4(a.z, b.z), __vadd4(a.w, b.w));
    }
    return r;
}

extern "C" __global__ void __launch_bounds__(GCM_THREADS, GCM_REDUCE_CTAS)
ccb_gcm_reduce(const gcm_key *key, gcm_msg min, gcm_msg mout, int dtype, const uint8_t *in, const uint8_t *tin,
               const uint8_t *local, uint8_t *plain, uint8_t *out, uint8_t *tout, int *fail) {
    CTA_STATE(s);
    load_key(s, key);
    const tables tb = tables_of();
    for (uint32_t c = blockIdx.x; c < min.nchunks; c += gridDim.x) {
        uint64_t off = (uint64_t)c * min.chunk_bytes, len = gcm_chunk_len(&min, c);
        uint32_t nb = (uint32_t)((len + 15) / 16);
        ctr_state cin = ctr_begin(tb, min, c), cout = ctr_begin(tb, mout, c);
        gh_acc ain = {}, aout = {};
        int64_t last = -1;
        for (uint32_t i = threadIdx.x; i < nb; i += GCM_THREADS) {
            uint4 v = load_block(in + off, len, i);
            uint4 y = add16(xor4(v, keystream(tb, min, cin, i)), load_block(local + off, len, i), dtype);
            if (plain) store_block(plain + off, len, i, y);
            gh_step(tb, ain, v); /* load_block zero-padded v */
            if (out) {
                uint4 o = xor4(y, keystream(tb, mout, cout, i));
                store_block(out + off, len, i, o);
                gh_step(tb, aout, pad_block(o, len, i));
            }
            last = i;
        }
        gcm_u128 Sin = cta_xor(s, gcm_lift(key, gh_value(ain), nb, last));
        gcm_u128 Sout = out ? cta_xor(s, gcm_lift(key, gh_value(aout), nb, last)) : Sin;
        if (threadIdx.x == 0) {
            s.bad = !tag_ok(tin, c, finish_tag(tb, key, &min, c, Sin));
            if (s.bad) atomicAdd(fail, 1);
            if (out) {
                gcm_u128 t = finish_tag(tb, key, &mout, c, Sout);
                if (s.bad) t.hi = ~t.hi; /* poison: the next receiver must fail too */
                put_tag(tout, c, t);
            }
        }
        if (out) zero_pad(out, mout, c);
        __syncthreads();
        if (s.bad) {
            if (plain) zero_chunk(plain + off, len);
            if (out) zero_chunk(out + off, len);
        }
        __syncthreads();
    }
}
