/*
 * The CUDA driver as the native core (core/, loader/, gcm/gcm_host.c: one
 * shared object, ccbridge._native) sees it: a table of the entry points it
 * uses, resolved from libcuda.so.1 at run time (so the package builds and
 * installs without CUDA), and one error convention: every entry point returns
 * 0, or -1 with a message in g_err (read through ccb_error(), core/core.h)
 * naming the driver call and its error.
 */
#ifndef CCB_CUDRV_H
#define CCB_CUDRV_H
#define _GNU_SOURCE
#include <stddef.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUevent, *CUfunction, *CUmodule, *CUgraph, *CUgraphExec;
typedef unsigned long long CUdeviceptr;


/* One table of the driver functions we use, resolved once by cu_open(). */
typedef struct {
    CUresult (*Init)(unsigned);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
    CUresult (*CtxDestroy)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*MemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*CtxEnablePeerAccess)(CUcontext, unsigned);
    CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
    CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
} ccb_driver;
extern ccb_driver cu;

/* The library is built with hidden visibility: what Python calls through
 * ctypes (ccbridge/bindings/: core.py, loader.py, gcm.py), and only that, is
 * exported, marked CCB_API at its declaration in its part's one header
 * (core/core.h, loader/loader.h, gcm/gcm.h). */
#define CCB_API __attribute__((visibility("default")))

#define CCB_ERR_LEN 512
extern __thread char g_err[CCB_ERR_LEN];

void set_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cu_fail(CUresult rc, const char *what);
/* Load the driver table and cuInit once (thread-safe); 0, or -1 with g_err. */
int cu_open(void);

/* CLOCK_MONOTONIC in ns: comparable across processes. */
static inline double mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Check a driver call; on failure record which call and jump to cleanup. */
#define CK(call)                                  \
    do {                                          \
        CUresult rc_ = (call);                    \
        if (rc_ != 0) {                           \
            cu_fail(rc_, #call);                  \
            goto fail;                            \
        }                                         \
    } while (0)

#endif
