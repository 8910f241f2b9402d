/*
 * The plugin's cryptography through OpenSSL's libcrypto.so.3, bound at run
 * time by ../common/ossl.c (shared with the emulator), so the plugin builds
 * without OpenSSL headers: AES-256-GCM records, SHA-256, HMAC-SHA256, HKDF
 * (RFC 5869, the same construction as ccbridge.secure.keys.hkdf) and
 * RAND_bytes for the handshake's fresh randomness.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net.h"
#include "../common/ossl.h"

int crypto_load(char *err, size_t errlen) { return ossl_load(err, errlen); }

void wipe(void *p, size_t n) {
    if (ossl_loaded()) ossl.cleanse(p, n);
    else explicit_bzero(p, n);
}

int crypto_random(void *buf, size_t n) { return ossl.rand_bytes(buf, (int)n) == 1 ? 0 : -1; }

void crypto_sha256(const void *in, size_t n, uint8_t out[32]) { ossl.sha256_oneshot(in, n, out); }

int crypto_hmac(const uint8_t *key, size_t keylen, const void *in, size_t n, uint8_t out[32]) {
    unsigned int len = 0;
    return ossl.hmac(ossl.sha256(), key, (int)keylen, in, n, out, &len) && len == 32 ? 0 : -1;
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

struct gcm { OSSL_CTX *ctx; };

gcm *gcm_new(void) {
    gcm *g = calloc(1, sizeof *g);
    if (g && !(g->ctx = ossl.ctx_new())) { free(g); return NULL; }
    return g;
}

void gcm_free(gcm *g) {
    if (!g) return;
    ossl.ctx_free(g->ctx);
    free(g);
}

/* Records are at most a few MiB, well inside EVP's int lengths. Per record only the IV is set:
 * EVP keeps the key schedule from gcm_key. */
int gcm_key(gcm *g, const uint8_t key[32], int enc) {
    return (enc ? ossl.enc_init : ossl.dec_init)(g->ctx, ossl.aes_256_gcm(), NULL, key, NULL) == 1 ? 0 : -1;
}

int gcm_seal(gcm *g, const uint8_t iv[12], const void *aad, size_t aadlen, const void *in, size_t n, void *out,
             uint8_t tag[TAG_BYTES]) {
    int len = 0;
    if (ossl.enc_init(g->ctx, NULL, NULL, NULL, iv) != 1) return -1;
    if (ossl.enc_update(g->ctx, NULL, &len, aad, (int)aadlen) != 1) return -1;
    if (n && ossl.enc_update(g->ctx, out, &len, in, (int)n) != 1) return -1;
    if (ossl.enc_final(g->ctx, (unsigned char *)out + n, &len) != 1) return -1;
    return ossl.ctrl(g->ctx, OSSL_GCM_GET_TAG, TAG_BYTES, tag) == 1 ? 0 : -1;
}

int gcm_open(gcm *g, const uint8_t iv[12], const void *aad, size_t aadlen, const void *in, size_t n, void *out,
             const uint8_t tag[TAG_BYTES]) {
    int len = 0;
    uint8_t t[TAG_BYTES];
    memcpy(t, tag, TAG_BYTES);
    if (ossl.dec_init(g->ctx, NULL, NULL, NULL, iv) != 1) return -1;
    if (ossl.dec_update(g->ctx, NULL, &len, aad, (int)aadlen) != 1) return -1;
    if (n && ossl.dec_update(g->ctx, out, &len, in, (int)n) != 1) return -1;
    if (ossl.ctrl(g->ctx, OSSL_GCM_SET_TAG, TAG_BYTES, t) != 1) return -1;
    return ossl.dec_final(g->ctx, (unsigned char *)out + n, &len) == 1 ? 0 : -1;
}
