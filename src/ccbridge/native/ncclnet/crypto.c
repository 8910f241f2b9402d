/*
 * The plugin's cryptography through OpenSSL's libcrypto.so.3, bound with
 * dlopen/dlsym at init so the plugin builds without OpenSSL headers (as the
 * emulator's cipher does): AES-256-GCM records, SHA-256, HMAC-SHA256, HKDF
 * (RFC 5869, the same construction as ccbridge.secure.keys.hkdf) and
 * RAND_bytes for the handshake's fresh randomness.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net.h"

typedef void CTX;
typedef void ALG;
static struct {
    CTX *(*ctx_new)(void);
    void (*ctx_free)(CTX *);
    const ALG *(*aes_256_gcm)(void);
    int (*enc_init)(CTX *, const ALG *, void *, const unsigned char *, const unsigned char *);
    int (*enc_update)(CTX *, unsigned char *, int *, const unsigned char *, int);
    int (*enc_final)(CTX *, unsigned char *, int *);
    int (*dec_init)(CTX *, const ALG *, void *, const unsigned char *, const unsigned char *);
    int (*dec_update)(CTX *, unsigned char *, int *, const unsigned char *, int);
    int (*dec_final)(CTX *, unsigned char *, int *);
    int (*ctrl)(CTX *, int, int, void *);
    const ALG *(*sha256)(void);
    unsigned char *(*hmac)(const ALG *, const void *, int, const unsigned char *, size_t, unsigned char *,
                           unsigned int *);
    unsigned char *(*sha256_oneshot)(const unsigned char *, size_t, unsigned char *);
    int (*rand_bytes)(unsigned char *, int);
    void (*cleanse)(void *, size_t);
} ssl;
static int loaded;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

#define GCM_GET_TAG 0x10 /* EVP_CTRL_GCM_GET_TAG */
#define GCM_SET_TAG 0x11 /* EVP_CTRL_GCM_SET_TAG */

int crypto_load(char *err, size_t errlen) {
    pthread_mutex_lock(&load_mu);
    void *h = loaded ? NULL : dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!loaded && !h) {
        snprintf(err, errlen, "cannot load OpenSSL's libcrypto.so.3 (install OpenSSL 3): %s", dlerror());
        pthread_mutex_unlock(&load_mu);
        return -1;
    }
    static const struct { void **slot; const char *name; } syms[] = {
        {(void **)&ssl.ctx_new, "EVP_CIPHER_CTX_new"}, {(void **)&ssl.ctx_free, "EVP_CIPHER_CTX_free"},
        {(void **)&ssl.aes_256_gcm, "EVP_aes_256_gcm"}, {(void **)&ssl.enc_init, "EVP_EncryptInit_ex"},
        {(void **)&ssl.enc_update, "EVP_EncryptUpdate"}, {(void **)&ssl.enc_final, "EVP_EncryptFinal_ex"},
        {(void **)&ssl.dec_init, "EVP_DecryptInit_ex"}, {(void **)&ssl.dec_update, "EVP_DecryptUpdate"},
        {(void **)&ssl.dec_final, "EVP_DecryptFinal_ex"}, {(void **)&ssl.ctrl, "EVP_CIPHER_CTX_ctrl"},
        {(void **)&ssl.sha256, "EVP_sha256"}, {(void **)&ssl.hmac, "HMAC"},
        {(void **)&ssl.sha256_oneshot, "SHA256"}, {(void **)&ssl.rand_bytes, "RAND_bytes"},
        {(void **)&ssl.cleanse, "OPENSSL_cleanse"},
    };
    for (size_t i = 0; !loaded && i < sizeof syms / sizeof syms[0]; i++) {
        if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
            snprintf(err, errlen, "libcrypto.so.3 lacks %s", syms[i].name);
            pthread_mutex_unlock(&load_mu);
            return -1;
        }
    }
    loaded = 1;
    pthread_mutex_unlock(&load_mu);
    return 0;
}

void wipe(void *p, size_t n) {
    if (loaded) ssl.cleanse(p, n);
    else explicit_bzero(p, n);
}

int crypto_random(void *buf, size_t n) { return ssl.rand_bytes(buf, (int)n) == 1 ? 0 : -1; }

void crypto_sha256(const void *in, size_t n, uint8_t out[32]) { ssl.sha256_oneshot(in, n, out); }

int crypto_hmac(const uint8_t *key, size_t keylen, const void *in, size_t n, uint8_t out[32]) {
    unsigned int len = 0;
    return ssl.hmac(ssl.sha256(), key, (int)keylen, in, n, out, &len) && len == 32 ? 0 : -1;
}

/* HKDF-SHA256 with one output block (32 bytes): PRK = HMAC(salt, ikm),
 * OKM = HMAC(PRK, info | 0x01). */
int crypto_hkdf(const uint8_t *ikm, size_t ikmlen, const uint8_t salt[32], const void *info, size_t infolen,
                uint8_t out[32]) {
    uint8_t prk[32], msg[256];
    if (infolen + 1 > sizeof msg) return -1;
    memcpy(msg, info, infolen);
    msg[infolen] = 1;
    int rc = crypto_hmac(salt, 32, ikm, ikmlen, prk) || crypto_hmac(prk, 32, msg, infolen + 1, out) ? -1 : 0;
    wipe(prk, sizeof prk);
    return rc;
}

struct gcm { CTX *ctx; };

gcm *gcm_new(void) {
    gcm *g = calloc(1, sizeof *g);
    if (g && !(g->ctx = ssl.ctx_new())) { free(g); return NULL; }
    return g;
}

void gcm_free(gcm *g) {
    if (!g) return;
    ssl.ctx_free(g->ctx);
    free(g);
}

/* Records are at most a few MiB, well inside EVP's int lengths. */
int gcm_seal(gcm *g, const uint8_t key[32], const uint8_t iv[12], const void *aad, size_t aadlen,
             const void *in, size_t n, void *out, uint8_t tag[TAG_BYTES]) {
    int len = 0;
    if (ssl.enc_init(g->ctx, ssl.aes_256_gcm(), NULL, key, iv) != 1) return -1;
    if (ssl.enc_update(g->ctx, NULL, &len, aad, (int)aadlen) != 1) return -1;
    if (n && ssl.enc_update(g->ctx, out, &len, in, (int)n) != 1) return -1;
    if (ssl.enc_final(g->ctx, (unsigned char *)out + n, &len) != 1) return -1;
    return ssl.ctrl(g->ctx, GCM_GET_TAG, TAG_BYTES, tag) == 1 ? 0 : -1;
}

int gcm_open(gcm *g, const uint8_t key[32], const uint8_t iv[12], const void *aad, size_t aadlen,
             const void *in, size_t n, void *out, const uint8_t tag[TAG_BYTES]) {
    int len = 0;
    uint8_t t[TAG_BYTES];
    memcpy(t, tag, TAG_BYTES);
    if (ssl.dec_init(g->ctx, ssl.aes_256_gcm(), NULL, key, iv) != 1) return -1;
    if (ssl.dec_update(g->ctx, NULL, &len, aad, (int)aadlen) != 1) return -1;
    if (n && ssl.dec_update(g->ctx, out, &len, in, (int)n) != 1) return -1;
    if (ssl.ctrl(g->ctx, GCM_SET_TAG, TAG_BYTES, t) != 1) return -1;
    return ssl.dec_final(g->ctx, (unsigned char *)out + n, &len) == 1 ? 0 : -1;
}
