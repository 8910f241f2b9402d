/*
 * The NCCL net plugin ABI this plugin exports, declared from NCCL's
 * documentation (ext-net/README.md, "API (v11)", and the per-version struct
 * descriptions under ext-net/example/nccl/ in NCCL 2.27/2.28): NCCL dlopens
 * libnccl-net-${NCCL_NET_PLUGIN}.so and dlsyms "ncclNetPlugin_v11" (NCCL
 * 2.28), then "ncclNetPlugin_v10" (NCCL 2.27, and 2.28 as a fallback), newest
 * first. Field order, types and function signatures must match NCCL's
 * exactly; tests/test_ncclnet_cpu.py checks the offsets it relies on, and
 * tests/test_bindings_twin.py holds ccbridge/bindings/ncclnet.py to this.
 */
#ifndef CCB_NCCLNET_H
#define CCB_NCCLNET_H

#include <stddef.h>
#include <stdint.h>

/* Result codes (README "Error codes"). */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,     /* a socket, OS or crypto failure: every wire fault */
    ncclInternalError = 3,   /* NCCL used the plugin wrongly */
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,    /* the user's configuration (a missing or weak key) */
    ncclRemoteError = 6,     /* the peer went away */
} ncclResult_t;

/* Logging: NCCL hands init a printf-like logger. */
typedef enum { NCCL_LOG_NONE = 0, NCCL_LOG_VERSION = 1, NCCL_LOG_WARN = 2, NCCL_LOG_INFO = 3,
               NCCL_LOG_ABORT = 4, NCCL_LOG_TRACE = 5 } ncclDebugLogLevel;
#define NCCL_INIT 1
#define NCCL_NET 16
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file,
                                  int line, const char *fmt, ...);
/* Profiler callback (unused here, passed through init). */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *phandle, int64_t pluginId,
                                               void *extData);

#define NCCL_NET_HANDLE_MAXSIZE 128 /* the handle buffer NCCL gives listen and connect */
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MAX_REQUESTS 32    /* requests NCCL keeps in flight per comm */
#define NCCL_NET_MAX_DEVS_PER_NIC 4
#define NCCL_NET_DEVICE_INVALID_VERSION 0

typedef enum { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 } ncclNetDeviceType;

/* Device offload handle (v7 on, unchanged through v11); we never offer one. */
typedef struct {
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    void *handle;
    size_t size;
    int needsProxyProgress;
} ccbNetDeviceHandle;

/* Fused virtual NICs (v9 on): the physical devices behind one index. */
typedef struct {
    int ndevs;
    int devs[NCCL_NET_MAX_DEVS_PER_NIC];
} ccbNetVDeviceProps;

/* Per-communicator configuration (v10: passed to connect; v11: to init). */
typedef struct {
    int trafficClass;
} ccbNetCommConfig;

/* Device properties, v10 layout; v11 appends one int (maxMultiRequestSize). */
typedef struct {
    char *name;
    char *pciPath;       /* NULL: a virtual device */
    uint64_t guid;
    int ptrSupport;      /* NCCL_PTR_HOST only: NCCL stages GPU data in host memory */
    int regIsGlobal;
    int forceFlush;
    int speed;           /* Mbps */
    int port;
    float latency;       /* us */
    int maxComms;
    int maxRecvs;        /* grouped receives per irecv */
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    ccbNetVDeviceProps vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
} ccbNetProperties_v10;

typedef struct {
    ccbNetProperties_v10 v10; /* same fields, same order: a prefix of v11's struct */
    int maxMultiRequestSize;
} ccbNetProperties_v11;

/* v11 communication attributes (setNetAttr; NCCL skips a NULL setNetAttr). */
typedef struct {
    int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
} ccbNetCommAttr;
typedef struct {
    ccbNetCommAttr sendCommAttr, recvCommAttr;
    uint32_t op, algo, proto;
} ccbNetAttr;

/* The entry points every version shares from regMr on (same order in v10 and v11). */
#define CCB_NET_DATA_PATH(DEVHANDLE, VPROPS)                                                              \
    ncclResult_t (*accept)(void *listenComm, void **recvComm, DEVHANDLE **recvDevComm);                   \
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);                 \
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,   \
                                void **mhandle);                                                          \
    ncclResult_t (*deregMr)(void *comm, void *mhandle);                                                   \
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle, void *phandle,  \
                          void **request);                                                                \
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles,   \
                          void **phandles, void **request);                                               \
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles, void **request); \
    ncclResult_t (*test)(void *request, int *done, int *sizes);                                           \
    ncclResult_t (*closeSend)(void *sendComm);                                                            \
    ncclResult_t (*closeRecv)(void *recvComm);                                                            \
    ncclResult_t (*closeListen)(void *listenComm);                                                        \
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);                          \
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);                                  \
    ncclResult_t (*makeVDevice)(int *d, VPROPS *props);

/* ncclNet_v10 (NCCL 2.27): process-wide init; connect takes the comm's config. */
typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ccbNetProperties_v10 *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, ccbNetCommConfig *config, void *handle, void **sendComm,
                            ccbNetDeviceHandle **sendDevComm);
    CCB_NET_DATA_PATH(ccbNetDeviceHandle, ccbNetVDeviceProps)
} ccbNet_v10;

/* ncclNet_v11 (NCCL 2.28): init once per communicator, returning a context
 * that listen/connect take and finalize frees; finalize is called
 * unconditionally, setNetAttr only when not NULL. */
typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, ccbNetCommConfig *config, ncclDebugLogger_t logFunction,
                         ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ccbNetProperties_v11 *props);
    ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm, ccbNetDeviceHandle **sendDevComm);
    CCB_NET_DATA_PATH(ccbNetDeviceHandle, ccbNetVDeviceProps)
    ncclResult_t (*finalize)(void *ctx);
    ncclResult_t (*setNetAttr)(void *ctx, ccbNetAttr *netAttr);
} ccbNet_v11;

#define NET_API __attribute__((visibility("default")))
NET_API extern ccbNet_v11 ncclNetPlugin_v11;
NET_API extern ccbNet_v10 ncclNetPlugin_v10;

#endif
