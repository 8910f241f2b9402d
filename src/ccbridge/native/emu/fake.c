/*
 * A fake CUDA driver for CPU tests: the hooks and the channel run unchanged
 * over it (ccbemu_test_init), so CI checks order, blocking, tolls, pacing,
 * cipher and the hook table without a GPU.
 *
 * "Device" memory is host memory the fake knows as device memory; copies are
 * memcpy. A stream is a clock: a kernel launched with grid.x = N keeps it
 * busy N microseconds; events complete when their stream's clock passes them.
 * Copies move their bytes at once and take no stream time (unless a test
 * gives them a bandwidth), but each stream counts the async copies issued on
 * it that nobody has waited for yet (a stream or an event synchronize after
 * them), so that tests can see whether an error path returned with copies
 * "in flight" (a D2H to pageable memory returns done, as the real driver's
 * does); and one call of a chosen fake function can be made to fail.
 * cuStreamWaitEvent holds a stream's clock until the event's time (so what
 * is queued behind it completes no sooner), events made without
 * CU_EVENT_DISABLE_TIMING can be timed, and every synchronize is counted
 * (how many times a call made the host wait).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

typedef struct { CUcontext ctx; uint64_t busy_until; int capturing; uint64_t issued, waited; CUgraph graph; unsigned long long capture; unsigned flags; } fstream;
typedef struct { uint64_t t; fstream *s; uint64_t seq; unsigned flags; int recorded; } fevent;
typedef struct { uintptr_t base; size_t size; int type; } falloc;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static falloc *allocs; /* every allocation ever made: the tests never free them (addresses stay unique) */
static size_t nallocs, cap_allocs;
static fstream default_stream = {.ctx = (CUcontext)1};
static uintptr_t next_ctx = 2;
static __thread CUcontext t_cur = (CUcontext)1;
static __thread CUcontext t_stack[16];
static __thread int t_depth;
static fstream *streams[4096];
static int nstreams;
static char fail_name[64];
static int fail_in; /* the fail_in-th next call of fail_name fails */
static uint64_t host_waits;   /* synchronize calls (event, stream, context) */
static double copy_gbps;      /* > 0: an async host<->device copy holds its stream n / copy_gbps ns */

static int injected(const char *name) {
    int hit = 0;
    pthread_mutex_lock(&mu);
    if (fail_in > 0 && strcmp(name, fail_name) == 0) hit = --fail_in == 0;
    pthread_mutex_unlock(&mu);
    return hit;
}
#define INJECT(name) do { if (injected(name)) return CUDA_ERROR_UNKNOWN; } while (0)
static void waited(fstream *s, uint64_t seq) { if (s && s->waited < seq) s->waited = seq; }

static fstream *S(CUstream s) {
    return (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) ? &default_stream : (fstream *)s;
}
static void sleep_until(uint64_t t) { emu_wait_until(t); }

static CUresult f_CtxGetCurrent(CUcontext *c) { *c = t_cur; return 0; }
static CUresult f_CtxPushCurrent(CUcontext c) { if (t_depth == 16) return CUDA_ERROR_UNKNOWN; t_stack[t_depth++] = t_cur; t_cur = c; return 0; }
static CUresult f_CtxPopCurrent(CUcontext *c) { if (!t_depth) return CUDA_ERROR_INVALID_VALUE; if (c) *c = t_cur; t_cur = t_stack[--t_depth]; return 0; }
static CUresult f_StreamGetCtx(CUstream s, CUcontext *c) { *c = S(s) == &default_stream ? t_cur : S(s)->ctx; return 0; }
static CUresult f_StreamCreate(CUstream *s, unsigned flags) {
    fstream *f = calloc(1, sizeof *f);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    f->ctx = t_cur;
    f->flags = flags;
    pthread_mutex_lock(&mu);
    if (nstreams < 4096) streams[nstreams++] = f;
    pthread_mutex_unlock(&mu);
    *s = f;
    return 0;
}
static void count_wait(void) { __atomic_fetch_add(&host_waits, 1, __ATOMIC_RELAXED); }
static CUresult f_StreamSynchronize(CUstream s) {
    if (S(s)->capturing) return CUDA_ERROR_INVALID_VALUE;
    count_wait();
    sleep_until(S(s)->busy_until);
    waited(S(s), S(s)->issued);
    return 0;
}
static CUresult f_StreamIsCapturing(CUstream s, int *st) { *st = S(s)->capturing; return 0; }
static CUresult f_StreamGetFlags(CUstream s, unsigned *flags) { *flags = S(s)->flags; return 0; }
/* Idle once its clock has passed (what it holds is done); not counted as a host wait: it never waits. */
static uint64_t query_ns; /* > 0: a stream query takes this long (the emulator's own work before a crossing) */
static CUresult f_StreamQuery(CUstream s) {
    INJECT("cuStreamQuery");
    if (query_ns) sleep_until(emu_now() + query_ns);
    return S(s)->busy_until <= emu_now() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult f_EventCreate(CUevent *e, unsigned flags) {
    fevent *f = calloc(1, sizeof *f);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    f->flags = flags;
    *e = f;
    return 0;
}
/* An event completes when its stream's clock passes it, and no sooner than it was recorded (its timestamp). */
static CUresult f_EventRecord(CUevent e, CUstream s) {
    fevent *f = e;
    uint64_t now = emu_now();
    f->t = S(s)->busy_until > now ? S(s)->busy_until : now;
    f->s = S(s), f->seq = S(s)->issued, f->recorded = 1;
    return 0;
}
/* Real ordering: what is queued on s after the wait starts no sooner than e completes (a never-recorded event is complete). */
static CUresult f_StreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    (void)flags;
    INJECT("cuStreamWaitEvent");
    fevent *f = e;
    if (!S(s)->capturing && f->recorded && S(s)->busy_until < f->t) S(s)->busy_until = f->t;
    return 0;
}
static CUresult f_EventElapsedTime(float *ms, CUevent a, CUevent b) {
    fevent *x = a, *y = b;
    INJECT("cuEventElapsedTime");
    if (!x->recorded || !y->recorded || ((x->flags | y->flags) & 2 /* CU_EVENT_DISABLE_TIMING */))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = emu_now();
    if (now < x->t || now < y->t) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)y->t - (double)x->t) / 1e6);
    return 0;
}
static CUresult f_EventQuery(CUevent e) {
    fevent *f = e;
    if (emu_now() < f->t) return CUDA_ERROR_NOT_READY;
    waited(f->s, f->seq);
    return 0;
}
static CUresult f_EventSynchronize(CUevent e) {
    fevent *f = e;
    INJECT("cuEventSynchronize");
    count_wait();
    sleep_until(f->t);
    waited(f->s, f->seq);
    return 0;
}

static void remember(void *p, size_t n, int type) {
    pthread_mutex_lock(&mu);
    /* no cap: a full suite makes thousands, and a forgotten device buffer would pass for host memory
     * (a copy between it and the host then looks like host-to-host and is not emulated) */
    if (nallocs == cap_allocs) {
        size_t cap = cap_allocs ? 2 * cap_allocs : 4096;
        falloc *grown = realloc(allocs, cap * sizeof *grown);
        if (!grown) abort(); /* a test helper: no way to report it */
        allocs = grown, cap_allocs = cap;
    }
    allocs[nallocs++] = (falloc){(uintptr_t)p, n, type};
    pthread_mutex_unlock(&mu);
}
static CUresult f_MemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    if (!(*p = malloc(n ? n : 1))) return CUDA_ERROR_OUT_OF_MEMORY;
    remember(*p, n, CU_MEMORYTYPE_HOST);
    return 0;
}
static CUresult f_MemAllocHost(void **p, size_t n) { return f_MemHostAlloc(p, n, 0); }
/* memory type and is-managed (never: the fake makes no managed memory) of its own allocations */
static CUresult f_PointerGetAttribute(void *out, int attr, CUdeviceptr p) {
    if (attr != CU_POINTER_ATTRIBUTE_MEMORY_TYPE && attr != CU_POINTER_ATTRIBUTE_IS_MANAGED) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (size_t i = nallocs; i-- > 0;) /* the newest first: the tests' live buffers */
        if (p >= allocs[i].base && p < allocs[i].base + allocs[i].size) {
            *(int *)out = attr == CU_POINTER_ATTRIBUTE_IS_MANAGED ? 0 : allocs[i].type;
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult f_PointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    for (unsigned i = 0; i < n; i++) {
        CUresult rc = f_PointerGetAttribute(data[i], attrs[i], p);
        if (rc) return rc;
    }
    return 0;
}
static void copy_issued(fstream *s, size_t n) {
    s->issued++;
    if (copy_gbps > 0 && !s->capturing) {
        uint64_t now = emu_now();
        s->busy_until = (s->busy_until > now ? s->busy_until : now) + emu_ns((double)n / copy_gbps);
    }
}
static CUresult f_HtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    INJECT("cuMemcpyHtoDAsync_v2");
    memcpy((void *)(uintptr_t)d, s, n);
    copy_issued(S(st), n);
    return 0;
}
/* As the real driver's: a D2H to pageable memory returns once its bytes are in, after its stream's queued work
 * (a host wait). */
static CUresult f_DtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) {
    INJECT("cuMemcpyDtoHAsync_v2");
    memcpy(d, (void *)(uintptr_t)s, n);
    fstream *f = S(st);
    copy_issued(f, n);
    int type = 0;
    int pinned = f_PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)d) == 0 &&
                 type == CU_MEMORYTYPE_HOST;
    if (!pinned && !f->capturing) {
        count_wait();
        sleep_until(f->busy_until);
        waited(f, f->issued);
    }
    return 0;
}
static CUresult f_HtoDAsync_ptsz(CUdeviceptr d, const void *s, size_t n, CUstream st) { return f_HtoDAsync(d, s, n, st); }
static CUresult f_HtoD(CUdeviceptr d, const void *s, size_t n) {
    sleep_until(default_stream.busy_until);
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
static CUresult f_DtoH(void *d, CUdeviceptr s, size_t n) {
    sleep_until(default_stream.busy_until);
    memcpy(d, (void *)(uintptr_t)s, n);
    return 0;
}
static CUresult f_Memcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return 0; }
static CUresult f_MemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return f_Memcpy(d, s, n); }
static CUresult f_Memcpy2DAsync(const CUDA_MEMCPY2D *c, CUstream st) {
    (void)st;
    const char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST ? c->srcHost : (const char *)(uintptr_t)c->srcDevice;
    char *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ? c->dstHost : (char *)(uintptr_t)c->dstDevice;
    for (size_t y = 0; y < c->Height; y++)
        memcpy(dst + (c->dstY + y) * c->dstPitch + c->dstXInBytes, src + (c->srcY + y) * c->srcPitch + c->srcXInBytes, c->WidthInBytes);
    return 0;
}
static CUresult f_Memcpy2D(const CUDA_MEMCPY2D *c) { sleep_until(default_stream.busy_until); return f_Memcpy2DAsync(c, NULL); }
static CUresult f_Memcpy3DAsync(const CUDA_MEMCPY3D *c, CUstream st) {
    (void)st;
    const char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST ? c->srcHost : (const char *)(uintptr_t)c->srcDevice;
    char *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ? c->dstHost : (char *)(uintptr_t)c->dstDevice;
    for (size_t z = 0; z < c->Depth; z++)
        for (size_t y = 0; y < c->Height; y++)
            memcpy(dst + ((c->dstZ + z) * c->dstHeight + c->dstY + y) * c->dstPitch + c->dstXInBytes,
                   src + ((c->srcZ + z) * c->srcHeight + c->srcY + y) * c->srcPitch + c->srcXInBytes, c->WidthInBytes);
    return 0;
}
static CUresult f_Memcpy3D(const CUDA_MEMCPY3D *c) { sleep_until(default_stream.busy_until); return f_Memcpy3DAsync(c, NULL); }
static CUresult f_MemcpyBatchAsync(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count, void *at, size_t *ix,
                                   size_t na, CUstream st) {
    (void)at; (void)ix; (void)na; (void)st;
    if (count > (1u << 20)) return 1; /* CUDA_ERROR_INVALID_VALUE, as the driver answers an absurd count */
    for (size_t i = 0; i < count; i++) memcpy((void *)(uintptr_t)d[i], (const void *)(uintptr_t)s[i], n[i]);
    return 0;
}
/* Modules: one, whose one function is the emulator's device-side wait (its first parameter: ns to hold the
 * stream); a module whose text does not name it is refused, as a driver refuses PTX it cannot compile. */
static char spin_fn; /* its handle */
static uint64_t last_spin_ns; /* what the last wait kernel was asked to hold its stream for */
static int modules_fail; /* 1: every module load fails (a driver without a PTX JIT) */
static CUresult f_ModuleLoadData(void **m, const void *image) {
    if (modules_fail || !strstr(image, ".entry ccbemu_spin")) return 218; /* CUDA_ERROR_INVALID_PTX */
    *m = &spin_fn;
    return 0;
}
static CUresult f_ModuleGetFunction(CUfunction *f, void *m, const char *name) {
    if (m != &spin_fn || strcmp(name, "ccbemu_spin")) return 500; /* CUDA_ERROR_NOT_FOUND */
    *f = &spin_fn;
    return 0;
}
static CUresult f_LaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned sh, CUstream st, void **p, void **e) {
    (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)e;
    INJECT("cuLaunchKernel");
    uint64_t t0 = emu_now();
    while (emu_now() - t0 < 2000) { /* the native submission: 2 us of CPU */ }
    if (S(st)->capturing) return 0;
    fstream *s = S(st);
    uint64_t now = emu_now();
    uint64_t ns = f == &spin_fn ? (last_spin_ns = *(unsigned long long *)p[0]) : (uint64_t)gx * 1000;
    s->busy_until = (s->busy_until > now ? s->busy_until : now) + ns;
    return 0;
}
/* Multi-GPU: a device that says it supports multicast, and multicast entry points that count their calls
 * (the emulator must refuse them without reaching the driver under a profile without NVLS). */
static long long multicast_calls;
static CUresult f_DeviceGetAttribute(int *v, int attr, CUdevice d) { (void)d; *v = attr == 132 ? 1 : 0; return 0; }
static CUresult f_CtxEnablePeerAccess(CUcontext c, unsigned flags) { (void)c; (void)flags; return 0; }
static CUresult f_MulticastCreate(unsigned long long *h, const void *p) { (void)p; multicast_calls++; *h = 1; return 0; }
static CUresult f_MulticastGetGranularity(size_t *g, const void *p, int o) { (void)p; (void)o; multicast_calls++; *g = 2 << 20; return 0; }
static CUresult f_CtxSynchronize(void) { count_wait(); sleep_until(default_stream.busy_until); return 0; }
static CUresult f_CtxSynchronize_v2(CUcontext c) { (void)c; return f_CtxSynchronize(); }
static CUresult f_HtoD_v1(CUdeviceptr d, const void *s, unsigned n) { return f_HtoD(d, s, n); } /* CUDA 2's 32-bit size */
static CUresult f_GetExportTable(const void **t, const void *id) { (void)id; *t = NULL; return CUDA_ERROR_NOT_SUPPORTED; }
/* Host functions run at once on the calling thread, after the stream's queued work (a test needs no callback thread). */
static CUresult f_LaunchHostFunc(CUstream st, void (*fn)(void *), void *user) {
    if (!S(st)->capturing) { sleep_until(S(st)->busy_until); fn(user); }
    return 0;
}
/* Graphs: handles only (what they hold is the emulator's side table's business). */
static CUresult f_GetCaptureInfo(CUstream st, int *status, unsigned long long *id, CUgraph *g, const void **deps,
                                 const void **edges, size_t *n) {
    (void)edges;
    if (status) *status = S(st)->capturing;
    if (id) *id = S(st)->capture;
    if (g) *g = S(st)->capturing ? S(st)->graph : NULL;
    if (deps) *deps = NULL;
    if (n) *n = 0;
    return 0;
}
static CUresult f_GraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)g; (void)flags;
    return (*e = malloc(1)) ? 0 : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_GraphExecDestroy(CUgraphExec e) { free(e); return 0; }
static CUresult f_GraphDestroy(CUgraph g) { (void)g; return 0; }
static CUresult f_GraphLaunch(CUgraphExec e, CUstream st) { (void)e; (void)st; return 0; }
/* Arrays: device memory addressed by offset. */
static CUresult f_HtoA(CUarray a, size_t off, const void *s, size_t n) { return f_HtoD((CUdeviceptr)(uintptr_t)a + off, s, n); }
static CUresult f_AtoH(void *d, CUarray a, size_t off, size_t n) { return f_DtoH(d, (CUdeviceptr)(uintptr_t)a + off, n); }
static CUresult f_HtoAAsync(CUarray a, size_t off, const void *s, size_t n, CUstream st) {
    return f_HtoDAsync((CUdeviceptr)(uintptr_t)a + off, s, n, st);
}
static CUresult f_AtoHAsync(void *d, CUarray a, size_t off, size_t n, CUstream st) {
    return f_DtoHAsync(d, (CUdeviceptr)(uintptr_t)a + off, n, st);
}
static CUresult f_CtxCreate(CUcontext *c, unsigned flags, CUdevice d) {
    (void)flags; (void)d;
    pthread_mutex_lock(&mu);
    *c = (CUcontext)next_ctx++;
    pthread_mutex_unlock(&mu);
    return f_CtxPushCurrent(*c);
}
static CUresult f_CtxDestroy(CUcontext c) { (void)c; return 0; }
static CUresult f_MemHostRegister(void *p, size_t n, unsigned f) { (void)f; remember(p, n, CU_MEMORYTYPE_HOST); return 0; }
static CUresult f_PrimaryGetState(CUdevice d, unsigned *flags, int *active) { (void)d; *flags = 0; *active = 1; return 0; }

static const struct { const char *name; void *fn; } kFake[] = {
    {"cuCtxGetCurrent", f_CtxGetCurrent}, {"cuCtxPushCurrent_v2", f_CtxPushCurrent},
    {"cuCtxPopCurrent_v2", f_CtxPopCurrent}, {"cuStreamGetCtx", f_StreamGetCtx},
    {"cuStreamCreate", f_StreamCreate}, {"cuStreamSynchronize", f_StreamSynchronize},
    {"cuStreamSynchronize_ptsz", f_StreamSynchronize}, {"cuStreamIsCapturing", f_StreamIsCapturing}, {"cuStreamQuery", f_StreamQuery}, {"cuStreamGetFlags", f_StreamGetFlags},
    {"cuEventCreate", f_EventCreate}, {"cuEventRecord", f_EventRecord}, {"cuEventQuery", f_EventQuery},
    {"cuEventSynchronize", f_EventSynchronize}, {"cuStreamWaitEvent", f_StreamWaitEvent},
    {"cuEventElapsedTime", f_EventElapsedTime}, {"cuMemHostAlloc", f_MemHostAlloc},
    {"cuMemAllocHost_v2", f_MemAllocHost}, {"cuPointerGetAttribute", f_PointerGetAttribute}, {"cuPointerGetAttributes", f_PointerGetAttributes},
    {"cuMemcpyHtoDAsync_v2", f_HtoDAsync}, {"cuMemcpyHtoDAsync_v2_ptsz", f_HtoDAsync_ptsz},
    {"cuMemcpyDtoHAsync_v2", f_DtoHAsync}, {"cuMemcpyDtoHAsync_v2_ptsz", f_DtoHAsync},
    {"cuMemcpyHtoD_v2", f_HtoD}, {"cuMemcpyDtoH_v2", f_DtoH}, {"cuMemcpy", f_Memcpy},
    {"cuMemcpyAsync", f_MemcpyAsync}, {"cuMemcpy2D_v2", f_Memcpy2D}, {"cuMemcpy2DAsync_v2", f_Memcpy2DAsync},
    {"cuMemcpy3D_v2", f_Memcpy3D}, {"cuMemcpy3DAsync_v2", f_Memcpy3DAsync}, {"cuMemcpyBatchAsync_v2", f_MemcpyBatchAsync},
    {"cuLaunchKernel", f_LaunchKernel}, {"cuCtxSynchronize", f_CtxSynchronize},
    {"cuCtxSynchronize_v2", f_CtxSynchronize_v2}, {"cuMemcpyHtoD", f_HtoD_v1}, {"cuGetExportTable", f_GetExportTable},
    {"cuLaunchHostFunc", f_LaunchHostFunc}, {"cuMemcpyHtoA_v2", f_HtoA}, {"cuMemcpyAtoH_v2", f_AtoH},
    {"cuMemcpyHtoAAsync_v2", f_HtoAAsync}, {"cuMemcpyAtoHAsync_v2", f_AtoHAsync},
    {"cuStreamGetCaptureInfo_v3", f_GetCaptureInfo}, {"cuGraphInstantiateWithFlags", f_GraphInstantiate},
    {"cuGraphExecDestroy", f_GraphExecDestroy}, {"cuGraphDestroy", f_GraphDestroy}, {"cuGraphLaunch", f_GraphLaunch},
    {"cuCtxCreate_v2", f_CtxCreate}, {"cuCtxDestroy_v2", f_CtxDestroy},
    {"cuMemHostRegister_v2", f_MemHostRegister}, {"cuDevicePrimaryCtxGetState", f_PrimaryGetState},
    {"cuModuleLoadData", f_ModuleLoadData}, {"cuModuleGetFunction", f_ModuleGetFunction},
    {"cuDeviceGetAttribute", f_DeviceGetAttribute}, {"cuCtxEnablePeerAccess", f_CtxEnablePeerAccess},
    {"cuMulticastCreate", f_MulticastCreate}, {"cuMulticastGetGranularity", f_MulticastGetGranularity},
};

static void *fake_table(const char *name);
static CUresult f_GetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    char name[128];
    /* the fake's versions, as the driver's: copies are _v2 from CUDA 3.2, cuCtxSynchronize from 13.0; the
     * per-thread flag picks _ptsz */
    int is_copy = strncmp(sym, "cuMemcpy", 8) == 0 && strcmp(sym, "cuMemcpy") && strcmp(sym, "cuMemcpyAsync");
    int v2 = is_copy ? ver >= 3020 : strcmp(sym, "cuCtxSynchronize") == 0 && ver >= 13000;
    snprintf(name, sizeof name, "%s%s%s", sym, v2 ? "_v2" : "", (flags & 2) ? "_ptsz" : "");
    if (status) *status = 0;
    *pfn = fake_table(name);
    return *pfn ? 0 : 500 /* CUDA_ERROR_NOT_FOUND */;
}

static void *fake_table(const char *name) {
    for (size_t i = 0; i < sizeof kFake / sizeof kFake[0]; i++)
        if (strcmp(kFake[i].name, name) == 0) return kFake[i].fn;
    return NULL;
}

void *ccbemu_fake_lookup(const char *name) {
    if (strcmp(name, "cuGetProcAddress_v2") == 0) return (void *)f_GetProcAddress_v2;
    return fake_table(name);
}

/* ---- helpers the tests call ---- */
void *ccbemu_fake_alloc(size_t n, int type) {
    void *p = malloc(n ? n : 1);
    if (p) remember(p, n, type);
    return p;
}
/* non-blocking, as PyTorch's and the probe's streams are (the default stream stays the blocking legacy one) */
CUstream ccbemu_fake_stream(void) { CUstream s = NULL; f_StreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */); return s; }
CUcontext ccbemu_fake_ctx_new(void) {
    pthread_mutex_lock(&mu);
    CUcontext c = (CUcontext)next_ctx++;
    pthread_mutex_unlock(&mu);
    return c;
}
void ccbemu_fake_set_ctx(CUcontext c) { t_cur = c; }
/* on: 1 begins a capture into a new graph, 2 into the last graph's address again (the
 * driver reusing a freed graph's handle), 0 ends it; each capture has its own id. */
void ccbemu_fake_capture(CUstream s, int on) {
    static uintptr_t next_graph = 0x6000;
    static unsigned long long next_capture;
    if (on == 1) S(s)->graph = (CUgraph)(next_graph += 16);
    if (on) S(s)->capture = ++next_capture;
    S(s)->capturing = on != 0;
}
void *ccbemu_fake_graph(CUstream s) { return S(s)->graph; }
/* The nth next call of the fake's `name` (cuEventSynchronize, cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2,
 * cuStreamWaitEvent, cuEventElapsedTime) fails. */
void ccbemu_fake_fail(const char *name, int nth) {
    pthread_mutex_lock(&mu);
    snprintf(fail_name, sizeof fail_name, "%s", name);
    fail_in = nth;
    pthread_mutex_unlock(&mu);
}
/* Async copies issued on any stream that no synchronize has waited for yet. */
long long ccbemu_fake_unwaited(void) {
    long long n = (long long)(default_stream.issued - default_stream.waited);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nstreams; i++) n += (long long)(streams[i]->issued - streams[i]->waited);
    pthread_mutex_unlock(&mu);
    return n;
}
/* Synchronize calls (event, stream, context) so far: the host waits a call made. */
long long ccbemu_fake_host_waits(void) { return (long long)__atomic_load_n(&host_waits, __ATOMIC_RELAXED); }
/* From now on an async host<->device copy holds its stream bytes / gbps ns (0: copies take no stream time). */
void ccbemu_fake_copy_gbps(double gbps) { copy_gbps = gbps; }
/* From now on cuStreamQuery takes ns (0: no time). */
void ccbemu_fake_query_ns(uint64_t ns) { query_ns = ns; }
/* Calls that reached the fake's multicast entry points. */
long long ccbemu_fake_multicast_calls(void) { return multicast_calls; }
/* 1: every module load fails from now on (the device-side wait cannot be loaded); 0: they work again. */
void ccbemu_fake_modules_fail(int on) { modules_fail = on; }
/* ns the last device-side wait kernel was launched with (0: none yet). */
unsigned long long ccbemu_fake_last_spin_ns(void) { return last_spin_ns; }
