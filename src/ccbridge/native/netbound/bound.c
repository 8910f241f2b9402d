/*
 * The NCCL net plugin's work with none of its waits, in native threads: the
 * reference `bench net`'s encrypted rows lack (its Python attempt measured
 * its own GIL: bench/RESULTS.md 2026-11-27 session 20, runs 3-4).
 *
 * Two processes, a sender and a receiver, each with L stream threads moving
 * their share of the bytes over L plain TCP loopback connections and, at the
 * same time and tied to nothing, C threads a lane sealing (sender) or opening
 * (receiver) as many bytes in records of R bytes with AES-256-GCM under
 * OpenSSL (the plugin's own library, bound as the plugin binds it:
 * native/common/ossl.c). The bytes lie where the plugin finds them: I
 * messages of S bytes in flight, each dealt to the lanes in records as the
 * plugin deals them; the sender seals each record from its place there into
 * a buffer of its own and its stream writes records (header, payload, tag)
 * from one buffer it reuses, as the plugin writes its sealed slot; the
 * receiver's stream reads each record into its place in the messages, and
 * its crypto opens a record that is in cache, as the plugin opens what it
 * has just read. First the streams alone, then the crypto alone, then both
 * at once; each as GB/s of the bytes over the later side's end. The plugin
 * does all of it and more (hand-offs, headers, ordering), so its encrypted
 * GB/s at L lanes sits at or below "both at once" on the same cores: that
 * figure is the limit the row is judged against.
 *
 * Built with the package as ccbridge/lib/ccbridge-net-bound (setup.py); `ccbridge
 * bench net` runs it beside its encrypted rows (-j: one JSON object a lane
 * count, every repeat's figures). By hand:
 *   ccbridge-net-bound -l 4,8,16 -s 4M [-r 256K] [-c 2] [-i 8] [-t 2G] [-n 3] [-y [-p US]] [-k] [-j]
 *
 * -c: crypto threads a lane (default 1), as many as seal or open a lane's
 * records at once in the plugin (its turns, CCBRIDGE_NET_TURNS: `bench net`
 * passes them); fewer would bound the plugin below what it does at few lanes.
 * -i: messages in flight (default 8, bench net's). -y: a thread a side that
 * polls and yields as NCCL's proxy thread does beside any transport (-p US:
 * napping that long between passes instead, as bench net's pollers do on a
 * machine of few cores). A message of one record travels on lane 0 alone, as
 * in the plugin. Each side is a process of its own that ends with this one.
 *
 * -k: a fourth pass, "coupled" (below coupled_stream): the same work with each lane's stream and crypto threads
 * handing records over in order, polling and yielding rather than sleeping, where no two lanes' records share a
 * place (a message of one record or of at least one a lane); it measures the hand-over design, not a limit.
 *
 * -r: record bytes (default: the plugin's plan for S over L lanes, capped at
 * 512 KiB: RECORD_MAX of native/ncclnet/plan.h). Opened records are real:
 * one record is sealed first and opened again and again (its tag checked).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/ossl.h"
#include "../common/sizes.h"
#include "../ncclnet/plan.h"

#define TAG 16
#define AAD 40

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* n bytes from the other process over the control socket, or exit saying which step lost it */
static void must_read(int fd, void *p, size_t n, const char *what) {
    ssize_t r = read(fd, p, n);
    if (r == (ssize_t)n) return;
    if (r < 0) die(what);
    fprintf(stderr, "%s: a measuring process ended early\n", what);
    exit(1);
}

static double median(const double *v, int k) {
    double s[16];
    memcpy(s, v, sizeof(double) * (size_t)k);
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) { double t = s[j]; s[j] = s[j - 1]; s[j - 1] = t; }
    return k % 2 ? s[k / 2] : (s[k / 2 - 1] + s[k / 2]) / 2;
}

typedef struct {
    int lanes, cpl, inflight, streams, crypt, poll, coupled;
    size_t size, total, record;
    const uint8_t *sealed, *key, *iv;
} plan;

/* the whole records of a message (main keeps a record within its message: at least one) */
static size_t per_message(const plan *pl) { return pl->size / pl->record; }

/* lane i's records in a measurement of about pl->total bytes: whole records (both jobs move the same bytes), at
 * least one. A message of one record travels on lane 0 in the plugin (its first lane rotates only for messages
 * of several), so there the other lanes carry none */
static size_t lane_records(const plan *pl, int i) {
    int one = per_message(pl) == 1;
    size_t per = one ? (i ? 0 : pl->total / pl->record) : pl->total / (size_t)pl->lanes / pl->record;
    return per || (one && i) ? per : 1;
}

static size_t total_bytes(const plan *pl) {
    size_t n = 0;
    for (int i = 0; i < pl->lanes; i++) n += lane_records(pl, i);
    return n * pl->record;
}

typedef struct {
    int fd, sender, crypt; /* crypt 1: a crypto thread, not a stream */
    int lane, nlanes, t, cpl; /* this thread's lane of nlanes; a crypto thread's index t of its lane's cpl */
    size_t size, record, k;   /* message size, record size, records a message */
    size_t nrec, done;        /* the lane's records in the measurement; a crypto thread's, sealed or opened */
    uint8_t *msgs;            /* inflight messages of size bytes, one after another */
    int inflight;
    const uint8_t *sealed; /* receiver: one record sealed under key/iv, to open again and again */
    const uint8_t *key, *iv;
    struct coupling *cp;   /* -k's coupled pass: the lane's hand-over between its stream and its crypto threads */
    double end;
} job;

/* where the lane's q-th record lies in the messages: the plugin deals record j of a message of k > 1 to lane
 * (first + j) % nlanes, the first rotating from message to message, so each lane carries its share; here lane i
 * takes records i, i + nlanes, ... of every message (record i % k where k <= i: the plugin's rotation gives
 * such a lane records of some messages, as many over time). One record a message: lane 0 alone */
static uint8_t *record_at(const job *j, size_t q) {
    size_t i = (size_t)j->lane, nl = (size_t)j->nlanes;
    size_t first = j->k > i ? i : i % j->k, per_msg = j->k > i ? (j->k - 1 - i) / nl + 1 : 1;
    size_t m = q / per_msg, jj = first + q % per_msg * nl;
    return j->msgs + m % (size_t)j->inflight * j->size + jj * j->record;
}

/* one record on the lane's socket: the sender writes at[0] (the whole record), the receiver reads into at[0..2] */
static void move_record(const job *j, struct iovec *at, int n, size_t wire) {
    for (size_t left = wire; left;) {
        ssize_t r = j->sender ? send(j->fd, at->iov_base, at->iov_len, 0) : readv(j->fd, at, n);
        if (r <= 0) die(j->sender ? "send" : "readv");
        left -= (size_t)r;
        for (size_t got = (size_t)r; got && n;) {
            size_t take = got < at->iov_len ? got : at->iov_len;
            at->iov_base = (uint8_t *)at->iov_base + take, at->iov_len -= take, got -= take;
            if (!at->iov_len) at++, n--;
        }
    }
}

/* a lane's socket, as the plugin's: the sender writes each record (header, payload, tag) from one buffer it
 * reuses (the plugin's sealed slot); the receiver reads each into its place in the messages, header and tag
 * apart (the plugin reads records in place) */
static void *stream_main(void *p) {
    job *j = p;
    size_t wire = AAD + j->record + TAG;
    uint8_t *slot = malloc(wire), head[AAD], tag[TAG];
    if (!slot) die("malloc");
    memset(slot, 0x5a, wire);
    for (size_t q = 0; q < j->nrec; q++) {
        struct iovec v[3] = {{head, AAD}, {record_at(j, q), j->record}, {tag, TAG}};
        if (j->sender) v[0] = (struct iovec){slot, wire};
        move_record(j, v, j->sender ? 1 : 3, wire);
    }
    j->end = now();
    free(slot);
    return NULL;
}

/* a lane's sealing (sender: each of its records read from its place in the messages, as the plugin seals
 * the caller's bytes into its slot) or opening (receiver: a record just read, so in cache, as the plugin
 * opens what it read a moment before); thread t of the lane's cpl takes records t, t + cpl, ... */
static void *crypto_main(void *p) {
    job *j = p;
    OSSL_CTX *c = ossl.ctx_new();
    uint8_t *in = malloc(j->record + TAG), *out = malloc(j->record + TAG), aad[AAD] = {0}, tag[TAG];
    int len;
    if (!c || !in || !out) die("crypto buffers");
    if (!j->sender) memcpy(in, j->sealed, j->record + TAG);
    int ok = (j->sender ? ossl.enc_init : ossl.dec_init)(c, ossl.aes_256_gcm(), NULL, j->key, NULL) == 1;
    for (size_t q = (size_t)j->t; ok && q < j->nrec; q += (size_t)j->cpl, j->done++) {
        if (j->sender) {
            ok = ossl.enc_init(c, NULL, NULL, NULL, j->iv) == 1 && ossl.enc_update(c, NULL, &len, aad, AAD) == 1 &&
                 ossl.enc_update(c, out, &len, record_at(j, q), (int)j->record) == 1 &&
                 ossl.enc_final(c, out + j->record, &len) == 1 && ossl.ctrl(c, OSSL_GCM_GET_TAG, TAG, tag) == 1;
        } else {
            memcpy(tag, in + j->record, TAG);
            ok = ossl.dec_init(c, NULL, NULL, NULL, j->iv) == 1 && ossl.dec_update(c, NULL, &len, aad, AAD) == 1 &&
                 ossl.dec_update(c, out, &len, in, (int)j->record) == 1 &&
                 ossl.ctrl(c, OSSL_GCM_SET_TAG, TAG, tag) == 1 && ossl.dec_final(c, out + j->record, &len) == 1;
        }
    }
    if (!ok) {
        fprintf(stderr, "AES-GCM %s failed\n", j->sender ? "seal" : "open (tag)");
        exit(1);
    }
    j->end = now();
    ossl.ctx_free(c);
    free(in);
    free(out);
    return NULL;
}

/* -k: the coupled pass, the plugin's data dependencies with none of its waits. Sending, a lane's crypto threads
 * seal its records in order into a ring of 2 x cpl slots and its stream writes each slot once it is sealed, a slot
 * sealed again once written; receiving, the stream reads each record into its place and the crypto threads open it
 * there once it is read (its tag checked: the sender sealed it under the record's own nonce), the stream reading
 * into a place again only once the record before it there is opened. A thread that finds nothing to do polls and
 * yields its core, never sleeps: the bound of a design that hands records between a lane's threads. */
#define MAX_CRYPTO 8
#define RING (2 * MAX_CRYPTO)
/* each counter on a cache line of its own, and each lane's on lines apart from the next lane's: no thread's write
 * disturbs a line another lane polls */
typedef struct coupling {
    _Alignas(64) _Atomic size_t moved;            /* records the stream wrote (sender) or read (receiver) */
    _Alignas(64) _Atomic size_t ready[RING];      /* sender: q + 1 once slot q % depth holds record q sealed */
    _Alignas(64) _Atomic size_t next[MAX_CRYPTO]; /* receiver: crypto thread t's next record to open (those
                                                   * before it opened) */
    _Alignas(64) size_t depth, window; /* sender's slots; receiver: a place's records apart (the lane's per window) */
    int cpl;                         /* the lane's crypto threads */
    uint8_t *slots, (*tags)[TAG];
} coupling;

/* a spin hint for 64 polls, then the core yielded; guarded as conn.c's relax(): the bound builds anywhere the plugin
 * does (an x86 builtin broke the build on aarch64). The count stops at 64: a long wait never overflows it */
static void await_turn(int spun) {
    if (spun >= 64) { sched_yield(); return; }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
#define UNTIL(cond) for (int spun_ = 0; !(cond); spun_ += spun_ < 64) await_turn(spun_)

static void record_iv(const job *j, size_t q, uint8_t iv[12]) {
    uint32_t lane = (uint32_t)j->lane;
    uint64_t seq = q;
    memcpy(iv, &lane, 4), memcpy(iv + 4, &seq, 8);
}

static size_t opened_below(const job *j) { /* every record below this one is opened */
    size_t m = SIZE_MAX;
    for (int t = 0; t < j->cp->cpl; t++) {
        size_t n = atomic_load(&j->cp->next[t]);
        m = n < m ? n : m;
    }
    return m;
}

/* the coupled pass opens records in their places: it runs where no two lanes' records share one (a message of
 * one record, or of a record or more a lane) */
static int coupled_fits(const plan *pl) {
    size_t k = per_message(pl);
    return pl->coupled && (k == 1 || k >= (size_t)pl->lanes);
}

static void *coupled_stream(void *p) {
    job *j = p;
    coupling *cp = j->cp;
    size_t wire = AAD + j->record + TAG;
    uint8_t head[AAD];
    for (size_t q = 0; q < j->nrec; q++) {
        struct iovec v[3] = {{head, AAD}, {record_at(j, q), j->record},
                             {cp->tags ? cp->tags[q % cp->window] : NULL, TAG}};
        int n = 3;
        if (j->sender) {
            UNTIL(atomic_load(&cp->ready[q % cp->depth]) == q + 1);
            v[0] = (struct iovec){cp->slots + q % cp->depth * wire, wire}, n = 1;
        } else
            UNTIL(q < opened_below(j) + cp->window);
        move_record(j, v, n, wire);
        atomic_store(&cp->moved, q + 1);
    }
    j->end = now();
    return NULL;
}

static void *coupled_crypto(void *p) {
    job *j = p;
    coupling *cp = j->cp;
    OSSL_CTX *c = ossl.ctx_new();
    uint8_t aad[AAD] = {0}, iv[12];
    size_t wire = AAD + j->record + TAG;
    int len, ok = c && (j->sender ? ossl.enc_init : ossl.dec_init)(c, ossl.aes_256_gcm(), NULL, j->key, NULL) == 1;
    for (size_t q = (size_t)j->t; ok && q < j->nrec; q += (size_t)j->cpl, j->done++) {
        uint8_t *place = record_at(j, q);
        record_iv(j, q, iv);
        if (j->sender) {
            UNTIL(q < atomic_load(&cp->moved) + cp->depth);
            uint8_t *slot = cp->slots + q % cp->depth * wire + AAD;
            ok = ossl.enc_init(c, NULL, NULL, NULL, iv) == 1 && ossl.enc_update(c, NULL, &len, aad, AAD) == 1 &&
                 ossl.enc_update(c, slot, &len, place, (int)j->record) == 1 &&
                 ossl.enc_final(c, slot + j->record, &len) == 1 &&
                 ossl.ctrl(c, OSSL_GCM_GET_TAG, TAG, slot + j->record) == 1;
            atomic_store(&cp->ready[q % cp->depth], q + 1);
        } else {
            UNTIL(atomic_load(&cp->moved) > q);
            ok = ossl.dec_init(c, NULL, NULL, NULL, iv) == 1 && ossl.dec_update(c, NULL, &len, aad, AAD) == 1 &&
                 ossl.dec_update(c, place, &len, place, (int)j->record) == 1 &&
                 ossl.ctrl(c, OSSL_GCM_SET_TAG, TAG, cp->tags[q % cp->window]) == 1 &&
                 ossl.dec_final(c, place + j->record, &len) == 1;
            atomic_store(&cp->next[j->t], q + (size_t)j->cpl);
        }
    }
    if (!ok) {
        fprintf(stderr, "AES-GCM %s failed (coupled pass)\n", j->sender ? "seal" : "open (tag)");
        exit(1);
    }
    j->end = now();
    ossl.ctx_free(c);
    return NULL;
}

/* -y: the thread NCCL's proxy runs beside any transport, polling and yielding its core between passes
 * (proxy.cc: `if (idle) sched_yield();`), as bench net's polling threads do beside the plugin; -p US: napping
 * that long between passes instead, as bench net's do on a machine of few cores */
static _Atomic int polling;
static long poll_pause_us;
static void *poll_main(void *p) {
    (void)p;
    struct timespec nap = {poll_pause_us / 1000000, poll_pause_us % 1000000 * 1000};
    while (atomic_load(&polling))
        if (poll_pause_us) nanosleep(&nap, NULL);
        else sched_yield();
    return NULL;
}

/* one side of one measurement: streams and/or crypto from t0; writes (t0, end of streams, end of crypto, CPU s,
 * records its crypto threads sealed or opened) */
#define MAX_LANES 32
static void side(int sender, int *fds, const plan *pl, int ctl) {
    job jobs[MAX_LANES * (1 + MAX_CRYPTO)];
    pthread_t th[MAX_LANES * (1 + MAX_CRYPTO)], poller;
    int n = 0;
    char go;
    /* the messages, touched before the clock (the plugin's callers' buffers) */
    uint8_t *msgs = malloc(pl->size * (size_t)pl->inflight);
    if (!msgs) die("malloc messages");
    memset(msgs, 0x3c, pl->size * (size_t)pl->inflight);
    job base = {-1, sender, 0, 0, pl->lanes, 0, 1, pl->size, pl->record, per_message(pl), 0, 0, msgs, pl->inflight,
                pl->sealed, pl->key, pl->iv, NULL, 0};
    coupling *cps = pl->coupled ? aligned_alloc(_Alignof(coupling), (size_t)pl->lanes * sizeof *cps) : NULL;
    if (pl->coupled && !cps) die("malloc coupling");
    if (cps) memset(cps, 0, (size_t)pl->lanes * sizeof *cps);
    for (int i = 0; cps && i < pl->lanes; i++) {
        /* a lane's records repeat their places every window: one record a message travels on lane 0 alone */
        size_t k = per_message(pl), mine = k == 1 ? 1 : k > (size_t)i ? (k - 1 - (size_t)i) / (size_t)pl->lanes + 1 : 1;
        cps[i].depth = 2 * (size_t)pl->cpl, cps[i].window = mine * (size_t)pl->inflight, cps[i].cpl = pl->cpl;
        for (int t = 0; t < pl->cpl; t++) atomic_store(&cps[i].next[t], (size_t)t);
        cps[i].slots = sender ? malloc(cps[i].depth * (AAD + pl->record + TAG)) : NULL;
        cps[i].tags = sender ? NULL : calloc(cps[i].window, TAG);
        if (sender ? !cps[i].slots : !cps[i].tags) die("malloc coupling");
        if (sender) memset(cps[i].slots, 0x5a, cps[i].depth * (AAD + pl->record + TAG));
    }
    for (int i = 0; i < pl->lanes * (1 + pl->cpl); i++) { /* a stream a lane, then cpl crypto threads a lane */
        int crypt = i >= pl->lanes, lane = crypt ? (i - pl->lanes) / pl->cpl : i;
        size_t nrec = lane_records(pl, lane);
        if (!nrec || !(crypt ? pl->crypt : pl->streams)) continue;
        jobs[n] = base;
        jobs[n].fd = crypt ? -1 : fds[lane], jobs[n].crypt = crypt, jobs[n].lane = lane, jobs[n].nrec = nrec;
        if (crypt) jobs[n].t = (i - pl->lanes) % pl->cpl, jobs[n].cpl = pl->cpl;
        jobs[n].cp = cps ? &cps[lane] : NULL;
        n++;
    }
    if (write(ctl, "r", 1) != 1) die("sync");
    must_read(ctl, &go, 1, "sync");
    double t0 = now(), c0 = cpu_s();
    atomic_store(&polling, 1);
    if (pl->poll && pthread_create(&poller, NULL, poll_main, NULL)) die("pthread_create");
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, jobs[i].cp ? (jobs[i].crypt ? coupled_crypto : coupled_stream)
                                                   : jobs[i].crypt ? crypto_main : stream_main, &jobs[i]))
            die("pthread_create");
    double ends[2] = {t0, t0}, done = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].end > ends[jobs[i].crypt]) ends[jobs[i].crypt] = jobs[i].end;
        done += (double)jobs[i].done;
    }
    atomic_store(&polling, 0);
    if (pl->poll) pthread_join(poller, NULL);
    double out[5] = {t0, ends[0], ends[1], cpu_s() - c0, done};
    if (write(ctl, out, sizeof out) != sizeof out) die("report");
    for (int i = 0; cps && i < pl->lanes; i++) free(cps[i].slots), free(cps[i].tags);
    free(cps);
    free(msgs);
}

/* one pass (m: 0 streams alone, 1 crypto alone, 2 both, 3 coupled) of both sides, each in a process of its own that
 * ends with this one and holds only its side's sockets; o[side] = what side() wrote */
static void one_pass(const plan *base, int m, int *sfd, int *rfd, pid_t parent, double o[2][5]) {
    int ctl[2][2];
    pid_t pid[2];
    for (int s = 0; s < 2; s++) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, ctl[s])) die("socketpair");
        if ((pid[s] = fork()) < 0) die("fork");
        if (!pid[s]) {
            close(ctl[s][0]);
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent) _exit(1);
            for (int i = 0; i < base->lanes; i++) close(s == 0 ? rfd[i] : sfd[i]);
            plan pl = *base;
            pl.streams = m != 1, pl.crypt = m != 0, pl.coupled = m == 3;
            side(s == 0, s == 0 ? sfd : rfd, &pl, ctl[s][1]);
            _exit(0);
        }
        close(ctl[s][1]);
    }
    char b;
    for (int s = 0; s < 2; s++) must_read(ctl[s][0], &b, 1, "ready");
    /* a side that died after its "ready": its end is closed, so the go fails (EPIPE, not the signal) */
    for (int s = 0; s < 2; s++)
        if (send(ctl[s][0], "g", 1, MSG_NOSIGNAL) != 1) {
            kill(pid[1 - s], SIGKILL);
            fprintf(stderr, "go: a measuring process ended early\n");
            exit(1);
        }
    /* a side that fails (exits) leaves the other blocked on a socket this process still holds: end it too. A side
     * that reported is left out (fd -1): its exit hangs its socket up, which poll reports whatever the events */
    for (int got = 0; got != 3;) {
        struct pollfd pf[2] = {{got & 1 ? -1 : ctl[0][0], POLLIN, 0}, {got & 2 ? -1 : ctl[1][0], POLLIN, 0}};
        if (poll(pf, 2, -1) < 0) die("poll");
        for (int s = 0; s < 2; s++) {
            if (got >> s & 1 || !pf[s].revents) continue;
            if (read(ctl[s][0], o[s], sizeof o[s]) != (ssize_t)sizeof o[s]) {
                kill(pid[1 - s], SIGKILL);
                fprintf(stderr, "result: a measuring process ended early\n");
                exit(1);
            }
            got |= 1 << s;
        }
    }
    for (int s = 0; s < 2; s++) { waitpid(pid[s], NULL, 0); close(ctl[s][0]); }
}

/* L connected loopback pairs: sfd[i] the sender's end of lane i, rfd[i] the receiver's */
static void connect_lanes(int lanes, int *sfd, int *rfd) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (void *)&a, sizeof a) || listen(ls, lanes) || getsockname(ls, (void *)&a, &al))
        die("listen");
    for (int i = 0; i < lanes; i++) {
        if ((sfd[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0 || connect(sfd[i], (void *)&a, sizeof a)) die("connect");
        if ((rfd[i] = accept(ls, NULL, NULL)) < 0) die("accept");
        setsockopt(sfd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    close(ls);
}

/* one record sealed under key/iv for the receiver to open again and again (its tag checked each time) */
static uint8_t *seal_one(size_t record, const uint8_t *key, const uint8_t *iv) {
    uint8_t *sealed = calloc(1, record + TAG), aad[AAD] = {0};
    OSSL_CTX *c = ossl.ctx_new();
    int len;
    if (!sealed || !c) die("seal");
    memset(sealed, 0x3c, record);
    if (ossl.enc_init(c, ossl.aes_256_gcm(), NULL, key, iv) != 1 || ossl.enc_update(c, NULL, &len, aad, AAD) != 1 ||
        ossl.enc_update(c, sealed, &len, sealed, (int)record) != 1 || ossl.enc_final(c, sealed + record, &len) != 1 ||
        ossl.ctrl(c, OSSL_GCM_GET_TAG, TAG, sealed + record) != 1) {
        fprintf(stderr, "seal failed\n");
        exit(1);
    }
    ossl.ctx_free(c);
    return sealed;
}

/* every repeat's figures at one lane count: one JSON object, or a row of medians */
static void report(int json, const plan *pl, int reps, double res[4][16], double cores[16], double seal[16],
                   double open_[16], double tcp[16], double recs[2][16]) {
    if (!json) {
        printf("%5d %8zu %12.2f %12.2f %12.2f %6.1f %5.2f, %5.2f %6.2f", pl->lanes, pl->record, median(res[0], reps),
               median(res[1], reps), median(res[2], reps), median(cores, reps), median(seal, reps),
               median(open_, reps), median(tcp, reps));
        if (coupled_fits(pl)) printf(" %8.2f", median(res[3], reps));
        else if (pl->coupled) printf(" %8s", "-");
        printf("\n");
        return;
    }
    const char *names[] = {"streams", "crypto", "both", "cores", "seal", "open", "tcp", "sealed", "opened"};
    const double *rows[] = {res[0], res[1], res[2], cores, seal, open_, tcp, recs[0], recs[1]};
    printf("{\"lanes\": %d, \"crypto_threads\": %d, \"inflight\": %d, \"poll\": %d, \"poll_pause_us\": %ld, "
           "\"record\": %zu, \"size\": %zu, \"bytes\": %zu, \"lane_records\": [", pl->lanes, pl->cpl, pl->inflight,
           pl->poll, poll_pause_us, pl->record, pl->size, total_bytes(pl));
    for (int i = 0; i < pl->lanes; i++)
        printf("%s%zu", i ? ", " : "", lane_records(pl, i));
    printf("]");
    for (int m = 0; m < 9; m++) {
        printf(", \"%s\": [", names[m]);
        for (int r = 0; r < reps; r++) printf(m < 7 ? "%s%.4f" : "%s%.0f", r ? ", " : "", rows[m][r]);
        printf("]");
    }
    if (pl->coupled && !coupled_fits(pl)) printf(", \"coupled\": null");
    if (coupled_fits(pl)) {
        printf(", \"coupled\": [");
        for (int r = 0; r < reps; r++) printf("%s%.4f", r ? ", " : "", res[3][r]);
        printf("]");
    }
    printf("}\n");
}

/* reps repeats of the three passes at pl->lanes lanes, then their report */
static void measure(const plan *base, int reps, int json, pid_t parent) {
    int sfd[MAX_LANES], rfd[MAX_LANES];
    double bytes = (double)total_bytes(base);
    double res[4][16], cores[4][16], seal[16], open_[16], tcp[16], recs[2][16];
    connect_lanes(base->lanes, sfd, rfd);
    for (int r = 0; r < reps; r++) {
        for (int m = 0; m < (coupled_fits(base) ? 4 : 3); m++) {
            double o[2][5];
            one_pass(base, m, sfd, rfd, parent, o);
            double t0 = o[0][0] < o[1][0] ? o[0][0] : o[1][0], end = 0;
            for (int s = 0; s < 2; s++)
                for (int e = 1; e < 3; e++) end = o[s][e] > end ? o[s][e] : end;
            res[m][r] = bytes / (end - t0) / 1e9;
            cores[m][r] = (o[0][3] + o[1][3]) / (end - t0);
            if (m == 2) {
                tcp[r] = bytes / ((o[1][1] > o[0][1] ? o[1][1] : o[0][1]) - t0) / 1e9;
                seal[r] = bytes / (o[0][2] - t0) / 1e9;
                open_[r] = bytes / (o[1][2] - t0) / 1e9;
                recs[0][r] = o[0][4], recs[1][r] = o[1][4];
            }
        }
    }
    report(json, base, reps, res, cores[2], seal, open_, tcp, recs);
    fflush(stdout);
    for (int i = 0; i < base->lanes; i++) { close(sfd[i]); close(rfd[i]); }
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [-l 4,8,16] [-s 4M] [-r REC] [-c 1] [-i 8] [-t 2G] [-n 3] [-y] [-p US] [-k] [-j]\n",
            argv0);
    return 2;
}

int main(int argc, char **argv) {
    int lanes_list[16] = {8}, nl = 1, reps = 3, cpl = 1, inflight = 8, poll = 0, json = 0, coupled = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t size = 4u << 20, total = 2ull << 30, rec_arg = 0;
    for (int o; (o = getopt(argc, argv, "l:s:r:c:i:t:n:p:ykj")) != -1;) {
        if (o == 'l') {
            nl = 0;
            for (char *t = strtok(optarg, ","); t && nl < 16; t = strtok(NULL, ",")) lanes_list[nl++] = atoi(t);
        } else if (o == 's') size = parse_size(optarg);
        else if (o == 'r') rec_arg = parse_size(optarg);
        else if (o == 't') total = parse_size(optarg);
        else if (o == 'j') json = 1;
        else if (o == 'y') poll = 1;
        else if (o == 'k') coupled = 1;
        else if (o == 'p') {
            poll_pause_us = atol(optarg);
            if (poll_pause_us < 0 || poll_pause_us > 100000) { fprintf(stderr, "-p: 0..100000 us\n"); return 2; }
        } else if (o == 'i') {
            inflight = atoi(optarg);
            if (inflight < 1 || inflight > 64) { fprintf(stderr, "-i: 1..64\n"); return 2; }
        } else if (o == 'c') {
            cpl = atoi(optarg);
            if (cpl < 1 || cpl > MAX_CRYPTO) { fprintf(stderr, "-c: 1..%d\n", MAX_CRYPTO); return 2; }
        } else if (o == 'n') reps = atoi(optarg) < 1 ? 1 : atoi(optarg) > 16 ? 16 : atoi(optarg);
        else return usage(argv[0]);
    }
    if (!size) { fprintf(stderr, "-s: at least 1 byte\n"); return 2; }
    for (int li = 0; li < nl; li++)
        if (lanes_list[li] < 1 || lanes_list[li] > MAX_LANES) { fprintf(stderr, "-l: 1..%d\n", MAX_LANES); return 2; }
    char err[256];
    pid_t parent = getpid();
    if (ossl_load(err, sizeof err)) { fprintf(stderr, "libcrypto: %s\n", err); return 1; }
    uint8_t key[32], iv[12];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 7 + 1);
    for (int i = 0; i < 12; i++) iv[i] = (uint8_t)(i + 3);
    if (!json) {
        printf("# streams and AES-256-GCM (%d threads a lane) of the same bytes, %d messages of %zu B in flight;\n"
               "# %.0f MiB a measurement, %ld CPUs%s; GB/s of the bytes over the later side's end (median of %d);\n"
               "# cores: both sides' CPU over that time\n", cpl, inflight, size, total / 1048576.0,
               sysconf(_SC_NPROCESSORS_ONLN), poll ? ", a polling thread a side" : "", reps);
        printf("%5s %8s %12s %12s %12s %6s %12s %6s%s\n", "lanes", "record", "streams", "crypto", "both at once",
               "cores", "seal, open", "TCP", coupled ? "  coupled" : "");
    }
    for (int li = 0; li < nl; li++) {
        size_t record = rec_arg;
        if (!record) record_plan(size, lanes_list[li], &record); /* the plugin's own plan (ncclnet/plan.c) */
        if (record > size) record = size; /* a one-record message: its record is the message (no byte past it) */
        uint8_t *sealed = seal_one(record, key, iv);
        plan pl = {lanes_list[li], cpl, inflight, 1, 1, poll, coupled, size, total, record, sealed, key, iv};
        measure(&pl, reps, json, parent);
        free(sealed);
    }
    return 0;
}
