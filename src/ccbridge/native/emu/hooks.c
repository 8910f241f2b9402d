/*
 * The interposer: one hook table, and the driver-API entry points it exports.
 *
 * Programs reach the driver three ways, and all three end in this table:
 *  - linked against libcuda: the preloaded exports below win symbol lookup;
 *  - dlopen + dlsym (libcudart's loader, ctypes, Triton): our dlsym returns
 *    the hook for any name in the table;
 *  - cuGetProcAddress[_v2] (libcudart >= 11.3, NCCL, cudaGetDriverEntryPoint):
 *    the real call picks the variant for the requested version and stream
 *    flavour; we map that exact pointer back to its table row and hand out
 *    that row's hook, so per-thread-default-stream (_ptsz/_ptds) variants
 *    keep their meaning.
 * Every hook calls the real function through the row's own pointer.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

typedef unsigned long long cuuint64_t;

#define HOOKS(X)                                                                                              \
    X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD_v2_ptds) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoH_v2_ptds)                    \
    X(cuMemcpyHtoDAsync_v2) X(cuMemcpyHtoDAsync_v2_ptsz) X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoHAsync_v2_ptsz) \
    X(cuMemcpy) X(cuMemcpy_ptds) X(cuMemcpyAsync) X(cuMemcpyAsync_ptsz)                                      \
    X(cuMemcpy2D_v2) X(cuMemcpy2D_v2_ptds) X(cuMemcpy2DUnaligned_v2) X(cuMemcpy2DUnaligned_v2_ptds)          \
    X(cuMemcpy2DAsync_v2) X(cuMemcpy2DAsync_v2_ptsz) X(cuMemcpy3D_v2) X(cuMemcpy3D_v2_ptds)                  \
    X(cuMemcpy3DAsync_v2) X(cuMemcpy3DAsync_v2_ptsz)                                                         \
    X(cuMemcpyBatchAsync) X(cuMemcpyBatchAsync_ptsz) X(cuMemcpyBatchAsync_v2) X(cuMemcpyBatchAsync_v2_ptsz)  \
    X(cuMemcpy3DBatchAsync) X(cuMemcpy3DBatchAsync_ptsz) X(cuMemcpy3DBatchAsync_v2)                          \
    X(cuMemcpy3DBatchAsync_v2_ptsz)                                                                          \
    X(cuMemcpyHtoA_v2) X(cuMemcpyHtoA_v2_ptds) X(cuMemcpyAtoH_v2) X(cuMemcpyAtoH_v2_ptds)                    \
    X(cuMemcpyHtoAAsync_v2) X(cuMemcpyHtoAAsync_v2_ptsz) X(cuMemcpyAtoHAsync_v2) X(cuMemcpyAtoHAsync_v2_ptsz) \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)                    \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) X(cuLaunchCooperativeKernelMultiDevice)   \
    X(cuLaunch) X(cuLaunchGrid) X(cuLaunchGridAsync) X(cuGraphLaunch) X(cuGraphLaunch_ptsz)                  \
    X(cuGraphInstantiate) X(cuGraphInstantiate_v2) X(cuGraphInstantiateWithFlags)                            \
    X(cuGraphInstantiateWithParams) X(cuGraphInstantiateWithParams_ptsz) X(cuGraphDestroy) X(cuGraphExecDestroy) \
    X(cuLaunchHostFunc) X(cuLaunchHostFunc_ptsz) X(cuStreamAddCallback) X(cuStreamAddCallback_ptsz)          \
    X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) X(cuEventSynchronize) X(cuCtxSynchronize)             \
    X(cuCtxSynchronize_v2)                                                                                   \
    X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy_v2)                                 \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset_v2)                \
    X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxReset)                                                  \
    X(cuMemHostRegister) X(cuMemHostRegister_v2) X(cuMemHostAlloc) X(cuMemAllocHost_v2)                      \
    X(cuPointerGetAttribute) X(cuPointerGetAttributes) X(cuEventElapsedTime) X(cuEventElapsedTime_v2)         \
    X(cuGetProcAddress) X(cuGetProcAddress_v2)                                                               \
    X(cuCtxEnablePeerAccess) X(cuDeviceGetAttribute)                                                         \
    X(cuMulticastCreate) X(cuMulticastGetGranularity) X(cuMulticastAddDevice) X(cuMulticastBindMem)         \
    X(cuMulticastBindAddr) X(cuMulticastUnbind)                                                              \
    NCCL_HOOKS(X)
/* NCCL's public API (nccl.h): the same table, but the real entry points come from libnccl (collective.c) */
#define NCCL_HOOKS(X)                                                                                         \
    X(ncclAllReduce) X(ncclReduceScatter) X(ncclAllGather) X(ncclBroadcast) X(ncclBcast) X(ncclReduce)       \
    X(ncclAlltoAll) X(ncclGather) X(ncclScatter) X(ncclSend) X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)    \
    X(ncclGroupSimulateEnd)

enum {
#define X(n) H_##n,
    HOOKS(X)
#undef X
    H_COUNT
};

static const char *const kNames[H_COUNT] = {
#define X(n) #n,
    HOOKS(X)
#undef X
};

static void *kHooks[H_COUNT]; /* filled at the end of this file, where every hook is defined */

static void *g_real[H_COUNT];
emu_driver drv;

const char *emu_api_name(int api) { return api >= 0 && api < H_COUNT ? kNames[api] : NULL; }

/* ---- set-up ---- */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static volatile int g_ready;
typedef void *(*lookup_fn)(const char *);

void emu_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ccbridge emulator: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(70);
}

static void find_real_dlsym(void) {
    if (real_dlsym) return;
    real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!real_dlsym) emu_fail("cannot find the C library's dlsym");
}

static lookup_fn g_lookup; /* the backend's lookup: libcuda's or the fake's */
static int is_nccl_name(const char *name) { return strncmp(name, "nccl", 4) == 0; }
int emu_driver_has(const char *name) { return g_lookup && g_lookup(name) != NULL; }

static void fill(lookup_fn look) {
    g_lookup = look;
    for (int i = 0; i < H_COUNT; i++)
        if (!is_nccl_name(kNames[i])) g_real[i] = look(kNames[i]); /* libnccl's come from dlsym or RTLD_NEXT */
    static const struct { size_t off; const char *name; } d[] = {
#define D(f, n) {offsetof(emu_driver, f), n}
        D(CtxGetCurrent, "cuCtxGetCurrent"), D(CtxPushCurrent, "cuCtxPushCurrent_v2"),
        D(CtxPopCurrent, "cuCtxPopCurrent_v2"), D(StreamGetCtx, "cuStreamGetCtx"),
        D(StreamCreate, "cuStreamCreate"), D(StreamSynchronize, "cuStreamSynchronize"),
        D(StreamIsCapturing, "cuStreamIsCapturing"), D(StreamQuery, "cuStreamQuery"),
        D(StreamGetFlags, "cuStreamGetFlags"), D(EventCreate, "cuEventCreate"),
        D(EventRecord, "cuEventRecord"), D(EventQuery, "cuEventQuery"), D(EventSynchronize, "cuEventSynchronize"),
        D(StreamWaitEvent, "cuStreamWaitEvent"), D(EventElapsedTime, "cuEventElapsedTime"),
        D(MemHostAlloc, "cuMemHostAlloc"), D(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
        D(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"), D(PointerGetAttribute, "cuPointerGetAttribute"),
        D(DevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState"), D(ModuleLoadData, "cuModuleLoadData"),
        D(ModuleGetFunction, "cuModuleGetFunction"), D(LaunchKernel, "cuLaunchKernel"),
#undef D
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        void *p = look(d[i].name);
        if (!p) emu_fail("the CUDA driver lacks %s (driver too old for the emulator?)", d[i].name);
        *(void **)((char *)&drv + d[i].off) = p;
    }
    drv.capture_info_v3 = (drv.StreamGetCaptureInfo = look("cuStreamGetCaptureInfo_v3")) != NULL;
    if (!drv.StreamGetCaptureInfo) drv.StreamGetCaptureInfo = look("cuStreamGetCaptureInfo_v2");
}

static void *g_libcuda;
static void *cuda_lookup(const char *name) { return real_dlsym(g_libcuda, name); }

static void load_config(const char *text, const char *origin) {
    char err[256];
    emu_config_defaults(&cfg);
    if (text && emu_config_parse(&cfg, text, err, sizeof err) != 0) emu_fail("bad configuration (%s): %s", origin, err);
    if (cfg.emulate && emu_cipher_load(err, sizeof err) != 0) emu_fail("%s", err);
    emu_dilate(&cfg);
    if (cfg.trace[0]) emu_trace_open(cfg.trace);
}

static void at_exit(void) { emu_trace_close(); emu_coverage_write(); }

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

void emu_init(void) {
    if (g_ready) return;
    pthread_mutex_lock(&g_init_mu);
    if (!g_ready) {
        find_real_dlsym();
        const char *path = getenv("CCBRIDGE_EMU_CONFIG");
        const char *text = NULL;
        if (path && !(text = read_file(path))) emu_fail("cannot read the configuration %s", path);
        if (!path) fprintf(stderr, "ccbridge emulator: preloaded without CCBRIDGE_EMU_CONFIG; running as passthrough\n");
        load_config(text, path ? path : "defaults");
        g_libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (g_libcuda) fill(cuda_lookup);
        atexit(at_exit);
        __sync_synchronize();
        g_ready = 1;
    }
    pthread_mutex_unlock(&g_init_mu);
}

/* CPU tests: the same hooks over a fake driver (fake.c). */
int ccbemu_test_init(const char *config_text, char *err, int errlen) {
    pthread_mutex_lock(&g_init_mu);
    find_real_dlsym();
    emu_config_defaults(&cfg);
    int rc = emu_config_parse(&cfg, config_text, err, (size_t)errlen);
    if (rc == 0 && cfg.emulate) rc = emu_cipher_load(err, (size_t)errlen);
    if (rc == 0) emu_dilate(&cfg);
    if (rc == 0) {
        emu_channels_reset();
        emu_stats_reset();
        emu_coverage_reset();
        emu_mgpu_reset();
        emu_dilate_reset();
        emu_bus_local();
        __atomic_store_n(&emu_paused, 0, __ATOMIC_RELAXED);
        fill(ccbemu_fake_lookup);
        emu_trace_open(cfg.trace); /* "" ends an earlier test's trace */
        g_ready = 1;
    }
    pthread_mutex_unlock(&g_init_mu);
    return rc;
}

void ccbemu_trace_flush(void) { emu_trace_close(); }
int ccbemu_summary(char *buf, int len) { return emu_summary_json(buf, (size_t)len); }
int ccbemu_coverage(char *buf, int len) { return emu_coverage_json(buf, (size_t)len); }
const char *ccbemu_hook_name(int i) { return emu_api_name(i); }
int ccbemu_seal(const uint8_t *key, const uint8_t *iv, const void *in, size_t len, void *out, uint8_t *tag) {
    char err[256];
    if (emu_cipher_load(err, sizeof err) != 0) return -1;
    return emu_gcm_seal(key, iv, in, len, out, tag);
}

int emu_hook_index(const char *name) {
    if (!name || !(emu_is_driver_name(name) || is_nccl_name(name))) return -1;
    for (int i = 0; i < H_COUNT; i++) if (strcmp(kNames[i], name) == 0) return i;
    return -1;
}

static void *defined_elsewhere(const char *name, void *self);

/* Names the loader asks for get their hook. RTLD_NEXT lookups are answered
 * relative to this library (glibc hides the caller's identity from us). */
void *dlsym(void *handle, const char *name) {
    find_real_dlsym();
    void *p = real_dlsym(handle, name);
    if (!p) return p;
    if (is_nccl_name(name)) { /* a program that loads libnccl itself (vLLM's pynccl: ctypes) */
        int k = emu_hook_index(name);
        if (k < 0) return p;
        emu_init();
        /* our own export, found through RTLD_DEFAULT: NCCL is there only if some library defines it (a program
         * that probes for NCCL must not find it because the interposer is preloaded) */
        if (p == kHooks[k] && !(p = defined_elsewhere(name, kHooks[k]))) return NULL;
        __atomic_store_n(&g_real[k], p, __ATOMIC_RELAXED);
        return kHooks[k];
    }
    if (!emu_is_driver_name(name)) return p;
    int i = emu_hook_index(name);
    if (i < 0) { /* not hooked: coverage notes the driver's own (no set-up here: libcuda's loading may call dlsym) */
        Dl_info info;
        if (dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "libcuda.so")) emu_cov_seen(name, COV_VIA_DLSYM);
        return p;
    }
    emu_init();
    emu_cov_seen(name, COV_VIA_DLSYM);
    return kHooks[i];
}

void *ccbemu_lookup(const char *name) {
    int i = emu_hook_index(name);
    return i < 0 ? NULL : kHooks[i];
}

void *ccbemu_real(const char *name) {
    int i = emu_hook_index(name);
    if (i < 0) return NULL;
    emu_init();
    return __atomic_load_n(&g_real[i], __ATOMIC_RELAXED);
}

#define REAL(n) ((n##_t *)g_real[H_##n])
/* t0_: when the call began, for the trace (0: not tracing) */
#define ENTER(n)                                                            \
    emu_init();                                                             \
    EMU_DILATE_SCOPE;                                                       \
    emu_count(H_##n);                                                       \
    __attribute__((unused)) const uint64_t t0_ = __atomic_load_n(&emu_tracing, __ATOMIC_RELAXED) ? emu_now() : 0; \
    if (!g_real[H_##n]) return CUDA_ERROR_NOT_INITIALIZED

/* ---- the trace of calls the channel does not see (record-only, launches, syncs) ---- */
static void rec(int api, int kind, int dir, int mem, size_t bytes, CUstream st, uint64_t t0, uint64_t t1, uint64_t toll,
                CUresult rc) {
    emu_record r = {api, dir, mem, t0, t1, 0, 0, toll, bytes, NULL, st, kind, rc};
    emu_trace_record(&r);
}
static void graph_note(CUstream st, int dir, int mem, size_t bytes);
/* A host<->device copy passed to the driver (not emulated): a crossing of the
 * trace; or, captured into a graph while emulating, a copy its launches pay for. */
static void dilate_copy(int dir, size_t bytes, CUstream st, int host_waits);
static CUresult pass_rec(int api, int dir, int mem, size_t bytes, CUstream st, uint64_t t0, uint64_t t1, CUresult rc) {
    if (!bytes) return rc;
    if (emu_capturing(st)) {
        if (cfg.emulate && rc == CUDA_SUCCESS) graph_note(st, dir, mem, bytes); /* (paused or not: the graph holds it) */
        return rc;
    }
    if (rc == CUDA_SUCCESS && !emu_on()) dilate_copy(dir, bytes, st, dir == DIR_D2H); /* CC off, or paused */
    if (t0) rec(api, REC_CROSSING, dir, mem, bytes, st, t0, t1, 0, rc);
    return rc;
}
/* what a passed copy needs looked at: when tracing, emulating (then it was captured, or moved no bytes) or
 * projecting */
#define PASS_LOOK(t0) ((t0) || cfg.emulate || cfg.dilation > 1)
/* Projected without emulation (CC off: passthrough --project): a crossing's bytes move at this machine's native
 * rate, and in dilated time they take r times as long (the target's PCIe is no faster): the rest, (r - 1) x
 * bytes at the native pinned rate, is waited for where the copy's end is met: on the host for a readback, on
 * the stream (a GPU-side wait after it) for an upload. No native rate measured: not dilated (README). */
static void dilate_copy(int dir, size_t bytes, CUstream st, int host_waits) {
    double rate = cfg.native_pinned_gbps[dir];
    if (!(cfg.dilation > 1) || !(rate > 0)) return;
    uint64_t ns = emu_ns((double)bytes / rate * (cfg.dilation - 1));
    if (host_waits) emu_spin_for(ns);
    else emu_device_wait(st, ns);
}
static CUresult pass_done(int api, int dir, const void *host, size_t bytes, CUstream st, uint64_t t0, CUresult rc) {
    uint64_t t1 = t0 ? emu_now() : 0;
    return PASS_LOOK(t0) && bytes ? pass_rec(api, dir, emu_host_kind(host), bytes, st, t0, t1, rc) : rc;
}

/* ---- entry points handed out by cuGetProcAddress ---- */
typedef CUresult cuGetProcAddress_t(const char *, void **, int, cuuint64_t);
typedef CUresult cuGetProcAddress_v2_t(const char *, void **, int, cuuint64_t, int *);

/* Hand out the hook of the exact variant the driver picked; coverage notes
 * that variant (its hook row, else the driver's exported name at that
 * address, else the name asked for). */
static void swap_in_hook(const char *symbol, void **pfn) {
    if (!*pfn) return;
    for (int i = 0; i < H_COUNT; i++)
        if (g_real[i] == *pfn) { *pfn = kHooks[i]; emu_cov_seen(kNames[i], COV_VIA_PROC); return; }
    const char *exact = emu_cov_exact_name(*pfn);
    emu_cov_seen(exact && emu_is_driver_name(exact) ? exact : symbol, COV_VIA_PROC);
}

EMU_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    ENTER(cuGetProcAddress);
    CUresult rc = REAL(cuGetProcAddress)(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS) swap_in_hook(symbol, pfn);
    return rc;
}

EMU_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status) {
    ENTER(cuGetProcAddress_v2);
    CUresult rc = REAL(cuGetProcAddress_v2)(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS) swap_in_hook(symbol, pfn);
    return rc;
}

/* ---- contiguous copies ---- */
#define PT(s) ((s) ? (s) : CU_STREAM_PER_THREAD)

static CUresult copy_h2d(int api, CUdeviceptr d, const void *s, size_t n, CUstream st, int sync_call) {
    emu_copy c = {api, DIR_H2D, (void *)s, d, n, st, sync_call};
    return emu_cross(&c);
}
static CUresult copy_d2h(int api, void *d, CUdeviceptr s, size_t n, CUstream st, int sync_call) {
    emu_copy c = {api, DIR_D2H, d, s, n, st, sync_call};
    return emu_cross(&c);
}
static int emulating(size_t n, CUstream st) { return emu_on() && n && !emu_capturing(st); }

typedef CUresult cuMemcpyHtoD_v2_t(CUdeviceptr, const void *, size_t);
typedef CUresult cuMemcpyDtoH_v2_t(void *, CUdeviceptr, size_t);
typedef CUresult cuMemcpyHtoDAsync_v2_t(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult cuMemcpyDtoHAsync_v2_t(void *, CUdeviceptr, size_t, CUstream);
typedef cuMemcpyHtoD_v2_t cuMemcpyHtoD_v2_ptds_t;
typedef cuMemcpyDtoH_v2_t cuMemcpyDtoH_v2_ptds_t;
typedef cuMemcpyHtoDAsync_v2_t cuMemcpyHtoDAsync_v2_ptsz_t;
typedef cuMemcpyDtoHAsync_v2_t cuMemcpyDtoHAsync_v2_ptsz_t;

#define DEF_SYNC_H2D(n, ST)                                                   \
    EMU_API CUresult n(CUdeviceptr d, const void *s, size_t b) {              \
        ENTER(n);                                                             \
        if (!emulating(b, ST)) return pass_done(H_##n, DIR_H2D, s, b, ST, t0_, REAL(n)(d, s, b)); \
        return copy_h2d(H_##n, d, s, b, ST, 1);                               \
    }
#define DEF_SYNC_D2H(n, ST)                                                   \
    EMU_API CUresult n(void *d, CUdeviceptr s, size_t b) {                    \
        ENTER(n);                                                             \
        if (!emulating(b, ST)) return pass_done(H_##n, DIR_D2H, d, b, ST, t0_, REAL(n)(d, s, b)); \
        return copy_d2h(H_##n, d, s, b, ST, 1);                               \
    }
#define DEF_ASYNC_H2D(n, NORM)                                                \
    EMU_API CUresult n(CUdeviceptr d, const void *s, size_t b, CUstream st) { \
        ENTER(n);                                                             \
        if (!emulating(b, NORM(st))) return pass_done(H_##n, DIR_H2D, s, b, NORM(st), t0_, REAL(n)(d, s, b, st)); \
        return copy_h2d(H_##n, d, s, b, NORM(st), 0);                         \
    }
#define DEF_ASYNC_D2H(n, NORM)                                                \
    EMU_API CUresult n(void *d, CUdeviceptr s, size_t b, CUstream st) {       \
        ENTER(n);                                                             \
        if (!emulating(b, NORM(st))) return pass_done(H_##n, DIR_D2H, d, b, NORM(st), t0_, REAL(n)(d, s, b, st)); \
        return copy_d2h(H_##n, d, s, b, NORM(st), 0);                         \
    }
#define AS_IS(s) (s)
DEF_SYNC_H2D(cuMemcpyHtoD_v2, NULL)
DEF_SYNC_H2D(cuMemcpyHtoD_v2_ptds, CU_STREAM_PER_THREAD)
DEF_SYNC_D2H(cuMemcpyDtoH_v2, NULL)
DEF_SYNC_D2H(cuMemcpyDtoH_v2_ptds, CU_STREAM_PER_THREAD)
DEF_ASYNC_H2D(cuMemcpyHtoDAsync_v2, AS_IS)
DEF_ASYNC_H2D(cuMemcpyHtoDAsync_v2_ptsz, PT)
DEF_ASYNC_D2H(cuMemcpyDtoHAsync_v2, AS_IS)
DEF_ASYNC_D2H(cuMemcpyDtoHAsync_v2_ptsz, PT)

/* Generic copies: unified addressing tells host from device. */
static CUresult generic(int api, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream st, int sync_call, int *handled) {
    int mem_d, mem_s;
    int dh = emu_is_host(dst, &mem_d), sh = emu_is_host(src, &mem_s);
    *handled = dh != sh;
    if (!*handled) return CUDA_SUCCESS; /* device-local or host-to-host: untouched */
    return sh ? copy_h2d(api, dst, (const void *)(uintptr_t)src, n, st, sync_call)
              : copy_d2h(api, (void *)(uintptr_t)dst, src, n, st, sync_call);
}
/* Passed through: a crossing of the trace if one side is host memory. */
static CUresult generic_pass(int api, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream st, uint64_t t0, CUresult rc) {
    uint64_t t1 = t0 ? emu_now() : 0;
    int mem_d, mem_s;
    if (!PASS_LOOK(t0) || !n) return rc;
    int dh = emu_is_host(dst, &mem_d), sh = emu_is_host(src, &mem_s);
    return dh == sh ? rc : pass_rec(api, sh ? DIR_H2D : DIR_D2H, sh ? mem_s : mem_d, n, st, t0, t1, rc);
}
typedef CUresult cuMemcpy_t(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult cuMemcpyAsync_t(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef cuMemcpy_t cuMemcpy_ptds_t;
typedef cuMemcpyAsync_t cuMemcpyAsync_ptsz_t;
#define DEF_GENERIC_SYNC(n, ST)                                               \
    EMU_API CUresult n(CUdeviceptr d, CUdeviceptr s, size_t b) {              \
        ENTER(n);                                                             \
        int handled = 0;                                                      \
        if (!emulating(b, ST)) return generic_pass(H_##n, d, s, b, ST, t0_, REAL(n)(d, s, b)); \
        CUresult rc = generic(H_##n, d, s, b, ST, 1, &handled);               \
        return handled ? rc : REAL(n)(d, s, b);                               \
    }
#define DEF_GENERIC_ASYNC(n, NORM)                                            \
    EMU_API CUresult n(CUdeviceptr d, CUdeviceptr s, size_t b, CUstream st) { \
        ENTER(n);                                                             \
        int handled = 0;                                                      \
        if (!emulating(b, NORM(st))) return generic_pass(H_##n, d, s, b, NORM(st), t0_, REAL(n)(d, s, b, st)); \
        CUresult rc = generic(H_##n, d, s, b, NORM(st), 0, &handled);         \
        return handled ? rc : REAL(n)(d, s, b, st);                           \
    }
DEF_GENERIC_SYNC(cuMemcpy, NULL)
DEF_GENERIC_SYNC(cuMemcpy_ptds, CU_STREAM_PER_THREAD)
DEF_GENERIC_ASYNC(cuMemcpyAsync, AS_IS)
DEF_GENERIC_ASYNC(cuMemcpyAsync_ptsz, PT)

/* ---- 2D / 3D copies: the real call moves the data, on the channel's stream ---- */
typedef struct {
    int dir, mem;
    size_t bytes;
    emu_span *spans;
    size_t nspans;
} plan;
/* plan_* results besides 0 (not a crossing) and 1 */
enum { PLAN_NOMEM = -1, PLAN_INVALID = -2 };
static CUresult plan_error(int k) { return k == PLAN_NOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE; }

/* Which side is host memory, and its rows. Returns 0 if not a crossing. */
static int side_host(int type, const void *host, CUdeviceptr dev, const void **base, int *mem) {
    if (type == CU_MEMORYTYPE_HOST) { *base = host; *mem = emu_host_kind(host); return 1; }
    if (type == CU_MEMORYTYPE_UNIFIED && emu_is_host(dev, mem)) { *base = (const void *)(uintptr_t)dev; return 1; }
    return 0;
}

/* a*b+c in size_t; 0 when it does not fit (the descriptor is then invalid, not a smaller copy) */
static int mul_add(size_t a, size_t b, size_t c, size_t *out) {
    return !__builtin_mul_overflow(a, b, out) && !__builtin_add_overflow(*out, c, out);
}

static int plan_rows(plan *p, int src_type, const void *src_host, CUdeviceptr src_dev, size_t sx, size_t sy, size_t sz,
                     size_t spitch, size_t sheight, int dst_type, const void *dst_host, CUdeviceptr dst_dev, size_t dx,
                     size_t dy, size_t dz, size_t dpitch, size_t dheight, size_t width, size_t height, size_t depth) {
    const void *base;
    int mem;
    int sh = side_host(src_type, src_host, src_dev, &base, &mem);
    int dh = side_host(dst_type, dst_host, dst_dev, &base, &mem);
    if (sh == dh) return 0;
    size_t x = sh ? sx : dx, y = sh ? sy : dy, z = sh ? sz : dz, pitch = sh ? spitch : dpitch;
    size_t hgt = sh ? sheight : dheight;
    if (!pitch) pitch = width;
    if (!hgt) hgt = height;
    p->dir = sh ? DIR_H2D : DIR_D2H;
    p->mem = mem;
    size_t rows, span_bytes, zl, yl, last_row, end;
    p->spans = NULL;
    if (!mul_add(height, depth, 0, &rows) || !mul_add(width, rows, 0, &p->bytes)) return PLAN_INVALID;
    if (!p->bytes) return 1; /* nothing crosses: the real call alone */
    /* the furthest host byte, x + width into row (z+depth-1)*hgt + y+height-1, must be addressable */
    if (__builtin_add_overflow(z, depth - 1, &zl) || __builtin_add_overflow(y, height - 1, &yl) ||
        !mul_add(zl, hgt, yl, &last_row) || !mul_add(last_row, pitch, x, &end) ||
        __builtin_add_overflow(end, width, &end) || end > UINTPTR_MAX - (uintptr_t)base ||
        !mul_add(sizeof(emu_span), rows, 0, &span_bytes))
        return PLAN_INVALID;
    p->nspans = rows;
    if (!(p->spans = malloc(span_bytes))) return PLAN_NOMEM;
    size_t k = 0;
    for (size_t zz = 0; zz < depth; zz++)
        for (size_t yy = 0; yy < height; yy++)
            p->spans[k++] = (emu_span){(const char *)base + ((z + zz) * hgt + y + yy) * pitch + x, width};
    return 1;
}

static int plan_2d(plan *p, const CUDA_MEMCPY2D *c) {
    return plan_rows(p, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, 0, c->srcPitch, 0,
                     c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, 0, c->dstPitch, 0,
                     c->WidthInBytes, c->Height, 1);
}
static int plan_3d(plan *p, const CUDA_MEMCPY3D *c) {
    return plan_rows(p, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch,
                     c->srcHeight, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstZ,
                     c->dstPitch, c->dstHeight, c->WidthInBytes, c->Height, c->Depth);
}

static CUresult run_plan(int api, plan *p, CUstream st, int sync_call, emu_issue_fn issue, void *arg) {
    emu_opaque o = {api, p->dir, p->mem, p->bytes, st, sync_call, p->spans, p->nspans, issue, arg};
    CUresult rc = emu_cross_opaque(&o);
    free(p->spans);
    return rc;
}

typedef CUresult cuMemcpy2D_v2_t(const CUDA_MEMCPY2D *);
typedef CUresult cuMemcpy2DAsync_v2_t(const CUDA_MEMCPY2D *, CUstream);
typedef CUresult cuMemcpy3D_v2_t(const CUDA_MEMCPY3D *);
typedef CUresult cuMemcpy3DAsync_v2_t(const CUDA_MEMCPY3D *, CUstream);
typedef cuMemcpy2D_v2_t cuMemcpy2D_v2_ptds_t, cuMemcpy2DUnaligned_v2_t, cuMemcpy2DUnaligned_v2_ptds_t;
typedef cuMemcpy2DAsync_v2_t cuMemcpy2DAsync_v2_ptsz_t;
typedef cuMemcpy3D_v2_t cuMemcpy3D_v2_ptds_t;
typedef cuMemcpy3DAsync_v2_t cuMemcpy3DAsync_v2_ptsz_t;

/* the blocking APIs run the real blocking call (we already waited for the stream) */
typedef struct { int h; const void *desc; } desc_arg;
static CUresult issue_sync_desc(void *a, CUstream st) {
    (void)st;
    desc_arg *d = a;
    return ((CUresult(*)(const void *))g_real[d->h])(d->desc);
}
static CUresult issue_async_desc(void *a, CUstream st) {
    desc_arg *d = a;
    return ((CUresult(*)(const void *, CUstream))g_real[d->h])(d->desc, st);
}

/* Passed through: the plan, made after the call, says what crossed (for the trace). */
static CUresult plan_pass(int api, int k, plan *p, CUstream st, uint64_t t0, uint64_t t1, CUresult rc) {
    if (k > 0) {
        pass_rec(api, p->dir, p->mem, p->bytes, st, t0, t1, rc);
        free(p->spans);
    }
    return rc;
}
#define PLAN_PASS(n, PLAN, desc, st, call)                                    \
    do {                                                                      \
        CUresult rc_ = (call);                                                \
        uint64_t t1_ = t0_ ? emu_now() : 0;                                   \
        plan pp_ = {0};                                                       \
        return PASS_LOOK(t0_) ? plan_pass(H_##n, PLAN(&pp_, desc), &pp_, st, t0_, t1_, rc_) : rc_; \
    } while (0)
#define DEF_DESC_SYNC(n, T, PLAN, ST)                                         \
    EMU_API CUresult n(const T *c) {                                          \
        ENTER(n);                                                             \
        plan p;                                                               \
        if (!emulating(1, ST)) PLAN_PASS(n, PLAN, c, ST, REAL(n)(c));         \
        int k = PLAN(&p, c);                                                  \
        if (k < 0) return plan_error(k);                                      \
        if (!k || !p.bytes) { if (k) free(p.spans); return REAL(n)(c); }      \
        desc_arg a = {H_##n, c};                                              \
        return run_plan(H_##n, &p, ST, 1, issue_sync_desc, &a);               \
    }
#define DEF_DESC_ASYNC(n, T, PLAN, NORM)                                      \
    EMU_API CUresult n(const T *c, CUstream st) {                             \
        ENTER(n);                                                             \
        plan p;                                                               \
        if (!emulating(1, NORM(st))) PLAN_PASS(n, PLAN, c, NORM(st), REAL(n)(c, st)); \
        int k = PLAN(&p, c);                                                  \
        if (k < 0) return plan_error(k);                                      \
        if (!k || !p.bytes) { if (k) free(p.spans); return REAL(n)(c, st); }  \
        desc_arg a = {H_##n, c};                                              \
        return run_plan(H_##n, &p, NORM(st), 0, issue_async_desc, &a);        \
    }
DEF_DESC_SYNC(cuMemcpy2D_v2, CUDA_MEMCPY2D, plan_2d, NULL)
DEF_DESC_SYNC(cuMemcpy2D_v2_ptds, CUDA_MEMCPY2D, plan_2d, CU_STREAM_PER_THREAD)
DEF_DESC_SYNC(cuMemcpy2DUnaligned_v2, CUDA_MEMCPY2D, plan_2d, NULL)
DEF_DESC_SYNC(cuMemcpy2DUnaligned_v2_ptds, CUDA_MEMCPY2D, plan_2d, CU_STREAM_PER_THREAD)
DEF_DESC_ASYNC(cuMemcpy2DAsync_v2, CUDA_MEMCPY2D, plan_2d, AS_IS)
DEF_DESC_ASYNC(cuMemcpy2DAsync_v2_ptsz, CUDA_MEMCPY2D, plan_2d, PT)
DEF_DESC_SYNC(cuMemcpy3D_v2, CUDA_MEMCPY3D, plan_3d, NULL)
DEF_DESC_SYNC(cuMemcpy3D_v2_ptds, CUDA_MEMCPY3D, plan_3d, CU_STREAM_PER_THREAD)
DEF_DESC_ASYNC(cuMemcpy3DAsync_v2, CUDA_MEMCPY3D, plan_3d, AS_IS)
DEF_DESC_ASYNC(cuMemcpy3DAsync_v2_ptsz, CUDA_MEMCPY3D, plan_3d, PT)

/* ---- batch copies: every host-side entry is part of one crossing ---- */
static int plan_batch(plan *p, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count) {
    int d2h = 0, pageable = 0;
    size_t k = 0, span_bytes;
    p->bytes = 0;
    if (!mul_add(sizeof(emu_span), count ? count : 1, 0, &span_bytes)) return PLAN_INVALID;
    if (!(p->spans = malloc(span_bytes))) return PLAN_NOMEM;
    for (size_t i = 0; i < count; i++) {
        int md, ms, dh = emu_is_host(dsts[i], &md), sh = emu_is_host(srcs[i], &ms);
        if (dh == sh || !sizes[i]) continue;
        d2h |= dh;
        pageable |= (sh ? ms : md) == MEM_PAGEABLE;
        p->spans[k++] = (emu_span){(const void *)(uintptr_t)(sh ? srcs[i] : dsts[i]), sizes[i]};
        if (__builtin_add_overflow(p->bytes, sizes[i], &p->bytes)) { free(p->spans); return PLAN_INVALID; }
    }
    p->nspans = k;
    p->dir = d2h ? DIR_D2H : DIR_H2D; /* a batch with any readback waits like a D2H */
    p->mem = pageable ? MEM_PAGEABLE : MEM_PINNED;
    return k > 0;
}

typedef CUresult cuMemcpyBatchAsync_t(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, void *, size_t *, size_t, size_t *, CUstream);
typedef CUresult cuMemcpyBatchAsync_v2_t(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, void *, size_t *, size_t, CUstream);
typedef cuMemcpyBatchAsync_t cuMemcpyBatchAsync_ptsz_t;
typedef cuMemcpyBatchAsync_v2_t cuMemcpyBatchAsync_v2_ptsz_t;
typedef struct {
    int h, v1;
    CUdeviceptr *dsts, *srcs;
    size_t *sizes, count, *attrs_idx, nattrs, *fail_idx;
    void *attrs;
} batch_arg;
static CUresult issue_batch(void *a, CUstream st) {
    batch_arg *b = a;
    if (b->v1) return ((cuMemcpyBatchAsync_t *)g_real[b->h])(b->dsts, b->srcs, b->sizes, b->count, b->attrs, b->attrs_idx, b->nattrs, b->fail_idx, st);
    return ((cuMemcpyBatchAsync_v2_t *)g_real[b->h])(b->dsts, b->srcs, b->sizes, b->count, b->attrs, b->attrs_idx, b->nattrs, st);
}
static CUresult batch(int h, int v1, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, void *attrs,
                      size_t *idx, size_t nattrs, size_t *fail_idx, CUstream st, int *handled) {
    plan p = {0};
    *handled = 0;
    if (!emulating(1, st)) return CUDA_SUCCESS;
    int k = plan_batch(&p, dsts, srcs, sizes, count);
    *handled = k != 0;
    if (k < 0) return plan_error(k);
    if (!k) { free(p.spans); return CUDA_SUCCESS; }
    batch_arg a = {h, v1, dsts, srcs, sizes, count, idx, nattrs, fail_idx, attrs};
    return run_plan(h, &p, st, 0, issue_batch, &a);
}
#define BATCH_PASS(n, d, s, z, c, st, call)                                   \
    do {                                                                      \
        CUresult rc_ = (call);                                                \
        uint64_t t1_ = t0_ ? emu_now() : 0;                                   \
        plan pp_ = {0};                                                       \
        return PASS_LOOK(t0_) ? plan_pass(H_##n, plan_batch(&pp_, d, s, z, c), &pp_, st, t0_, t1_, rc_) : rc_; \
    } while (0)
#define DEF_BATCH_V1(n, NORM)                                                                                     \
    EMU_API CUresult n(CUdeviceptr *d, CUdeviceptr *s, size_t *z, size_t c, void *at, size_t *ix, size_t na, size_t *fi,  \
               CUstream st) {                                                                                     \
        ENTER(n);                                                                                                 \
        int handled;                                                                                              \
        CUresult rc = batch(H_##n, 1, d, s, z, c, at, ix, na, fi, NORM(st), &handled);                            \
        if (handled) return rc;                                                                                   \
        BATCH_PASS(n, d, s, z, c, NORM(st), REAL(n)(d, s, z, c, at, ix, na, fi, st));                             \
    }
#define DEF_BATCH_V2(n, NORM)                                                                                     \
    EMU_API CUresult n(CUdeviceptr *d, CUdeviceptr *s, size_t *z, size_t c, void *at, size_t *ix, size_t na, CUstream st) { \
        ENTER(n);                                                                                                 \
        int handled;                                                                                              \
        CUresult rc = batch(H_##n, 0, d, s, z, c, at, ix, na, NULL, NORM(st), &handled);                          \
        if (handled) return rc;                                                                                   \
        BATCH_PASS(n, d, s, z, c, NORM(st), REAL(n)(d, s, z, c, at, ix, na, st));                                 \
    }
DEF_BATCH_V1(cuMemcpyBatchAsync, AS_IS)
DEF_BATCH_V1(cuMemcpyBatchAsync_ptsz, PT)
DEF_BATCH_V2(cuMemcpyBatchAsync_v2, AS_IS)
DEF_BATCH_V2(cuMemcpyBatchAsync_v2_ptsz, PT)

/* ---- copies to and from CUDA arrays: one contiguous host span, through the channel ---- */
typedef CUresult cuMemcpyHtoA_v2_t(CUarray, size_t, const void *, size_t);
typedef CUresult cuMemcpyAtoH_v2_t(void *, CUarray, size_t, size_t);
typedef CUresult cuMemcpyHtoAAsync_v2_t(CUarray, size_t, const void *, size_t, CUstream);
typedef CUresult cuMemcpyAtoHAsync_v2_t(void *, CUarray, size_t, size_t, CUstream);
typedef cuMemcpyHtoA_v2_t cuMemcpyHtoA_v2_ptds_t;
typedef cuMemcpyAtoH_v2_t cuMemcpyAtoH_v2_ptds_t;
typedef cuMemcpyHtoAAsync_v2_t cuMemcpyHtoAAsync_v2_ptsz_t;
typedef cuMemcpyAtoHAsync_v2_t cuMemcpyAtoHAsync_v2_ptsz_t;
typedef struct { int h, dir, async; CUarray a; size_t off; void *host; size_t n; } array_arg;
static CUresult issue_array(void *p, CUstream st) {
    array_arg *a = p;
    if (a->dir == DIR_H2D)
        return a->async ? ((cuMemcpyHtoAAsync_v2_t *)g_real[a->h])(a->a, a->off, a->host, a->n, st)
                        : ((cuMemcpyHtoA_v2_t *)g_real[a->h])(a->a, a->off, a->host, a->n);
    return a->async ? ((cuMemcpyAtoHAsync_v2_t *)g_real[a->h])(a->host, a->a, a->off, a->n, st)
                    : ((cuMemcpyAtoH_v2_t *)g_real[a->h])(a->host, a->a, a->off, a->n);
}
/* Returns the crossing's result; *handled 0: not emulated, the caller runs the real call. */
static CUresult array_copy(int h, int dir, int async, CUarray arr, size_t off, void *host, size_t n, CUstream st,
                           int *handled) {
    if (!(*handled = emulating(n, st))) return CUDA_SUCCESS;
    emu_span span = {host, n};
    array_arg a = {h, dir, async, arr, off, host, n};
    emu_opaque o = {h, dir, emu_host_kind(host), n, st, !async, &span, 1, issue_array, &a};
    return emu_cross_opaque(&o);
}
#define DEF_HTOA(n, ST)                                                                          \
    EMU_API CUresult n(CUarray a, size_t off, const void *s, size_t b) {                        \
        ENTER(n);                                                                               \
        int handled;                                                                            \
        CUresult rc = array_copy(H_##n, DIR_H2D, 0, a, off, (void *)s, b, ST, &handled);        \
        return handled ? rc : pass_done(H_##n, DIR_H2D, s, b, ST, t0_, REAL(n)(a, off, s, b));  \
    }
#define DEF_ATOH(n, ST)                                                                          \
    EMU_API CUresult n(void *d, CUarray a, size_t off, size_t b) {                              \
        ENTER(n);                                                                               \
        int handled;                                                                            \
        CUresult rc = array_copy(H_##n, DIR_D2H, 0, a, off, d, b, ST, &handled);                \
        return handled ? rc : pass_done(H_##n, DIR_D2H, d, b, ST, t0_, REAL(n)(d, a, off, b));  \
    }
#define DEF_HTOA_ASYNC(n, NORM)                                                                  \
    EMU_API CUresult n(CUarray a, size_t off, const void *s, size_t b, CUstream st) {           \
        ENTER(n);                                                                               \
        int handled;                                                                            \
        CUresult rc = array_copy(H_##n, DIR_H2D, 1, a, off, (void *)s, b, NORM(st), &handled);  \
        return handled ? rc : pass_done(H_##n, DIR_H2D, s, b, NORM(st), t0_, REAL(n)(a, off, s, b, st)); \
    }
#define DEF_ATOH_ASYNC(n, NORM)                                                                  \
    EMU_API CUresult n(void *d, CUarray a, size_t off, size_t b, CUstream st) {                 \
        ENTER(n);                                                                               \
        int handled;                                                                            \
        CUresult rc = array_copy(H_##n, DIR_D2H, 1, a, off, d, b, NORM(st), &handled);          \
        return handled ? rc : pass_done(H_##n, DIR_D2H, d, b, NORM(st), t0_, REAL(n)(d, a, off, b, st)); \
    }
DEF_HTOA(cuMemcpyHtoA_v2, NULL)
DEF_HTOA(cuMemcpyHtoA_v2_ptds, CU_STREAM_PER_THREAD)
DEF_ATOH(cuMemcpyAtoH_v2, NULL)
DEF_ATOH(cuMemcpyAtoH_v2_ptds, CU_STREAM_PER_THREAD)
DEF_HTOA_ASYNC(cuMemcpyHtoAAsync_v2, AS_IS)
DEF_HTOA_ASYNC(cuMemcpyHtoAAsync_v2_ptsz, PT)
DEF_ATOH_ASYNC(cuMemcpyAtoHAsync_v2, AS_IS)
DEF_ATOH_ASYNC(cuMemcpyAtoHAsync_v2_ptsz, PT)

/* ---- 3D batch copies: hooked so that coverage sees them, counted, passed through ----
 * Their operands (pointers with row lengths in elements, or arrays with their
 * formats) would need the arrays' element sizes to tell the bytes crossing;
 * README "Known limits" says they are not charged. */
typedef CUresult cuMemcpy3DBatchAsync_t(size_t, void *, size_t *, unsigned long long, CUstream);
typedef CUresult cuMemcpy3DBatchAsync_v2_t(size_t, void *, unsigned long long, CUstream);
typedef cuMemcpy3DBatchAsync_t cuMemcpy3DBatchAsync_ptsz_t;
typedef cuMemcpy3DBatchAsync_v2_t cuMemcpy3DBatchAsync_v2_ptsz_t;
#define DEF_BATCH3D_V1(n)                                                                        \
    EMU_API CUresult n(size_t k, void *ops, size_t *fail, unsigned long long f, CUstream st) {  \
        ENTER(n);                                                                               \
        return REAL(n)(k, ops, fail, f, st);                                                    \
    }
#define DEF_BATCH3D_V2(n)                                                                        \
    EMU_API CUresult n(size_t k, void *ops, unsigned long long f, CUstream st) {                \
        ENTER(n);                                                                               \
        return REAL(n)(k, ops, f, st);                                                          \
    }
DEF_BATCH3D_V1(cuMemcpy3DBatchAsync)
DEF_BATCH3D_V1(cuMemcpy3DBatchAsync_ptsz)
DEF_BATCH3D_V2(cuMemcpy3DBatchAsync_v2)
DEF_BATCH3D_V2(cuMemcpy3DBatchAsync_v2_ptsz)

/* ---- launches: a fixed toll added to each launch; a graph pays once ----
 * Additive, as the published figures are (CC-on minus CC-off per launch,
 * measured at the framework level): a multiple of this machine's driver
 * submission would scale with a cost CC does not add to. Paid before the real
 * launch: under CC the GPU sees the work only once its submission has crossed
 * the bridge, so a launch + wait waits for the kernel after the toll (paid
 * after the launch, the kernel ran during it and an empty kernel's ~3 us of
 * native completion vanished from every launch + wait). A launch being
 * captured into a graph is not submitted, so it pays nothing; a launch the
 * driver refuses has paid it (the submission was made). */
typedef struct { int on; uint64_t toll; } launch_charge;
/* Inside a real NCCL call: NCCL's own calls of its API (ncclBcast calls ncclBroadcast, ncclAlltoAll a group of
 * sends and recvs, through its PLT, so into our exports) pass straight through, neither charged nor traced; and
 * its kernel launch queues the operation's pending charge first (collective.c). */
static __thread int t_in_nccl;
static launch_charge launch_begin(CUstream st) {
    launch_charge c = {0, 0};
    if (!emu_on()) return c;
    uint64_t from = emu_now(); /* our own check below is inside the toll */
    if (emu_capturing(st)) return c;
    c.on = 1;
    if ((c.toll = emu_ns(cfg.launch_toll_ns * (emu_mgpu() ? cfg.mgpu_launch_factor : 1.0)))) emu_wait_until(from + c.toll);
    return c;
}
static CUresult launch_done(int api, uint64_t t0, CUresult rc, CUstream st, launch_charge c) {
    if (rc == CUDA_SUCCESS && c.on) emu_work_submitted();
    /* (a refused launch that paid its toll keeps its line, so an account can say where the time went) */
    if (t0 && (c.on || (rc == CUDA_SUCCESS && !emu_capturing(st)))) rec(api, REC_LAUNCH, -1, 0, 0, st, t0, emu_now(), c.toll, rc);
    return rc;
}
/* (a GNU statement expression: the toll is paid, and inside NCCL its operation's wait queued, before `call` runs;
 * the time queuing the wait took is the collective's, so the launch's line starts that much later) */
#define LAUNCH_DONE(n, call, st)                                                                                  \
    ({ CUstream st_ = (st); launch_charge c_ = launch_begin(st_); uint64_t w_ = 0;                                \
       if (t_in_nccl) { uint64_t a_ = emu_now(); emu_coll_at_launch(st_); w_ = emu_now() - a_; }                 \
       launch_done(H_##n, t0_ ? t0_ + w_ : 0, (call), st_, c_); })
typedef CUresult cuLaunchKernel_t(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void **, void **);
typedef CUresult cuLaunchCooperativeKernel_t(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                             unsigned, CUstream, void **);
typedef struct { unsigned grid[3], block[3], shmem; CUstream stream; } launch_config_head;
typedef CUresult cuLaunchKernelEx_t(const launch_config_head *, CUfunction, void **, void **);
typedef CUresult cuGraphLaunch_t(CUgraphExec, CUstream);
typedef cuLaunchKernel_t cuLaunchKernel_ptsz_t;
typedef cuLaunchCooperativeKernel_t cuLaunchCooperativeKernel_ptsz_t;
typedef cuLaunchKernelEx_t cuLaunchKernelEx_ptsz_t;
typedef cuGraphLaunch_t cuGraphLaunch_ptsz_t;

#define DEF_LAUNCH(n, NORM)                                                                                        \
    EMU_API CUresult n(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,  \
               unsigned sh, CUstream st, void **params, void **extra) {                                            \
        ENTER(n);                                                                                                  \
        return LAUNCH_DONE(n, REAL(n)(f, gx, gy, gz, bx, by, bz, sh, st, params, extra), NORM(st));               \
    }
#define DEF_COOP(n, NORM)                                                                                          \
    EMU_API CUresult n(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,  \
               unsigned sh, CUstream st, void **params) {                                                          \
        ENTER(n);                                                                                                  \
        return LAUNCH_DONE(n, REAL(n)(f, gx, gy, gz, bx, by, bz, sh, st, params), NORM(st));                      \
    }
#define DEF_LAUNCH_EX(n, NORM)                                                                                     \
    EMU_API CUresult n(const launch_config_head *c, CUfunction f, void **params, void **extra) {                   \
        ENTER(n);                                                                                                  \
        return LAUNCH_DONE(n, REAL(n)(c, f, params, extra), NORM(c ? c->stream : NULL));                          \
    }
#define DEF_GRAPH(n, NORM)                                                                                         \
    EMU_API CUresult n(CUgraphExec g, CUstream st) {                                                               \
        ENTER(n);                                                                                                  \
        return graph_launch(H_##n, t0_, g, st, NORM(st), REAL(n));                                                 \
    }
/* ---- copies inside CUDA graphs: paid for when the graph is launched ----
 * A host<->device copy captured into a graph (stream capture) is passed to
 * the driver as it is and noted in a side table under the graph being
 * captured into (cuStreamGetCaptureInfo); instantiating the graph gives the
 * executable graph the same list. Each launch of it then pays every noted
 * copy as a crossing of the launching stream's context channel, in order
 * with that channel's other crossings (emu_charge: pacing, toll, round
 * trip), while the bytes move inside the graph natively:
 *  - an H2D is staged by the CPU when the graph is submitted: paid before the
 *    real launch, on the calling thread, without waiting for the stream; the
 *    graph reaches the GPU only after its staging, as under CC;
 *  - a D2H lands in host memory only when the graph has run, and the CPU
 *    decrypts it: paid after the real launch, waiting for the stream to reach
 *    the end of the graph first, so cuGraphLaunch returns only once the
 *    graph's readbacks would be in host memory (asynchrony revoked).
 * An NCCL operation captured into a graph left its device-side wait in the graph (before its kernel node)
 * (collective.c), so the GPU pays it on every replay; the side table notes it
 * too, so that each launch writes its trace line again (graph replay) and an
 * account sees every replay's toll, not the capture's alone.
 * Not seen: memcpy nodes added explicitly (cuGraphAddMemcpyNode, cuGraphAddNode),
 * graphs changed by cuGraphExecUpdate or cloned; README "Known limits". */
typedef struct { int coll; int dir, mem; size_t bytes; emu_coll op; } graph_copy; /* coll: op, else a copy */
/* capture: the id of the capture that noted the copies of a CUgraph; a new capture at the same
 * address (a freed graph's handle reused, a failed capture's graph) starts the list anew */
typedef struct gnode { void *key; graph_copy *c; size_t n, cap; unsigned long long capture; struct gnode *next; } gnode;
static gnode *g_graphs; /* keyed by CUgraph or CUgraphExec */
static pthread_mutex_t g_graphs_mu = PTHREAD_MUTEX_INITIALIZER;

static gnode *gfind(void *key, int make) { /* g_graphs_mu held */
    gnode *n = g_graphs;
    while (n && n->key != key) n = n->next;
    if (n || !make || !(n = calloc(1, sizeof *n))) return n;
    n->key = key;
    n->next = g_graphs;
    return g_graphs = n;
}
static int gappend(gnode *n, const graph_copy *c, size_t k) { /* g_graphs_mu held */
    if (n->n + k > n->cap) {
        size_t cap = (n->n + k) * 2;
        graph_copy *m = realloc(n->c, cap * sizeof *m);
        if (!m) return -1;
        n->c = m, n->cap = cap;
    }
    memcpy(n->c + n->n, c, k * sizeof *c);
    n->n += k;
    return 0;
}
static void graph_forget(void *key) {
    pthread_mutex_lock(&g_graphs_mu);
    for (gnode **pp = &g_graphs; *pp; pp = &(*pp)->next)
        if ((*pp)->key == key) { gnode *n = *pp; *pp = n->next; free(n->c); free(n); break; }
    pthread_mutex_unlock(&g_graphs_mu);
}

typedef CUresult capture_info_v3_t(CUstream, int *, unsigned long long *, CUgraph *, const void **, const void **, size_t *);
typedef CUresult capture_info_v2_t(CUstream, int *, unsigned long long *, CUgraph *, const void **, size_t *);
static CUgraph capture_graph(CUstream st, unsigned long long *id) {
    int status = 0;
    CUgraph g = NULL;
    CUresult rc = !drv.StreamGetCaptureInfo ? CUDA_ERROR_NOT_SUPPORTED
                  : drv.capture_info_v3 ? ((capture_info_v3_t *)drv.StreamGetCaptureInfo)(st, &status, id, &g, NULL, NULL, NULL)
                                        : ((capture_info_v2_t *)drv.StreamGetCaptureInfo)(st, &status, id, &g, NULL, NULL);
    return rc == CUDA_SUCCESS && status == 1 /* CU_STREAM_CAPTURE_STATUS_ACTIVE */ ? g : NULL;
}
static void graph_add(CUstream st, const graph_copy *item) {
    unsigned long long id = 0;
    CUgraph g = capture_graph(st, &id);
    if (!g) return;
    graph_copy c = *item;
    pthread_mutex_lock(&g_graphs_mu);
    gnode *n = gfind(g, 1);
    if (n && n->capture != id) n->n = 0, n->capture = id;
    if (n) gappend(n, &c, 1);
    pthread_mutex_unlock(&g_graphs_mu);
}
static void graph_note(CUstream st, int dir, int mem, size_t bytes) {
    graph_copy c = {0, dir, mem, bytes};
    graph_add(st, &c);
}
void emu_graph_note_coll(const emu_coll *op) {
    graph_copy c = {1, -1, 0, op->bytes};
    c.op = *op;
    graph_add(op->stream, &c);
}
static CUresult graph_instantiated(CUresult rc, CUgraphExec *e, CUgraph g) {
    if (rc != CUDA_SUCCESS || !e) return rc;
    graph_forget(*e); /* a handle the driver reuses starts empty */
    pthread_mutex_lock(&g_graphs_mu);
    gnode *src = gfind(g, 0), *dst = src && src->n ? gfind(*e, 1) : NULL;
    if (dst) gappend(dst, src->c, src->n);
    pthread_mutex_unlock(&g_graphs_mu);
    return rc;
}
/* A snapshot of exec's copies (the caller frees it); 0 if none. */
static size_t graph_copies(CUgraphExec e, graph_copy **out) {
    size_t k = 0;
    pthread_mutex_lock(&g_graphs_mu);
    gnode *n = gfind(e, 0);
    if (n && n->n && (*out = malloc(n->n * sizeof **out))) memcpy(*out, n->c, (k = n->n) * sizeof **out);
    pthread_mutex_unlock(&g_graphs_mu);
    return k;
}
/* The charges are costs only: they never change what the launch returns. */
static CUresult graph_launch(int api, uint64_t t0, CUgraphExec g, CUstream raw, CUstream st, cuGraphLaunch_t *real) {
    graph_copy *c = NULL;
    int on = emu_on();
    size_t n = (on || t0) && !emu_capturing(st) ? graph_copies(g, &c) : 0;
    for (size_t i = 0; i < n && on; i++)
        if (!c[i].coll && c[i].dir == DIR_H2D) emu_charge(api, DIR_H2D, c[i].mem, c[i].bytes, st);
    if (t0 && n) t0 = emu_now(); /* the launch row starts after the H2D rows: no time counted twice */
    launch_charge lc = launch_begin(st);
    CUresult rc = launch_done(api, t0, real(g, raw), st, lc);
    uint64_t t = t0 && rc == CUDA_SUCCESS ? emu_now() : 0;
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        if (c[i].coll && t) emu_coll_replayed(&c[i].op, st, t); /* its wait is in the graph: the GPU pays it */
        else if (!c[i].coll && on && c[i].dir == DIR_D2H) emu_charge(api, DIR_D2H, c[i].mem, c[i].bytes, st);
    }
    free(c);
    return rc;
}

typedef CUresult cuGraphInstantiate_t(CUgraphExec *, CUgraph, void *, char *, size_t);
typedef cuGraphInstantiate_t cuGraphInstantiate_v2_t;
typedef CUresult cuGraphInstantiateWithFlags_t(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult cuGraphInstantiateWithParams_t(CUgraphExec *, CUgraph, void *);
typedef cuGraphInstantiateWithParams_t cuGraphInstantiateWithParams_ptsz_t;
typedef CUresult cuGraphDestroy_t(CUgraph);
typedef CUresult cuGraphExecDestroy_t(CUgraphExec);
#define DEF_INSTANTIATE_LOG(n)                                                                     \
    EMU_API CUresult n(CUgraphExec *e, CUgraph g, void *err_node, char *log, size_t len) {        \
        ENTER(n);                                                                                 \
        return graph_instantiated(REAL(n)(e, g, err_node, log, len), e, g);                       \
    }
#define DEF_INSTANTIATE_PARAMS(n)                                                                  \
    EMU_API CUresult n(CUgraphExec *e, CUgraph g, void *params) {                                 \
        ENTER(n);                                                                                 \
        return graph_instantiated(REAL(n)(e, g, params), e, g);                                   \
    }
DEF_INSTANTIATE_LOG(cuGraphInstantiate)
DEF_INSTANTIATE_LOG(cuGraphInstantiate_v2)
DEF_INSTANTIATE_PARAMS(cuGraphInstantiateWithParams)
DEF_INSTANTIATE_PARAMS(cuGraphInstantiateWithParams_ptsz)
EMU_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    ENTER(cuGraphInstantiateWithFlags);
    return graph_instantiated(REAL(cuGraphInstantiateWithFlags)(e, g, flags), e, g);
}
EMU_API CUresult cuGraphDestroy(CUgraph g) { ENTER(cuGraphDestroy); graph_forget(g); return REAL(cuGraphDestroy)(g); }
EMU_API CUresult cuGraphExecDestroy(CUgraphExec e) { ENTER(cuGraphExecDestroy); graph_forget(e); return REAL(cuGraphExecDestroy)(e); }

DEF_LAUNCH(cuLaunchKernel, AS_IS)
DEF_LAUNCH(cuLaunchKernel_ptsz, PT)
DEF_COOP(cuLaunchCooperativeKernel, AS_IS)
DEF_COOP(cuLaunchCooperativeKernel_ptsz, PT)
DEF_LAUNCH_EX(cuLaunchKernelEx, AS_IS)
DEF_LAUNCH_EX(cuLaunchKernelEx_ptsz, PT)
DEF_GRAPH(cuGraphLaunch, AS_IS)
DEF_GRAPH(cuGraphLaunch_ptsz, PT)

/* the legacy launches (still exported by CUDA 13's driver) */
typedef CUresult cuLaunch_t(CUfunction);
typedef CUresult cuLaunchGrid_t(CUfunction, int, int);
typedef CUresult cuLaunchGridAsync_t(CUfunction, int, int, CUstream);
typedef struct { CUfunction f; unsigned grid[3], block[3], shmem; CUstream stream; void **params; } launch_params;
typedef CUresult cuLaunchCooperativeKernelMultiDevice_t(launch_params *, unsigned, unsigned);
EMU_API CUresult cuLaunch(CUfunction f) { ENTER(cuLaunch); return LAUNCH_DONE(cuLaunch, REAL(cuLaunch)(f), NULL); }
EMU_API CUresult cuLaunchGrid(CUfunction f, int w, int h) { ENTER(cuLaunchGrid); return LAUNCH_DONE(cuLaunchGrid, REAL(cuLaunchGrid)(f, w, h), NULL); }
EMU_API CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream st) {
    ENTER(cuLaunchGridAsync);
    return LAUNCH_DONE(cuLaunchGridAsync, REAL(cuLaunchGridAsync)(f, w, h, st), st);
}
EMU_API CUresult cuLaunchCooperativeKernelMultiDevice(launch_params *p, unsigned n, unsigned flags) {
    ENTER(cuLaunchCooperativeKernelMultiDevice);
    return LAUNCH_DONE(cuLaunchCooperativeKernelMultiDevice, REAL(cuLaunchCooperativeKernelMultiDevice)(p, n, flags), p && n ? p->stream : NULL);
}

/* ---- host functions in a stream: a launch that makes the GPU wait for the host ----
 * Under CC the GPU's "reached the host function" notice and the host's "done,
 * go on" both cross the bridge: the stream stalls one host-GPU round trip
 * beyond the function itself. So the call pays the launch toll, and the
 * function is wrapped to spin one round trip (sync_toll) on the driver's
 * callback thread after it returns, which holds back the work queued behind
 * it exactly as long. A host function captured into a graph is passed
 * through unwrapped (the wrapper is freed after its one call). */
typedef void (*host_fn)(void *);
typedef void (*stream_cb)(CUstream, CUresult, void *);
typedef struct { host_fn fn; stream_cb cb; void *user; } host_call;
static void run_host_call(host_call *h, CUstream st, CUresult status) {
    host_call c = *h;
    free(h);
    if (c.fn) c.fn(c.user); else c.cb(st, status, c.user);
    emu_spin_for(emu_ns(cfg.sync_toll_ns));
}
static void host_fn_wrapper(void *p) { run_host_call(p, NULL, CUDA_SUCCESS); }
static void stream_cb_wrapper(CUstream st, CUresult status, void *p) { run_host_call(p, st, status); }
/* A wrapper for this call, or NULL to pass the caller's function through. */
static host_call *host_call_new(host_fn fn, stream_cb cb, void *user, CUstream st) {
    if (!emu_on() || emu_capturing(st)) return NULL;
    host_call *h = malloc(sizeof *h);
    if (h) *h = (host_call){fn, cb, user};
    return h;
}
static CUresult host_call_done(int api, uint64_t t0, CUresult rc, host_call *h, CUstream st, launch_charge c) {
    if (rc != CUDA_SUCCESS) free(h); /* never enqueued: never called */
    return launch_done(api, t0, rc, st, c);
}
typedef CUresult cuLaunchHostFunc_t(CUstream, host_fn, void *);
typedef CUresult cuStreamAddCallback_t(CUstream, stream_cb, void *, unsigned);
typedef cuLaunchHostFunc_t cuLaunchHostFunc_ptsz_t;
typedef cuStreamAddCallback_t cuStreamAddCallback_ptsz_t;
#define DEF_HOST_FUNC(n, NORM)                                                                   \
    EMU_API CUresult n(CUstream st, host_fn fn, void *user) {                                   \
        ENTER(n);                                                                               \
        host_call *h = host_call_new(fn, NULL, user, NORM(st));                                 \
        launch_charge c_ = launch_begin(NORM(st));                                              \
        CUresult rc = h ? REAL(n)(st, host_fn_wrapper, h) : REAL(n)(st, fn, user);              \
        return host_call_done(H_##n, t0_, rc, h, NORM(st), c_);                                 \
    }
#define DEF_STREAM_CB(n, NORM)                                                                   \
    EMU_API CUresult n(CUstream st, stream_cb cb, void *user, unsigned flags) {                 \
        ENTER(n);                                                                               \
        host_call *h = host_call_new(NULL, cb, user, NORM(st));                                 \
        launch_charge c_ = launch_begin(NORM(st));                                              \
        CUresult rc = h ? REAL(n)(st, stream_cb_wrapper, h, flags) : REAL(n)(st, cb, user, flags); \
        return host_call_done(H_##n, t0_, rc, h, NORM(st), c_);                                 \
    }
DEF_HOST_FUNC(cuLaunchHostFunc, AS_IS)
DEF_HOST_FUNC(cuLaunchHostFunc_ptsz, PT)
DEF_STREAM_CB(cuStreamAddCallback, AS_IS)
DEF_STREAM_CB(cuStreamAddCallback_ptsz, PT)

/* ---- synchronization: a round trip when there is work to wait for (pace.c) ---- */
static CUresult sync_done(int api, uint64_t t0, CUresult rc, CUstream st) {
    uint64_t toll = rc == CUDA_SUCCESS ? emu_roundtrip(0) : 0;
    if (t0) rec(api, REC_SYNC, -1, 0, 0, st, t0, emu_now(), toll, rc);
    return rc;
}
#define SYNC_DONE(n, rc, st) sync_done(H_##n, t0_, rc, st)
typedef CUresult cuStreamSynchronize_t(CUstream);
typedef cuStreamSynchronize_t cuStreamSynchronize_ptsz_t;
typedef CUresult cuEventSynchronize_t(CUevent);
typedef CUresult cuCtxSynchronize_t(void);
typedef CUresult cuCtxSynchronize_v2_t(CUcontext);
EMU_API CUresult cuStreamSynchronize(CUstream s) { ENTER(cuStreamSynchronize); return SYNC_DONE(cuStreamSynchronize, REAL(cuStreamSynchronize)(s), s); }
EMU_API CUresult cuStreamSynchronize_ptsz(CUstream s) {
    ENTER(cuStreamSynchronize_ptsz);
    return SYNC_DONE(cuStreamSynchronize_ptsz, REAL(cuStreamSynchronize_ptsz)(s), PT(s));
}
EMU_API CUresult cuEventSynchronize(CUevent e) { ENTER(cuEventSynchronize); return SYNC_DONE(cuEventSynchronize, REAL(cuEventSynchronize)(e), NULL); }
EMU_API CUresult cuCtxSynchronize(void) { ENTER(cuCtxSynchronize); return SYNC_DONE(cuCtxSynchronize, REAL(cuCtxSynchronize)(), NULL); }
EMU_API CUresult cuCtxSynchronize_v2(CUcontext c) { ENTER(cuCtxSynchronize_v2); return SYNC_DONE(cuCtxSynchronize_v2, REAL(cuCtxSynchronize_v2)(c), NULL); }

/* ---- secure context lifecycle ---- */
/* A context created or destroyed, or pinned host memory allocated: its CC toll (serialized machine-wide),
 * and a trace line (kind context or alloc) so that an account of two runs can name where that time went. */
static CUresult lifecycle(int api, uint64_t t0, int kind, size_t bytes, CUresult rc, double ns) {
    uint64_t toll = 0;
    if (rc == CUDA_SUCCESS && emu_on() && ns > 0) {
        uint64_t a = emu_now();
        emu_wait_until(emu_bus_reserve(EMU_LIFECYCLE, a, emu_ns(ns)));
        toll = emu_now() - a;
    }
    if (t0) rec(api, kind, -1, 0, bytes, NULL, t0, emu_now(), toll, rc);
    return rc;
}
#define LIFECYCLE(n, rc, ns) lifecycle(H_##n, t0_, REC_CONTEXT, 0, rc, ns)
typedef CUresult cuCtxCreate_v2_t(CUcontext *, unsigned, CUdevice);
typedef CUresult cuCtxCreate_v3_t(CUcontext *, void *, int, unsigned, CUdevice);
typedef CUresult cuCtxCreate_v4_t(CUcontext *, void *, unsigned, CUdevice);
typedef CUresult cuCtxDestroy_v2_t(CUcontext);
typedef CUresult cuDevicePrimaryCtxRetain_t(CUcontext *, CUdevice);
typedef CUresult cuDevicePrimaryCtxRelease_v2_t(CUdevice);
typedef cuDevicePrimaryCtxRelease_v2_t cuDevicePrimaryCtxReset_v2_t;
typedef cuDevicePrimaryCtxRelease_v2_t cuDevicePrimaryCtxRelease_t; /* the pre-11.0 names: same call */
typedef cuDevicePrimaryCtxRelease_v2_t cuDevicePrimaryCtxReset_t;
EMU_API CUresult cuCtxCreate_v2(CUcontext *c, unsigned f, CUdevice d) {
    ENTER(cuCtxCreate_v2);
    return LIFECYCLE(cuCtxCreate_v2, REAL(cuCtxCreate_v2)(c, f, d), cfg.ctx_create_ns);
}
EMU_API CUresult cuCtxCreate_v3(CUcontext *c, void *p, int n, unsigned f, CUdevice d) {
    ENTER(cuCtxCreate_v3);
    return LIFECYCLE(cuCtxCreate_v3, REAL(cuCtxCreate_v3)(c, p, n, f, d), cfg.ctx_create_ns);
}
EMU_API CUresult cuCtxCreate_v4(CUcontext *c, void *p, unsigned f, CUdevice d) {
    ENTER(cuCtxCreate_v4);
    return LIFECYCLE(cuCtxCreate_v4, REAL(cuCtxCreate_v4)(c, p, f, d), cfg.ctx_create_ns);
}
EMU_API CUresult cuCtxDestroy_v2(CUcontext c) {
    ENTER(cuCtxDestroy_v2);
    emu_channel_forget(c);
    emu_spin_forget(c);
    return LIFECYCLE(cuCtxDestroy_v2, REAL(cuCtxDestroy_v2)(c), cfg.ctx_destroy_ns);
}

#define MAX_DEV 64
static CUcontext g_primary[MAX_DEV];
static int primary_active(CUdevice d) {
    unsigned flags;
    int active = 0;
    return drv.DevicePrimaryCtxGetState(d, &flags, &active) == CUDA_SUCCESS && active;
}
EMU_API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    ENTER(cuDevicePrimaryCtxRetain);
    int was = primary_active(d);
    CUresult rc = REAL(cuDevicePrimaryCtxRetain)(c, d);
    if (rc == CUDA_SUCCESS && d >= 0 && d < MAX_DEV) g_primary[d] = *c;
    return LIFECYCLE(cuDevicePrimaryCtxRetain, rc, was ? 0 : cfg.ctx_create_ns);
}
static CUresult primary_down(int api, uint64_t t0, CUresult rc, CUdevice d) {
    int gone = rc == CUDA_SUCCESS && !primary_active(d);
    if (gone && d >= 0 && d < MAX_DEV && g_primary[d]) emu_channel_forget(g_primary[d]), emu_spin_forget(g_primary[d]);
    return lifecycle(api, t0, REC_CONTEXT, 0, rc, gone ? cfg.ctx_destroy_ns : 0);
}
#define PRIMARY_DOWN(n, d) primary_down(H_##n, t0_, REAL(n)(d), d)
EMU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { ENTER(cuDevicePrimaryCtxRelease_v2); return PRIMARY_DOWN(cuDevicePrimaryCtxRelease_v2, d); }
EMU_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { ENTER(cuDevicePrimaryCtxReset_v2); return PRIMARY_DOWN(cuDevicePrimaryCtxReset_v2, d); }
EMU_API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { ENTER(cuDevicePrimaryCtxRelease); return PRIMARY_DOWN(cuDevicePrimaryCtxRelease, d); }
EMU_API CUresult cuDevicePrimaryCtxReset(CUdevice d) { ENTER(cuDevicePrimaryCtxReset); return PRIMARY_DOWN(cuDevicePrimaryCtxReset, d); }

/* ---- host memory: no registration of ordinary memory under CC ---- */
typedef CUresult cuMemHostRegister_t(void *, size_t, unsigned);
typedef cuMemHostRegister_t cuMemHostRegister_v2_t;
typedef CUresult cuMemHostAlloc_t(void **, size_t, unsigned);
typedef CUresult cuMemAllocHost_v2_t(void **, size_t);
/* Pinning ordinary memory: an alloc line either way, so a trace shows where a program tried it (and, under
 * CC, was refused: rc 801) without a toll of its own. */
#define HOST_REGISTER(n, p, b, f)                                                                          \
    lifecycle(H_##n, t0_, REC_ALLOC, b,                                                                    \
              emu_on() && cfg.refuse_host_register ? CUDA_ERROR_NOT_SUPPORTED : REAL(n)(p, b, f), 0)
EMU_API CUresult cuMemHostRegister(void *p, size_t n, unsigned f) {
    ENTER(cuMemHostRegister);
    return HOST_REGISTER(cuMemHostRegister, p, n, f);
}
EMU_API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) {
    ENTER(cuMemHostRegister_v2);
    return HOST_REGISTER(cuMemHostRegister_v2, p, n, f);
}
EMU_API CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) {
    ENTER(cuMemHostAlloc);
    return lifecycle(H_cuMemHostAlloc, t0_, REC_ALLOC, n, REAL(cuMemHostAlloc)(p, n, f), cfg.host_alloc_toll_ns);
}
EMU_API CUresult cuMemAllocHost_v2(void **p, size_t n) {
    ENTER(cuMemAllocHost_v2);
    return lifecycle(H_cuMemAllocHost_v2, t0_, REC_ALLOC, n, REAL(cuMemAllocHost_v2)(p, n), cfg.host_alloc_toll_ns);
}

/* ---- what CC drivers answer about pinned memory ----
 * Under CC, pinned host memory reports the managed memory type (TensorRT PR #4740, vLLM PRs #50671/#57404):
 * cudaPointerGetAttributes says cudaMemoryTypeManaged for cudaMallocHost memory, torch's is_pinned() answers
 * False, and frameworks take their "not pinned" paths (a re-pin per batch; a detached copy where a live view
 * was meant). With pinned_reports_managed the program's queries get the answer a managed allocation gives
 * (is-managed 1, memory type device; the pointers themselves are the driver's); the emulator's own
 * classification keeps asking the driver (drv.PointerGetAttribute). Each such answer is a trace line (query)
 * at its call site, so advise can name the code that asks. cuMemHostGetDevicePointer stays a live view, as
 * the same reports say it is on CC hardware. */
typedef CUresult cuPointerGetAttribute_t(void *, int, CUdeviceptr);
typedef CUresult cuPointerGetAttributes_t(unsigned, int *, void **, CUdeviceptr);
static int pinned_host(CUdeviceptr p) {
    unsigned type = 0;
    return drv.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST;
}
static int managed_view(int attr, void *data) { /* 1 if it changed the answer */
    if (!data) return 0;
    if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) return *(unsigned *)data = CU_MEMORYTYPE_DEVICE, 1;
    if (attr == CU_POINTER_ATTRIBUTE_IS_MANAGED) return *(unsigned *)data = 1, 1;
    return 0;
}
static int asks_type(int attr) { return attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE || attr == CU_POINTER_ATTRIBUTE_IS_MANAGED; }
static CUresult queried(int api, uint64_t t0, CUresult rc, int changed) {
    if (changed && t0) rec(api, REC_QUERY, -1, MEM_PINNED, 0, NULL, t0, emu_now(), 0, rc);
    return rc;
}
EMU_API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    ENTER(cuPointerGetAttribute);
    CUresult rc = REAL(cuPointerGetAttribute)(data, attr, p);
    int changed = rc == CUDA_SUCCESS && emu_on() && cfg.pinned_reports_managed && asks_type(attr) && pinned_host(p) &&
                  managed_view(attr, data);
    return queried(H_cuPointerGetAttribute, t0_, rc, changed);
}
EMU_API CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    ENTER(cuPointerGetAttributes);
    CUresult rc = REAL(cuPointerGetAttributes)(n, attrs, data, p);
    int changed = 0, asks = 0;
    for (unsigned i = 0; attrs && i < n; i++) asks |= asks_type(attrs[i]);
    if (rc == CUDA_SUCCESS && asks && emu_on() && cfg.pinned_reports_managed && data && pinned_host(p))
        for (unsigned i = 0; i < n; i++) changed |= managed_view(attrs[i], data[i]);
    return queried(H_cuPointerGetAttributes, t0_, rc, changed);
}

/* ---- GPU time read from events: a trace line, so advise can name event timing under CC ----
 * Under CC, CUDA event timing is unreliable (TensorRT PR #4740: negative latencies); TensorRT-LLM and
 * FlashInfer time with %globaltimer stamps there instead. The emulator does not falsify the answer (what CC
 * hardware gets wrong is not published as a model); it notes each read and where it came from. */
typedef CUresult cuEventElapsedTime_t(float *, CUevent, CUevent);
typedef cuEventElapsedTime_t cuEventElapsedTime_v2_t;
EMU_API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    ENTER(cuEventElapsedTime);
    CUresult rc = REAL(cuEventElapsedTime)(ms, a, b);
    if (t0_) rec(H_cuEventElapsedTime, REC_TIMING, -1, 0, 0, NULL, t0_, emu_now(), 0, rc);
    return rc;
}
EMU_API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    ENTER(cuEventElapsedTime_v2);
    CUresult rc = REAL(cuEventElapsedTime_v2)(ms, a, b);
    if (t0_) rec(H_cuEventElapsedTime_v2, REC_TIMING, -1, 0, 0, NULL, t0_, emu_now(), 0, rc);
    return rc;
}

/* ---- multi-GPU: peer access, NVLink multicast ---- */
/* Peer access on: the process is multi-GPU (its launches pay the multi-GPU launch toll from now on). */
typedef CUresult cuCtxEnablePeerAccess_t(CUcontext, unsigned);
EMU_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    ENTER(cuCtxEnablePeerAccess);
    CUresult rc = REAL(cuCtxEnablePeerAccess)(peer, flags);
    if (rc == CUDA_SUCCESS || rc == 704 /* CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED */) emu_mgpu_on();
    return rc;
}
/* Under a profile without NVLS, multicast is what CC makes it: unsupported. The attribute says so (NCCL and
 * PyTorch's symmetric memory ask it before they try) and the entry points refuse without reaching the driver:
 * a multicast object can take a shared host's GPUs out of service, so an emulated run never makes one. */
#define CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED 132
static int multicast_off(void) { return emu_on() && !cfg.nvls; }
typedef CUresult cuDeviceGetAttribute_t(int *, int, CUdevice);
EMU_API CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    ENTER(cuDeviceGetAttribute);
    CUresult rc = REAL(cuDeviceGetAttribute)(v, attr, d);
    if (rc == CUDA_SUCCESS && attr == CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED && multicast_off()) *v = 0;
    return rc;
}
typedef unsigned long long cu_handle;
typedef CUresult cuMulticastCreate_t(cu_handle *, const void *);
typedef CUresult cuMulticastGetGranularity_t(size_t *, const void *, int);
typedef CUresult cuMulticastAddDevice_t(cu_handle, CUdevice);
typedef CUresult cuMulticastBindMem_t(cu_handle, size_t, cu_handle, size_t, size_t, unsigned long long);
typedef CUresult cuMulticastBindAddr_t(cu_handle, size_t, CUdeviceptr, size_t, unsigned long long);
typedef CUresult cuMulticastUnbind_t(cu_handle, CUdevice, size_t, size_t);
#define MULTICAST(n, call) do { ENTER(n); return multicast_off() ? CUDA_ERROR_NOT_SUPPORTED : REAL(n) call; } while (0)
EMU_API CUresult cuMulticastCreate(cu_handle *h, const void *p) { MULTICAST(cuMulticastCreate, (h, p)); }
EMU_API CUresult cuMulticastGetGranularity(size_t *g, const void *p, int o) { MULTICAST(cuMulticastGetGranularity, (g, p, o)); }
EMU_API CUresult cuMulticastAddDevice(cu_handle h, CUdevice d) { MULTICAST(cuMulticastAddDevice, (h, d)); }
EMU_API CUresult cuMulticastBindMem(cu_handle h, size_t o, cu_handle m, size_t mo, size_t n, unsigned long long f) {
    MULTICAST(cuMulticastBindMem, (h, o, m, mo, n, f));
}
EMU_API CUresult cuMulticastBindAddr(cu_handle h, size_t o, CUdeviceptr p, size_t n, unsigned long long f) {
    MULTICAST(cuMulticastBindAddr, (h, o, p, n, f));
}
EMU_API CUresult cuMulticastUnbind(cu_handle h, CUdevice d, size_t o, size_t n) { MULTICAST(cuMulticastUnbind, (h, d, o, n)); }

/* ---- NCCL: each operation is charged on its stream, right before its own kernel (collective.c) ---- */
typedef int ncclResult_t;
#define NCCL_INTERNAL_ERROR 3
#define NCCL_FIRST H_ncclAllReduce /* NCCL_HOOKS are the table's last rows */
#define N_NCCL (H_COUNT - NCCL_FIRST)

/* Where a name is defined other than by us: the global scope after this library, else any loaded object
 * (libnccl's first). The loaded objects' paths are collected first and opened after the walk: dlopen inside
 * dl_iterate_phdr's callback would take the loader's locks in the other order than a concurrent dlopen. */
typedef struct { char paths[32][512]; int n; } loaded;
static int collect(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    loaded *l = arg;
    if (info->dlpi_name && info->dlpi_name[0] && l->n < 32) snprintf(l->paths[l->n++], 512, "%s", info->dlpi_name);
    return 0;
}
static void *in_object(const char *path, const char *name, void *self) {
    void *h = path && path[0] ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    void *p = h ? real_dlsym(h, name) : NULL;
    if (h) dlclose(h);
    return p == self ? NULL : p;
}
static void *defined_elsewhere(const char *name, void *self) {
    void *p = real_dlsym(RTLD_NEXT, name);
    if (p && p != self) return p;
    static loaded l; /* (static: 16 KiB is too much for a caller's stack) */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    l.n = 0;
    dl_iterate_phdr(collect, &l);
    p = NULL;
    for (int pass = 0; pass < 2 && !p; pass++)
        for (int i = 0; i < l.n && !p; i++) {
            const char *base = strrchr(l.paths[i], '/');
            int is_nccl = strncmp(base ? base + 1 : l.paths[i], "libnccl", 7) == 0;
            if (is_nccl == !pass) p = in_object(l.paths[i], name, self);
        }
    pthread_mutex_unlock(&mu);
    return p;
}

/* The real entry point a call meant, resolved per call site (return address) and cached: in the caller's own
 * scope first (PyTorch's libnccl is a dependency of an extension Python loaded RTLD_LOCAL, out of the global
 * scope; a second libnccl in the process stays the caller's own); else what dlsym handed out (a program that
 * loads libnccl itself, through ctypes); else anywhere. */
#define NCCL_SITES 32
static struct { void *ret, *real; } g_nccl_site[N_NCCL][NCCL_SITES];
static int g_nccl_nsite[N_NCCL];
static pthread_mutex_t g_nccl_mu = PTHREAD_MUTEX_INITIALIZER;
static void *nccl_real(int i, void *ret) {
    int k = i - NCCL_FIRST, n = __atomic_load_n(&g_nccl_nsite[k], __ATOMIC_ACQUIRE);
    for (int j = 0; j < n; j++)
        if (g_nccl_site[k][j].ret == ret) return g_nccl_site[k][j].real;
    Dl_info info;
    void *p = ret && dladdr(ret, &info) ? in_object(info.dli_fname, kNames[i], kHooks[i]) : NULL;
    if (!p) p = __atomic_load_n(&g_real[i], __ATOMIC_RELAXED);
    if (!p) p = defined_elsewhere(kNames[i], kHooks[i]);
    if (!p) {
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "ccbridge emulator: %s called, but no loaded NCCL library defines it\n", kNames[i]);
        return NULL;
    }
    pthread_mutex_lock(&g_nccl_mu);
    if ((n = g_nccl_nsite[k]) < NCCL_SITES) {
        g_nccl_site[k][n].ret = ret, g_nccl_site[k][n].real = p;
        __atomic_store_n(&g_nccl_nsite[k], n + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_nccl_mu);
    return p;
}

#define NCCL_ENTER(n)                                                       \
    emu_init();                                                             \
    EMU_DILATE_SCOPE;                                                       \
    emu_count(H_##n);                                                       \
    const uint64_t t0_ = __atomic_load_n(&emu_tracing, __ATOMIC_RELAXED) ? emu_now() : 0; \
    n##_t *real_ = (n##_t *)nccl_real(H_##n, __builtin_return_address(0));  \
    if (!real_) return NCCL_INTERNAL_ERROR
#define NCCL_INNER(call) ({ t_in_nccl++; ncclResult_t r_ = (call); t_in_nccl--; r_; })
/* (GNU statement expression) the charge left pending, the real call (whose kernel launch queues it), the trace line */
#define NCCL_OP(n, op, count, dtype, comm, st, call)                                                             \
    ({ ncclResult_t r_;                                                                                         \
       if (t_in_nccl || !emu_coll_looks(t0_)) r_ = (call);                                                      \
       else { emu_coll c_; emu_coll_begin(&c_, H_##n, op, count, dtype, comm, (CUstream)(st), t0_, (void *)real_); \
              r_ = NCCL_INNER(call); emu_coll_end(&c_, r_); }                                                   \
       r_; })
typedef ncclResult_t ncclAllReduce_t(const void *, void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclReduceScatter_t(const void *, void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclAllGather_t(const void *, void *, size_t, int, void *, CUstream);
typedef ncclResult_t ncclBroadcast_t(const void *, void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclBcast_t(void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclReduce_t(const void *, void *, size_t, int, int, int, void *, CUstream);
typedef ncclResult_t ncclAlltoAll_t(const void *, void *, size_t, int, void *, CUstream);
typedef ncclResult_t ncclGather_t(const void *, void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclScatter_t(const void *, void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclSend_t(const void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclRecv_t(void *, size_t, int, int, void *, CUstream);
typedef ncclResult_t ncclGroupStart_t(void);
typedef ncclResult_t ncclGroupEnd_t(void);
typedef ncclResult_t ncclGroupSimulateEnd_t(void *);
/* the two shapes most operations share: (send, recv, count, type, op or root, comm, stream) and the same without
 * the op or root */
#define DEF_NCCL_X(n, OP)                                                                                          \
    EMU_API ncclResult_t n(const void *s, void *r, size_t c, int t, int x, void *comm, CUstream st) {              \
        NCCL_ENTER(n);                                                                                             \
        return NCCL_OP(n, OP, c, t, comm, st, real_(s, r, c, t, x, comm, st));                                     \
    }
#define DEF_NCCL(n, OP)                                                                                            \
    EMU_API ncclResult_t n(const void *s, void *r, size_t c, int t, void *comm, CUstream st) {                     \
        NCCL_ENTER(n);                                                                                             \
        return NCCL_OP(n, OP, c, t, comm, st, real_(s, r, c, t, comm, st));                                        \
    }
DEF_NCCL_X(ncclAllReduce, OP_ALLREDUCE)
DEF_NCCL_X(ncclReduceScatter, OP_REDUCESCATTER)
DEF_NCCL_X(ncclBroadcast, OP_BROADCAST)
DEF_NCCL_X(ncclGather, OP_GATHER)
DEF_NCCL_X(ncclScatter, OP_GATHER) /* (the same wire bytes per rank as a gather) */
DEF_NCCL(ncclAllGather, OP_ALLGATHER)
DEF_NCCL(ncclAlltoAll, OP_ALLTOALL)
EMU_API ncclResult_t ncclBcast(void *b, size_t n, int t, int root, void *comm, CUstream st) {
    NCCL_ENTER(ncclBcast);
    return NCCL_OP(ncclBcast, OP_BROADCAST, n, t, comm, st, real_(b, n, t, root, comm, st));
}
EMU_API ncclResult_t ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, void *comm, CUstream st) {
    NCCL_ENTER(ncclReduce);
    return NCCL_OP(ncclReduce, OP_REDUCE, n, t, comm, st, real_(s, r, n, t, op, root, comm, st));
}
EMU_API ncclResult_t ncclSend(const void *s, size_t n, int t, int peer, void *comm, CUstream st) {
    NCCL_ENTER(ncclSend);
    return NCCL_OP(ncclSend, OP_SEND, n, t, comm, st, real_(s, n, t, peer, comm, st));
}
EMU_API ncclResult_t ncclRecv(void *r, size_t n, int t, int peer, void *comm, CUstream st) {
    NCCL_ENTER(ncclRecv);
    return NCCL_OP(ncclRecv, OP_RECV, n, t, comm, st, real_(r, n, t, peer, comm, st));
}
EMU_API ncclResult_t ncclGroupStart(void) {
    NCCL_ENTER(ncclGroupStart);
    (void)t0_;
    if (t_in_nccl) return real_();
    ncclResult_t rc = real_();
    if (rc == 0) emu_group_start();
    return rc;
}
/* the group's charges are queued as NCCL launches the group's work, inside the real call; what no launch took, after */
EMU_API ncclResult_t ncclGroupEnd(void) {
    NCCL_ENTER(ncclGroupEnd);
    (void)t0_;
    if (t_in_nccl) return real_();
    emu_group_end();
    ncclResult_t rc = NCCL_INNER(real_());
    emu_coll_settle();
    return rc;
}
/* a simulated group (a cost estimate: PyTorch's collective time estimator) runs nothing: nothing is charged */
EMU_API ncclResult_t ncclGroupSimulateEnd(void *info) {
    NCCL_ENTER(ncclGroupSimulateEnd);
    (void)t0_;
    if (t_in_nccl) return real_(info);
    emu_group_drop();
    return NCCL_INNER(real_(info));
}

_Static_assert(H_COUNT <= 160, "trace.c counts calls of at most MAX_API hook rows");

static void *kHooks[H_COUNT] = {
#define X(n) (void *)n,
    HOOKS(X)
#undef X
};
