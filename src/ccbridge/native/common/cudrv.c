/* The driver table and the error convention of the native core (cudrv.h); nothing here is exported. */
#include "cudrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

ccb_driver cu;
static int g_opened;
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;

/* what is the call's source text, e.g. "cu.DeviceGet(&dev, 0)": report it as cuDeviceGet. */
int cu_fail(CUresult rc, const char *what) {
    const char *name = "unknown error";
    if (cu.GetErrorName) cu.GetErrorName(rc, &name);
    int len = (int)strcspn(what, "(");
    if (strncmp(what, "cu.", 3) == 0) set_err("cu%.*s failed: %s (%d)", len - 3, what + 3, name, rc);
    else set_err("%.*s failed: %s (%d)", len, what, name, rc);
    return -1;
}



int cu_open(void) {
    pthread_mutex_lock(&g_open_lock);
    if (g_opened) {
        pthread_mutex_unlock(&g_open_lock);
        return 0;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        set_err("cannot load the CUDA driver library libcuda.so.1 (no NVIDIA driver here?): %s", dlerror());
        pthread_mutex_unlock(&g_open_lock);
        return -1;
    }
    static const struct { void **slot; const char *name; } syms[] = {
        {(void **)&cu.Init, "cuInit"},
        {(void **)&cu.GetErrorName, "cuGetErrorName"},
        {(void **)&cu.DeviceGetCount, "cuDeviceGetCount"},
        {(void **)&cu.DeviceGet, "cuDeviceGet"},
        {(void **)&cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
        {(void **)&cu.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
        {(void **)&cu.CtxCreate, "cuCtxCreate_v2"},
        {(void **)&cu.CtxDestroy, "cuCtxDestroy_v2"},
        {(void **)&cu.CtxPopCurrent, "cuCtxPopCurrent_v2"},
        {(void **)&cu.CtxSetCurrent, "cuCtxSetCurrent"},
        {(void **)&cu.CtxGetCurrent, "cuCtxGetCurrent"},
        {(void **)&cu.MemAlloc, "cuMemAlloc_v2"},
        {(void **)&cu.MemFree, "cuMemFree_v2"},
        {(void **)&cu.MemHostAlloc, "cuMemHostAlloc"},
        {(void **)&cu.MemFreeHost, "cuMemFreeHost"},
        {(void **)&cu.MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
        {(void **)&cu.MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
        {(void **)&cu.MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
        {(void **)&cu.StreamCreate, "cuStreamCreate"},
        {(void **)&cu.StreamDestroy, "cuStreamDestroy_v2"},
        {(void **)&cu.StreamSynchronize, "cuStreamSynchronize"},
        {(void **)&cu.StreamWaitEvent, "cuStreamWaitEvent"},
        {(void **)&cu.EventCreate, "cuEventCreate"},
        {(void **)&cu.EventRecord, "cuEventRecord"},
        {(void **)&cu.EventDestroy, "cuEventDestroy_v2"},
        {(void **)&cu.ModuleLoadData, "cuModuleLoadData"},
        {(void **)&cu.ModuleUnload, "cuModuleUnload"},
        {(void **)&cu.ModuleGetFunction, "cuModuleGetFunction"},
        {(void **)&cu.FuncSetAttribute, "cuFuncSetAttribute"},
        {(void **)&cu.LaunchKernel, "cuLaunchKernel"},
        {(void **)&cu.StreamBeginCapture, "cuStreamBeginCapture_v2"},
        {(void **)&cu.StreamEndCapture, "cuStreamEndCapture"},
        {(void **)&cu.GraphInstantiate, "cuGraphInstantiateWithFlags"},
        {(void **)&cu.GraphLaunch, "cuGraphLaunch"},
        {(void **)&cu.GraphExecDestroy, "cuGraphExecDestroy"},
        {(void **)&cu.GraphDestroy, "cuGraphDestroy"},
        {(void **)&cu.MemcpyPeerAsync, "cuMemcpyPeerAsync"},
        {(void **)&cu.EventSynchronize, "cuEventSynchronize"},
        {(void **)&cu.CtxEnablePeerAccess, "cuCtxEnablePeerAccess"},
        {(void **)&cu.DeviceCanAccessPeer, "cuDeviceCanAccessPeer"},
        {(void **)&cu.EventElapsedTime, "cuEventElapsedTime"},
        {(void **)&cu.MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"},
        {(void **)&cu.PointerGetAttribute, "cuPointerGetAttribute"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot) {
            set_err("the CUDA driver lacks %s (driver too old?)", syms[i].name);
            pthread_mutex_unlock(&g_open_lock);
            return -1;
        }
    }
    CUresult rc = cu.Init(0);
    if (rc != 0) {
        cu_fail(rc, "cuInit(0)");
        pthread_mutex_unlock(&g_open_lock);
        return -1;
    }
    g_opened = 1;
    pthread_mutex_unlock(&g_open_lock);
    return 0;
}

