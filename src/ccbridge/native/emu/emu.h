/*
 * ccbridge bridge emulator: internal interface.
 *
 * The emulator is an LD_PRELOAD library in front of the CUDA driver API. It
 * is split so that the parts that decide (channel order, blocking, tolls,
 * pacing, cipher) are exercised on CPU-only machines through a fake driver
 * backend (fake.c), and only the driver table differs on a GPU:
 *
 *   hooks.c    the one hook table; dlsym / cuGetProcAddress interposition;
 *              the exported driver-API entry points
 *   channel.c  per-context secure channel: FIFO order, revoked asynchrony,
 *              pinned DMA or the driver's pageable path, toll and pacing
 *   cipher.c   AES-256-GCM through the system libcrypto, and the lanes
 *              (threads) that share a crossing's CPU work
 *   pace.c     clocks, waits, the machine-wide bus shared by all processes
 *   config.c   the profile parameters (key=value text from the launcher)
 *   trace.c    per-crossing trace and per-hook counters
 *   coverage.c which driver entry points a program resolved, each classified
 *   fake.c     a fake driver for CPU tests
 *
 * No CUDA headers: the few types and constants used are declared here.
 */
#ifndef CCBEMU_H
#define CCBEMU_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUevent, *CUfunction, *CUgraph, *CUgraphExec, *CUarray, *CUmodule;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_ARRAY 3
#define CU_MEMORYTYPE_UNIFIED 4
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8

/* CUDA_MEMCPY2D and CUDA_MEMCPY3D as laid out in cuda.h */
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

/* ---- the driver functions the emulator itself calls (real or fake) ---- */
typedef struct {
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*StreamGetCtx)(CUstream, CUcontext *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamIsCapturing)(CUstream, int *);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamGetFlags)(CUstream, unsigned *);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
    CUresult (*DevicePrimaryCtxGetState)(CUdevice, unsigned *, int *);
    /* the device-side wait a collective's charge runs as (collective.c): a kernel loaded from PTX */
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    /* optional: cuStreamGetCaptureInfo_v3 (v3 = 1) or _v2 (v3 = 0); NULL if the driver has neither */
    void *StreamGetCaptureInfo;
    int capture_info_v3;
} emu_driver;

extern emu_driver drv;

/* ---- profile parameters (config.c) ---- */
enum { DIR_H2D = 0, DIR_D2H = 1 };
enum { MEM_PINNED = 0, MEM_PAGEABLE = 1 };

typedef struct {
    char profile[64];
    int emulate;                 /* 0: passthrough (hooks on, no costs) */
    double chan_gbps[2][2];      /* [dir][mem] per-channel bandwidth, 0 = unpaced */
    double system_gbps[2];       /* [dir] machine-wide bridge, 0 = unshared */
    double toll_ns[2];           /* [dir] fixed cost per crossing */
    double cc_ratio[2][2];       /* [dir][mem] published CC-on / CC-off bandwidth: the floor against native */
    double native_pinned_gbps[2]; /* [dir] this machine's native pinned bandwidth (launcher), 0 = unknown; a pageable
                                     crossing times its own native copy instead (channel.c, pageable_floor) */
    double launch_toll_ns;       /* added to each kernel or graph launch */
    double mgpu_launch_factor;   /* the launch toll's multiple once the process is multi-GPU (emu_mgpu) */
    int multi_gpu;               /* 1: multi-GPU CC mode from the start (the system's setting), 0: detected */
    double nccl_toll_ns;         /* per NCCL operation (a group is one), device-side, before the op */
    int nccl_one_rank;           /* 1: a one-rank communicator's operations pay too (calibration only: they cross
                                    no GPU); 0: they pay nothing */
    size_t nccl_toll_max_bytes;  /* the toll applies to operations of at most this many bytes; 0: every one */
    double nvlink_kept;          /* published CC-on / CC-off GPU-GPU bandwidth for large transfers */
    int nvls;                    /* 0: NVLink multicast off (cuMulticast* refused, the attribute says unsupported) */
    double native_nvlink_gbps;   /* this machine's GPU-GPU copy rate (launcher), 0 = unknown: no bandwidth term */
    double native_kernel_ns;     /* GPU time one more empty kernel adds to a busy stream (launcher): the device-side
                                    wait is that much shorter than its charge */
    /* Projection to a faster GPU (ccbridge run --project): time dilated by r = target / this GPU. Every emulated
     * cost is r times longer (tolls x r, bridge rates / r: applied once, at load, emu_dilate), host work between
     * hooked calls is stretched by r on its thread (emu_dilate_enter/leave), so that the GPU, left at its own
     * speed, runs r times faster than everything around it: the target's proportions. 1: no projection. */
    double dilation;
    double target_nvlink_gbps;   /* the target's GPU-GPU link rate (its datasheet); 0: this machine's */
    double sync_toll_ns;         /* one host-GPU round trip: a synchronize that waits for work, a D2H */
    double ctx_create_ns, ctx_destroy_ns;
    double host_alloc_toll_ns;   /* per pinned host allocation */
    int refuse_host_register;    /* cuMemHostRegister -> CUDA_ERROR_NOT_SUPPORTED */
    int pinned_reports_managed;  /* the program's pointer queries answer managed for pinned host memory */
    int lanes;                   /* threads sharing a crossing's CPU work (>= 1) */
    size_t chunk_bytes;          /* a pinned D2H lands in chunks of this size */
    char trace[512];             /* trace file prefix, "" = off */
    char coverage[512];          /* coverage file prefix, "" = off */
} emu_config;

extern emu_config cfg;
/* Emulation paused (ccbemu_emulate_pause; the pauses held): the hooks pass calls through, as under the
 * passthrough profile. Meant to be set between calls: a call in flight on another thread may see either state
 * for its remaining steps. */
extern int emu_paused;
static inline int emu_on(void) { return cfg.emulate && !__atomic_load_n(&emu_paused, __ATOMIC_RELAXED); }
/* Parse "key=value" lines; unknown keys or bad values -> -1 with a message. */
int emu_config_parse(emu_config *c, const char *text, char *err, size_t errlen);
void emu_config_defaults(emu_config *c);
void emu_dilate(emu_config *c);            /* scale the costs by c->dilation (once, after parsing) */
int emu_dilate_enter(void);                /* a hooked call begins: stretch this thread's host work since the last */
void emu_dilate_leave(int *unused);        /* (cleanup of the hook's scope) it returns: host work starts again */
void emu_dilate_reset(void);               /* tests: this thread starts afresh (no host work timed yet) */
/* Projecting or not is asked here, inline: without projection a hook pays a load and a branch, no calls. */
static inline int emu_dilate_begin(void) { return cfg.dilation > 1 ? emu_dilate_enter() : 0; }
static inline void emu_dilate_end(int *unused) {
    if (cfg.dilation > 1) emu_dilate_leave(unused);
}
/* every hook: host work stretched on entry and timed again from its return (a GNU cleanup runs at any return) */
#define EMU_DILATE_SCOPE __attribute__((cleanup(emu_dilate_end), unused)) int dil_ = emu_dilate_begin()

/* ---- clocks and pacing (pace.c) ---- */
uint64_t emu_now(void);                 /* CLOCK_MONOTONIC ns, shared by processes */
void emu_wait_until(uint64_t deadline);  /* sleep, then spin the last stretch */
void emu_spin_for(uint64_t ns);
/* A duration in ns computed in double (bytes over a bandwidth, a toll) as
 * whole ns: NaN or negative is 0, and it is capped at EMU_NS_MAX (casting a
 * double beyond uint64_t's range is undefined); any clock + EMU_NS_MAX fits. */
#define EMU_NS_MAX (1ull << 60)
uint64_t emu_ns(double ns);
/* Reserve `ns` of a machine-wide timeline (a direction of the bridge, or
 * EMU_LIFECYCLE), starting no sooner than `from` (a crossing's: when its
 * stream reached it, which may be past); returns the end of the reservation. */
uint64_t emu_bus_reserve(int dir, uint64_t from, uint64_t ns);
/* Context create/destroy tolls go one at a time, machine-wide: the driver's
 * resource manager serializes these calls under a global lock, and no
 * published figure says secure contexts can be made in parallel; so a pool
 * that creates 8 contexts from 8 threads pays 8 tolls, as the bridge law's
 * "8 worker contexts in 5.20 s" does. */
#define EMU_LIFECYCLE 2
void emu_bus_local(void);

/* One channel's bandwidth: the profile's, but never above this machine's
 * native bandwidth times the published CC-on/CC-off ratio, so a host whose
 * native path is slow still shows the CC tax. 0 = not paced. */
double emu_chan_gbps(int dir, int mem);
/* Host-GPU round trips under CC (sync_toll): launches and crossings mark work
 * submitted; a synchronize pays a round trip only if work was submitted since
 * the last one, and a D2H crossing always pays one (the host waits for the
 * GPU and the bytes). Returns the ns it waited; _due returns the ns owed
 * without waiting (the caller folds them into a wait of its own). */
void emu_work_submitted(void);
uint64_t emu_roundtrip(int always);
uint64_t emu_roundtrip_due(int always);

/* ---- multi-GPU: collectives on the GPU timeline (collective.c) ----
 * An NCCL operation pays, on its stream right before its own kernel, device-side time (a kernel that waits on the
 * GPU's global timer): the profile's per-operation toll plus its wire bytes x (1/nvlink_kept - 1) at this
 * machine's NVLink rate. The host is not held. A group (ncclGroupStart..End) is one operation: NCCL launches it as one
 * plan, one per GPU. An operation captured into a CUDA graph leaves its wait in the graph, so every replay pays it. */
enum { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_ALLTOALL, OP_GATHER, OP_SEND, OP_RECV };
size_t emu_nccl_type_size(int dtype);              /* ncclDataType_t -> bytes; 0: unknown */
size_t emu_wire_bytes(int op, size_t bytes, int ranks);
/* An operation about to be issued (its real call next): its charge left pending for its kernel, or noted for its
 * group's end. */
typedef struct {
    int api, op, ranks, site;
    size_t bytes, wire;
    CUstream stream;
    CUcontext ctx;        /* the stream's: a group's operations on several GPUs are charged per GPU */
    uint64_t t_enter, charged;
} emu_coll;
void emu_coll_begin(emu_coll *c, int api, int op, size_t count, int dtype, void *comm, CUstream st, uint64_t t0,
                    void *real_fn);
void emu_coll_end(emu_coll *c, int rc);  /* after the real call: its trace line, or held for the group's */
int emu_coll_looks(uint64_t t0);         /* 0: a passthrough operation (not charged, traced or grouped) */
/* A graph launch ran an operation the graph captured: its trace line (graph replay), charged as captured. */
void emu_coll_replayed(const emu_coll *c, CUstream st, uint64_t t);
void emu_graph_note_coll(const emu_coll *c); /* hooks.c: an operation captured into the graph its stream builds */
int emu_rank(void);                      /* this process's rank in its first communicator of 2+ ranks; -1: none */
int emu_world(void);                     /* that communicator's size; 0: none */
void emu_group_start(void);
void emu_group_end(void);                /* before the real ncclGroupEnd: the outermost charges its group */
/* hooks.c, a kernel launch inside a real NCCL call on this thread: a pending charge of the launch's context is
 * queued on the launch's stream, before the kernel */
void emu_coll_at_launch(CUstream st);
void emu_coll_settle(void);              /* after the real call: a charge no launch took, on its operation's stream */
void emu_group_drop(void);               /* ncclGroupSimulateEnd: the group ran nothing, nothing is charged */
void emu_spin_forget(CUcontext ctx);     /* a context gone: its wait kernel with it */
int emu_mgpu(void);                      /* multi-GPU: a communicator of 2+ ranks, peer access, or multi_gpu=1 */
void emu_mgpu_on(void);
void emu_mgpu_reset(void);               /* tests: a fresh process's state */
/* Queue ns of GPU time on stream st (a one-thread kernel spinning on %globaltimer); returns ns queued. */
uint64_t emu_device_wait(CUstream st, uint64_t ns);

/* ---- cipher and lanes (cipher.c) ---- */
int emu_cipher_load(char *err, size_t errlen);
/* AES-256-GCM seal: out gets the ciphertext (len bytes), tag 16 bytes. */
int emu_gcm_seal(const uint8_t key[32], const uint8_t iv[12], const void *in, size_t len, void *out, uint8_t tag[16]);
typedef struct lanes lanes;
lanes *emu_lanes_new(int n);
void emu_lanes_free(lanes *l);
/* Split [in, in+len) into slices over the lanes; seal each slice; copy if asked. */
int emu_lanes_run(lanes *l, const void *in, void *copy_to, size_t len, uint64_t *cipher_bytes);

/* ---- channels and crossings (channel.c) ---- */
typedef struct {
    int api;          /* hook index, for the trace */
    int dir;          /* DIR_H2D / DIR_D2H */
    void *host;
    CUdeviceptr dev;
    size_t bytes;
    CUstream stream;  /* normalized: 0 legacy, CU_STREAM_PER_THREAD, or a handle */
    int sync_call;    /* the blocking API (cuMemcpyHtoD...) */
} emu_copy;

/* Spans of host memory whose bytes an opaque copy moves (2D/3D/batch). */
typedef struct { const void *p; size_t len; } emu_span;
typedef CUresult (*emu_issue_fn)(void *arg, CUstream stream);
typedef struct {
    int api, dir, mem;
    size_t bytes;
    CUstream stream;
    int sync_call;
    const emu_span *spans;
    size_t nspans;
    emu_issue_fn issue;   /* enqueues the real copy on `stream` */
    void *arg;
} emu_opaque;

int emu_host_kind(const void *p);  /* MEM_PINNED or MEM_PAGEABLE */
int emu_is_host(CUdeviceptr p, int *mem); /* generic copies: is this a host address? */
int emu_capturing(CUstream s);
CUresult emu_cross(const emu_copy *c);
CUresult emu_cross_opaque(const emu_opaque *o);
/* A crossing's cost without its bytes (they move inside a CUDA graph): the
 * channel's order, pacing, toll and round trip; a D2H waits for its stream
 * first, an H2D does not (staged when the graph is submitted). */
CUresult emu_charge(int api, int dir, int mem, size_t bytes, CUstream stream);
void emu_channel_forget(CUcontext ctx);
void emu_channels_reset(void);

/* ---- trace and counters (trace.c) ----
 * One trace schema for record-only, emulated and real CC-on runs; Python's
 * emulate/trace.py holds the same version and columns (tests/test_trace_schema.py).
 * kind: crossing (a host<->device copy), launch (kernel, graph, host function),
 * sync (a synchronize), context (one created or destroyed), alloc (pinned host
 * memory allocated or registered, refused ones too; bytes its size); dir and
 * mem are empty but for crossings, ctx where unknown. blocked_channel_ns / blocked_stream_ns: what the emulator waited for
 * (0 when not emulating: the driver's own waits are inside t_return - t_enter).
 * collective: an NCCL operation (api its NCCL name); bytes its payload, ranks the communicator's size,
 * wire_bytes what each rank puts on the links (the ring algorithm's, nccl-tests' bus bytes), toll_ns the
 * device-side time queued on its stream ahead of it (per-operation toll + bandwidth kept); ranks and
 * wire_bytes are empty on other lines.
 * site: the calling thread's Python call site when the call was recorded (set through
 * ccbemu_site_slot by emulate/siteboot/ccbridge_sites.py; empty where none was noted). */
#define EMU_TRACE_SCHEMA 5
#define EMU_TRACE_COLUMNS \
    "t_enter_ns,t_return_ns,tid,ctx,stream,api,kind,dir,mem,bytes,blocked_channel_ns,blocked_stream_ns,toll_ns,rc,site,ranks," \
    "wire_bytes,graph"
/* mark: a point the program named (ccbemu_mark: api is its name), e.g. the steady-state window's begin and end;
 * query: a pointer-attribute query answered "managed" for pinned host memory (pinned_reports_managed);
 * timing: cuEventElapsedTime (GPU time read from events, which CC makes unreliable) */
enum { REC_CROSSING = 0, REC_LAUNCH, REC_SYNC, REC_CONTEXT, REC_ALLOC, REC_COLLECTIVE, REC_MARK, REC_QUERY, REC_TIMING };
/* graph: a collective captured into a CUDA graph (no GPU time now), or run again by a graph launch */
enum { GRAPH_NONE = 0, GRAPH_CAPTURE, GRAPH_REPLAY };
typedef struct {
    int api, dir, mem;   /* dir -1: none */
    uint64_t t_enter, t_return, blocked_stream_ns, blocked_channel_ns, toll_ns;
    size_t bytes;
    CUcontext ctx;
    CUstream stream;
    int kind;
    CUresult rc;
    int ranks;           /* collectives: the communicator's size (0: not a collective) */
    size_t wire_bytes;
    int graph;           /* GRAPH_*: collectives only */
    const char *label;   /* marks: the name, written as the api */
} emu_record;
extern int emu_tracing;  /* a trace is being written and not paused: hooks record (atomic loads and stores) */
void emu_trace_open(const char *prefix);
void emu_trace_record(const emu_record *r);
void emu_count(int api);
void emu_stat_add(int dir, int mem, size_t bytes, uint64_t blocked_ns, uint64_t cipher_bytes);
int emu_summary_json(char *buf, size_t len);
void emu_trace_close(void);
void emu_stats_reset(void);
const char *emu_api_name(int api);

/* ---- coverage (coverage.c) ---- */
#define EMU_COVERAGE_SCHEMA 1
enum { COV_HOOKED, COV_HARMLESS, COV_MISSING, COV_UNCLASSIFIED };
enum { COV_VIA_DLSYM, COV_VIA_PROC, COV_VIA_LINKED, COV_VIA_CALLED };
int emu_is_driver_name(const char *name);   /* cu + an upper-case letter */
int emu_cov_class(const char *name);
void emu_cov_seen(const char *name, int via); /* always noted (set-up may come later); written if asked */
const char *emu_cov_exact_name(void *p);    /* the exported name at exactly p (dladdr) */
int emu_coverage_json(char *buf, size_t len);
void emu_coverage_write(void);
void emu_coverage_reset(void);

/* ---- set-up (hooks.c) ---- */
void emu_init(void);
int emu_hook_index(const char *name);      /* its row in the hook table, -1 if none */
int emu_driver_has(const char *name);      /* the driver backend (libcuda or fake) defines it */
uint64_t emu_calls(int api);               /* calls counted for a hook row (trace.c) */
void emu_fail(const char *fmt, ...);  /* fatal set-up error: message and exit */

/* ---- what the library exports ----
 * It is built with hidden visibility, so that the programs it is preloaded
 * into see nothing of it but the hooked driver entry points (hooks.c, each
 * defined EMU_API), dlsym, and the API below, which ccbridge/bindings/emu.py
 * declares through ctypes (for the interposer's switches, the call-site hook
 * and the CPU tests; tests/test_bindings_twin.py holds the two to each other)
 * and tests/gpu/coverage.py calls. tests/test_native_symbols.py holds the
 * export list to this. */
#define EMU_API __attribute__((visibility("default")))
EMU_API void *dlsym(void *handle, const char *name);
EMU_API int ccbemu_test_init(const char *config_text, char *err, int errlen); /* fake driver, this config */
EMU_API void ccbemu_trace_flush(void);
EMU_API int ccbemu_trace_pause(int paused);    /* 1: hooks stop writing trace lines, 0: again; was it recording */
EMU_API int ccbemu_emulate_pause(int pause);   /* 1: hold a pause (no costs), 0: release one; was it emulating */
EMU_API int *ccbemu_site_slot(void);           /* this thread's Python call site id, -1: none */
EMU_API int ccbemu_mark(const char *name);     /* a mark line in the trace (ccbridge.mark); 1 if one was written */
EMU_API int ccbemu_waited(const char *name, uint64_t t_enter); /* a sync line from t_enter to now (marks.waited) */
EMU_API int ccbemu_summary(char *buf, int len);
EMU_API int ccbemu_coverage(char *buf, int len); /* coverage JSON, as written at exit */
EMU_API const char *ccbemu_hook_name(int i);   /* hook table row i; NULL past the end */
EMU_API void *ccbemu_lookup(const char *name);  /* the hook for a driver entry point */
/* The driver's own entry point behind a hook (NULL: not hooked or not found): for ccbridge's instruments, the
 * probe core's %globaltimer stamp, which must neither pay an emulated toll nor be traced as the program's work. */
EMU_API void *ccbemu_real(const char *name);
EMU_API int ccbemu_seal(const uint8_t *key, const uint8_t *iv, const void *in, size_t len, void *out, uint8_t *tag);
/* the fake driver (fake.c) */
EMU_API void *ccbemu_fake_alloc(size_t n, int type);
EMU_API CUstream ccbemu_fake_stream(void);
EMU_API CUcontext ccbemu_fake_ctx_new(void);
EMU_API void ccbemu_fake_set_ctx(CUcontext c);
EMU_API void ccbemu_fake_capture(CUstream s, int on);
EMU_API void *ccbemu_fake_graph(CUstream s); /* the graph s is (or was last) capturing into */
EMU_API void ccbemu_fake_fail(const char *name, int nth);
EMU_API long long ccbemu_fake_unwaited(void);
EMU_API long long ccbemu_fake_host_waits(void);
EMU_API void ccbemu_fake_copy_gbps(double gbps);
EMU_API void ccbemu_fake_query_ns(uint64_t ns);
EMU_API long long ccbemu_fake_multicast_calls(void);
EMU_API void ccbemu_fake_modules_fail(int on);
EMU_API unsigned long long ccbemu_fake_last_spin_ns(void);
void *ccbemu_fake_lookup(const char *name); /* internal: the fake's driver table */
#endif
