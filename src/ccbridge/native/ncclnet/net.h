/* Internals of the ccbridge NCCL net plugin (hidden; see plugin.c). */
#ifndef CCB_NET_INTERNAL_H
#define CCB_NET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ncclnet.h"

#define KEY_BYTES 32
#define TAG_BYTES 16

/* logging through NCCL's logger (plugin.c); messages never carry key material */
void net_log(int warn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* crypto.c: OpenSSL's libcrypto.so.3, loaded at run time (no build-time headers) */
int crypto_load(char *err, size_t errlen);
int crypto_random(void *buf, size_t n);
void crypto_sha256(const void *in, size_t n, uint8_t out[32]);
int crypto_hmac(const uint8_t *key, size_t keylen, const void *in, size_t n, uint8_t out[32]);
int crypto_hkdf(const uint8_t *ikm, size_t ikmlen, const uint8_t salt[32], const void *info, size_t infolen,
                uint8_t out[32]);
typedef struct gcm gcm;
gcm *gcm_new(void);
void gcm_free(gcm *g);
/* seal/open one record: in may equal out; open returns -1 on a bad tag */
int gcm_seal(gcm *g, const uint8_t key[32], const uint8_t iv[12], const void *aad, size_t aadlen,
             const void *in, size_t n, void *out, uint8_t tag[TAG_BYTES]);
int gcm_open(gcm *g, const uint8_t key[32], const uint8_t iv[12], const void *aad, size_t aadlen,
             const void *in, size_t n, void *out, const uint8_t tag[TAG_BYTES]);
void wipe(void *p, size_t n);

/* keys.c: the group secret, with ccbridge.secure's formats and rules */
const char *key_weakness(const uint8_t key[KEY_BYTES]);
/* 0 and the secret, or -1 and why in err (never quoting the material) */
int key_load(uint8_t key[KEY_BYTES], char *err, size_t errlen);


/* ---- connections (conn.c) ---- */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <netinet/in.h>

#define RECORD_MAX (1u << 20)   /* plaintext bytes per record */
#define HEADER_BYTES 16         /* le32 length | le32 flags | le64 seq: the record's AAD */
#define FLAG_LAST 1u            /* the message's last record: truncation at a record boundary shows */
#define EPOCH_SHIFT 16          /* a fresh record key every 2^16 records (<= 64 GiB per key) */
#define MAX_REQS NCCL_NET_MAX_REQUESTS

typedef union { struct sockaddr sa; struct sockaddr_in in; struct sockaddr_in6 in6; } net_addr;

/* The listen handle NCCL carries to the connecting rank (<= 128 bytes).
 * stage is the connecting side's own progress (connect is called again
 * with the same buffer until it returns a comm); listen leaves it NULL. */
typedef struct {
    uint32_t magic, version;
    uint8_t listen_id[16];   /* bound into the handshake transcript */
    net_addr addr;           /* offset 24: where to connect */
    uint32_t pad;
    struct comm *stage;      /* offset 56 */
} net_handle;

enum { REQ_FREE = 0, REQ_PENDING, REQ_DONE, REQ_FAILED };
typedef struct req {
    struct comm *c;
    void *data;
    size_t size;             /* send: message length; recv: buffer capacity, then bytes received */
    _Atomic int state;
} req;

enum { COMM_HANDSHAKE = 0, COMM_READY = 1, COMM_FAILED = -1 };
typedef struct comm {
    int fd, sender;          /* sender: the connecting side; data flows sender -> receiver only */
    net_addr peer;           /* sender: where to connect */
    uint8_t secret[KEY_BYTES], listen_id[16], data_key[KEY_BYTES], epoch_key[KEY_BYTES];
    uint64_t epoch, seq;     /* the record key's epoch, the next record's number */
    _Atomic int state;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    req reqs[MAX_REQS];
    uint64_t head, tail;     /* the worker serves reqs[head % MAX_REQS]; posts go to tail */
    gcm *g;
    uint8_t *buf;            /* sender: one sealed record */
    ncclResult_t err;        /* the first failure, for every later request */
    char why[256];
} comm;

comm *comm_start(int fd, int sender, const net_addr *peer, const uint8_t secret[KEY_BYTES], const uint8_t listen_id[16]);
void comm_close(comm *c);
req *comm_post(comm *c, void *data, size_t size);
int handshake_timeout_s(void);
#endif
