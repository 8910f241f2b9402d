/*
 * A plain CUDA C program (driver API, linked against libcuda) that moves
 * random bytes through every copy API, direction, memory kind, size, offset,
 * stream and thread count, with contexts and CUDA graph capture and replay,
 * and checks every byte. Run natively and under `ccbridge run`: the
 * emulator must keep it byte-exact and free of deadlock.
 *
 *   emu_stress THREADS OPS_PER_THREAD MAX_BYTES BIG_BYTES
 * Exit 0: all exact. Exit 1: a mismatch or a failed call (printed).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUevent, *CUgraph, *CUgraphExec, *CUarray;
typedef unsigned long long CUdeviceptr;
typedef struct {
    size_t srcXInBytes, srcY; int srcMemoryType; const void *srcHost; CUdeviceptr srcDevice; CUarray srcArray; size_t srcPitch;
    size_t dstXInBytes, dstY; int dstMemoryType; void *dstHost; CUdeviceptr dstDevice; CUarray dstArray; size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD; int srcMemoryType; const void *srcHost; CUdeviceptr srcDevice; CUarray srcArray;
    void *reserved0; size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD; int dstMemoryType; void *dstHost; CUdeviceptr dstDevice; CUarray dstArray;
    void *reserved1; size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct { int type, id; } CUmemLocation;
typedef struct { int srcAccessOrder; CUmemLocation srcLocHint, dstLocHint; unsigned flags; } CUmemcpyAttributes;

CUresult cuInit(unsigned);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemHostAlloc(void **, size_t, unsigned);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned);
CUresult cuMemHostUnregister(void *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyAsync(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *, CUstream);
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *);
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *, CUstream);
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t, CUstream);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);

#define HOST 1
#define DEVICE 2
static int g_batch_ok = 1, g_failed;
static CUcontext g_ctx[3];
static size_t g_max, g_big;
static int g_ops;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long g_total_ops, g_total_bytes;

#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n_ = "?"; cuGetErrorName(r_, &n_); \
    fprintf(stderr, "FAIL %s:%d %s -> %s (%d)\n", __FILE__, __LINE__, #x, n_, r_); g_failed = 1; return -1; } } while (0)

static uint64_t rnd(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
static void fill(void *p, size_t n, uint64_t *s) { unsigned char *b = p; for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(rnd(s) >> 24); }

typedef struct { size_t w, h, d, hpitch, dpitch; } geom; /* host and device layouts of one transfer */
typedef struct {
    int id;
    CUcontext ctx;
    CUstream s[2];
    CUevent ev;
    CUdeviceptr dev, dev2;
    unsigned char *pinned[2], *pageable[2];
    uint64_t seed;
} worker;

/* H2D of the geometry from host h (+hoff) to device (+doff) through api k */
static int h2d(worker *w, int k, const unsigned char *h, CUdeviceptr d, geom g, CUstream s) {
    size_t n = g.w;
    if (g.h == 1 && g.d == 1) {
        switch (k % 5) {
        case 0: CK(cuMemcpyHtoD_v2(d, h, n)); return 0;
        case 1: CK(cuMemcpyHtoDAsync_v2(d, h, n, s)); return 0;
        case 2: CK(cuMemcpy(d, (CUdeviceptr)(uintptr_t)h, n)); return 0;
        case 3: CK(cuMemcpyAsync(d, (CUdeviceptr)(uintptr_t)h, n, s)); return 0;
        default:
            if (g_batch_ok) {
                CUdeviceptr dsts[1] = {d}, srcs[1] = {(CUdeviceptr)(uintptr_t)h};
                size_t sizes[1] = {n}, idx[1] = {0};
                CUmemcpyAttributes a = {1 /* stream order */, {0, 0}, {0, 0}, 0};
                CK(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 1, &a, idx, 1, s));
                return 0;
            }
            CK(cuMemcpyHtoDAsync_v2(d, h, n, s));
            return 0;
        }
    }
    if (g.d == 1) {
        CUDA_MEMCPY2D c = {0};
        c.srcMemoryType = HOST; c.srcHost = h; c.srcPitch = g.hpitch;
        c.dstMemoryType = DEVICE; c.dstDevice = d; c.dstPitch = g.dpitch;
        c.WidthInBytes = g.w; c.Height = g.h;
        if (k & 1) CK(cuMemcpy2DAsync_v2(&c, s)); else CK(cuMemcpy2D_v2(&c));
        return 0;
    }
    CUDA_MEMCPY3D c = {0};
    c.srcMemoryType = HOST; c.srcHost = h; c.srcPitch = g.hpitch; c.srcHeight = g.h;
    c.dstMemoryType = DEVICE; c.dstDevice = d; c.dstPitch = g.dpitch; c.dstHeight = g.h;
    c.WidthInBytes = g.w; c.Height = g.h; c.Depth = g.d;
    if (k & 1) CK(cuMemcpy3DAsync_v2(&c, s)); else CK(cuMemcpy3D_v2(&c));
    (void)w;
    return 0;
}

static int d2h(int k, unsigned char *h, CUdeviceptr d, geom g, CUstream s) {
    size_t n = g.w;
    if (g.h == 1 && g.d == 1) {
        switch (k % 5) {
        case 0: CK(cuMemcpyDtoH_v2(h, d, n)); return 0;
        case 1: CK(cuMemcpyDtoHAsync_v2(h, d, n, s)); break;
        case 2: CK(cuMemcpy((CUdeviceptr)(uintptr_t)h, d, n)); return 0;
        case 3: CK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)h, d, n, s)); break;
        default:
            if (g_batch_ok) {
                CUdeviceptr dsts[1] = {(CUdeviceptr)(uintptr_t)h}, srcs[1] = {d};
                size_t sizes[1] = {n}, idx[1] = {0};
                CUmemcpyAttributes a = {1, {0, 0}, {0, 0}, 0};
                CK(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 1, &a, idx, 1, s));
            } else {
                CK(cuMemcpyDtoHAsync_v2(h, d, n, s));
            }
        }
        CK(cuStreamSynchronize(s));
        return 0;
    }
    if (g.d == 1) {
        CUDA_MEMCPY2D c = {0};
        c.srcMemoryType = DEVICE; c.srcDevice = d; c.srcPitch = g.dpitch;
        c.dstMemoryType = HOST; c.dstHost = h; c.dstPitch = g.hpitch;
        c.WidthInBytes = g.w; c.Height = g.h;
        if (k & 1) { CK(cuMemcpy2DAsync_v2(&c, s)); CK(cuStreamSynchronize(s)); } else CK(cuMemcpy2D_v2(&c));
        return 0;
    }
    CUDA_MEMCPY3D c = {0};
    c.srcMemoryType = DEVICE; c.srcDevice = d; c.srcPitch = g.dpitch; c.srcHeight = g.h;
    c.dstMemoryType = HOST; c.dstHost = h; c.dstPitch = g.hpitch; c.dstHeight = g.h;
    c.WidthInBytes = g.w; c.Height = g.h; c.Depth = g.d;
    if (k & 1) { CK(cuMemcpy3DAsync_v2(&c, s)); CK(cuStreamSynchronize(s)); } else CK(cuMemcpy3D_v2(&c));
    return 0;
}

/* bytes of the host span a geometry covers, row by row */
static int same_rows(const unsigned char *a, const unsigned char *b, geom g, size_t *bad) {
    for (size_t z = 0; z < g.d; z++)
        for (size_t y = 0; y < g.h; y++) {
            size_t off = (z * g.h + y) * g.hpitch;
            if (memcmp(a + off, b + off, g.w)) { *bad = off; return 0; }
        }
    return 1;
}

static size_t span(geom g, size_t pitch) { return (g.d * g.h - 1) * pitch + g.w; }

static int one_op(worker *w, size_t n) {
    uint64_t *s = &w->seed;
    geom g = {n, 1, 1, n, n};
    int shape = (int)(rnd(s) % 4);
    if (shape == 2 && n >= 64) { g.h = 1 + rnd(s) % 8; g.w = n / g.h; }
    if (shape == 3 && n >= 256) { g.d = 1 + rnd(s) % 4; g.h = 1 + rnd(s) % 4; g.w = n / (g.h * g.d); }
    if (g.h > 1 || g.d > 1) { g.hpitch = g.w + rnd(s) % 64; g.dpitch = g.w + 64 * (rnd(s) % 2); }
    size_t hoff = rnd(s) % 64, doff = rnd(s) % 64;
    int ksrc = (int)(rnd(s) & 1), kdst = (int)(rnd(s) & 1);
    unsigned char *src = (ksrc ? w->pinned[0] : w->pageable[0]) + hoff;
    unsigned char *dst = (kdst ? w->pinned[1] : w->pageable[1]) + hoff;
    size_t hs = span(g, g.hpitch);
    fill(src, hs, s);
    fill(dst, hs, s);
    CUstream a = w->s[rnd(s) & 1], b = w->s[rnd(s) & 1];
    if (h2d(w, (int)rnd(s), src, w->dev + doff, g, a)) return -1;
    /* device-local hop on a (untouched by the emulator), then read back on b after an event */
    size_t ds = span(g, g.dpitch);
    CK(cuMemcpyDtoDAsync_v2(w->dev2 + doff, w->dev + doff, ds, a));
    CK(cuMemsetD8Async(w->dev + doff, 0x5A, ds, a));
    CK(cuEventRecord(w->ev, a));
    CK(cuStreamWaitEvent(b, w->ev, 0));
    if (d2h((int)rnd(s), dst, w->dev2 + doff, g, b)) return -1;
    size_t bad;
    if (!same_rows(src, dst, g, &bad)) {
        fprintf(stderr, "FAIL thread %d: mismatch at host offset %zu (w=%zu h=%zu d=%zu pinned src=%d dst=%d)\n",
                w->id, bad, g.w, g.h, g.d, ksrc, kdst);
        g_failed = 1;
        return -1;
    }
    pthread_mutex_lock(&g_mu);
    g_total_ops++;
    g_total_bytes += 2 * g.w * g.h * g.d;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

/* A captured graph (D2D + memset) replayed between crossings. */
static int graph_rounds(worker *w, int rounds) {
    CUgraph gr;
    CUgraphExec ge;
    size_t n = 1 << 16;
    CK(cuStreamBeginCapture_v2(w->s[0], w->id % 2 ? 1 /* thread-local */ : 2 /* relaxed */));
    CK(cuMemcpyDtoDAsync_v2(w->dev2, w->dev, n, w->s[0]));
    CK(cuMemsetD8Async(w->dev, 0, n, w->s[0]));
    CK(cuStreamEndCapture(w->s[0], &gr));
    CK(cuGraphInstantiateWithFlags(&ge, gr, 0));
    for (int r = 0; r < rounds; r++) {
        fill(w->pinned[0], n, &w->seed);
        CK(cuMemcpyHtoDAsync_v2(w->dev, w->pinned[0], n, w->s[0]));
        CK(cuGraphLaunch(ge, w->s[0]));
        CK(cuMemcpyDtoHAsync_v2(w->pageable[1], w->dev2, n, w->s[0]));
        CK(cuStreamSynchronize(w->s[0]));
        if (memcmp(w->pageable[1], w->pinned[0], n)) { fprintf(stderr, "FAIL graph round %d thread %d\n", r, w->id); g_failed = 1; return -1; }
    }
    return 0;
}

static void *thread_main(void *p) {
    worker *w = p;
    if (cuCtxSetCurrent(w->ctx)) { g_failed = 1; return NULL; }
    size_t cap = g_max * 2 + 4096;
    for (int i = 0; i < 2; i++) {
        if (cuStreamCreate(&w->s[i], 0 /* blocking: ordered with the legacy stream the blocking APIs use */) || cuMemHostAlloc((void **)&w->pinned[i], cap, 0) || !(w->pageable[i] = malloc(cap))) {
            fprintf(stderr, "FAIL thread %d set-up\n", w->id); g_failed = 1; return NULL;
        }
    }
    if (cuEventCreate(&w->ev, 2) || cuMemAlloc_v2(&w->dev, cap) || cuMemAlloc_v2(&w->dev2, cap)) { g_failed = 1; return NULL; }
    if (graph_rounds(w, 4)) return NULL;
    for (int k = 0; k < g_ops && !g_failed; k++) {
        /* sizes log-uniform from 1 B to g_max */
        int bits = 0;
        while ((1ull << bits) < g_max) bits++;
        size_t n = 1 + (size_t)(rnd(&w->seed) % ((1ull << (rnd(&w->seed) % (bits + 1))) ));
        if (n > g_max) n = g_max;
        if (one_op(w, n)) return NULL;
    }
    return NULL;
}

int main(int argc, char **argv) {
    int nthreads = argc > 1 ? atoi(argv[1]) : 4;
    g_ops = argc > 2 ? atoi(argv[2]) : 100;
    g_max = argc > 3 ? strtoull(argv[3], 0, 0) : (1u << 20);
    g_big = argc > 4 ? strtoull(argv[4], 0, 0) : (256u << 20);
    CUdevice dev;
    CUcontext popped;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_ctx[0], dev)) { fprintf(stderr, "FAIL init\n"); return 1; }
    for (int i = 1; i < 3; i++)
        if (cuCtxCreate_v2(&g_ctx[i], 0, dev) || cuCtxPopCurrent_v2(&popped)) { fprintf(stderr, "FAIL ctx\n"); return 1; }
    cuCtxSetCurrent(g_ctx[0]);
    /* does this driver take batch copies? (same answer natively and emulated) */
    {
        CUdeviceptr d; CUstream s; void *h;
        if (cuMemAlloc_v2(&d, 64) || cuStreamCreate(&s, 1) || cuMemHostAlloc(&h, 64, 0)) return 1;
        CUdeviceptr dsts[1] = {d}, srcs[1] = {(CUdeviceptr)(uintptr_t)h};
        size_t sizes[1] = {64}, idx[1] = {0};
        CUmemcpyAttributes a = {1, {0, 0}, {0, 0}, 0};
        CUresult r = cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 1, &a, idx, 1, s);
        g_batch_ok = r == 0;
        printf("batch copies: %s (rc %d)\n", g_batch_ok ? "used" : "refused by the driver", r);
        cuStreamSynchronize(s);
    }
    {
        static char reg[1 << 16];
        CUresult r = cuMemHostRegister_v2(reg, sizeof reg, 0);
        printf("cuMemHostRegister: rc %d\n", r);
        if (r == 0) cuMemHostUnregister(reg);
    }
    /* big and edge sizes on one thread first: 1 B, odd, the largest */
    worker big = {.id = 99, .ctx = g_ctx[0], .seed = 0x1234567ull};
    size_t keep = g_max;
    g_max = g_big;
    pthread_t t;
    g_ops = 0;
    pthread_create(&t, NULL, thread_main, &big);
    pthread_join(t, NULL);
    size_t edge[] = {1, 3, 4097, (1u << 20) + 7, g_big};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0] && !g_failed; i++)
        for (int rep = 0; rep < (edge[i] >= (64u << 20) ? 2 : 6) && !g_failed; rep++) if (edge[i] <= g_big) one_op(&big, edge[i]);
    g_max = keep;
    g_ops = argc > 2 ? atoi(argv[2]) : 100;
    worker *ws = calloc((size_t)nthreads, sizeof *ws);
    pthread_t *th = calloc((size_t)nthreads, sizeof *th);
    for (int i = 0; i < nthreads && !g_failed; i++) {
        ws[i] = (worker){.id = i, .ctx = g_ctx[i % 3], .seed = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)};
        pthread_create(&th[i], NULL, thread_main, &ws[i]);
    }
    for (int i = 0; i < nthreads; i++) if (th[i]) pthread_join(th[i], NULL);
    printf("emu_stress: %d threads, %llu round trips, %.1f MiB moved, %s\n", nthreads, g_total_ops,
           g_total_bytes / 1048576.0, g_failed ? "FAILED" : "all byte-exact");
    return g_failed ? 1 : 0;
}
