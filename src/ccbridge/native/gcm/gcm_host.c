/*
 * The host side of the GPU AES-256-GCM (gcm.h): key setup, per-message
 * parameters, kernel launches on the caller's stream, and a sequential model
 * of the kernels (same arithmetic: T-table rounds with counter caching, GHASH
 * by table; same thread decomposition) that the CPU tests check against
 * OpenSSL.
 */
#include "gcm.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static uint8_t xtime(uint8_t x) { return (uint8_t)((x << 1) ^ ((x & 0x80) ? 0x1b : 0)); }
static uint8_t rotl8(uint8_t x, int n) { return (uint8_t)((x << n) | (x >> (8 - n))); }

static void aes_sbox(uint8_t sbox[256]) {
    /* walk the multiplicative group with generator 3 and its inverse */
    uint8_t p = 1, q = 1;
    do {
        p = p ^ xtime(p);
        q ^= q << 1;
        q ^= q << 2;
        q ^= q << 4;
        if (q & 0x80) q ^= 0x09;
        sbox[p] = (uint8_t)(q ^ rotl8(q, 1) ^ rotl8(q, 2) ^ rotl8(q, 3) ^ rotl8(q, 4) ^ 0x63);
    } while (p != 1);
    sbox[0] = 0x63;
}

/* the kernels copy the GHASH table into shared memory 16 bytes at a time */
_Static_assert(offsetof(gcm_key, ghtab) % 16 == 0, "gcm_key.ghtab must be 16-byte aligned");

size_t ccb_gcm_key_size(void) { return sizeof(gcm_key); }

/* The host reads the one plain copy of the T-table (gcm_te). */
static gcm_tab host_tab(const gcm_key *k) {
    gcm_tab t = {(const uint8_t *)k->te0, 2};
    return t;
}
size_t ccb_gcm_msg_size(void) { return sizeof(gcm_msg); }

static gcm_u128 gcm_pow(const gcm_key *k, uint64_t e) {
    gcm_u128 r = {0, 0}, b = k->hpow[0];
    int first = 1;
    for (; e; e >>= 1) {
        if (e & 1) {
            r = first ? b : gcm_mul(r, b);
            first = 0;
        }
        b = gcm_mul(b, b);
    }
    return r;
}

int ccb_gcm_key(const uint8_t key[32], gcm_key *k) {
    uint8_t sbox[256];
    aes_sbox(sbox);
    for (int x = 0; x < 256; x++) {
        uint8_t s = sbox[x], s2 = xtime(s);
        k->te0[x] = ((uint32_t)s2 << 24) | ((uint32_t)s << 16) | ((uint32_t)s << 8) | (uint8_t)(s2 ^ s);
    }
    uint32_t *w = k->rk;
    for (int i = 0; i < 8; i++)
        w[i] = ((uint32_t)key[4 * i] << 24) | ((uint32_t)key[4 * i + 1] << 16) | ((uint32_t)key[4 * i + 2] << 8) | key[4 * i + 3];
    uint8_t rcon = 1;
    for (int i = 8; i < 60; i++) {
        uint32_t t = w[i - 1];
        if (i % 8 == 0 || i % 8 == 4) {
            if (i % 8 == 0) t = (t << 8) | (t >> 24);
            t = ((uint32_t)sbox[t >> 24] << 24) | ((uint32_t)sbox[(t >> 16) & 0xff] << 16) |
                ((uint32_t)sbox[(t >> 8) & 0xff] << 8) | sbox[t & 0xff];
            if (i % 8 == 0) {
                t ^= (uint32_t)rcon << 24;
                rcon = xtime(rcon);
            }
        }
        w[i] = w[i - 8] ^ t;
    }
    uint32_t zero[4] = {0, 0, 0, 0}, h[4];
    gcm_aes(host_tab(k), k->rk, zero, h);
    k->hpow[0] = gcm_from_raw(h);
    for (int i = 1; i <= GCM_THREADS; i++) k->hpow[i] = gcm_mul(k->hpow[i - 1], k->hpow[0]);
    /* gcm_mul_tab's table: entry e of nibble j is the product of the block whose only nonzero nibble is j, = e */
    for (int j = 0; j < 32; j++)
        for (int e = 0; e < 16; e++) {
            uint8_t x[16] = {0}, y[16];
            x[4 * (j >> 3) + ((j & 7) >> 1)] = (uint8_t)(e << (4 * (j & 1)));
            gcm_store_be(y, gcm_mul(gcm_load_be(x), k->hpow[GCM_THREADS - 1]));
            memcpy(k->ghtab + 256 * j + 8 * e, y, 8);
            memcpy(k->ghtab + 256 * j + 128 + 8 * e, y + 8, 8);
        }
    return 0;
}

/* Fill one message's launch parameters. Messages of 0 bytes still carry one
 * (empty) chunk, so they are authenticated too. */
int ccb_gcm_msg(const gcm_key *k, gcm_msg *m, uint64_t nbytes, uint32_t chunk_bytes, const uint8_t prefix[8],
                const uint8_t id[32]) {
    if (chunk_bytes == 0 || chunk_bytes % 16) {
        set_err("chunk size must be a positive multiple of 16 bytes, got %u", chunk_bytes);
        return -1;
    }
    uint64_t nchunks = nbytes ? (nbytes + chunk_bytes - 1) / chunk_bytes : 1;
    if (nchunks > 0xffffffffull) {
        set_err("a message of %llu bytes needs more than 2^32 chunks of %u bytes", (unsigned long long)nbytes, chunk_bytes);
        return -1;
    }
    memset(m, 0, sizeof *m);
    m->nbytes = nbytes;
    m->chunk_bytes = chunk_bytes;
    m->nchunks = (uint32_t)nchunks;
    memcpy(m->prefix, prefix, GCM_PREFIX_BYTES);
    memcpy(m->id, id, GCM_ID_BYTES);
    memcpy(m->rk, k->rk, sizeof m->rk);
    uint64_t full = ((uint64_t)chunk_bytes + 15) / 16, last = (gcm_chunk_len(m, m->nchunks - 1) + 15) / 16;
    m->hm_full = gcm_pow(k, full + 2);
    m->hm_last = gcm_pow(k, last + 2);
    return 0;
}

/* A plain AES-GCM message: 96-bit nonce, any AAD (see gcm_msg). */
int ccb_gcm_raw_msg(const gcm_key *k, gcm_msg *m, uint64_t nbytes, const uint8_t iv[12], const uint8_t *aad,
                    uint64_t aad_len) {
    uint64_t chunk = (nbytes + 15) & ~15ull;
    if (chunk > 0xfffffff0ull) {
        set_err("a raw message is at most 4 GiB");
        return -1;
    }
    static const uint8_t zero[GCM_ID_BYTES];
    if (ccb_gcm_msg(k, m, nbytes, chunk ? (uint32_t)chunk : 16, iv, zero) != 0) return -1;
    m->raw = 1;
    m->ctr_base = ((uint32_t)iv[8] << 24) | ((uint32_t)iv[9] << 16) | ((uint32_t)iv[10] << 8) | iv[11];
    m->aad_bits = aad_len * 8;
    gcm_u128 a = {0, 0};
    for (uint64_t off = 0; off < aad_len; off += 16) {
        uint8_t b[16] = {0};
        memcpy(b, aad + off, aad_len - off < 16 ? aad_len - off : 16);
        a = gcm_xor(off ? gcm_mul(a, k->hpow[0]) : a, gcm_load_be(b));
    }
    m->aad_hash = a;
    return 0;
}

/* The kernels' work, done by one CPU thread, thread by thread. Decrypting,
 * returns the number of chunks whose tag failed (their output zeroed). */
int ccb_gcm_model(const gcm_key *k, const gcm_msg *m, int decrypt, const uint8_t *in, uint8_t *out, uint8_t *tags) {
    int bad = 0;
    gcm_tab tab = host_tab(k);
    for (uint32_t c = 0; c < m->nchunks; c++) {
        uint64_t off = (uint64_t)c * m->chunk_bytes, len = gcm_chunk_len(m, c);
        uint32_t nb = (uint32_t)((len + 15) / 16), ctr0[4];
        gcm_counter(m, c, 0, ctr0);
        uint32_t x[3] = {ctr0[0] ^ m->rk[0], ctr0[1] ^ m->rk[1], ctr0[2] ^ m->rk[2]};
        gcm_u128 S = {0, 0};
        for (uint32_t t = 0; t < GCM_THREADS; t++) {
            uint32_t acc[4] = {0, 0, 0, 0};
            int64_t last = -1;
            gcm_ctr_cache cc;
            gcm_ctr_fill(tab, m->rk, x, (t + 2) ^ m->rk[3], &cc);
            for (uint32_t i = t; i < nb; i += GCM_THREADS) {
                uint32_t ks[4], w[4], prod[4];
                gcm_ctr_aes(tab, m->rk, x, &cc, i + 2, ks);
                uint8_t blk[16] = {0}, ksb[16], o[16];
                uint32_t n = (uint32_t)(len - 16ull * i < 16 ? len - 16ull * i : 16);
                memcpy(blk, in + off + 16ull * i, n);
                memcpy(ksb, ks, 16); /* memory order: the host is little-endian, as the GPU */
                for (int j = 0; j < 16; j++) o[j] = j < (int)n ? blk[j] ^ ksb[j] : 0;
                memcpy(out + off + 16ull * i, o, n);
                memcpy(w, decrypt ? blk : o, 16);
                gcm_mul_tab(k->ghtab, acc, prod);
                for (int j = 0; j < 4; j++) acc[j] = prod[j] ^ w[j];
                last = i;
            }
            S = gcm_xor(S, gcm_lift(k, gcm_from_raw(acc), nb, last));
        }
        uint32_t j0[4], ej0[4];
        gcm_counter(m, c, 1, j0);
        gcm_aes(tab, m->rk, j0, ej0);
        gcm_u128 tag = gcm_chunk_tag(k, m, c, S, ej0);
        if (!decrypt) {
            gcm_store_be(tags + 16ull * c, tag);
        } else {
            gcm_u128 want = gcm_load_be(tags + 16ull * c);
            if (want.hi != tag.hi || want.lo != tag.lo) {
                memset(out + off, 0, len);
                bad++;
            }
        }
    }
    return bad;
}

/* ---- kernel launches (the fatbin built from gcm.cu by setup.py) ---- */

enum { K_CRYPT, K_REDUCE, K_COUNT };
static const char *const kernel_names[K_COUNT] = {"ccb_gcm_crypt", "ccb_gcm_reduce"};

#define MAX_MODULES 64
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8 /* cuda.h's CUfunction_attribute */
static struct {
    CUcontext ctx;
    CUfunction fn[K_COUNT];
    unsigned smem; /* dynamic shared memory per launch: GCM_SMEM_BYTES for kernels built with the paired table */
} g_mods[MAX_MODULES];
static int g_nmods;
static pthread_mutex_t g_mod_lock = PTHREAD_MUTEX_INITIALIZER;

/* Load the kernels into the device's primary context once (and make that
 * context current on this thread if none is). */
int ccb_gcm_load(int device, const void *image) {
    if (cu_open() != 0) return -1;
    CUdevice dev;
    CUcontext ctx = NULL, cur = NULL;
    CK(cu.DeviceGet(&dev, device));
    CK(cu.DevicePrimaryCtxRetain(&ctx, dev));
    CK(cu.CtxGetCurrent(&cur));
    if (cur != ctx) CK(cu.CtxSetCurrent(ctx));
    pthread_mutex_lock(&g_mod_lock);
    for (int i = 0; i < g_nmods; i++)
        if (g_mods[i].ctx == ctx) {
            pthread_mutex_unlock(&g_mod_lock);
            return 0;
        }
    if (g_nmods == MAX_MODULES) {
        pthread_mutex_unlock(&g_mod_lock);
        set_err("too many CUDA contexts for the GCM kernels");
        return -1;
    }
    CUmodule mod;
    CUresult rc = cu.ModuleLoadData(&mod, image);
    if (rc) {
        pthread_mutex_unlock(&g_mod_lock);
        cu_fail(rc, "cuModuleLoadData(gcm kernels; built for another GPU architecture?)");
        return -1;
    }
    for (int k = 0; k < K_COUNT; k++) {
        rc = cu.ModuleGetFunction(&g_mods[g_nmods].fn[k], mod, kernel_names[k]);
        if (rc) {
            pthread_mutex_unlock(&g_mod_lock);
            cu_fail(rc, "cuModuleGetFunction(gcm kernel)");
            return -1;
        }
    }
    /* kernels of the paired T-table in dynamic shared memory say so by a marker entry; older builds (the bench's
     * legacy variant) keep their static shared memory and launch with none */
    CUfunction marker;
    g_mods[g_nmods].smem = 0;
    if (cu.ModuleGetFunction(&marker, mod, "ccb_gcm_dynamic_smem") == 0) {
        for (int k = 0; k < K_COUNT; k++) {
            rc = cu.FuncSetAttribute(g_mods[g_nmods].fn[k], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     GCM_SMEM_BYTES);
            if (rc) {
                pthread_mutex_unlock(&g_mod_lock);
                cu_fail(rc, "cuFuncSetAttribute(gcm kernel, max dynamic shared memory)");
                return -1;
            }
        }
        g_mods[g_nmods].smem = GCM_SMEM_BYTES;
    }
    g_mods[g_nmods++].ctx = ctx;
    pthread_mutex_unlock(&g_mod_lock);
    return 0;
fail:
    return -1;
}

/* The kernel and its dynamic shared memory in the current context. */
static CUfunction kernel(int which, unsigned *smem) {
    CUcontext cur = NULL;
    if (cu.CtxGetCurrent(&cur) != 0 || !cur) {
        set_err("no CUDA context is current on this thread (call ccb_gcm_load first)");
        return NULL;
    }
    for (int i = 0; i < g_nmods; i++)
        if (g_mods[i].ctx == cur) {
            *smem = g_mods[i].smem;
            return g_mods[i].fn[which];
        }
    set_err("the GCM kernels are not loaded in the current CUDA context");
    return NULL;
}

static int launch(int which, unsigned grid, CUstream stream, void **args) {
    unsigned smem = 0;
    CUfunction f = kernel(which, &smem);
    if (!f) return -1;
    CUresult rc = cu.LaunchKernel(f, grid, 1, 1, GCM_THREADS, 1, 1, smem, stream, args, NULL);
    return rc ? cu_fail(rc, "cuLaunchKernel(gcm)") : 0;
}

/* Encrypt (tags written) or verify+decrypt (failures counted into *fail,
 * the failed chunks' output zeroed). key is the device copy of gcm_key. */
int ccb_gcm_crypt(unsigned grid, CUstream stream, CUdeviceptr key, const gcm_msg *m, int decrypt, CUdeviceptr in,
                  CUdeviceptr out, CUdeviceptr tags, CUdeviceptr fail) {
    gcm_msg mv = *m;
    void *args[] = {&key, &mv, &decrypt, &in, &out, &tags, &fail};
    return launch(K_CRYPT, grid, stream, args);
}

/* One reduce-scatter hop: verify+decrypt (min, tin), add local, write the sum
 * to plain (if any) and encrypt it as mout (if out): one pass over the bytes.
 * A chunk that fails verification is zeroed in plain and sent on with a
 * poisoned tag, so every later receiver fails too. */
int ccb_gcm_reduce(unsigned grid, CUstream stream, CUdeviceptr key, const gcm_msg *min, const gcm_msg *mout, int dtype,
                   CUdeviceptr in, CUdeviceptr tin, CUdeviceptr local, CUdeviceptr plain, CUdeviceptr out,
                   CUdeviceptr tout, CUdeviceptr fail) {
    gcm_msg a = *min, b = *mout;
    void *args[] = {&key, &a, &b, &dtype, &in, &tin, &local, &plain, &out, &tout, &fail};
    return launch(K_REDUCE, grid, stream, args);
}
