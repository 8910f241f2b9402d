/*
 * The CUDA driver as the native core sees it: a table of the entry points it
 * uses, resolved from libcuda.so.1 at run time (so the package builds and
 * installs without CUDA), and one error convention: every entry point returns
 * 0, or -1 with a message in ccb_error() naming the driver call and its error.
 */
#ifndef CCB_CUDRV_H
#define CCB_CUDRV_H
#define _GNU_SOURCE
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUevent, *CUfunction, *CUmodule, *CUgraph, *CUgraphExec;
typedef unsigned long long CUdeviceptr;


/* One table of the driver functions we use, resolved once by ccb_open(). */
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
} ccb_driver;
extern ccb_driver cu;

/* The library is built with hidden visibility: what Python calls through
 * ctypes (ccbridge/native.py, load/engine.py, secure/gcm.py), and only that,
 * is exported, marked at its definition. */
#define CCB_API __attribute__((visibility("default")))

#define CCB_ERR_LEN 512
extern __thread char g_err[CCB_ERR_LEN];

void set_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cu_fail(CUresult rc, const char *what);
int ccb_open(void);
double ccb_now_ns(void);

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
