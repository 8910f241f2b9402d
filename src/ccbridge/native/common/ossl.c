/* OpenSSL's libcrypto.so.3 bound at run time: see ossl.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "ossl.h"

ossl_api ossl;
static int g_loaded;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

int ossl_loaded(void) { return __atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE); }

int ossl_load(char *err, size_t errlen) {
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    if (!g_loaded) {
        void *h = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
        static const struct { void **slot; const char *name; } syms[] = {
            {(void **)&ossl.ctx_new, "EVP_CIPHER_CTX_new"}, {(void **)&ossl.ctx_free, "EVP_CIPHER_CTX_free"},
            {(void **)&ossl.aes_256_gcm, "EVP_aes_256_gcm"}, {(void **)&ossl.enc_init, "EVP_EncryptInit_ex"},
            {(void **)&ossl.enc_update, "EVP_EncryptUpdate"}, {(void **)&ossl.enc_final, "EVP_EncryptFinal_ex"},
            {(void **)&ossl.dec_init, "EVP_DecryptInit_ex"}, {(void **)&ossl.dec_update, "EVP_DecryptUpdate"},
            {(void **)&ossl.dec_final, "EVP_DecryptFinal_ex"}, {(void **)&ossl.ctrl, "EVP_CIPHER_CTX_ctrl"},
            {(void **)&ossl.sha256, "EVP_sha256"}, {(void **)&ossl.hmac, "HMAC"},
            {(void **)&ossl.sha256_oneshot, "SHA256"}, {(void **)&ossl.rand_bytes, "RAND_bytes"},
            {(void **)&ossl.cleanse, "OPENSSL_cleanse"},
        };
        if (!h) {
            snprintf(err, errlen, "cannot load OpenSSL's libcrypto.so.3 (install OpenSSL 3): %s", dlerror());
            rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < sizeof syms / sizeof syms[0]; i++) {
            if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
                snprintf(err, errlen, "libcrypto.so.3 lacks %s", syms[i].name);
                rc = -1;
            }
        }
        if (rc == 0) __atomic_store_n(&g_loaded, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
