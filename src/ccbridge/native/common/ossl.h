/*
 * OpenSSL's libcrypto.so.3, bound at run time with dlopen/dlsym: the
 * emulator and the NCCL net plugin build without OpenSSL headers and use the
 * system's own library (the cipher a confidential VM's stack would run).
 * Compiled into each native library that needs it (one private copy each).
 * ccbridge/bindings/libcrypto.py binds the same calls from Python;
 * tests/test_bindings_twin.py holds the two to each other.
 */
#ifndef CCB_OSSL_H
#define CCB_OSSL_H
#include <stddef.h>

typedef void OSSL_CTX;
typedef void OSSL_ALG;
typedef struct {
    OSSL_CTX *(*ctx_new)(void);
    void (*ctx_free)(OSSL_CTX *);
    const OSSL_ALG *(*aes_256_gcm)(void);
    int (*enc_init)(OSSL_CTX *, const OSSL_ALG *, void *, const unsigned char *, const unsigned char *);
    int (*enc_update)(OSSL_CTX *, unsigned char *, int *, const unsigned char *, int);
    int (*enc_final)(OSSL_CTX *, unsigned char *, int *);
    int (*dec_init)(OSSL_CTX *, const OSSL_ALG *, void *, const unsigned char *, const unsigned char *);
    int (*dec_update)(OSSL_CTX *, unsigned char *, int *, const unsigned char *, int);
    int (*dec_final)(OSSL_CTX *, unsigned char *, int *);
    int (*ctrl)(OSSL_CTX *, int, int, void *);
    const OSSL_ALG *(*sha256)(void);
    unsigned char *(*hmac)(const OSSL_ALG *, const void *, int, const unsigned char *, size_t, unsigned char *,
                           unsigned int *);
    unsigned char *(*sha256_oneshot)(const unsigned char *, size_t, unsigned char *);
    int (*rand_bytes)(unsigned char *, int);
    void (*cleanse)(void *, size_t);
} ossl_api;

extern ossl_api ossl;
#define OSSL_GCM_SET_IVLEN 0x9 /* EVP_CTRL_GCM_SET_IVLEN */
#define OSSL_GCM_GET_TAG 0x10  /* EVP_CTRL_GCM_GET_TAG */
#define OSSL_GCM_SET_TAG 0x11  /* EVP_CTRL_GCM_SET_TAG */

/* Load once (thread-safe); 0, or -1 with the reason in err. */
int ossl_load(char *err, size_t errlen);
/* 1 once ossl_load has succeeded. */
int ossl_loaded(void);
#endif
