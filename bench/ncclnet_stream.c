/*
 * The NCCL net plugin's loopback stream, driven from C (no Python in the
 * polling loop): two processes, one sending, one receiving, messages of
 * each size with `inflight` posted at a time, polled with test() as NCCL's
 * proxy thread does. Per side it reports the plugin threads' CPU (the
 * process's CPU less the polling thread's) as nanoseconds per byte moved,
 * and their context switches per MiB: the cost per byte that
 * `ccbridge bench net` reports as cores at a throughput, without the noise
 * of a loaded machine's wall clock.
 *
 *   cc -O2 -rdynamic -o /tmp/ncclnet_stream bench/ncclnet_stream.c -ldl -lpthread
 *   CCBRIDGE_KEY=$(openssl rand -hex 32) /tmp/ncclnet_stream \
 *       src/ccbridge/lib/libnccl-net-ccbridge.so -l 1,2,8 -s 64K,512K,4M -t 256M [-i 8] [-r 3] [-p 20] [-P]
 *
 * -p: microseconds the polling thread sleeps after a pass that found nothing
 * (0 = poll again after sched_yield(), as NCCL's proxy thread does; give a
 * machine of few cores a pause, or the two polling threads take its cores
 * from the plugin's).
 * -P: where the plugin threads' time goes (not in a -DCCB_NO_INTERPOSE build, the
 * one for sanitizers): this program interposes the libc calls the plugin makes (read, readv, recv, send, pthread_cond_wait,
 * pthread_mutex_lock; build with -rdynamic) and adds up their calls, wall
 * time and CPU time per side; the CPU outside them is the plugin's own
 * (AES-GCM, copies, bookkeeping).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/ccbridge/native/ncclnet/ncclnet.h"
#include "../src/ccbridge/native/common/sizes.h"

static ccbNet_v11 *net;

/* ---- -P: the plugin threads' libc calls, counted (the polling thread's are not) ---- */
enum { C_READ, C_READV, C_RECV, C_SEND, C_CONDWAIT, C_LOCK, C_N };
static const char *cname[C_N] = {"read", "readv", "recv", "send", "cond_wait", "mutex_lock"};
typedef struct { _Atomic long calls, wall_ns, cpu_ns; } counter;
static counter counters[C_N];
static int profiling;
static _Thread_local int polling; /* the bench's own thread */

static long ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

#define COUNTED(which, call)                                                                          \
    do {                                                                                              \
        if (!profiling || polling) return call;                                                      \
        long w0 = ns(CLOCK_MONOTONIC), c0 = ns(CLOCK_THREAD_CPUTIME_ID);                              \
        __typeof__(call) rv = call;                                                                   \
        counters[which].cpu_ns += ns(CLOCK_THREAD_CPUTIME_ID) - c0;                                    \
        counters[which].wall_ns += ns(CLOCK_MONOTONIC) - w0;                                          \
        counters[which].calls++;                                                                      \
        return rv;                                                                                    \
    } while (0)

static void *next(const char *name, const char *version) {
    void *f = version ? dlvsym(RTLD_NEXT, name, version) : NULL;
    return f ? f : dlsym(RTLD_NEXT, name);
}

#ifndef CCB_NO_INTERPOSE /* -DCCB_NO_INTERPOSE for sanitizer builds: the interposers hide libc from them */
ssize_t read(int fd, void *b, size_t n) {
    static ssize_t (*f)(int, void *, size_t);
    if (!f) f = next("read", NULL);
    COUNTED(C_READ, f(fd, b, n));
}
ssize_t readv(int fd, const struct iovec *iov, int n) {
    static ssize_t (*f)(int, const struct iovec *, int);
    if (!f) f = next("readv", NULL);
    COUNTED(C_READV, f(fd, iov, n));
}
ssize_t recv(int fd, void *b, size_t n, int flags) {
    static ssize_t (*f)(int, void *, size_t, int);
    if (!f) f = next("recv", NULL);
    COUNTED(C_RECV, f(fd, b, n, flags));
}
ssize_t send(int fd, const void *b, size_t n, int flags) {
    static ssize_t (*f)(int, const void *, size_t, int);
    if (!f) f = next("send", NULL);
    COUNTED(C_SEND, f(fd, b, n, flags));
}
int pthread_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu) {
    static int (*f)(pthread_cond_t *, pthread_mutex_t *);
    if (!f) f = next("pthread_cond_wait", "GLIBC_2.3.2"); /* not the pre-NPTL compat version */
    COUNTED(C_CONDWAIT, f(cv, mu));
}
int pthread_mutex_lock(pthread_mutex_t *mu) {
    static int (*f)(pthread_mutex_t *);
    if (!f) f = next("pthread_mutex_lock", NULL);
    COUNTED(C_LOCK, f(mu));
}
#endif

typedef struct { long calls[C_N], wall_ns[C_N], cpu_ns[C_N]; } profile;

static void snap(profile *p) {
    for (int i = 0; i < C_N; i++)
        p->calls[i] = counters[i].calls, p->wall_ns[i] = counters[i].wall_ns, p->cpu_ns[i] = counters[i].cpu_ns;
}

static void show(const char *who, const profile *a, const profile *b, size_t bytes, double cpu) {
    double mib = (double)bytes / (1 << 20), in = 0;
    printf("      %s:", who);
    for (int i = 0; i < C_N; i++) {
        long calls = b->calls[i] - a->calls[i];
        if (!calls) continue;
        in += (double)(b->cpu_ns[i] - a->cpu_ns[i]);
        printf(" %s %.1f/MiB wall %.3f cpu %.3f ns/B;", cname[i], calls / mib,
               (double)(b->wall_ns[i] - a->wall_ns[i]) / (double)bytes, (double)(b->cpu_ns[i] - a->cpu_ns[i]) / (double)bytes);
    }
    printf(" outside them %.3f ns/B\n", (cpu * 1e9 - in) / (double)bytes);
}
static void *ctx;

static void die(const char *what, int rc) {
    fprintf(stderr, "%s failed (NCCL error %d)\n", what, rc);
    exit(1);
}

static double now(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void nap(long us) {
    if (us > 0) nanosleep(&(struct timespec){.tv_nsec = us * 1000}, NULL);
    else sched_yield(); /* NCCL's proxy thread after an idle pass (proxy.cc: if (idle) sched_yield()) */
}

static int parse_list(char *s, size_t *out, int max) {
    int n = 0;
    for (char *save, *t = strtok_r(s, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) out[n++] = parse_size(t);
    return n;
}

static void xfer(int fd, void *p, size_t n, int out) {
    for (uint8_t *b = p; n;) {
        ssize_t r = out ? write(fd, b, n) : read(fd, b, n);
        if (r <= 0) { perror("pipe"); exit(1); }
        b += r, n -= (size_t)r;
    }
}

typedef struct { double cpu, wall; long vcsw, ivcsw; profile p0, p1; } sample;

/* this process less its polling (calling) thread */
static void take(sample *s) {
    struct rusage all, me;
    getrusage(RUSAGE_SELF, &all);
    getrusage(RUSAGE_THREAD, &me);
    s->cpu = all.ru_utime.tv_sec + all.ru_utime.tv_usec * 1e-6 + all.ru_stime.tv_sec + all.ru_stime.tv_usec * 1e-6 -
             now(CLOCK_THREAD_CPUTIME_ID);
    s->vcsw = all.ru_nvcsw - me.ru_nvcsw, s->ivcsw = all.ru_nivcsw - me.ru_nivcsw;
    s->wall = now(CLOCK_MONOTONIC);
}

static uint8_t pattern(size_t slot, size_t i) { return (uint8_t)(slot * 131 + i * 7 + (i >> 12)); }

/* one measurement; returns the bytes moved and fills d (this side's cost) */
static size_t stream(void *comm, int sender, size_t size, int inflight, size_t total, long poll_us, sample *d,
                     int *bad) {
    uint8_t **bufs = calloc((size_t)inflight, sizeof *bufs), **want = calloc((size_t)inflight, sizeof *want);
    void **reqs = calloc((size_t)inflight, sizeof *reqs);
    for (int i = 0; i < inflight; i++) { /* the patterns made before the clock: checked by memcmp in it */
        bufs[i] = malloc(size ? size : 1), want[i] = malloc(size ? size : 1);
        for (size_t b = 0; b < size; b++) want[i][b] = pattern((size_t)i, b), bufs[i][b] = sender ? want[i][b] : 0;
    }
    size_t count = total / (size ? size : 1);
    if (count < 2 * (size_t)inflight) count = 2 * (size_t)inflight;
    sample a, b;
    snap(&d->p0);
    take(&a);
    size_t posted = 0, done = 0;
    while (done < count) {
        int progress = 0;
        while (posted < count && posted - done < (size_t)inflight) {
            int slot = (int)(posted % (size_t)inflight), rc;
            void *r = NULL;
            if (sender) rc = net->isend(comm, bufs[slot], size, 0, NULL, NULL, &r);
            else {
                size_t sz = size;
                int tag = 0;
                void *data = bufs[slot], *mh = NULL, *ph = NULL;
                rc = net->irecv(comm, 1, &data, &sz, &tag, &mh, &ph, &r);
            }
            if (rc) die(sender ? "isend" : "irecv", rc);
            if (!r) break; /* the plugin is full: NCCL retries */
            reqs[slot] = r, posted++, progress = 1;
        }
        int slot = (int)(done % (size_t)inflight), fin = 0, got = 0;
        int rc = net->test(reqs[slot], &fin, &got);
        if (rc) die("test", rc);
        if (fin) {
            if (!sender && (done < (size_t)inflight || done >= count - (size_t)inflight))
                *bad |= memcmp(bufs[slot], want[slot], size) != 0;
            if (!sender && (size_t)got != size) *bad = 1;
            if (!sender) memset(bufs[slot], 0, size < 64 ? size : 64); /* a stale buffer must not pass */
            done++, progress = 1;
        }
        if (!progress) nap(poll_us);
    }
    take(&b);
    snap(&d->p1);
    d->cpu = b.cpu - a.cpu, d->wall = b.wall - a.wall, d->vcsw = b.vcsw - a.vcsw, d->ivcsw = b.ivcsw - a.ivcsw;
    for (int i = 0; i < inflight; i++) free(bufs[i]), free(want[i]);
    free(bufs), free(want), free(reqs);
    return count * size;
}

static void side(int fd, int sender, const char *lib, size_t *lanes, int nl, size_t *sizes, int ns, int inflight,
                 size_t total, int repeat, long poll_us) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h || !(net = dlsym(h, "ncclNetPlugin_v11"))) { fprintf(stderr, "%s: %s\n", lib, dlerror()); exit(1); }
    int rc = net->init(&ctx, 1, NULL, NULL, NULL);
    if (rc) die("init", rc);
    for (int li = 0; li < nl; li++) {
        char handle[NCCL_NET_HANDLE_MAXSIZE] = {0}, v[16];
        void *lcomm = NULL, *comm = NULL;
        snprintf(v, sizeof v, "%zu", lanes[li]);
        setenv("CCBRIDGE_NET_LANES", v, 1);
        if (!sender) {
            if ((rc = net->listen(ctx, 0, handle, &lcomm))) die("listen", rc);
            xfer(fd, handle, sizeof handle, 1);
            while (!comm) {
                if ((rc = net->accept(lcomm, &comm, NULL))) die("accept", rc);
                if (!comm) nap(1000);
            }
        } else {
            xfer(fd, handle, sizeof handle, 0);
            while (!comm) {
                if ((rc = net->connect(ctx, 0, handle, &comm, NULL))) die("connect", rc);
                if (!comm) nap(1000);
            }
        }
        for (int si = 0; si < ns; si++) {
            for (int r = 0; r < repeat; r++) {
                char go = 0;
                sample d, peer;
                int bad = 0;
                xfer(fd, &go, 1, sender), xfer(fd, &go, 1, !sender); /* both ready */
                size_t bytes = stream(comm, sender, sizes[si], inflight, total, poll_us, &d, &bad);
                if (sender) { xfer(fd, &d, sizeof d, 1); continue; }
                xfer(fd, &peer, sizeof peer, 0);
                double mib = (double)bytes / (1 << 20);
                printf("%5zu %9zu %8.2f %11.3f %11.3f %9.2f %9.2f %9.1f %9.1f%s\n", lanes[li], sizes[si],
                       bytes / d.wall / 1e9, peer.cpu / (double)bytes * 1e9, d.cpu / (double)bytes * 1e9,
                       peer.cpu / peer.wall, d.cpu / d.wall, (peer.vcsw + peer.ivcsw) / mib,
                       (d.vcsw + d.ivcsw) / mib, bad ? "  WRONG BYTES" : "");
                if (profiling) {
                    show("send", &peer.p0, &peer.p1, bytes, peer.cpu);
                    show("recv", &d.p0, &d.p1, bytes, d.cpu);
                }
                fflush(stdout);
            }
        }
        if (sender) net->closeSend(comm);
        else net->closeRecv(comm), net->closeListen(lcomm);
    }
    net->finalize(ctx);
}

int main(int argc, char **argv) {
    size_t lanes[16] = {1, 2, 8}, sizes[16] = {64 << 10, 512 << 10, 4 << 20}, total = 256 << 20;
    int nl = 3, ns = 3, inflight = 8, repeat = 3, opt;
    long poll_us = sysconf(_SC_NPROCESSORS_ONLN) >= 8 ? 0 : 20;
    polling = 1;
    while ((opt = getopt(argc, argv, "l:s:t:i:r:p:P")) != -1) {
        switch (opt) {
        case 'l': nl = parse_list(optarg, lanes, 16); break;
        case 's': ns = parse_list(optarg, sizes, 16); break;
        case 't': total = parse_size(optarg); break;
        case 'i': inflight = atoi(optarg); break;
        case 'r': repeat = atoi(optarg); break;
        case 'p': poll_us = atol(optarg); break;
        case 'P':
#ifdef CCB_NO_INTERPOSE
            fprintf(stderr, "-P needs the interposers: this build has CCB_NO_INTERPOSE\n");
            return 2;
#endif
            profiling = 1;
            break;
        default: optind = argc + 1;
        }
    }
    if (optind != argc - 1 || inflight < 1 || inflight > NCCL_NET_MAX_REQUESTS || !getenv("CCBRIDGE_KEY")) {
        fprintf(stderr, "usage: CCBRIDGE_KEY=<64 hex> %s PLUGIN.so [-l lanes,..] [-s size,..] [-t total] "
                        "[-i inflight] [-r repeat] [-p poll_us] [-P]\n", argv[0]);
        return 2;
    }
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return 1; }
    printf("# ns/B: plugin threads' CPU per byte; cores: that CPU over the wall time; csw/MiB: their context switches\n");
    printf("%5s %9s %8s %11s %11s %9s %9s %9s %9s\n", "lanes", "size", "GB/s", "send ns/B", "recv ns/B",
           "send cor", "recv cor", "send csw", "recv csw");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        side(sv[1], 1, argv[optind], lanes, nl, sizes, ns, inflight, total, repeat, poll_us);
        _exit(0);
    }
    close(sv[1]);
    side(sv[0], 0, argv[optind], lanes, nl, sizes, ns, inflight, total, repeat, poll_us);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
