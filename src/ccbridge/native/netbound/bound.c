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
 *   ccbridge-net-bound -l 4,8,16 -s 4M [-r 256K] [-c 2] [-i 8] [-t 2G] [-n 3] [-y] [-j]
 *
 * -c: crypto threads a lane (default 1), as many as seal or open a lane's
 * records at once in the plugin (its turns, CCBRIDGE_NET_TURNS: `bench net`
 * passes them); fewer would bound the plugin below what it does at few lanes.
 * -i: messages in flight (default 8, bench net's). -y: a thread a side that
 * polls and yields as NCCL's proxy thread does beside any transport.
 *
 * -r: record bytes (default: the plugin's plan for S over L lanes, capped at
 * 256 KiB: RECORD_MAX of native/ncclnet/plan.h). Opened records are real:
 * one record is sealed first and opened again and again (its tag checked).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static double median(const double *v, int k) {
    double s[16];
    memcpy(s, v, sizeof(double) * (size_t)k);
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && s[j] < s[j - 1]; j--) { double t = s[j]; s[j] = s[j - 1]; s[j - 1] = t; }
    return k % 2 ? s[k / 2] : (s[k / 2 - 1] + s[k / 2]) / 2;
}

/* each lane's bytes: whole records (both jobs move the same bytes), at least one */
static size_t per_lane(size_t total, int lanes, size_t record) {
    size_t per = total / (size_t)lanes / record * record;
    return per ? per : record;
}

typedef struct {
    int fd, sender, crypt; /* crypt 1: a crypto thread, not a stream */
    int lane, nlanes, t, cpl; /* this thread's lane of nlanes; a crypto thread's index t of its lane's cpl */
    size_t size, record, k;   /* message size, record size, records a message */
    size_t nrec;              /* the lane's records in the measurement */
    uint8_t *msgs;            /* inflight messages of size bytes, one after another */
    int inflight;
    const uint8_t *sealed; /* receiver: one record sealed under key/iv, to open again and again */
    const uint8_t *key, *iv;
    double end;
} job;

/* where the lane's q-th record lies in the messages: the plugin deals record j of each message to lane
 * j % nlanes (the message's first lane rotates, which changes which lane, not how much each carries) */
static uint8_t *record_at(const job *j, size_t q) {
    size_t i = (size_t)j->lane, nl = (size_t)j->nlanes;
    size_t first = j->k > i ? i : i % j->k, per_msg = j->k > i ? (j->k - 1 - i) / nl + 1 : 1;
    size_t m = q / per_msg, jj = first + q % per_msg * nl;
    return j->msgs + m % (size_t)j->inflight * j->size + jj * j->record;
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
        struct iovec v[3] = {{head, AAD}, {record_at(j, q), j->record}, {tag, TAG}}, *at = v;
        if (j->sender) v[0] = (struct iovec){slot, wire};
        int n = j->sender ? 1 : 3;
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
    for (size_t q = (size_t)j->t; ok && q < j->nrec; q += (size_t)j->cpl) {
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

/* -y: the thread NCCL's proxy runs beside any transport, polling and yielding its core between passes
 * (proxy.cc: `if (idle) sched_yield();`), as bench net's polling threads do beside the plugin */
static _Atomic int polling;
static void *poll_main(void *p) {
    (void)p;
    while (atomic_load(&polling)) sched_yield();
    return NULL;
}

typedef struct {
    int lanes, cpl, inflight, streams, crypt, poll;
    size_t size, total, record;
    const uint8_t *sealed, *key, *iv;
} plan;

/* one side of one measurement: streams and/or crypto from t0; writes (t0, end of streams, end of crypto, CPU s) */
#define MAX_LANES 32
#define MAX_CRYPTO 8
static void side(int sender, int *fds, const plan *pl, int ctl) {
    job jobs[MAX_LANES * (1 + MAX_CRYPTO)];
    pthread_t th[MAX_LANES * (1 + MAX_CRYPTO)], poller;
    int n = 0;
    char go;
    size_t k = pl->size / pl->record ? pl->size / pl->record : 1, nrec = per_lane(pl->total, pl->lanes, pl->record) /
                                                                        pl->record;
    /* the messages, touched before the clock (the plugin's callers' buffers) */
    uint8_t *msgs = malloc(pl->size * (size_t)pl->inflight);
    if (!msgs) die("malloc messages");
    memset(msgs, 0x3c, pl->size * (size_t)pl->inflight);
    job base = {-1, sender, 0, 0, pl->lanes, 0, 1, pl->size, pl->record, k, nrec, msgs, pl->inflight, pl->sealed,
                pl->key, pl->iv, 0};
    for (int i = 0; i < pl->lanes && pl->streams; i++) {
        jobs[n] = base;
        jobs[n].fd = fds[i], jobs[n].lane = i;
        n++;
    }
    for (int i = 0; i < pl->lanes * pl->cpl && pl->crypt; i++) {
        jobs[n] = base;
        jobs[n].crypt = 1, jobs[n].lane = i / pl->cpl, jobs[n].t = i % pl->cpl, jobs[n].cpl = pl->cpl;
        n++;
    }
    if (write(ctl, "r", 1) != 1 || read(ctl, &go, 1) != 1) die("sync");
    double t0 = now(), c0 = cpu_s();
    atomic_store(&polling, 1);
    if (pl->poll && pthread_create(&poller, NULL, poll_main, NULL)) die("pthread_create");
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, jobs[i].crypt ? crypto_main : stream_main, &jobs[i])) die("pthread_create");
    double ends[2] = {t0, t0};
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].end > ends[jobs[i].crypt]) ends[jobs[i].crypt] = jobs[i].end;
    }
    atomic_store(&polling, 0);
    if (pl->poll) pthread_join(poller, NULL);
    double out[4] = {t0, ends[0], ends[1], cpu_s() - c0};
    if (write(ctl, out, sizeof out) != sizeof out) die("report");
    free(msgs);
}

int main(int argc, char **argv) {
    int lanes_list[16] = {8}, nl = 1, reps = 3, cpl = 1, inflight = 8, poll = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t size = 4u << 20, total = 2ull << 30, rec_arg = 0;
    int json = 0;
    for (int o; (o = getopt(argc, argv, "l:s:r:c:i:t:n:yj")) != -1;) {
        if (o == 'l') {
            nl = 0;
            for (char *t = strtok(optarg, ","); t && nl < 16; t = strtok(NULL, ",")) lanes_list[nl++] = atoi(t);
        } else if (o == 's') size = parse_size(optarg);
        else if (o == 'r') rec_arg = parse_size(optarg);
        else if (o == 't') total = parse_size(optarg);
        else if (o == 'j') json = 1;
        else if (o == 'y') poll = 1;
        else if (o == 'i') {
            inflight = atoi(optarg);
            if (inflight < 1 || inflight > 64) { fprintf(stderr, "-i: 1..64\n"); return 2; }
        }
        else if (o == 'c') {
            cpl = atoi(optarg);
            if (cpl < 1 || cpl > MAX_CRYPTO) { fprintf(stderr, "-c: 1..%d\n", MAX_CRYPTO); return 2; }
        }
        else if (o == 'n') reps = atoi(optarg) < 1 ? 1 : atoi(optarg) > 16 ? 16 : atoi(optarg);
        else { fprintf(stderr, "usage: %s [-l 4,8,16] [-s 4M] [-r REC] [-c 1] [-i 8] [-t 2G] [-n 3] [-y] [-j]\n",
                           argv[0]);
            return 2;
        }
    }
    char err[256];
    if (ossl_load(err, sizeof err)) { fprintf(stderr, "libcrypto: %s\n", err); return 1; }
    uint8_t key[32], iv[12];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 7 + 1);
    for (int i = 0; i < 12; i++) iv[i] = (uint8_t)(i + 3);
    if (!json) printf("# streams and AES-256-GCM (%d threads a lane) of the same bytes, %d messages of %zu B in flight%s,\n"
           "# %.0f MiB per measurement, %ld CPUs; GB/s of the bytes over the later side's end (median of %d); cores:\n"
           "# both sides' CPU over that time\n", cpl, inflight, size, poll ? ", a polling thread a side" : "",
           total / 1048576.0, sysconf(_SC_NPROCESSORS_ONLN), reps);
    if (!json) printf("%5s %8s %12s %12s %12s %6s %12s %6s\n", "lanes", "record", "streams", "crypto", "both at once", "cores",
           "seal, open", "TCP");
    for (int li = 0; li < nl; li++) {
        int lanes = lanes_list[li];
        if (lanes < 1 || lanes > MAX_LANES) { fprintf(stderr, "-l: 1..%d\n", MAX_LANES); return 2; }
        size_t record = rec_arg;
        if (!record) record_plan(size, lanes, &record); /* the plugin's own plan (ncclnet/plan.c) */
        /* one record sealed for the receiver to open again and again */
        uint8_t *sealed = calloc(1, record + TAG), aad[AAD] = {0};
        OSSL_CTX *c = ossl.ctx_new();
        int len;
        memset(sealed, 0x3c, record);
        if (ossl.enc_init(c, ossl.aes_256_gcm(), NULL, key, iv) != 1 || ossl.enc_update(c, NULL, &len, aad, AAD) != 1 ||
            ossl.enc_update(c, sealed, &len, sealed, (int)record) != 1 || ossl.enc_final(c, sealed + record, &len) != 1 ||
            ossl.ctrl(c, OSSL_GCM_GET_TAG, TAG, sealed + record) != 1) { fprintf(stderr, "seal failed\n"); return 1; }
        ossl.ctx_free(c);
        int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        if (ls < 0 || bind(ls, (void *)&a, sizeof a) || listen(ls, lanes) || getsockname(ls, (void *)&a, &al)) die("listen");
        int sfd[MAX_LANES], rfd[MAX_LANES];
        for (int i = 0; i < lanes; i++) {
            if ((sfd[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0 || connect(sfd[i], (void *)&a, sizeof a)) die("connect");
            if ((rfd[i] = accept(ls, NULL, NULL)) < 0) die("accept");
            setsockopt(sfd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        close(ls);
        double res[3][16], cores[3][16], seal[16], open_[16], tcp[16];
        for (int r = 0; r < reps && r < 16; r++) {
            for (int m = 0; m < 3; m++) { /* streams alone, crypto alone, both */
                int ctl[2][2];
                pid_t pid[2];
                for (int s = 0; s < 2; s++) {
                    if (socketpair(AF_UNIX, SOCK_STREAM, 0, ctl[s])) die("socketpair");
                    if ((pid[s] = fork()) < 0) die("fork");
                    if (!pid[s]) {
                        close(ctl[s][0]);
                        plan pl = {lanes, cpl, inflight, m != 1, m != 0, poll, size, total, record, sealed, key, iv};
                        side(s == 0, s == 0 ? sfd : rfd, &pl, ctl[s][1]);
                        _exit(0);
                    }
                    close(ctl[s][1]);
                }
                char b;
                for (int s = 0; s < 2; s++)
                    if (read(ctl[s][0], &b, 1) != 1) die("ready");
                for (int s = 0; s < 2; s++)
                    if (write(ctl[s][0], "g", 1) != 1) die("go");
                double o[2][4];
                for (int s = 0; s < 2; s++)
                    if (read(ctl[s][0], o[s], sizeof o[s]) != sizeof o[s]) die("result");
                for (int s = 0; s < 2; s++) { waitpid(pid[s], NULL, 0); close(ctl[s][0]); }
                double t0 = o[0][0] < o[1][0] ? o[0][0] : o[1][0], end = 0;
                for (int s = 0; s < 2; s++)
                    for (int k = 1; k < 3; k++) end = o[s][k] > end ? o[s][k] : end;
                double bytes = (double)per_lane(total, lanes, record) * lanes;
                res[m][r] = bytes / (end - t0) / 1e9;
                cores[m][r] = (o[0][3] + o[1][3]) / (end - t0);
                if (m == 2) {
                    tcp[r] = bytes / ((o[1][1] > o[0][1] ? o[1][1] : o[0][1]) - t0) / 1e9;
                    seal[r] = bytes / (o[0][2] - t0) / 1e9;
                    open_[r] = bytes / (o[1][2] - t0) / 1e9;
                }
            }
        }
        int k = reps < 16 ? reps : 16;
        if (json) {
            const char *names[] = {"streams", "crypto", "both", "cores", "seal", "open", "tcp"};
            const double *rows[] = {res[0], res[1], res[2], cores[2], seal, open_, tcp};
            printf("{\"lanes\": %d, \"crypto_threads\": %d, \"inflight\": %d, \"poll\": %d, \"record\": %zu, "
                   "\"size\": %zu, \"bytes\": %zu", lanes, cpl, inflight, poll, record, size,
                   per_lane(total, lanes, record) * (size_t)lanes);
            for (int m = 0; m < 7; m++) {
                printf(", \"%s\": [", names[m]);
                for (int r = 0; r < k; r++) printf("%s%.4f", r ? ", " : "", rows[m][r]);
                printf("]");
            }
            printf("}\n");
        } else {
            printf("%5d %8zu %12.2f %12.2f %12.2f %6.1f %5.2f, %5.2f %6.2f\n", lanes, record, median(res[0], k),
                   median(res[1], k), median(res[2], k), median(cores[2], k), median(seal, k), median(open_, k),
                   median(tcp, k));
        }
        fflush(stdout);
        for (int i = 0; i < lanes; i++) { close(sfd[i]); close(rfd[i]); }
        free(sealed);
    }
    return 0;
}
