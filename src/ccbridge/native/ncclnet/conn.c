/*
 * One connection: a worker thread that connects (sending side), runs the
 * handshake, then moves messages as AES-256-GCM records, one request at a
 * time in posting order. NCCL's calls only queue requests and poll their
 * state, so none of them blocks on the network.
 *
 * Handshake (both sides, over the new socket):
 *   hello   = "CCBNET" 0 1 | le32 role | 32 fresh random bytes | listen id (16)
 *   th      = SHA-256("ccbridge/net/v1" | sender's hello | receiver's hello)
 *   K_x     = HKDF-SHA256(secret, salt = th, info = label_x)
 *   confirm = HMAC-SHA256(K_confirm_<own role>, th), checked before any data
 * so a wrong key, a stale (replayed) hello or a different listen id fails the
 * connection on both sides, and every connection has fresh keys.
 *
 * Records: header (le32 length, le32 flags, le64 seq) | ciphertext | tag,
 * the header as AAD, the nonce 0^4 | le64(seq) under the connection's
 * sending key (a fresh record key every 2^EPOCH_SHIFT records). The
 * receiver wants seq exactly in order, the flags it knows, a length that fits
 * the posted buffer, and a good tag; a message ends only at a record
 * flagged LAST. Anything else fails the request and the connection.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "net.h"

#define HELLO_BYTES 64
static const char MAGIC[8] = {'C', 'C', 'B', 'N', 'E', 'T', 0, 1};

int handshake_timeout_s(void) {
    const char *s = getenv("CCBRIDGE_NET_HANDSHAKE_TIMEOUT");
    int t = s ? atoi(s) : 0;
    return t > 0 ? t : 60;
}

static void fail(comm *c, ncclResult_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(comm *c, ncclResult_t code, const char *fmt, ...) {
    if (c->err != ncclSuccess) return; /* keep the first cause */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    c->err = code;
    net_log(1, "NET/ccbridge: connection %s: %s", c->sender ? "send" : "recv", c->why);
}

/* 0, or -1 on EOF (*eof set) or error */
static int read_full(int fd, void *p, size_t n, int *eof) {
    for (uint8_t *b = p; n;) {
        ssize_t r = read(fd, b, n);
        if (r > 0) { b += r; n -= (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        *eof = r == 0;
        return -1;
    }
    return 0;
}

static int write_full(int fd, const void *p, size_t n) {
    for (const uint8_t *b = p; n;) {
        ssize_t r = send(fd, b, n, MSG_NOSIGNAL);
        if (r > 0) { b += r; n -= (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        return -1;
    }
    return 0;
}

static void set_timeout(int fd, int seconds) {
    struct timeval tv = {.tv_sec = seconds};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int connect_peer(comm *c) {
    time_t deadline = time(NULL) + handshake_timeout_s();
    for (;;) {
        int fd = socket(c->peer.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) { fail(c, ncclSystemError, "socket: %s", strerror(errno)); return -1; }
        socklen_t len = c->peer.sa.sa_family == AF_INET ? sizeof c->peer.in : sizeof c->peer.in6;
        if (connect(fd, &c->peer.sa, len) == 0) { c->fd = fd; return 0; }
        int e = errno;
        close(fd);
        if ((e != ECONNREFUSED && e != EINTR && e != ETIMEDOUT) || time(NULL) >= deadline) {
            fail(c, ncclSystemError, "connect: %s", strerror(e));
            return -1;
        }
        usleep(20000); /* the listener's backlog was full: NCCL's own socket transport retries too */
    }
}

static void hello(uint8_t out[HELLO_BYTES], uint32_t role, const uint8_t rnd[32], const uint8_t id[16]) {
    memcpy(out, MAGIC, 8);
    memcpy(out + 8, &role, 4);
    memset(out + 12, 0, 4);
    memcpy(out + 16, rnd, 32);
    memcpy(out + 48, id, 16);
}

static int derive(comm *c, const uint8_t th[32], const char *label, uint8_t out[32]) {
    return crypto_hkdf(c->secret, KEY_BYTES, th, label, strlen(label), out);
}

static int handshake(comm *c) {
    uint8_t rnd[32], mine[HELLO_BYTES], theirs[HELLO_BYTES], t[15 + 2 * HELLO_BYTES], th[32];
    uint8_t kmine[32], ktheirs[32], cmine[32], ctheirs[32], cgot[32];
    int eof = 0, rc = -1;
    uint32_t role = c->sender ? 1 : 2, peer_role = c->sender ? 2 : 1;
    set_timeout(c->fd, handshake_timeout_s());
    if (crypto_random(rnd, sizeof rnd)) { fail(c, ncclSystemError, "RAND_bytes failed"); return -1; }
    hello(mine, role, rnd, c->listen_id);
    if (write_full(c->fd, mine, HELLO_BYTES) || read_full(c->fd, theirs, HELLO_BYTES, &eof)) {
        fail(c, ncclRemoteError, "handshake: %s", eof ? "peer closed the connection" : strerror(errno));
        goto out;
    }
    if (memcmp(theirs, MAGIC, 8) || memcmp(theirs + 8, &peer_role, 4) || memcmp(theirs + 48, c->listen_id, 16)) {
        fail(c, ncclSystemError, "handshake: the peer is not a ccbridge net plugin of this version, "
                                 "or connected to another listener");
        goto out;
    }
    memcpy(t, "ccbridge/net/v1", 15);
    memcpy(t + 15, c->sender ? mine : theirs, HELLO_BYTES);
    memcpy(t + 15 + HELLO_BYTES, c->sender ? theirs : mine, HELLO_BYTES);
    crypto_sha256(t, sizeof t, th);
    if (derive(c, th, c->sender ? "ccbridge/net/v1 confirm sender" : "ccbridge/net/v1 confirm receiver", kmine) ||
        derive(c, th, c->sender ? "ccbridge/net/v1 confirm receiver" : "ccbridge/net/v1 confirm sender", ktheirs) ||
        derive(c, th, "ccbridge/net/v1 data sender->receiver", c->data_key) ||
        crypto_hmac(kmine, 32, th, 32, cmine) || crypto_hmac(ktheirs, 32, th, 32, ctheirs)) {
        fail(c, ncclSystemError, "handshake: key derivation failed");
        goto out;
    }
    if (write_full(c->fd, cmine, 32) || read_full(c->fd, cgot, 32, &eof)) {
        fail(c, ncclRemoteError, "handshake: %s", eof ? "peer closed the connection (a different key?)" : strerror(errno));
        goto out;
    }
    volatile uint8_t diff = 0; /* constant time */
    for (int i = 0; i < 32; i++) diff |= cgot[i] ^ ctheirs[i];
    if (diff) {
        fail(c, ncclSystemError, "handshake: the peer's confirmation does not verify: a different key "
                                 "($CCBRIDGE_KEY / $CCBRIDGE_KEY_FILE) or a tampered/replayed handshake");
        goto out;
    }
    set_timeout(c->fd, 0);
    c->epoch = UINT64_MAX;
    rc = 0;
out:
    wipe(kmine, 32), wipe(ktheirs, 32), wipe(rnd, 32);
    return rc;
}

/* the record key and nonce of record seq */
static int record_key(comm *c, uint64_t seq, uint8_t iv[12]) {
    uint64_t e = seq >> EPOCH_SHIFT;
    if (e != c->epoch) {
        uint8_t info[29], zero[32] = {0};
        memcpy(info, "ccbridge/net/v1 epoch", 21);
        memcpy(info + 21, &e, 8);
        if (crypto_hkdf(c->data_key, KEY_BYTES, zero, info, sizeof info, c->epoch_key)) return -1;
        c->epoch = e;
    }
    memset(iv, 0, 4);
    memcpy(iv + 4, &seq, 8);
    return 0;
}

static int send_message(comm *c, req *r) {
    size_t off = 0;
    do {
        uint32_t n = r->size - off < RECORD_MAX ? (uint32_t)(r->size - off) : RECORD_MAX;
        uint32_t flags = off + n == r->size ? FLAG_LAST : 0;
        uint8_t iv[12], *h = c->buf;
        memcpy(h, &n, 4), memcpy(h + 4, &flags, 4), memcpy(h + 8, &c->seq, 8);
        if (record_key(c, c->seq, iv) ||
            gcm_seal(c->g, c->epoch_key, iv, h, HEADER_BYTES, (uint8_t *)r->data + off, n, h + HEADER_BYTES,
                     h + HEADER_BYTES + n)) {
            fail(c, ncclSystemError, "AES-GCM seal failed");
            return -1;
        }
        if (write_full(c->fd, h, HEADER_BYTES + n + TAG_BYTES)) {
            fail(c, ncclRemoteError, "send: %s", strerror(errno));
            return -1;
        }
        c->seq++;
        off += n;
    } while (off < r->size);
    return 0;
}

static int recv_message(comm *c, req *r) {
    size_t got = 0;
    for (;;) {
        uint8_t h[HEADER_BYTES], tag[TAG_BYTES], iv[12];
        uint32_t n, flags;
        uint64_t seq;
        int eof = 0;
        if (read_full(c->fd, h, HEADER_BYTES, &eof)) goto closed;
        memcpy(&n, h, 4), memcpy(&flags, h + 4, 4), memcpy(&seq, h + 8, 8);
        if (seq != c->seq) {
            fail(c, ncclSystemError, "record %llu arrived where %llu was due: replayed, reordered or dropped",
                 (unsigned long long)seq, (unsigned long long)c->seq);
            return -1;
        }
        if ((flags & ~FLAG_LAST) || n > RECORD_MAX || n > r->size - got) {
            fail(c, ncclSystemError, n > r->size - got && n <= RECORD_MAX && !(flags & ~FLAG_LAST)
                     ? "the message is longer than the posted receive buffer (%zu bytes)" : "malformed record header (%zu)",
                 r->size);
            return -1;
        }
        uint8_t *dst = (uint8_t *)r->data + got;
        if (read_full(c->fd, dst, n, &eof) || read_full(c->fd, tag, TAG_BYTES, &eof)) goto closed;
        if (record_key(c, seq, iv) || gcm_open(c->g, c->epoch_key, iv, h, HEADER_BYTES, dst, n, dst, tag)) {
            fail(c, ncclSystemError, "record %llu failed authentication (tampered, or a different key)",
                 (unsigned long long)seq);
            return -1;
        }
        c->seq++;
        got += n;
        if (flags & FLAG_LAST) { r->size = got; return 0; }
        continue;
    closed:
        fail(c, ncclRemoteError, "%s mid-message (%zu bytes received)",
             eof ? "the peer closed the connection" : strerror(errno), got);
        return -1;
    }
}

static void serve(comm *c) {
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->stop && c->head == c->tail) pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop) { pthread_mutex_unlock(&c->mu); return; }
        req *r = &c->reqs[c->head % MAX_REQS];
        pthread_mutex_unlock(&c->mu);
        int ok = c->err == ncclSuccess && (c->sender ? send_message(c, r) : recv_message(c, r)) == 0;
        pthread_mutex_lock(&c->mu);
        atomic_store(&r->state, ok ? REQ_DONE : REQ_FAILED);
        c->head++;
        pthread_mutex_unlock(&c->mu);
    }
}

static void *worker(void *p) {
    comm *c = p;
    if ((c->sender && connect_peer(c)) || handshake(c)) {
        atomic_store(&c->state, COMM_FAILED);
        return NULL;
    }
    wipe(c->secret, KEY_BYTES); /* the connection keys are all it needs now */
    atomic_store(&c->state, COMM_READY);
    serve(c);
    return NULL;
}

comm *comm_start(int fd, int sender, const net_addr *peer, const uint8_t secret[KEY_BYTES], const uint8_t listen_id[16]) {
    comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd, c->sender = sender;
    if (peer) c->peer = *peer;
    memcpy(c->secret, secret, KEY_BYTES);
    memcpy(c->listen_id, listen_id, 16);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->g = gcm_new();
    c->buf = sender ? malloc(HEADER_BYTES + RECORD_MAX + TAG_BYTES) : NULL;
    if (!c->g || (sender && !c->buf) || pthread_create(&c->th, NULL, worker, c) != 0) {
        gcm_free(c->g);
        free(c->buf);
        wipe(c->secret, KEY_BYTES);
        free(c);
        return NULL;
    }
    return c;
}

/* NULL when MAX_REQS are already outstanding (NCCL then retries) */
req *comm_post(comm *c, void *data, size_t size) {
    pthread_mutex_lock(&c->mu);
    req *r = &c->reqs[c->tail % MAX_REQS];
    if (atomic_load(&r->state) != REQ_FREE) { pthread_mutex_unlock(&c->mu); return NULL; }
    r->c = c, r->data = data, r->size = size;
    atomic_store(&r->state, REQ_PENDING);
    c->tail++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return r;
}

void comm_close(comm *c) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR); /* wakes a worker blocked on the socket */
    pthread_join(c->th, NULL);
    if (c->fd >= 0) close(c->fd);
    gcm_free(c->g);
    free(c->buf);
    wipe(c, sizeof *c);
    free(c);
}
