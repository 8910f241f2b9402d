/*
 * Real AES-256-GCM over every crossing byte, through the system OpenSSL
 * (libcrypto.so.3, loaded at run time), on the threads of the crossing:
 * CPU contention and scaling with contexts and cores are then real.
 *
 * A crossing's bytes are sealed in slices, each with its own IV and tag (the
 * "multi-chaining" of the bridge law, section 5); the calling thread and the
 * channel's helper lanes take slices until none are left. Ciphertext goes to
 * per-lane scratch (the bounce buffer's stand-in); the data the GPU receives
 * is the caller's plaintext, so every path stays byte-exact.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "../common/ossl.h"

int emu_cipher_load(char *err, size_t errlen) { return ossl_load(err, errlen); }

static __thread OSSL_CTX *t_ctx;

int emu_gcm_seal(const uint8_t key[32], const uint8_t iv[12], const void *in, size_t len, void *out, uint8_t tag[16]) {
    if (!t_ctx && !(t_ctx = ossl.ctx_new())) return -1;
    int n = 0;
    if (ossl.enc_init(t_ctx, ossl.aes_256_gcm(), NULL, key, iv) != 1) return -1;
    const unsigned char *src = in;
    unsigned char *dst = out;
    while (len) { /* EVP takes int lengths */
        int step = len > (1u << 30) ? (1 << 30) : (int)len;
        if (ossl.enc_update(t_ctx, dst, &n, src, step) != 1) return -1;
        src += step; dst += step; len -= (size_t)step;
    }
    if (ossl.enc_final(t_ctx, dst, &n) != 1) return -1;
    return ossl.ctrl(t_ctx, OSSL_GCM_GET_TAG, 16, tag) == 1 ? 0 : -1;
}

/* ---- lanes: the calling thread plus n-1 helpers share a crossing's slices ----
 *
 * Slices are small (EMU_SLICE) and taken one at a time, so whichever lanes
 * are running share the work and a helper the scheduler has not run yet
 * costs nothing: the caller waits for the bytes to be sealed, not for every
 * helper to wake. (Each lane sealing one large slice and the caller waiting
 * for all of them made a crossing as slow as its last-scheduled lane: the
 * emulated b300 channels ran at 7 GB/s with 12 of 16 cores busy.)
 *
 * One counter serves every run: its high bits are the run's number, its low
 * bits the next offset, so a helper that wakes late cannot take a slice of
 * the next run by mistake: it checks the number against `run`, which holds
 * the current run's number and length and changes only once all its bytes
 * are sealed. */
#define EMU_SLICE (256u << 10)
#define RUN_SHIFT 40
#define RUN_OFF(v) ((v) & ((1ull << RUN_SHIFT) - 1))

struct lanes {
    int n;
    pthread_t *th;
    unsigned char **scratch;
    uint8_t key[32];
    _Atomic uint64_t iv_counter;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t generation;     /* runs started (under mu) */
    int quit;
    const unsigned char *in;
    unsigned char *copy_to;
    _Atomic uint64_t next;   /* run number << RUN_SHIFT | next offset to take */
    _Atomic uint64_t run;    /* run number << RUN_SHIFT | its length */
    _Atomic uint64_t left;   /* bytes of the run not sealed yet */
    _Atomic int failed;
};

static void work(lanes *l, int lane) {
    uint8_t tag[16], iv[12];
    for (;;) {
        uint64_t v = atomic_fetch_add(&l->next, EMU_SLICE), r = atomic_load(&l->run);
        size_t off = RUN_OFF(v), len = RUN_OFF(r);
        if (v >> RUN_SHIFT != r >> RUN_SHIFT || off >= len) return; /* a finished run, or nothing left */
        size_t n = len - off < EMU_SLICE ? len - off : EMU_SLICE;
        if (l->copy_to) memcpy(l->copy_to + off, l->in + off, n);
        uint64_t c = atomic_fetch_add(&l->iv_counter, 1);
        memset(iv, 0, 4);
        memcpy(iv + 4, &c, 8);
        if (emu_gcm_seal(l->key, iv, l->in + off, n, l->scratch[lane], tag) != 0) atomic_store(&l->failed, 1);
        if (atomic_fetch_sub(&l->left, n) == n) { /* the run's last bytes */
            pthread_mutex_lock(&l->mu);
            pthread_cond_signal(&l->done);
            pthread_mutex_unlock(&l->mu);
        }
    }
}

typedef struct { lanes *l; int lane; } helper_arg;

static void *helper_main(void *p) {
    helper_arg a = *(helper_arg *)p;
    free(p);
    lanes *l = a.l;
    uint64_t seen = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && l->generation == seen) pthread_cond_wait(&l->go, &l->mu);
        if (l->quit) break;
        seen = l->generation;
        pthread_mutex_unlock(&l->mu);
        work(l, a.lane);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

lanes *emu_lanes_new(int n) {
    lanes *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->n = n;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->go, NULL);
    pthread_cond_init(&l->done, NULL);
    l->scratch = calloc((size_t)n, sizeof *l->scratch);
    l->th = calloc((size_t)n, sizeof *l->th);
    FILE *f = fopen("/dev/urandom", "rb");
    if (!l->scratch || !l->th || !f || fread(l->key, 1, sizeof l->key, f) != sizeof l->key) {
        if (f) fclose(f);
        emu_lanes_free(l);
        return NULL;
    }
    fclose(f);
    for (int i = 0; i < n; i++) {
        if (!(l->scratch[i] = malloc(EMU_SLICE))) { emu_lanes_free(l); return NULL; }
    }
    for (int i = 1; i < n; i++) {
        helper_arg *a = malloc(sizeof *a);
        if (!a) { emu_lanes_free(l); return NULL; }
        *a = (helper_arg){l, i};
        if (pthread_create(&l->th[i], NULL, helper_main, a) != 0) { free(a); emu_lanes_free(l); return NULL; }
    }
    return l;
}

void emu_lanes_free(lanes *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->quit = 1;
    pthread_cond_broadcast(&l->go);
    pthread_mutex_unlock(&l->mu);
    for (int i = 1; i < l->n; i++) if (l->th && l->th[i]) pthread_join(l->th[i], NULL);
    for (int i = 0; l->scratch && i < l->n; i++) free(l->scratch[i]);
    free(l->scratch);
    free(l->th);
    free(l);
}

/* One run at a time per lanes (a channel serves one crossing at a time). */
int emu_lanes_run(lanes *l, const void *in, void *copy_to, size_t len, uint64_t *cipher_bytes) {
    if (!len) return 0;
    pthread_mutex_lock(&l->mu);
    uint64_t id = ++l->generation;
    l->in = in;
    l->copy_to = copy_to;
    atomic_store(&l->failed, 0);
    atomic_store(&l->left, len);
    atomic_store(&l->run, id << RUN_SHIFT | len);
    atomic_store(&l->next, id << RUN_SHIFT); /* opens the run: lanes may take slices from here on */
    if (l->n > 1 && len > EMU_SLICE) pthread_cond_broadcast(&l->go); /* small crossings stay on the caller */
    pthread_mutex_unlock(&l->mu);
    work(l, 0);
    pthread_mutex_lock(&l->mu);
    while (atomic_load(&l->left)) pthread_cond_wait(&l->done, &l->mu);
    pthread_mutex_unlock(&l->mu);
    if (cipher_bytes) *cipher_bytes += len;
    return atomic_load(&l->failed) ? -1 : 0;
}
