/*
 * ccbridge probe core: the timing loops that Python overhead would distort.
 *
 * Loaded with ctypes (ccbridge/bindings/core.py); its interface is core.h,
 * the driver table and the error convention (0, or -1 with ccb_error()) are
 * in ../common/cudrv.h.
 *
 * A "session" is one context (the device's primary context, or a context of
 * its own) with its streams and one host + one device buffer per stream.
 * Sessions are what the concurrency tests multiply: N streams in one session,
 * a thread on each of those N streams (threads), N sessions with contexts of
 * their own, or one session per process.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include "core.h"
#include "../common/spin_ptx.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char kPtx[] = CCB_PTX_HEADER ".visible .entry ccb_noop()\n{\n\tret;\n}\n" CCB_PTX_SPIN("ccb_spin")
    CCB_PTX_STAMP("ccb_stamp");

const char *ccb_error(void) { return g_err; }

double ccb_now_ns(void) { return mono_ns(); }

int ccb_open(void) { return cu_open(); }

int ccb_device_count(int *count) {
    CK(cu.DeviceGetCount(count));
    return 0;
fail:
    return -1;
}

/* Fill with non-zero pseudo-random bytes: zeros hide unwritten outputs. */
static void fill_part(unsigned char *b, size_t n, uint64_t seed) {
    uint64_t x = seed | 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        memcpy(b + i, &x, 8);
    }
    for (; i < n; i++) b[i] = (unsigned char)(x >> (8 * (i & 7))) | 1;
}

/* A buffer is filled in up to FILL_PARTS parts of at least FILL_PART_MIN bytes, each by a thread of its own with a
 * seed of its own: one thread filled (and faulted in) 1 GiB of pageable memory in 0.73 s on a CPU core of the
 * build machine (no GPU there), where the transfer family's set-up before its first copy took 1.65 s on one H200.
 * Nothing is measured while a session opens. */
#define FILL_PARTS 8
#define FILL_PART_MIN ((size_t)4 << 20)

typedef struct {
    unsigned char *b;
    size_t n;
    uint64_t seed;
} fill_arg;

static void *fill_main(void *p) {
    fill_arg *a = p;
    fill_part(a->b, a->n, a->seed);
    return NULL;
}

static void fill_random(void *p, size_t n, uint64_t seed) {
    size_t parts = n / FILL_PART_MIN < FILL_PARTS ? n / FILL_PART_MIN : FILL_PARTS;
    if (parts < 2) { fill_part(p, n, seed); return; }
    /* First touch on this thread: a pageable buffer's pages land on its memory node, as when it filled them all
     * (the fill threads may run on another socket); pinned pages are placed already, and touched again cheaply. */
    for (size_t at = 0; at < n; at += 4096) ((volatile unsigned char *)p)[at] = 0;
    size_t step = (n / parts) & ~(size_t)7;
    pthread_t th[FILL_PARTS];
    fill_arg args[FILL_PARTS];
    int made[FILL_PARTS] = {0};
    for (size_t k = 0; k < parts; k++) {
        size_t at = k * step;
        args[k] = (fill_arg){(unsigned char *)p + at, k + 1 < parts ? step : n - at, seed ^ 0xD1B54A32D192ED03ull * k};
        made[k] = k > 0 && pthread_create(&th[k], NULL, fill_main, &args[k]) == 0;
        if (k > 0 && !made[k]) fill_part(args[k].b, args[k].n, args[k].seed); /* no thread: filled here */
    }
    fill_part(args[0].b, args[0].n, args[0].seed);
    for (size_t k = 1; k < parts; k++) if (made[k]) pthread_join(th[k], NULL);
}

struct ccb_session {
    int device;
    int own_context;
    int kind;
    size_t max_bytes;
    int nstreams;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction noop, spin, stamp;
    CUstream stream[CCB_MAX_STREAMS];
    void *host[CCB_MAX_STREAMS];
    CUdeviceptr dptr[CCB_MAX_STREAMS];
    CUdeviceptr dscratch;
};

static void *host_alloc(ccb_session *s, size_t n) {
    void *p = NULL;
    if (s->kind == CCB_PINNED) {
        CUresult rc = cu.MemHostAlloc(&p, n, 0);
        if (rc != 0) { cu_fail(rc, "cuMemHostAlloc"); return NULL; }
    } else if (posix_memalign(&p, 4096, n) != 0) {
        set_err("out of host memory allocating %zu bytes", n);
        return NULL;
    }
    return p;
}

static void host_free(ccb_session *s, void *p) {
    if (!p) return;
    if (s->kind == CCB_PINNED) cu.MemFreeHost(p); else free(p);
}

void ccb_session_close(ccb_session *s) {
    if (!s) return;
    if (s->ctx) {
        cu.CtxSetCurrent(s->ctx);
        for (int i = 0; i < s->nstreams; i++) {
            if (s->stream[i]) cu.StreamDestroy(s->stream[i]);
            if (s->dptr[i]) cu.MemFree(s->dptr[i]);
            host_free(s, s->host[i]);
        }
        if (s->dscratch) cu.MemFree(s->dscratch);
        if (s->mod) cu.ModuleUnload(s->mod);
        if (s->own_context) cu.CtxDestroy(s->ctx);
        else { cu.CtxSetCurrent(NULL); cu.DevicePrimaryCtxRelease(s->dev); }
    }
    free(s);
}

static int verify_roundtrip(ccb_session *s, size_t bytes);

ccb_session *ccb_session_open(int device, int own_context, int kind, size_t max_bytes, int nstreams) {
    if (cu_open() != 0) return NULL;
    if (nstreams < 1 || nstreams > CCB_MAX_STREAMS) {
        set_err("nstreams must be 1..%d, got %d", CCB_MAX_STREAMS, nstreams);
        return NULL;
    }
    if (max_bytes < 8) max_bytes = 8;
    ccb_session *s = calloc(1, sizeof *s);
    if (!s) { set_err("out of memory"); return NULL; }
    s->device = device; s->own_context = own_context; s->kind = kind;
    s->max_bytes = max_bytes; s->nstreams = nstreams;
    CK(cu.DeviceGet(&s->dev, device));
    if (own_context) {
        CUcontext popped;
        CK(cu.CtxCreate(&s->ctx, 0, s->dev));
        CK(cu.CtxPopCurrent(&popped));
    } else {
        CK(cu.DevicePrimaryCtxRetain(&s->ctx, s->dev));
    }
    CK(cu.CtxSetCurrent(s->ctx));
    CK(cu.ModuleLoadData(&s->mod, kPtx));
    CK(cu.ModuleGetFunction(&s->noop, s->mod, "ccb_noop"));
    CK(cu.ModuleGetFunction(&s->spin, s->mod, "ccb_spin"));
    CK(cu.ModuleGetFunction(&s->stamp, s->mod, "ccb_stamp"));
    for (int i = 0; i < nstreams; i++) {
        CK(cu.StreamCreate(&s->stream[i], 1 /* CU_STREAM_NON_BLOCKING */));
        CK(cu.MemAlloc(&s->dptr[i], max_bytes));
        if (!(s->host[i] = host_alloc(s, max_bytes))) goto fail;
        fill_random(s->host[i], max_bytes, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) + (uint64_t)device);
    }
    CK(cu.MemAlloc(&s->dscratch, max_bytes));
    /* Every session proves the path is byte-exact before it is timed. */
    if (verify_roundtrip(s, max_bytes < (64u << 20) ? max_bytes : (64u << 20)) != 0) goto fail;
    return s;
fail:;
    char saved[sizeof g_err];
    memcpy(saved, g_err, sizeof saved);
    ccb_session_close(s);
    memcpy(g_err, saved, sizeof saved);
    return NULL;
}

/* H2D random bytes, D2D, D2H into fresh memory, compare: byte-exact or error. */
static int verify_roundtrip(ccb_session *s, size_t bytes) {
    unsigned char *back = malloc(bytes);
    if (!back) { set_err("out of host memory"); return -1; }
    memset(back, 0, bytes);
    CK(cu.CtxSetCurrent(s->ctx));
    CK(cu.MemcpyHtoDAsync(s->dptr[0], s->host[0], bytes, s->stream[0]));
    CK(cu.MemcpyDtoDAsync(s->dscratch, s->dptr[0], bytes, s->stream[0]));
    CK(cu.MemcpyDtoHAsync(back, s->dscratch, bytes, s->stream[0]));
    CK(cu.StreamSynchronize(s->stream[0]));
    if (memcmp(back, s->host[0], bytes) != 0) {
        size_t i = 0;
        while (i < bytes && back[i] == ((unsigned char *)s->host[0])[i]) i++;
        set_err("data corrupted on the H2D->D2D->D2H round trip: first wrong byte at offset %zu of %zu", i, bytes);
        free(back);
        return -1;
    }
    free(back);
    return 0;
fail:
    free(back);
    return -1;
}

int ccb_verify(ccb_session *s, size_t bytes) {
    if (bytes > s->max_bytes) { set_err("verify size %zu exceeds session buffers (%zu)", bytes, s->max_bytes); return -1; }
    return verify_roundtrip(s, bytes);
}

static CUresult issue_copy(ccb_session *s, int dir, int i, size_t bytes) {
    if (dir == CCB_H2D) return cu.MemcpyHtoDAsync(s->dptr[i], s->host[i], bytes, s->stream[i]);
    if (dir == CCB_D2H) return cu.MemcpyDtoHAsync(s->host[i], s->dptr[i], bytes, s->stream[i]);
    return cu.MemcpyDtoDAsync(s->dscratch, s->dptr[i], bytes, s->stream[i]);
}

/*
 * iters copies of `bytes`, round-robin over the session's streams first..first+nstreams-1. sync_every=k>0: after
 * every k copies all those streams are waited for and the group's wall time becomes one entry of samples_ns (k=1:
 * per-copy latency; k=nstreams: one copy on each stream per round). sync_every=0: all copies are queued and waited
 * for once (sustained bandwidth). incall_ns is how long the host thread sat inside the copy calls themselves.
 */
static int copy_on(ccb_session *s, int dir, size_t bytes, int first, int nstreams, int iters, int sync_every,
                   double *samples_ns, ccb_copy_out *out) {
    if (bytes > s->max_bytes) { set_err("copy size %zu exceeds session buffers (%zu)", bytes, s->max_bytes); return -1; }
    if (first < 0 || nstreams < 1 || first + nstreams > s->nstreams) {
        set_err("streams %d..%d outside 0..%d", first, first + nstreams - 1, s->nstreams - 1);
        return -1;
    }
    CK(cu.CtxSetCurrent(s->ctx));
    double incall = 0, t0 = ccb_now_ns(), g0 = t0;
    int g = 0;
    for (int k = 0; k < iters; k++) {
        double a = ccb_now_ns();
        CK(issue_copy(s, dir, first + k % nstreams, bytes));
        double b = ccb_now_ns();
        incall += b - a;
        if (sync_every > 0 && (k + 1) % sync_every == 0) {
            for (int i = first; i < first + nstreams; i++) CK(cu.StreamSynchronize(s->stream[i]));
            double t = ccb_now_ns();
            if (samples_ns) samples_ns[g++] = t - g0;
            g0 = t;
        }
    }
    for (int i = first; i < first + nstreams; i++) CK(cu.StreamSynchronize(s->stream[i]));
    out->start_ns = t0;
    out->end_ns = ccb_now_ns();
    out->incall_ns = incall;
    out->bytes = (double)bytes * iters;
    return 0;
fail:
    return -1;
}

int ccb_copy(ccb_session *s, int dir, size_t bytes, int nstreams, int iters, int sync_every,
             double *samples_ns, ccb_copy_out *out) {
    if (nstreams < 1 || nstreams > s->nstreams) { set_err("nstreams %d outside 1..%d", nstreams, s->nstreams); return -1; }
    return copy_on(s, dir, bytes, 0, nstreams, iters, sync_every, samples_ns, out);
}

/* A start gate: workers warm up, check in, and wait until the caller opens it. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready, open, abort;
} gate_t;

typedef struct {
    ccb_session *s;
    int stream, dir, iters, warmup;
    size_t bytes;
    gate_t *gate;
    ccb_copy_out out;
    int rc;
    char err[sizeof g_err];
} worker_arg;

static void *worker_main(void *p) {
    worker_arg *w = p;
    ccb_copy_out warm;
    w->rc = copy_on(w->s, w->dir, w->bytes, w->stream, 1, w->warmup, 0, NULL, &warm);
    pthread_mutex_lock(&w->gate->mu);
    w->gate->ready++;
    pthread_cond_broadcast(&w->gate->cv);
    while (!w->gate->open) pthread_cond_wait(&w->gate->cv, &w->gate->mu);
    int abort = w->gate->abort;
    pthread_mutex_unlock(&w->gate->mu);
    if (w->rc == 0 && !abort) w->rc = copy_on(w->s, w->dir, w->bytes, w->stream, 1, w->iters, 0, NULL, &w->out);
    if (w->rc != 0) memcpy(w->err, g_err, sizeof w->err);
    return NULL;
}

/* One thread per (session, stream), all released together after their warm-up; streams NULL: stream 0 of each. */
int ccb_workers(ccb_session **sessions, const int *streams, int n, int dir, size_t bytes, int iters, int warmup,
                ccb_copy_out *outs) {
    pthread_t th[CCB_MAX_STREAMS];
    worker_arg args[CCB_MAX_STREAMS];
    gate_t gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
    if (n < 1 || n > CCB_MAX_STREAMS) { set_err("worker count %d outside 1..%d", n, CCB_MAX_STREAMS); return -1; }
    int started = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        args[i] = (worker_arg){.s = sessions[i], .stream = streams ? streams[i] : 0, .dir = dir, .iters = iters,
                               .warmup = warmup, .bytes = bytes, .gate = &gate};
        if (pthread_create(&th[i], NULL, worker_main, &args[i]) != 0) break;
        started++;
    }
    pthread_mutex_lock(&gate.mu);
    while (gate.ready < started) pthread_cond_wait(&gate.cv, &gate.mu);
    gate.abort = started < n;
    gate.open = 1;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (started < n) {
        set_err("could not start %d threads (started %d)", n, started);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        outs[i] = args[i].out;
        if (args[i].rc != 0 && rc == 0) { memcpy(g_err, args[i].err, sizeof g_err); rc = -1; }
    }
    return rc;
}

/*
 * Launch cost of an empty kernel. PIPELINED: n launches, one sync, per-launch
 * time. WAIT: launch + stream sync, mean per pair. GRAPH: n launches captured
 * into one graph; one replay + sync, per-kernel time.
 */
int ccb_launch(ccb_session *s, int mode, int n, double *ns_per_kernel) {
    CUstream st = s->stream[0];
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    CK(cu.CtxSetCurrent(s->ctx));
    if (mode == CCB_LAUNCH_GRAPH) {
        CK(cu.StreamBeginCapture(st, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */));
        for (int i = 0; i < n; i++) CK(cu.LaunchKernel(s->noop, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL));
        CK(cu.StreamEndCapture(st, &g));
        CK(cu.GraphInstantiate(&ge, g, 0));
        CK(cu.GraphLaunch(ge, st)); /* warm: uploads the graph */
        CK(cu.StreamSynchronize(st));
        double t0 = ccb_now_ns();
        CK(cu.GraphLaunch(ge, st));
        CK(cu.StreamSynchronize(st));
        *ns_per_kernel = (ccb_now_ns() - t0) / n;
        cu.GraphExecDestroy(ge);
        cu.GraphDestroy(g);
        return 0;
    }
    CK(cu.StreamSynchronize(st));
    double t0 = ccb_now_ns();
    for (int i = 0; i < n; i++) {
        CK(cu.LaunchKernel(s->noop, 1, 1, 1, 1, 1, 1, 0, st, NULL, NULL));
        if (mode == CCB_LAUNCH_WAIT) CK(cu.StreamSynchronize(st));
    }
    CK(cu.StreamSynchronize(st));
    *ns_per_kernel = (ccb_now_ns() - t0) / n;
    return 0;
fail:
    if (ge) cu.GraphExecDestroy(ge);
    if (g) cu.GraphDestroy(g);
    return -1;
}

/*
 * Does an async copy return before queued GPU work drains? A spin kernel of
 * spin_ns runs on stream 0; the copy goes to stream 0 (same), stream 1 (idle),
 * or stream 1 after it event-waits on stream 0. The caller compares call_ns
 * with remaining_ns to give the verdict.
 */
int ccb_semantics(ccb_session *s, int dir, int relation, size_t bytes, double spin_ns, ccb_sem_out *out) {
    CUevent ev = NULL;
    if (s->nstreams < 2) { set_err("semantics needs a session with 2 streams"); return -1; }
    if (bytes > s->max_bytes) { set_err("copy size %zu exceeds session buffers", bytes); return -1; }
    CK(cu.CtxSetCurrent(s->ctx));
    CK(cu.EventCreate(&ev, 2 /* CU_EVENT_DISABLE_TIMING */));
    CUstream busy = s->stream[0];
    int ci = relation == CCB_SAME_STREAM ? 0 : 1;
    unsigned long long ns = (unsigned long long)spin_ns;
    void *args[] = {&ns};
    /* warm both paths so first-use costs stay out of the verdict */
    CK(issue_copy(s, dir, ci, bytes));
    CK(cu.StreamSynchronize(s->stream[ci]));
    double t0 = ccb_now_ns();
    CK(cu.LaunchKernel(s->spin, 1, 1, 1, 1, 1, 1, 0, busy, args, NULL));
    if (relation == CCB_EVENT_WAIT) {
        CK(cu.EventRecord(ev, busy));
        CK(cu.StreamWaitEvent(s->stream[1], ev, 0));
    }
    double a = ccb_now_ns();
    CK(issue_copy(s, dir, ci, bytes));
    double b = ccb_now_ns();
    CK(cu.StreamSynchronize(s->stream[0]));
    CK(cu.StreamSynchronize(s->stream[1]));
    double c = ccb_now_ns();
    out->remaining_ns = spin_ns - (a - t0) > 0 ? spin_ns - (a - t0) : 0;
    out->call_ns = b - a;
    out->done_ns = c - a;
    cu.EventDestroy(ev);
    return 0;
fail:
    if (ev) cu.EventDestroy(ev);
    return -1;
}

/* Create n contexts, then destroy them: total wall time of each phase. */
int ccb_ctx_lifecycle(int device, int n, double *create_ns, double *destroy_ns) {
    CUcontext ctx[CCB_MAX_STREAMS] = {0}, prev = NULL, popped, c;
    CUdevice dev;
    if (cu_open() != 0) return -1;
    if (n < 1 || n > CCB_MAX_STREAMS) { set_err("context count %d outside 1..%d", n, CCB_MAX_STREAMS); return -1; }
    CK(cu.CtxGetCurrent(&prev));
    CK(cu.DeviceGet(&dev, device));
    double t0 = ccb_now_ns();
    for (int i = 0; i < n; i++) {
        CK(cu.CtxCreate(&c, 0, dev));
        ctx[i] = c; /* recorded before anything else can fail: the cleanup destroys it */
        CK(cu.CtxPopCurrent(&popped));
    }
    double t1 = ccb_now_ns();
    int failed = 0;
    for (int i = 0; i < n; i++) { /* a refused destroy does not stop the others' */
        CUresult rc = cu.CtxDestroy(ctx[i]);
        ctx[i] = NULL;
        if (rc != 0 && !failed++) cu_fail(rc, "cuCtxDestroy");
    }
    *create_ns = t1 - t0;
    *destroy_ns = ccb_now_ns() - t1;
    cu.CtxSetCurrent(prev);
    return failed ? -1 : 0;
fail:
    for (int i = 0; i < n; i++) if (ctx[i]) cu.CtxDestroy(ctx[i]);
    cu.CtxSetCurrent(prev);
    return -1;
}

/* Allocate `count` pinned staging slots of `bytes` in the session's context. */
int ccb_pinned_slots(ccb_session *s, size_t bytes, int count, double *alloc_ns, double *free_ns) {
    void *p[CCB_MAX_STREAMS] = {0};
    int made = 0;
    if (count < 1 || count > CCB_MAX_STREAMS) { set_err("slot count %d outside 1..%d", count, CCB_MAX_STREAMS); return -1; }
    CK(cu.CtxSetCurrent(s->ctx));
    double t0 = ccb_now_ns();
    for (; made < count; made++) CK(cu.MemHostAlloc(&p[made], bytes, 0));
    double t1 = ccb_now_ns();
    for (int i = 0; i < count; i++) { cu.MemFreeHost(p[i]); p[i] = NULL; }
    *alloc_ns = t1 - t0;
    *free_ns = ccb_now_ns() - t1;
    return 0;
fail:
    for (int i = 0; i < made; i++) if (p[i]) cu.MemFreeHost(p[i]);
    return -1;
}

/* GPU-to-GPU copy rate src -> dst over peer access (NVLink where the GPUs have it): bytes per second over iters
 * back-to-back copies of `bytes`, after one warm-up. The emulator's launcher hands it to the interposer as the
 * rate a collective's bandwidth-kept term is computed at. -1 with the reason where the GPUs have no peer access
 * (the copy would be staged through the host: not the link CC's figure is about). */
int ccb_peer_rate(int src, int dst, size_t bytes, int iters, double *bytes_per_s) {
    CUdevice ds, dd;
    CUcontext cs = NULL, cd = NULL, was = NULL;
    CUdeviceptr a = 0, b = 0;
    CUstream st = NULL;
    int can = 0, ok = -1;
    CK(cu.CtxGetCurrent(&was));
    CK(cu.DeviceGet(&ds, src));
    CK(cu.DeviceGet(&dd, dst));
    CK(cu.DeviceCanAccessPeer(&can, dd, ds));
    if (!can) {
        set_err("GPU %d cannot access GPU %d as a peer (no NVLink or P2P path)", dst, src);
        return -1;
    }
    CK(cu.DevicePrimaryCtxRetain(&cs, ds));
    CK(cu.DevicePrimaryCtxRetain(&cd, dd));
    CK(cu.CtxSetCurrent(cs));
    CK(cu.MemAlloc(&a, bytes));
    CK(cu.CtxSetCurrent(cd));
    CK(cu.MemAlloc(&b, bytes));
    CUresult rc = cu.CtxEnablePeerAccess(cs, 0);
    if (rc != 0 && rc != 704 /* CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED */) CK(rc);
    CK(cu.StreamCreate(&st, 1));
    CK(cu.MemcpyPeerAsync(b, cd, a, cs, bytes, st));
    CK(cu.StreamSynchronize(st));
    double t0 = ccb_now_ns();
    for (int i = 0; i < iters; i++) CK(cu.MemcpyPeerAsync(b, cd, a, cs, bytes, st));
    CK(cu.StreamSynchronize(st));
    *bytes_per_s = (double)bytes * iters / ((ccb_now_ns() - t0) * 1e-9);
    ok = 0;
fail:
    if (st) cu.StreamDestroy(st);
    if (b) cu.MemFree(b);
    if (a && cu.CtxSetCurrent(cs) == 0) cu.MemFree(a);
    if (cs) cu.DevicePrimaryCtxRelease(ds);
    if (cd) cu.DevicePrimaryCtxRelease(dd);
    cu.CtxSetCurrent(was); /* the caller's context as it was (peer access stays on, as the driver keeps it) */
    return ok;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* GPU time one more kernel adds to a stream (its dispatch, an empty spin of 0 ns), median of reps: between two
 * marks with the kernel, less between two marks without it, while a 200 us spin queued ahead keeps the GPU busy
 * so that the host's launch latency stays out. The emulator's device-side wait is such a kernel: its charge is
 * shortened by this, so that a stream is held for the toll, not the toll plus the wait's own dispatch. The marks:
 * CUDA events (timer CCB_TIMER_EVENTS), or %globaltimer stamps written to device memory (CCB_TIMER_GLOBALTIMER:
 * a stamp is itself a kernel, and its own dispatch is in both intervals alike, so the difference holds). */
static int mark(ccb_session *s, int timer, CUevent e, int slot) {
    if (timer == CCB_TIMER_EVENTS) return cu.EventRecord(e, s->stream[0]) ? -1 : 0;
    unsigned long long at = s->dscratch + 8ull * (unsigned long long)slot;
    void *p[] = {&at};
    return cu.LaunchKernel(s->stamp, 1, 1, 1, 1, 1, 1, 0, s->stream[0], p, NULL) ? -1 : 0;
}

int ccb_kernel_gap(ccb_session *s, int reps, int timer, double *ns) {
    CUevent a = NULL, b = NULL;
    double *t = NULL;
    int ok = -1;
    if (reps < 1 || !(t = malloc(sizeof *t * 2 * (size_t)reps))) { set_err("kernel gap: bad reps %d", reps); return -1; }
    if (timer != CCB_TIMER_EVENTS && timer != CCB_TIMER_GLOBALTIMER) { set_err("kernel gap: timer %d", timer); goto fail; }
    CK(cu.CtxSetCurrent(s->ctx));
    CK(cu.EventCreate(&a, 0));
    CK(cu.EventCreate(&b, 0));
    for (int i = 0; i < 2 * reps; i++) { /* even: with the kernel, odd: without, interleaved */
        unsigned long long busy = 200000, none = 0, stamps[2];
        void *pb[] = {&busy}, *pn[] = {&none};
        float ms;
        CK(cu.LaunchKernel(s->spin, 1, 1, 1, 1, 1, 1, 0, s->stream[0], pb, NULL));
        if (mark(s, timer, a, 0)) { set_err("kernel gap: the first mark was refused"); goto fail; }
        if (i % 2 == 0) CK(cu.LaunchKernel(s->spin, 1, 1, 1, 1, 1, 1, 0, s->stream[0], pn, NULL));
        if (mark(s, timer, b, 1)) { set_err("kernel gap: the second mark was refused"); goto fail; }
        if (timer == CCB_TIMER_EVENTS) {
            CK(cu.EventSynchronize(b));
            CK(cu.EventElapsedTime(&ms, a, b));
            t[(i % 2) * reps + i / 2] = ms * 1e6;
        } else {
            CK(cu.MemcpyDtoHAsync(stamps, s->dscratch, sizeof stamps, s->stream[0]));
            CK(cu.StreamSynchronize(s->stream[0]));
            t[(i % 2) * reps + i / 2] = (double)(stamps[1] - stamps[0]);
        }
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    qsort(t + reps, (size_t)reps, sizeof *t, cmp_double);
    *ns = t[reps / 2] - t[reps + reps / 2];
    if (*ns < 0) *ns = 0;
    ok = 0;
fail:
    if (a) cu.EventDestroy(a);
    if (b) cu.EventDestroy(b);
    free(t);
    return ok;
}

/* The stamp kernel of each context a framework stamps from (few: one per GPU), loaded once. A full table reuses
 * its slots in turn (a process of more than 64 live contexts reloads, never leaks a module per stamp); a context
 * destroyed and made again under the same handle finds its stale function refused and loads anew. */
#define MAX_STAMP_CTX 64
static struct { CUcontext ctx; CUfunction fn; } g_stamp[MAX_STAMP_CTX];
static int g_nstamp, g_next_evict;
static pthread_mutex_t g_stamp_mu = PTHREAD_MUTEX_INITIALIZER;

static int stamp_fn(CUcontext ctx, int fresh, CUfunction *out) {
    CUfunction fn = NULL;
    int slot = -1;
    pthread_mutex_lock(&g_stamp_mu);
    for (int i = 0; i < g_nstamp && slot < 0; i++)
        if (g_stamp[i].ctx == ctx) slot = i, fn = g_stamp[i].fn;
    if (!fn || fresh) {
        CUmodule mod;
        CUresult rc = cu.ModuleLoadData(&mod, kPtx);
        if (rc == 0) rc = cu.ModuleGetFunction(&fn, mod, "ccb_stamp");
        if (rc != 0) {
            pthread_mutex_unlock(&g_stamp_mu);
            return cu_fail(rc, "loading the stamp kernel");
        }
        if (slot < 0) slot = g_nstamp < MAX_STAMP_CTX ? g_nstamp++ : g_next_evict++ % MAX_STAMP_CTX;
        g_stamp[slot].ctx = ctx, g_stamp[slot].fn = fn;
    }
    pthread_mutex_unlock(&g_stamp_mu);
    *out = fn;
    return 0;
}

/* The stamp is an instrument, not the program's work: under the emulator (preloaded) it is launched through the
 * driver's own entry point, so it pays no emulated launch toll (events pay none either: the two timers measure the
 * same window) and no trace counts it as a launch. Without the emulator, the driver's entry point as it is. */
typedef CUresult launch_fn(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
static launch_fn *stamp_launcher(void) {
    static launch_fn *fn;
    launch_fn *f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (f) return f;
    void *(*real)(const char *) = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "ccbemu_real");
    f = real ? (launch_fn *)real("cuLaunchKernel") : NULL;
    if (!f) f = (launch_fn *)cu.LaunchKernel;
    __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    return f;
}

int ccb_stamp(void *st, unsigned long long at) {
    CUcontext ctx = NULL;
    CUfunction fn = NULL;
    if (cu_open() != 0) return -1;
    CK(cu.CtxGetCurrent(&ctx));
    if (!ctx) { set_err("stamp: no current CUDA context on this thread"); return -1; }
    void *p[] = {&at};
    for (int fresh = 0; fresh < 2; fresh++) {
        if (stamp_fn(ctx, fresh, &fn) != 0) return -1;
        CUresult rc = stamp_launcher()(fn, 1, 1, 1, 1, 1, 1, 0, (CUstream)st, p, NULL);
        if (rc == 0) return 0;
        if (fresh || (rc != 400 && rc != 201 && rc != 709)) return cu_fail(rc, "launching the stamp kernel");
        /* invalid handle or context: a stale function of a context since destroyed; load it anew, once */
    }
fail:
    return -1;
}

int ccb_pinned_answers(ccb_session *s, int *memory_type, int *is_managed, int *view_live) {
    CUdeviceptr view = 0, host = (CUdeviceptr)(uintptr_t)s->host[0];
    unsigned type = 0, managed = 0;
    uint64_t got = 0, want, kept;
    if (s->kind != CCB_PINNED) { set_err("pinned answers: the session's host memory is pageable"); return -1; }
    CK(cu.CtxSetCurrent(s->ctx));
    CK(cu.PointerGetAttribute(&type, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */, host));
    CK(cu.PointerGetAttribute(&managed, 8 /* CU_POINTER_ATTRIBUTE_IS_MANAGED */, host));
    *memory_type = (int)type, *is_managed = (int)managed;
    CK(cu.MemHostGetDevicePointer(&view, s->host[0], 0));
    want = 0x5EED0000CAFEull ^ (uint64_t)mono_ns(); /* written after the view was taken */
    memcpy(&kept, s->host[0], sizeof kept);
    memcpy(s->host[0], &want, sizeof want);
    CK(cu.MemcpyDtoDAsync(s->dscratch, view, sizeof want, s->stream[0]));
    CK(cu.MemcpyDtoHAsync(&got, s->dscratch, sizeof got, s->stream[0]));
    CK(cu.StreamSynchronize(s->stream[0]));
    *view_live = got == want;
    memcpy(s->host[0], &kept, sizeof kept); /* the session's pattern, which its copies check, as it was */
    return 0;
fail:
    return -1;
}
