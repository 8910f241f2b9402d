/*
 * One connection: NLANES sockets ("lanes"), each with a worker thread that
 * connects (sending side), runs its own handshake, then moves records.
 * NCCL's calls only queue requests and poll their state, so none of them
 * blocks on the network; the lanes give one connection several cores of
 * AES-GCM and several TCP streams, as NCCL's own socket transport gives a
 * connection several sockets and helper threads.
 *
 * Handshake (per lane, both sides, over the lane's new socket):
 *   hello   = "CCBNET" 0 3 | le32 role | le16 lane | le16 nlanes |
 *             32 fresh random bytes | listen id (16) | connection id (16)
 *   th      = SHA-256("ccbridge/net/v2" | sender's hello | receiver's hello)
 *   K_x     = HKDF-SHA256(secret, salt = th, info = label_x)
 *   confirm = HMAC-SHA256(K_confirm_<own role>, th), checked before any data
 * so a wrong key, a stale (replayed) hello or a different listen id fails the
 * lane and with it the connection on both sides, and every lane has fresh
 * keys. The receiver wants nlanes distinct lane numbers under one
 * connection id (the sender's random, shared by its lanes).
 *
 * Records: header (le64 seq, le64 msg, le64 size, le64 offset, le32 n,
 * le32 flags = 0) | ciphertext | tag, the header as AAD, the nonce
 * 0^4 | le64(seq) under the lane's key (a fresh record key every
 * 2^EPOCH_SHIFT records). A message of size bytes is k = record_plan(size)
 * records; record j travels on lane (first + j) % nlanes. A receiving lane
 * wants its seq exactly in order, known flags, exactly one of the plan's
 * records (offset j * rec, the plan's length, on the plan's lane, each
 * lane's records of a message in the plan's order, every record of a
 * message agreeing on its size and first lane), checked before any payload
 * byte is written, the message inside the posted buffer, and a good tag; so
 * the request completes when all k records have arrived, each once. The
 * header is sent in the clear: message sizes, counts and timing are visible
 * on the wire. A sender that closes cleanly
 * ends every lane with a FIN record (flags 1, no payload). A lane whose
 * socket ends at a record boundary without one (a rank that exits or dies
 * without closing) ends only itself, like a FIN: the records it brought
 * stand, and the connection fails once a receive needs a record the lane
 * never carried (the message was cut short), or once every lane ended
 * (nothing more can come). A socket that ends inside a record, and anything
 * else, fails the connection and every request on it.
 *
 * Stages (CCBRIDGE_NET_TURNS=0 or 1: turns below off; CCBRIDGE_NET_PIPELINE
 * = depth, default 2; 0: none): each lane
 * has a second thread, so that its cryptography overlaps its socket I/O.
 * Sending, the lane thread seals records into depth buffer slots and the
 * send stage writes them in order and counts each once written; receiving,
 * the lane thread reads records in place (every header check above done
 * first, as before) and the open stage opens them in order and counts each.
 * The lane's key and record-key epoch belong to whichever thread runs the
 * crypto: the lane thread uses it itself only while the stage holds no
 * record (a record that arrived before its receive, a FIN, and a message of
 * one record, which skips the hand-off for latency). A failing stage fails
 * the connection like any lane; a lane thread ends its stage before it ends.
 * A receiving lane whose socket ends (a FIN, its end without one, a cut or
 * an error) first waits for its stage to open and count every record it
 * read, as one thread would have: those stand, and a lane's end is judged
 * (which receives it starves, whether it was the last) by them. Records are
 * read and opened in place, so a failed connection leaves its pending
 * receives' buffers with what arrived, unauthenticated (a lane reads up to
 * depth records past one whose tag its stage has yet to find bad).
 *
 * Turns (CCBRIDGE_NET_TURNS = T, 2..8, the default 2 where it is unset or
 * empty; the stages above at 0 or 1): a lane's T
 * threads take turns at its socket. The turn's holder does what one lane
 * thread does up to the crypto (sending: takes the lane's next record and
 * its seq; receiving: reads the next record in place, every check above
 * first, claims, early records and the lane's end included), then passes
 * the turn on and seals (opens) that record itself under its own key
 * context, so the record's bytes stay in the cache of the core that
 * touched them and up to T records of a lane are sealed (opened) at once.
 * Sealed records are written in seq order (a write turn). A receiving
 * lane's end waits, as with the stages, until every record it read is
 * opened and counted; a lane reads up to T - 1 records past one whose tag
 * another of its threads has yet to find bad. A message of one record on
 * a lane with nothing else in flight (sending: every earlier record
 * written, no message queued behind it; receiving: no record opening on
 * another thread, no byte of the next one read) skips the hand-off for
 * latency, as with the stages: the holder seals and writes (opens) it
 * with the turn kept, so no thread of the lane is woken, and goes on to
 * the lane's next record itself. Keeping the turn keeps it in seq order
 * and its own key context keyed for its epoch, as any turn's record;
 * bulk records pass the turn on as before.
 *
 * Hand-off, kept off the per-record path: isend puts a message on the queue
 * of each lane with records in it (the lanes read their queues without the
 * lock and work out their records from the plan); a receiving lane takes the
 * lock once per message, at its first record of it; every lane counts its
 * records with one atomic add, and the one that adds the k-th completes the
 * request.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "net.h"

#define HELLO_BYTES 80
/* version 3: records of up to 512 KiB (2: 256 KiB), which a receiver checks against its own plan: a peer of
 * another version is refused here, not mid-stream as a malformed record */
static const char MAGIC[8] = {'C', 'C', 'B', 'N', 'E', 'T', 0, 3};

int handshake_timeout_s(void) {
    const char *s = getenv("CCBRIDGE_NET_HANDSHAKE_TIMEOUT");
    int t = s ? atoi(s) : 0;
    return t > 0 ? t : 60;
}

int lanes_wanted(void) {
    const char *s = getenv("CCBRIDGE_NET_LANES");
    int n = s ? atoi(s) : 0;
    return n < 1 ? DEFAULT_LANES : n > MAX_LANES ? MAX_LANES : n;
}

int pipeline_wanted(void) {
    const char *s = getenv("CCBRIDGE_NET_PIPELINE");
    int n = s && *s ? atoi(s) : DEFAULT_PIPELINE;
    /* one slot would not overlap: the lane thread would wait for it before sealing the next record */
    return n < 1 ? 0 : n < 2 ? 2 : n > MAX_PIPELINE ? MAX_PIPELINE : n;
}

int turns_wanted(void) {
    const char *s = getenv("CCBRIDGE_NET_TURNS");
    int n = s && *s ? atoi(s) : DEFAULT_TURNS;
    /* 0 or 1 (one thread taking turns with itself would be the serial lane): off, the stage pipeline */
    return n < 2 ? 0 : n > MAX_TURNS ? MAX_TURNS : n;
}

/* how long lane 0 (every one-record message's lane) polls before it sleeps: a thread woken from
 * sleep costs several microseconds per message, which small collectives feel at every hop. Only
 * after a message that was all lane 0's (one record, or one lane): a message spread over lanes
 * waits on lanes that never poll, so lane 0 polling after one gains little latency, and in a
 * stream of them it kept up to a core busy per side that the other lanes need */
long spin_us_wanted(void) {
    const char *s = getenv("CCBRIDGE_NET_SPIN_US");
    /* a machine of few cores has none to spare for polling (it starves the threads doing the work) */
    long us = s && *s ? atol(s) : sysconf(_SC_NPROCESSORS_ONLN) >= SPIN_CORES ? DEFAULT_SPIN_US : 0;
    return us < 0 ? 0 : us > MAX_SPIN_US ? MAX_SPIN_US : us;
}

static long spin_ns(void) {
    /* read and set by every connection's lane 0 (the send and the receive side's, at once): atomic,
     * relaxed (each computes the same value) */
    static _Atomic long cached = -1;
    long ns = atomic_load_explicit(&cached, memory_order_relaxed);
    if (ns < 0) {
        ns = spin_us_wanted() * 1000;
        atomic_store_explicit(&cached, ns, memory_order_relaxed);
    }
    return ns;
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* every wait of lane l rechecks stop and failure (its cv under c->mu, held by the caller; its ring's
 * under rmu, taken here: a stage between its check and its wait cannot miss the wakeup) */
static void wake_lane(lane *l) {
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_lock(&l->rmu);
    pthread_cond_broadcast(&l->rcv);
    pthread_mutex_unlock(&l->rmu);
}

/* the first failure wins; it wakes every lane (sockets shut, waits broadcast) */
static void fail(comm *c, int quiet, ncclResult_t code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void fail(comm *c, int quiet, ncclResult_t code, const char *fmt, ...) {
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->err) == ncclSuccess) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->why, sizeof c->why, fmt, ap);
        va_end(ap);
        atomic_store(&c->err, code);
        int expected = COMM_HANDSHAKE; /* a connection not handed to NCCL yet fails its connect/accept */
        atomic_compare_exchange_strong(&c->state, &expected, COMM_FAILED);
        c->told = !quiet;
        if (!quiet) net_log(1, "NET/ccbridge: connection %s: %s", c->sender ? "send" : "recv", c->why);
        for (int i = 0; i < c->nlanes; i++) {
            if (c->lanes[i].fd >= 0) shutdown(c->lanes[i].fd, SHUT_RDWR);
            wake_lane(&c->lanes[i]);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

static int failed(comm *c) { return atomic_load(&c->err) != ncclSuccess; }

ncclResult_t comm_error(comm *c) {
    ncclResult_t err = (ncclResult_t)atomic_load(&c->err);
    if (err == ncclSuccess) return err;
    pthread_mutex_lock(&c->mu);
    if (!c->told) net_log(1, "NET/ccbridge: connection %s: %s", c->sender ? "send" : "recv", c->why);
    c->told = 1; /* a quiet failure (the peer closed between messages) is told when a request meets it */
    pthread_mutex_unlock(&c->mu);
    return err;
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

static int connect_peer(lane *l) {
    comm *c = l->c;
    time_t deadline = time(NULL) + handshake_timeout_s();
    for (;;) {
        int fd = socket(c->peer.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) { fail(c, 0, ncclSystemError, "socket: %s", strerror(errno)); return -1; }
        socklen_t len = c->peer.sa.sa_family == AF_INET ? sizeof c->peer.in : sizeof c->peer.in6;
        if (connect(fd, &c->peer.sa, len) == 0) {
            pthread_mutex_lock(&c->mu);
            l->fd = fd;
            int dead = failed(c);
            pthread_mutex_unlock(&c->mu);
            if (dead) shutdown(fd, SHUT_RDWR); /* another lane failed meanwhile */
            return dead ? -1 : 0;
        }
        int e = errno;
        close(fd);
        if ((e != ECONNREFUSED && e != EINTR && e != ETIMEDOUT) || time(NULL) >= deadline || failed(c)) {
            fail(c, 0, ncclSystemError, "connect: %s", strerror(e));
            return -1;
        }
        usleep(20000); /* the listener's backlog was full: NCCL's own socket transport retries too */
    }
}

static void hello(uint8_t out[HELLO_BYTES], uint32_t role, uint16_t idx, uint16_t nlanes, const uint8_t rnd[32],
                  const uint8_t id[16], const uint8_t conn_id[16]) {
    memcpy(out, MAGIC, 8);
    memcpy(out + 8, &role, 4);
    memcpy(out + 12, &idx, 2);
    memcpy(out + 14, &nlanes, 2);
    memcpy(out + 16, rnd, 32);
    memcpy(out + 48, id, 16);
    memcpy(out + 64, conn_id, 16);
}

static int derive(comm *c, const uint8_t th[32], const char *label, uint8_t out[32]) {
    return crypto_hkdf(c->secret, KEY_BYTES, th, label, strlen(label), out);
}

/* the receiver's bookkeeping once a lane's peer is known: one connection, distinct lane numbers */
static int claim_lane(lane *l, const uint8_t theirs[HELLO_BYTES]) {
    comm *c = l->c;
    uint16_t idx, n;
    memcpy(&idx, theirs + 12, 2);
    memcpy(&n, theirs + 14, 2);
    int ok = 0;
    pthread_mutex_lock(&c->mu);
    if (n == c->nlanes && idx < n && !(c->lanes_seen >> idx & 1) &&
        (!c->conn_id_set || !memcmp(c->conn_id, theirs + 64, 16))) {
        if (!c->conn_id_set) memcpy(c->conn_id, theirs + 64, 16), c->conn_id_set = 1;
        c->lanes_seen |= 1u << idx;
        l->idx = idx;
        ok = 1;
    }
    pthread_mutex_unlock(&c->mu);
    return ok ? 0 : -1;
}

/* a peer that gave up mid-handshake (its side of a lane failed, which ends all its lanes) closes or
 * resets the socket: our write may see EPIPE/ECONNRESET rather than our read an EOF */
static int closed(int eof) { return eof || errno == EPIPE || errno == ECONNRESET; }
#define PEER_GONE "the peer closed the connection (a different key?)"

static int handshake(lane *l) {
    comm *c = l->c;
    uint8_t rnd[32], mine[HELLO_BYTES], theirs[HELLO_BYTES], t[15 + 2 * HELLO_BYTES], th[32];
    uint8_t kmine[32], ktheirs[32], cmine[32], ctheirs[32], cgot[32];
    int eof = 0, rc = -1;
    uint32_t role = c->sender ? 1 : 2, peer_role = c->sender ? 2 : 1;
    set_timeout(l->fd, handshake_timeout_s());
    if (crypto_random(rnd, sizeof rnd)) { fail(c, 0, ncclSystemError, "RAND_bytes failed"); return -1; }
    hello(mine, role, c->sender ? (uint16_t)l->idx : 0xffff, (uint16_t)c->nlanes, rnd, c->listen_id,
          c->sender ? c->conn_id : (const uint8_t[16]){0});
    if (write_full(l->fd, mine, HELLO_BYTES) || read_full(l->fd, theirs, HELLO_BYTES, &eof)) {
        fail(c, 0, ncclRemoteError, "handshake: %s", closed(eof) ? PEER_GONE : strerror(errno));
        goto out;
    }
    if (memcmp(theirs, MAGIC, 8) || memcmp(theirs + 8, &peer_role, 4) || memcmp(theirs + 48, c->listen_id, 16)) {
        fail(c, 0, ncclSystemError, "handshake: the peer is not a ccbridge net plugin of this version, "
                                    "or connected to another listener");
        goto out;
    }
    if (c->sender ? memcmp(theirs + 14, mine + 14, 2) != 0 : claim_lane(l, theirs) != 0) {
        fail(c, 0, ncclSystemError, "handshake: lane %u of %u does not belong to this connection",
             theirs[12] | theirs[13] << 8, theirs[14] | theirs[15] << 8);
        goto out;
    }
    memcpy(t, "ccbridge/net/v2", 15);
    memcpy(t + 15, c->sender ? mine : theirs, HELLO_BYTES);
    memcpy(t + 15 + HELLO_BYTES, c->sender ? theirs : mine, HELLO_BYTES);
    crypto_sha256(t, sizeof t, th);
    if (derive(c, th, c->sender ? "ccbridge/net/v2 confirm sender" : "ccbridge/net/v2 confirm receiver", kmine) ||
        derive(c, th, c->sender ? "ccbridge/net/v2 confirm receiver" : "ccbridge/net/v2 confirm sender", ktheirs) ||
        derive(c, th, "ccbridge/net/v2 data sender->receiver", l->data_key) ||
        crypto_hmac(kmine, 32, th, 32, cmine) || crypto_hmac(ktheirs, 32, th, 32, ctheirs)) {
        fail(c, 0, ncclSystemError, "handshake: key derivation failed");
        goto out;
    }
    if (write_full(l->fd, cmine, 32) || read_full(l->fd, cgot, 32, &eof)) {
        fail(c, 0, ncclRemoteError, "handshake: %s", closed(eof) ? PEER_GONE : strerror(errno));
        goto out;
    }
    volatile uint8_t diff = 0; /* constant time */
    for (int i = 0; i < 32; i++) diff |= cgot[i] ^ ctheirs[i];
    if (diff) {
        fail(c, 0, ncclSystemError, "handshake: the peer's confirmation does not verify: a different key "
                                    "($CCBRIDGE_KEY / $CCBRIDGE_KEY_FILE) or a tampered/replayed handshake");
        goto out;
    }
    set_timeout(l->fd, 0);
    int one = 1;
    setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small records go out at once */
    for (int t = 0; t < MAX_TURNS; t++) l->kx[t].epoch = UINT64_MAX;
    rc = 0;
out:
    wipe(kmine, 32), wipe(ktheirs, 32), wipe(rnd, 32);
    return rc;
}

/* the nonce of record seq on lane l, with kx (one of l's key contexts) keyed for its epoch */
static int record_key(lane *l, keyed *kx, uint64_t seq, uint8_t iv[12]) {
    uint64_t e = seq >> EPOCH_SHIFT;
    if (e != kx->epoch) {
        uint8_t info[29], zero[32] = {0}, key[KEY_BYTES];
        memcpy(info, "ccbridge/net/v2 epoch", 21);
        memcpy(info + 21, &e, 8);
        int rc = crypto_hkdf(l->data_key, KEY_BYTES, zero, info, sizeof info, key) || gcm_key(kx->g, key, l->c->sender);
        wipe(key, sizeof key);
        if (rc) return -1;
        kx->epoch = e;
    }
    memset(iv, 0, 4);
    memcpy(iv + 4, &seq, 8);
    return 0;
}

/* r's records are all moved (by the lane that counted the last). Only a pending request completes: one
 * that test() freed because the connection failed under it (another lane failed it while this lane
 * still moved a record) stays free, never done */
static void finish(req *r) {
    int pending = REQ_PENDING;
    atomic_compare_exchange_strong(&r->state, &pending, REQ_DONE);
}

/* ---- a lane's two stages: the ring between them; or its threads taking turns ---- */

static int halted(comm *c) { return c->stop || failed(c); }

/* the lane thread: the slot to fill next, once the stage has freed one; NULL once stopped or failed */
static slot *ring_slot(lane *l) {
    pthread_mutex_lock(&l->rmu);
    while (l->rhead - l->rtail == (uint64_t)l->depth && !halted(l->c)) pthread_cond_wait(&l->rcv, &l->rmu);
    slot *s = halted(l->c) ? NULL : &l->ring[l->rhead % (uint64_t)l->depth];
    pthread_mutex_unlock(&l->rmu);
    return s;
}

/* one end of the ring moved on (the lane thread's head: a slot filled; the stage's tail: one freed), and
 * whoever waits on the other end told */
static void ring_advance(lane *l, uint64_t *end) {
    pthread_mutex_lock(&l->rmu);
    (*end)++;
    pthread_cond_broadcast(&l->rcv);
    pthread_mutex_unlock(&l->rmu);
}

/* records the lane read and handed on that are not yet opened and counted (caller holds rmu): in the
 * ring, or (turns) opening on the lane's other threads */
static int handed(const lane *l) { return l->staged ? l->rhead != l->rtail : l->opening > 0; }

/* the lane thread (or the turn's holder): 1 when no record it handed on is outstanding (ring: the lane's
 * key, socket and buffers are then the lane thread's alone until it pushes again), waiting for that if
 * `wait`; 0 not yet, -1 halted */
static int ring_idle(lane *l, int wait) {
    if (!l->staged && !l->turns) return 1;
    pthread_mutex_lock(&l->rmu);
    while (wait && handed(l) && !halted(l->c)) pthread_cond_wait(&l->rcv, &l->rmu);
    int rc = halted(l->c) ? -1 : !handed(l);
    pthread_mutex_unlock(&l->rmu);
    return rc;
}

/* the receiving lane thread, before it ends or fails its lane (a FIN, its socket's end or a broken
 * socket): 1 once every record it read is opened and counted, as one thread would have before reading
 * on (the peer finished sending those, and lane_end bounds what the lane brought by them); 0 once the
 * connection stopped or failed (the stage dropped what it held: nothing more to say) */
static int drain(lane *l) { return !halted(l->c) && ring_idle(l, 1) > 0; }

/* the stage: the oldest filled slot; NULL once halted, or once the lane thread quit and none is left */
static slot *ring_next(lane *l) {
    pthread_mutex_lock(&l->rmu);
    while (l->rhead == l->rtail && !l->quit && !halted(l->c)) pthread_cond_wait(&l->rcv, &l->rmu);
    slot *s = halted(l->c) || l->rhead == l->rtail ? NULL : &l->ring[l->rtail % (uint64_t)l->depth];
    pthread_mutex_unlock(&l->rmu);
    return s;
}

/* turns: the lane's socket (and its record in turn: seq, the message being cut or claimed, l->next,
 * l->buf) to this thread alone, once no other holds it; 0 once the lane is over or halted */
static int take_turn(lane *l) {
    pthread_mutex_lock(&l->rmu);
    while (l->held && !l->over && !l->quit && !halted(l->c)) pthread_cond_wait(&l->rcv, &l->rmu);
    int ok = !l->over && !l->quit && !halted(l->c);
    l->held |= ok;
    pthread_mutex_unlock(&l->rmu);
    return ok;
}

/* turns: the socket to the next thread; `opening` records (0 or 1) now outstanding with this one, `over`
 * when the lane ended (every thread of it leaves) */
static void give_turn(lane *l, int opening, int over) {
    pthread_mutex_lock(&l->rmu);
    l->held = 0, l->opening += opening, l->over |= over;
    pthread_cond_broadcast(&l->rcv);
    pthread_mutex_unlock(&l->rmu);
}

/* turns, send: wait until record seq is the next to be written (records are written in seq order);
 * 0 once halted */
static int write_turn(lane *l, uint64_t seq) {
    pthread_mutex_lock(&l->rmu);
    while (l->wseq != seq && !halted(l->c)) pthread_cond_wait(&l->rcv, &l->rmu);
    int ok = !halted(l->c);
    pthread_mutex_unlock(&l->rmu);
    return ok;
}

/* one of r's k records moved (sent, or received and opened): the k-th completes r (recv: its size) */
static void finish_record(req *r, uint32_t k, const uint64_t *size) {
    if (atomic_fetch_add(&r->done, 1) + 1 == k) {
        if (size) r->size = *size;
        finish(r);
    }
}

/* ---- sending lanes ---- */

/* lane idx's first record in r (j), or k when it has none */
static uint32_t first_share(const req *r, int idx, int nlanes) {
    uint32_t j = (uint32_t)((idx - (int)r->first + nlanes) % nlanes);
    return j < r->k ? j : r->k;
}

/* record j of r sealed as record seq of lane l under kx into h (header | ciphertext | tag), *len its bytes
 * on the wire */
static int seal_record(lane *l, keyed *kx, const req *r, uint32_t j, size_t rec, uint64_t seq, uint8_t *h,
                       size_t *len) {
    size_t off = (size_t)j * rec, n = r->size - off < rec ? r->size - off : rec;
    uint32_t n32 = (uint32_t)n, flags = 0;
    uint64_t size = r->size, off64 = off;
    uint8_t iv[12];
    memcpy(h, &seq, 8), memcpy(h + 8, &r->msg, 8), memcpy(h + 16, &size, 8), memcpy(h + 24, &off64, 8);
    memcpy(h + 32, &n32, 4), memcpy(h + 36, &flags, 4);
    if (record_key(l, kx, seq, iv) ||
        gcm_seal(kx->g, iv, h, HEADER_BYTES, (uint8_t *)r->data + off, n, h + HEADER_BYTES, h + HEADER_BYTES + n)) {
        fail(l->c, 0, ncclSystemError, "AES-GCM seal failed");
        return -1;
    }
    *len = HEADER_BYTES + n + TAG_BYTES;
    return 0;
}

static int write_record(lane *l, const uint8_t *h, size_t len) {
    if (write_full(l->fd, h, len)) {
        /* a socket shut by our own close (an abort with sends in flight) is no failure of the peer */
        if (!halted(l->c)) fail(l->c, 0, ncclRemoteError, "send: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* the send stage: writes the sealed records in order, counting each once written */
static void write_stage(lane *l) {
    for (slot *s; (s = ring_next(l));) {
        if (write_record(l, l->buf + (size_t)(s - l->ring) * SLOT_BYTES, s->n)) return;
        finish_record(s->r, s->k, NULL);
        ring_advance(l, &l->rtail);
    }
}

/* the next message with records for lane l (its queue's head), or NULL once the connection stops
 * or fails; lane 0 polls `spin` ns before it sleeps, the others sleep at once */
static req *next_message(lane *l, long spin) {
    comm *c = l->c;
    if (spin && l->qtail == atomic_load(&l->qhead))
        for (long t0 = now_ns(); l->qtail == atomic_load(&l->qhead) && !c->stop && now_ns() - t0 < spin;) relax();
    if (l->qtail == atomic_load(&l->qhead)) {
        pthread_mutex_lock(&c->mu); /* comm_post pushes and signals under it: no wakeup is lost */
        while (!c->stop && !failed(c) && l->qtail == atomic_load(&l->qhead)) pthread_cond_wait(&l->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
    }
    if (c->stop || failed(c)) return NULL;
    return &c->reqs[l->q[l->qtail++ % MAX_REQS] % MAX_REQS];
}

/* lane l's next record to send, record *j of *r (*rec bytes a record of it, *k records in all): the lane's
 * share of each queued message in turn; 0 once the connection stops or fails. A message's fields were
 * written before its queue entry was published, and stay until every lane with a share (this one too) has
 * counted its records: r is not read here after this lane's last record of it is handed out */
static int next_record(lane *l, req **r, uint32_t *j, size_t *rec, uint32_t *k) {
    comm *c = l->c;
    uint32_t nl = (uint32_t)c->nlanes;
    if (l->sj >= l->sk) { /* lane 0 polls after a message that was all its own (sk: the last one's records) */
        req *m = next_message(l, l->sk == 1 || nl == 1 ? (l->idx == 0 ? spin_ns() : 0) : 0);
        if (!m) return 0;
        l->sreq = m, l->sk = m->k, l->sj = first_share(m, l->idx, c->nlanes);
        record_plan(m->size, c->nlanes, &l->srec);
    }
    *r = l->sreq, *j = l->sj, *rec = l->srec, *k = l->sk;
    l->sj += nl;
    return 1;
}

static void send_lane(lane *l) {
    keyed *kx = &l->kx[0];
    size_t rec, len;
    uint32_t j, k;
    for (req *r; next_record(l, &r, &j, &rec, &k);) {
        /* nothing to overlap with (the lane's last record of r, no message queued after it, the
         * send stage idle): sent from here, sparing a small message the hand-off */
        int alone = l->sj >= k && l->qtail == atomic_load(&l->qhead);
        int idle = !l->staged ? 1 : alone ? ring_idle(l, 0) : 0;
        if (idle < 0) return;
        if (idle) {
            if (seal_record(l, kx, r, j, rec, l->seq++, l->buf, &len) || write_record(l, l->buf, len)) return;
            finish_record(r, k, NULL);
            continue;
        }
        slot *s = ring_slot(l);
        if (!s || seal_record(l, kx, r, j, rec, l->seq++, l->buf + (size_t)(s - l->ring) * SLOT_BYTES, &s->n))
            return;
        s->r = r, s->k = k;
        ring_advance(l, &l->rhead);
    }
}

/* turns, send: whether record seq (taken by the turn's holder) is the lane's next to be written, every
 * earlier one written: nothing then waits in write_turn, and none can until the holder gives the turn */
static int turn_idle(lane *l, uint64_t seq) {
    pthread_mutex_lock(&l->rmu);
    int idle = l->wseq == seq && !halted(l->c);
    pthread_mutex_unlock(&l->rmu);
    return idle;
}

/* turns, send: thread t takes the lane's next record and its number in turn, seals it into its own slot
 * with its own key context while the other threads take theirs, then writes it once every earlier record
 * of the lane is written. A message of one record, none queued behind it, on a lane with nothing else in
 * flight is sealed and written with the turn kept (the pipeline's fast path): no other thread is woken,
 * for it or for the next message, which the same thread takes */
static void send_turns(lane *l, int t) {
    keyed *kx = &l->kx[t];
    uint8_t *buf = l->buf + (size_t)t * SLOT_BYTES;
    size_t rec, len;
    uint32_t j, k;
    for (int mine = 0; mine || take_turn(l);) {
        req *r;
        int got = next_record(l, &r, &j, &rec, &k);
        uint64_t seq = l->seq;
        l->seq += (uint64_t)got;
        mine = got && k == 1 && l->qtail == atomic_load(&l->qhead) && turn_idle(l, seq);
        if (!mine) give_turn(l, 0, !got);
        if (!got || seal_record(l, kx, r, j, rec, seq, buf, &len) || (!mine && !write_turn(l, seq)) ||
            write_record(l, buf, len))
            return;
        if (mine) {
            /* no thread waits for this record's write (turn_idle): none to wake */
            pthread_mutex_lock(&l->rmu);
            l->wseq++;
            pthread_mutex_unlock(&l->rmu);
        } else
            ring_advance(l, &l->wseq); /* the next record's writer goes on while r is counted */
        finish_record(r, k, NULL);
    }
}

/* ---- receiving lanes ---- */

static int busy(comm *c) {
    int any = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < MAX_REQS; i++) any |= atomic_load(&c->reqs[i].state) == REQ_PENDING;
    pthread_mutex_unlock(&c->mu);
    return any;
}

/* whether lane l, which its peer ended, leaves receive r (its plan known) short: l's share of r is its
 * records j0, j0 + nlanes, ... below k, each lane brings its share of a message in that order, and l
 * brought records up to its last one. Caller holds c->mu. */
static int starves(const lane *l, const req *r) {
    int nl = l->c->nlanes;
    uint32_t j0 = (uint32_t)((l->idx - (int)r->first + nl) % nl);
    if (j0 >= r->k) return 0;                                 /* no share in r */
    if (!l->end_any || l->end_msg < r->msg) return 1;         /* none of it came */
    return l->end_msg == r->msg && l->end_j + (uint64_t)nl < r->k; /* part of it came */
}

/* a receive that needs records lane l will never bring */
static void fail_cut(comm *c, const lane *l, int how, uint64_t msg) {
    fail(c, 0, ncclRemoteError, "lane %d: %s, before its records of message %llu", l->idx,
         how == LANE_FIN ? "the peer closed the connection" : "the peer's socket ended without closing",
         (unsigned long long)msg);
}

/* the posted receive of message msg, checked against the record's view of it (its size, and the
 * lane of its record 0 implied by where this record came); NULL after failing. A lane claims each
 * message once, at its first record of it; the message cannot finish before the lane counts that
 * record, so the lane keeps r for the message's later records. The first claim makes the message's
 * plan known: a lane that ended before bringing its share fails it now. */
static req *claim_message(lane *l, uint64_t msg, uint64_t size, uint32_t k, uint32_t first) {
    comm *c = l->c;
    pthread_mutex_lock(&c->mu);
    req *r = &c->reqs[msg % MAX_REQS];
    const char *bad = r->msg != msg || atomic_load(&r->state) != REQ_PENDING ? "a record of a finished message"
                      : r->k && (r->total != size || r->first != first) ? "records of one message disagree on its size or layout"
                                                                         : NULL;
    size_t cap = r->size;
    const lane *gone = NULL;
    if (!bad && size <= cap && !r->k) {
        r->k = k, r->total = size, r->first = first;
        for (int i = 0; i < c->nlanes && !gone; i++)
            if (c->lanes[i].ended && starves(&c->lanes[i], r)) gone = &c->lanes[i];
    }
    int how = gone ? gone->ended : LANE_OPEN;
    pthread_mutex_unlock(&c->mu);
    if (bad) fail(c, 0, ncclSystemError, "lane %d: %s", l->idx, bad);
    else if (size > cap)
        fail(c, 0, ncclSystemError, "the message (%llu bytes) is longer than the posted receive buffer (%zu bytes)",
             (unsigned long long)size, cap);
    else if (gone) fail_cut(c, gone, how, msg);
    return bad || size > cap || gone ? NULL : r;
}

/* the peer ended lane l at a record boundary, with a FIN or its socket's end (how), after the record
 * (last_msg, last_j) (any 0: none came): every record the lane will bring was counted, so the lane is
 * done, and the connection too only where that costs a receive: a pending one that needs records the
 * lane never brought (cut short), or, once every lane ended, any pending one (nothing more comes; a
 * later receive meets the failure when posted). Quiet where it costs none, like a FIN. */
static void lane_end(lane *l, int how, uint64_t last_msg, uint64_t last_j, int any) {
    comm *c = l->c;
    pthread_mutex_lock(&c->mu);
    l->ended = how, l->end_msg = last_msg, l->end_j = last_j, l->end_any = any;
    int all = ++c->ended == c->nlanes, pending = 0, eof_lane = -1;
    uint64_t cut = UINT64_MAX;
    for (int i = 0; i < MAX_REQS; i++) {
        req *r = &c->reqs[i];
        if (atomic_load(&r->state) != REQ_PENDING) continue;
        pending = 1;
        if (r->k && starves(l, r) && r->msg < cut) cut = r->msg;
    }
    for (int i = 0; i < c->nlanes && eof_lane < 0; i++)
        if (c->lanes[i].ended == LANE_EOF) eof_lane = c->lanes[i].idx;
    pthread_mutex_unlock(&c->mu);
    if (cut != UINT64_MAX) fail_cut(c, l, how, cut);
    else if (all && eof_lane >= 0)
        fail(c, !pending, ncclRemoteError, "lane %d: the peer's socket ended without closing", eof_lane);
    else if (all) fail(c, !pending, ncclRemoteError, "the peer closed the connection");
}

/* the next record's header (into h): what the last payload's read brought of it, then the rest;
 * lane 0 polls the socket for `spin` ns before it blocks. 0, or -1 on an error or the socket's end,
 * *eof then 1 at the record boundary (before the header's first byte), 2 inside the header */
static int read_header(lane *l, uint8_t h[HEADER_BYTES], long spin, int *eof) {
    size_t got = l->have;
    memcpy(h, l->next, got);
    l->have = 0;
    for (long t0 = spin ? now_ns() : 0; got < HEADER_BYTES;) {
        int polling = spin && now_ns() - t0 < spin && !l->c->stop;
        ssize_t r = recv(l->fd, h + got, HEADER_BYTES - got, polling ? MSG_DONTWAIT : 0);
        if (r > 0) got += (size_t)r;
        else if (r == 0) { *eof = got ? 2 : 1; return -1; }
        else if (errno == EINTR) continue;
        else if (polling && (errno == EAGAIN || errno == EWOULDBLOCK)) relax();
        else return -1;
    }
    return 0;
}

/* a record's n payload bytes into dst and its tag, in as few reads as the socket allows; a read
 * may also take (part of) the next record's header, kept in l->next, but never waits for it */
static int read_body(lane *l, void *dst, size_t n, uint8_t tag[TAG_BYTES], int *eof) {
    struct iovec iov[3] = {{dst, n}, {tag, TAG_BYTES}, {l->next, HEADER_BYTES}};
    int i = n ? 0 : 1;
    while (i < 2) {
        ssize_t r = readv(l->fd, iov + i, 3 - i);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            *eof = r == 0;
            return -1;
        }
        for (size_t got = (size_t)r; got;) {
            size_t take = got < iov[i].iov_len ? got : iov[i].iov_len;
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + take, iov[i].iov_len -= take, got -= take;
            if (i == 2) l->have += take;
            else if (!iov[i].iov_len) i++;
        }
    }
    return 0;
}

/* a record's payload opened in place under kx, a key context of lane l the caller owns (the open stage's,
 * the lane thread's while that stage is idle, or a turn thread's own) */
static int open_record(lane *l, keyed *kx, uint64_t seq, const uint8_t h[HEADER_BYTES], uint8_t *dst, size_t n,
                       const uint8_t tag[TAG_BYTES]) {
    uint8_t iv[12];
    if (record_key(l, kx, seq, iv) || gcm_open(kx->g, iv, h, HEADER_BYTES, dst, n, dst, tag)) {
        fail(l->c, 0, ncclSystemError, "lane %d: record %llu failed authentication (tampered, or a different key)",
             l->idx, (unsigned long long)seq);
        return -1;
    }
    return 0;
}

/* a record read in place (s), opened and counted by whoever holds it */
static int open_slot(lane *l, keyed *kx, slot *s) {
    if (open_record(l, kx, s->seq, s->h, s->dst, s->n, s->tag)) return -1;
    finish_record(s->r, s->k, &s->size);
    return 0;
}

/* recv: wait until message msg was posted (its record came first), for at most ms milliseconds
 * (ms < 0: for as long as it takes); 1 once posted, 0 not yet, -1 once stopped or failed */
static int wait_posted(lane *l, uint64_t msg, long ms) {
    comm *c = l->c;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000, until.tv_nsec += ms % 1000 * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    l->want = msg, l->waiting = 1; /* comm_post wakes this lane alone, once msg is posted */
    while (!c->stop && !failed(c) && msg >= atomic_load(&c->posted) && rc == 0)
        rc = ms < 0 ? pthread_cond_wait(&l->cv, &c->mu) : pthread_cond_timedwait(&l->cv, &c->mu, &until);
    l->waiting = 0;
    int posted = msg < atomic_load(&c->posted);
    pthread_mutex_unlock(&c->mu);
    return c->stop || failed(c) ? -1 : posted;
}

/* the stage pipeline: record s, read in place, opened here when nothing is left to overlap with (the
 * lane's last record of its message, no next record begun to arrive, the open stage idle: a small message
 * spared the hand-off), else handed to that stage; 0, or -1 after failing or halting */
static int open_in_turn(lane *l, const slot *s, int last) {
    int idle = !l->staged ? 1 : !last || l->have ? 0 : ring_idle(l, 0);
    if (idle < 0) return -1;
    if (idle) return open_slot(l, &l->kx[0], (slot *)s);
    slot *to = ring_slot(l);
    if (!to) return -1;
    *to = *s;
    ring_advance(l, &l->rhead);
    return 0;
}

/* the lane's end, read instead of a record's header: its socket's end or a break (eof as read_header set
 * it), or a FIN record (h); judged once every record the lane read is opened and counted. Always -1 (the
 * lane is over) */
static int recv_end(lane *l, keyed *kx, const uint8_t *h, int eof, int e) {
    comm *c = l->c;
    if (!drain(l)) return -1;
    if (!h) {
        /* no FIN first: the peer exited or died, or the lane was cut on the wire; at a record
         * boundary that ends the lane alone (a truncated message fails where it is needed) */
        if (eof == 1) lane_end(l, LANE_EOF, l->rmsg, l->rj, l->rany);
        else if (eof) fail(c, 0, ncclRemoteError, "lane %d: the peer closed the connection mid-record", l->idx);
        else fail(c, !busy(c), ncclRemoteError, "lane %d: %s without closing", l->idx, strerror(e));
        return -1;
    }
    uint64_t seq, msg, size, off;
    uint32_t n;
    uint8_t none[1], tag[TAG_BYTES], iv[12];
    memcpy(&seq, h, 8), memcpy(&msg, h + 8, 8), memcpy(&size, h + 16, 8), memcpy(&off, h + 24, 8);
    memcpy(&n, h + 32, 4);
    /* the records before it are opened and counted first (the peer's close ends no request) */
    if (n || msg || size || off || seq != l->seq || read_body(l, none, 0, tag, &eof) ||
        record_key(l, kx, seq, iv) || gcm_open(kx->g, iv, h, HEADER_BYTES, none, 0, none, tag)) {
        fail(c, 0, ncclSystemError, "lane %d: a bad end-of-connection record", l->idx);
        return -1;
    }
    lane_end(l, LANE_FIN, l->rmsg, l->rj, l->rany);
    return -1;
}

/* lane l's next record, read by the lane thread or the turn's holder (kx its key context): 1 with the
 * record read in place (s, *last: the lane's last record of its message) for the caller to open and count,
 * 0 when it was opened and counted here (it came before its receive), -1 once the lane is over (ended,
 * failed or halted) */
static int recv_record(lane *l, keyed *kx, slot *s, int *last) {
    comm *c = l->c;
    uint8_t *h = s->h, *tag = s->tag;
    uint64_t seq, msg, size, off;
    uint32_t n, flags;
    int eof = 0;
    if (read_header(l, h, l->rk == 1 || c->nlanes == 1 ? (l->idx == 0 ? spin_ns() : 0) : 0, &eof))
        return recv_end(l, kx, NULL, eof, errno);
    memcpy(&seq, h, 8), memcpy(&msg, h + 8, 8), memcpy(&size, h + 16, 8), memcpy(&off, h + 24, 8);
    memcpy(&n, h + 32, 4), memcpy(&flags, h + 36, 4);
    if (flags == FLAG_FIN) return recv_end(l, kx, h, 0, 0);
    /* the record must be exactly one of the plan's records: record j = offset / rec of the k that
     * record_plan cuts `size` into, of the length the plan gives it (so offset + n never passes size,
     * never wraps), on the lane the plan puts it (first + j), and on this lane the records of one
     * message come as the plan deals them (j, j + nlanes, ...): each record counts once, and k
     * counted records fill the message exactly. Checked before a byte of payload is read. */
    size_t rec = 0;
    uint32_t k = size <= (1ull << 40) ? record_plan(size, c->nlanes, &rec) : 0;
    if (seq != l->seq) {
        fail(c, 0, ncclSystemError, "lane %d: record %llu arrived where %llu was due: replayed, reordered or dropped",
             l->idx, (unsigned long long)seq, (unsigned long long)l->seq);
        return -1;
    }
    uint64_t j = rec ? off / rec : 0;
    int nl = c->nlanes;
    int same = l->rany && msg == l->rmsg;
    if (flags || !k || (rec ? off % rec != 0 : off != 0) || j >= k ||
        n != (size - off < rec ? size - off : rec) || (l->rany && msg < l->rmsg) ||
        (same ? j != l->rj + (uint64_t)nl : j >= (uint64_t)nl)) {
        fail(c, 0, ncclSystemError, "lane %d: malformed record header", l->idx);
        return -1;
    }
    uint32_t first = (uint32_t)((l->idx - (int)(j % (uint64_t)nl) + nl) % nl);
    l->rmsg = msg, l->rj = j, l->rk = k, l->rany = 1;
    /* a later record of a message this lane claimed: the claim's checks, against what it recorded */
    req *r = same ? l->rcur : NULL;
    if (r && (r->total != size || r->first != first)) {
        fail(c, 0, ncclSystemError, "lane %d: records of one message disagree on its size or layout", l->idx);
        return -1;
    }
    if (!same) l->rcur = NULL;
    /* a posted receive takes the record in place. One not posted yet (the sender ran ahead) is
     * waited for a while with the payload left in the socket, so that the record still lands in
     * place (a copy costs a quarter of what opening it does); after that the record goes into the
     * lane's own buffer and is authenticated before the lane waits on, so that a forged message
     * number fails soon instead of waiting for a receive that never comes */
    if (!r && msg >= atomic_load(&c->posted) && wait_posted(l, msg, EARLY_WAIT_MS) < 0) return -1;
    if (!r && msg < atomic_load(&c->posted) && !(r = l->rcur = claim_message(l, msg, size, k, first))) return -1;
    uint8_t *dst = r ? (uint8_t *)r->data + off : l->buf;
    if (read_body(l, dst, n, tag, &eof)) {
        int e = errno;
        if (drain(l)) /* not when our own close shut the socket */
            fail(c, 0, ncclRemoteError, "lane %d: %s mid-record", l->idx,
                 eof ? "the peer closed the connection" : strerror(e));
        return -1;
    }
    l->seq++;
    /* this lane's last record of the message: r may finish (and be reused) once it is counted */
    *last = j + (uint64_t)nl >= k;
    if (*last) l->rcur = NULL;
    s->dst = dst, s->n = n, s->seq = seq, s->size = size, s->k = k, s->r = r;
    if (r) return 1;
    /* authenticated before it waits for its receive (nothing handed on outstanding: the key is this
     * thread's) */
    if (ring_idle(l, 1) < 0 || open_record(l, kx, seq, h, l->buf, n, tag)) return -1;
    if (wait_posted(l, msg, -1) < 0 || !(r = l->rcur = claim_message(l, msg, size, k, first))) return -1;
    memcpy((uint8_t *)r->data + off, l->buf, n);
    if (*last) l->rcur = NULL;
    finish_record(r, k, &size);
    return 0;
}

static void recv_lane(lane *l) {
    for (;;) {
        slot s;
        int last = 0, rc = recv_record(l, &l->kx[0], &s, &last);
        if (rc < 0 || (rc > 0 && open_in_turn(l, &s, last))) return;
    }
}

/* turns, recv: whether the lane has no record read and handed on that is not yet opened and counted (the
 * turn's holder asks: none can be handed on until it gives the turn) */
static int turn_quiet(lane *l) {
    pthread_mutex_lock(&l->rmu);
    int quiet = !l->opening && !halted(l->c);
    pthread_mutex_unlock(&l->rmu);
    return quiet;
}

/* turns, recv: thread t reads the lane's next record in turn, then opens it with its own key context, in
 * place on the core that read it, while another thread reads the next. A message of one record, no next
 * record begun to arrive, on a lane with nothing else being opened is opened with the turn kept (the
 * pipeline's fast path): no other thread is woken, for it or for the next record, which the same thread
 * reads */
static void recv_turns(lane *l, int t) {
    keyed *kx = &l->kx[t];
    for (int mine = 0; mine || take_turn(l);) {
        slot s;
        int last = 0, rc = recv_record(l, kx, &s, &last);
        mine = rc > 0 && s.k == 1 && !l->have && turn_quiet(l);
        if (!mine) give_turn(l, rc > 0, rc < 0);
        if (rc < 0) return;
        if (!rc) continue;
        int bad = open_slot(l, kx, &s);
        if (!mine) {
            pthread_mutex_lock(&l->rmu);
            l->opening--;
            pthread_cond_broadcast(&l->rcv);
            pthread_mutex_unlock(&l->rmu);
        }
        if (bad) return;
    }
}

/* the open stage: opens the records read in place, in order, counting each */
static void open_stage(lane *l) {
    for (slot *s; (s = ring_next(l));) {
        if (open_slot(l, &l->kx[0], s)) return;
        ring_advance(l, &l->rtail);
    }
}

static void *stage_main(void *p) {
    lane *l = p;
    if (l->c->sender) write_stage(l);
    else open_stage(l);
    return NULL;
}

/* thread t of a lane whose threads take turns (0: the lane thread; t > 0 started into tth[t]) */
static void lane_turns(lane *l, int t) {
    if (l->c->sender) send_turns(l, t);
    else recv_turns(l, t);
}

/* a turn thread's start: its key context, kx[t] of its lane */
static void *turn_main(void *p) {
    keyed *kx = p;
    lane_turns((lane *)((char *)(kx - kx->t) - offsetof(lane, kx)), kx->t);
    return NULL;
}

/* the lane's other threads, after the lane thread's own work ended: told, then joined */
static void lane_join(lane *l) {
    if (!l->staged && l->crew < 2) return;
    pthread_mutex_lock(&l->rmu);
    l->quit = 1;
    pthread_cond_broadcast(&l->rcv);
    pthread_mutex_unlock(&l->rmu);
    if (l->staged) pthread_join(l->th2, NULL);
    for (int t = 1; t < l->crew; t++) pthread_join(l->tth[t], NULL);
}

static void *worker(void *p) {
    lane *l = p;
    comm *c = l->c;
    if ((c->sender && connect_peer(l)) || handshake(l)) {
        atomic_store(&c->state, COMM_FAILED);
        return NULL;
    }
    pthread_mutex_lock(&c->mu);
    if (++c->ready == c->nlanes && !failed(c)) {
        wipe(c->secret, KEY_BYTES); /* the lanes' keys are all it needs now */
        atomic_store(&c->state, COMM_READY);
    }
    pthread_mutex_unlock(&c->mu);
    if (c->turns) {
        /* the lane's threads take turns (fewer where one fails to start: the lane still runs on those) */
        l->turns = c->turns;
        for (l->crew = 1; l->crew < l->turns; l->crew++)
            if (pthread_create(&l->tth[l->crew], NULL, turn_main, &l->kx[l->crew])) break;
        lane_turns(l, 0);
    } else {
        /* the second stage; without its thread the lane runs both stages in turn */
        l->depth = c->depth;
        l->staged = l->depth && pthread_create(&l->th2, NULL, stage_main, l) == 0;
        if (c->sender) send_lane(l);
        else recv_lane(l);
    }
    lane_join(l);
    return NULL;
}

comm *comm_new(int sender, int nlanes, const net_addr *peer, const uint8_t secret[KEY_BYTES],
               const uint8_t listen_id[16]) {
    if (nlanes < 1 || nlanes > MAX_LANES) return NULL;
    comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->sender = sender, c->nlanes = nlanes, c->depth = pipeline_wanted(), c->turns = turns_wanted();
    if (peer) c->peer = *peer;
    memcpy(c->secret, secret, KEY_BYTES);
    memcpy(c->listen_id, listen_id, 16);
    if (sender && crypto_random(c->conn_id, 16)) { free(c); return NULL; }
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca; /* wait_posted's deadline is on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    for (int i = 0; i < nlanes; i++) {
        lane *l = &c->lanes[i];
        l->c = c, l->fd = -1, l->idx = i;
        l->sj = l->sk = l->rk = 1; /* as after a message of one record: lane 0 polls for the first */
        pthread_cond_init(&l->cv, &ca);
        pthread_cond_init(&l->rcv, NULL);
        pthread_mutex_init(&l->rmu, NULL);
    }
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < nlanes; i++) {
        lane *l = &c->lanes[i];
        int keys = c->turns ? c->turns : 1, slots = !sender ? 1 : c->turns ? c->turns : c->depth > 1 ? c->depth : 1;
        int ok = (l->buf = malloc((size_t)slots * SLOT_BYTES)) != NULL;
        for (int t = 0; t < keys; t++) ok &= (l->kx[t].g = gcm_new()) != NULL, l->kx[t].t = t;
        if (!ok) { comm_close(c); return NULL; } /* every lane's fd is -1 by now: none is closed */
    }
    return c;
}

static int start_lane(lane *l) {
    if (pthread_create(&l->th, NULL, worker, l) != 0) {
        fail(l->c, 0, ncclSystemError, "pthread_create: %s", strerror(errno));
        atomic_store(&l->c->state, COMM_FAILED);
        return -1;
    }
    l->started = 1;
    return 0;
}

int comm_start_lanes(comm *c) {
    for (int i = 0; i < c->nlanes; i++)
        if (start_lane(&c->lanes[i])) return -1;
    return 0;
}

int comm_add_socket(comm *c, int fd) {
    lane *l = &c->lanes[c->accepted++];
    pthread_mutex_lock(&c->mu);
    l->fd = fd;
    pthread_mutex_unlock(&c->mu);
    return start_lane(l);
}

/* NULL when MAX_REQS are already outstanding (NCCL then retries) */
req *comm_post(comm *c, void *data, size_t size) {
    pthread_mutex_lock(&c->mu);
    uint64_t m = atomic_load(&c->posted);
    req *r = &c->reqs[m % MAX_REQS];
    if (atomic_load(&r->state) != REQ_FREE) { pthread_mutex_unlock(&c->mu); return NULL; }
    r->c = c, r->data = data, r->size = size, r->msg = m, r->k = 0, r->first = 0;
    atomic_store(&r->done, 0);
    if (c->sender) {
        size_t rec;
        r->k = record_plan(size, c->nlanes, &rec);
        if (r->k > 1) r->first = (uint32_t)(c->rr++ % (uint64_t)c->nlanes);
    }
    atomic_store(&r->state, REQ_PENDING);
    atomic_store(&c->posted, m + 1);
    if (c->sender) {
        /* only the lanes with records in m hear of it; at most MAX_REQS messages are outstanding, so
         * a lane's queue (which holds only those) never overflows */
        for (uint32_t j = 0; j < r->k && j < (uint32_t)c->nlanes; j++) {
            lane *l = &c->lanes[(r->first + j) % (uint32_t)c->nlanes];
            uint64_t head = atomic_load_explicit(&l->qhead, memory_order_relaxed);
            l->q[head % MAX_REQS] = m;
            atomic_store_explicit(&l->qhead, head + 1, memory_order_release);
            pthread_cond_signal(&l->cv);
        }
    } else {
        for (int i = 0; i < c->nlanes; i++)
            if (c->lanes[i].waiting && c->lanes[i].want <= m) pthread_cond_signal(&c->lanes[i].cv);
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* a sender's clean end of lane l: an authenticated FIN record, only if the socket takes it at once */
static void send_fin(lane *l) {
    uint8_t *h = l->buf, iv[12], none[1];
    uint32_t flags = FLAG_FIN;
    memset(h, 0, HEADER_BYTES);
    memcpy(h, &l->seq, 8), memcpy(h + 36, &flags, 4);
    keyed *kx = &l->kx[0];
    if (!record_key(l, kx, l->seq, iv) && !gcm_seal(kx->g, iv, h, HEADER_BYTES, none, 0, none, h + HEADER_BYTES))
        (void)!send(l->fd, h, HEADER_BYTES + TAG_BYTES, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void comm_close(comm *c) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    /* a sender with nothing in flight ends its lanes cleanly (after the lane threads stopped);
     * otherwise (an abort) every socket is shut at once, which wakes lanes blocked on them */
    int clean = c->sender && atomic_load(&c->state) == COMM_READY && !failed(c);
    for (int i = 0; clean && i < MAX_REQS; i++) clean = atomic_load(&c->reqs[i].state) != REQ_PENDING;
    for (int i = 0; i < c->nlanes; i++) {
        if (!clean && c->lanes[i].fd >= 0) shutdown(c->lanes[i].fd, SHUT_RDWR);
        wake_lane(&c->lanes[i]);
    }
    pthread_mutex_unlock(&c->mu);
    /* every lane stops before any is torn down: a lane still running may fail() the connection
     * (its peer's FINs, a socket error), which shuts every lane's socket and wakes every lane's cv,
     * so a lane closed (fd number free for reuse) or destroyed while another runs is not safe */
    for (int i = 0; i < c->nlanes; i++)
        if (c->lanes[i].started) pthread_join(c->lanes[i].th, NULL);
    for (int i = 0; i < c->nlanes; i++) {
        lane *l = &c->lanes[i];
        if (clean) send_fin(l);
        if (l->fd >= 0) close(l->fd);
        for (int t = 0; t < MAX_TURNS; t++) gcm_free(l->kx[t].g);
        free(l->buf);
        pthread_cond_destroy(&l->cv);
        pthread_cond_destroy(&l->rcv);
        pthread_mutex_destroy(&l->rmu);
    }
    pthread_mutex_destroy(&c->mu);
    wipe(c, sizeof *c);
    free(c);
}
