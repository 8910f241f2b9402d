/*
 * Multi-GPU CC: NCCL operations on the GPU timeline, the multi-GPU mode.
 *
 * Published (bridge-law section 6): under multi-GPU CC every cross-GPU operation pays a fixed toll (+10-15 us
 * on B300, +9-13 us on H200, messages <= 1 MB), attributed to the GPU secure firmware's set-up of each
 * operation, and large transfers keep 0.89x / 0.94x of NVLink's bandwidth. Both are GPU time: the host that
 * issues an all_reduce is not held, the stream is. So the charge is a wait the GPU executes, queued right before
 * the operation's own kernel: a one-thread kernel that spins on %globaltimer. Compute on other streams overlaps
 * it as it would overlap the firmware's work; a CUDA graph that captures the operation captures the wait too, so
 * each replay pays it (collectives in graphs still move data and pay per operation).
 *
 * Where: the charge is computed as the operation is issued and left pending on the thread; NCCL's first kernel
 * launch inside the real call (the hooked launch, emu_coll_at_launch) queues it on that launch's stream, after
 * NCCL's own stream joins. Queued before the real call instead, a captured graph runs it beside NCCL's
 * graph-mixing event-record node (a branch off the previous kernel), and that node's time leaves the charge.
 * What no launch on this thread took (a one-rank operation, a copy-engine collective, a non-blocking
 * communicator's launch on NCCL's own thread, an error) is queued after the real call on the operation's stream
 * (emu_coll_settle): each charge is queued once, in one of the two places.
 *
 * A group (ncclGroupStart..ncclGroupEnd) is one operation per GPU: NCCL collects the group's tasks and launches
 * them at the outermost ncclGroupEnd as one plan per communicator (src/group.cc, src/enqueue.cc ncclLaunchPrepare
 * in NCCL 2.28), so each GPU of the group pays one toll, plus its operations' bandwidth terms, on its first
 * operation's stream (NCCL makes a GPU's streams of a group wait for each other). GPUs driven from one thread
 * (ncclCommInitAll, nccl-tests -g) work in parallel and are charged in parallel. A send and its matching recv
 * are one exchange: the send carries the bytes on the wire, the recv none (it waits for the sender's stream).
 * An operation that fails before it is queued (its rc is neither success nor in-progress) is not charged in a
 * group; outside one it is charged, as a refused launch's toll is paid.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "../common/spin_ptx.h"

static __thread int t_depth; /* this thread's nesting of NCCL groups */

/* ---- the multi-GPU mode ---- */
static int g_mgpu;
int emu_mgpu(void) { return cfg.multi_gpu || __atomic_load_n(&g_mgpu, __ATOMIC_RELAXED); }
void emu_mgpu_on(void) { __atomic_store_n(&g_mgpu, 1, __ATOMIC_RELAXED); }
void emu_mgpu_reset(void) { __atomic_store_n(&g_mgpu, 0, __ATOMIC_RELAXED); }

/* ---- sizes ---- */
size_t emu_nccl_type_size(int dtype) {
    /* ncclDataType_t (nccl.h): int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16,
     * float8e4m3, float8e5m2 */
    static const unsigned char k[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return dtype >= 0 && dtype < (int)sizeof k ? k[dtype] : 0;
}

/* What each rank puts on the links, by the ring algorithms (nccl-tests' bus bytes): the basis of the
 * bandwidth term. bytes: all_gather's send count, reduce_scatter's receive count, else the buffer. */
size_t emu_wire_bytes(int op, size_t bytes, int ranks) {
    if (ranks < 2) return 0;
    size_t n = (size_t)ranks;
    switch (op) {
    case OP_ALLREDUCE: return (size_t)((double)bytes * 2.0 * (double)(n - 1) / (double)n);
    case OP_ALLGATHER:
    case OP_REDUCESCATTER: return bytes * (n - 1);
    case OP_ALLTOALL: return bytes * (n - 1);          /* count to each other rank */
    case OP_GATHER: return bytes * (n - 1) / n;        /* gather/scatter: count per rank, one root; the mean rank's */
    case OP_BROADCAST:
    case OP_REDUCE:
    case OP_SEND: return bytes;
    default: return 0; /* OP_RECV: the peer's send carries it */
    }
}

/* The time the wire bytes take beyond this machine's own transfer: at the kept fraction of the link (emulating;
 * paused or CC off, all of it), and, projected, in dilated time at the target's link rate
 * (r x wire / (target x kept)) less what this GPU's transfer took. */
static uint64_t bandwidth_ns(size_t wire) {
    if (!wire || cfg.native_nvlink_gbps <= 0) return 0;
    double local = (double)wire / cfg.native_nvlink_gbps;
    double target = cfg.target_nvlink_gbps > 0 ? cfg.target_nvlink_gbps : cfg.native_nvlink_gbps;
    double kept = emu_on() && cfg.nvlink_kept > 0 ? cfg.nvlink_kept : 1.0;
    double want = cfg.dilation * (double)wire / (target * kept);
    return want > local ? emu_ns(want - local) : 0;
}
static uint64_t toll_ns(size_t bytes) {
    return !emu_on() || (cfg.nccl_toll_max_bytes && bytes > cfg.nccl_toll_max_bytes) ? 0 : emu_ns(cfg.nccl_toll_ns);
}
/* what charges an operation: the emulated CC costs, or, projected without them (CC off), the link's dilated time */
static int charging(void) { return emu_on() || cfg.dilation > 1; }

/* Whether an operation needs emu_coll_begin/end at all: charged, traced (t0), or inside an open group (whose
 * operations are held for its end). Else the hook is a passthrough: the real call, nothing else. */
int emu_coll_looks(uint64_t t0) { return t0 || t_depth > 0 || charging(); }

/* ---- the device-side wait ---- */
static const char kSpinPtx[] = CCB_PTX_HEADER CCB_PTX_SPIN("ccbemu_spin");

#define MAX_SPIN_CTX 64
static struct { CUcontext ctx; CUfunction fn; } g_spin[MAX_SPIN_CTX]; /* fn NULL: its load failed (not retried) */
static int g_nspin, g_next_evict;
static pthread_mutex_t g_spin_mu = PTHREAD_MUTEX_INITIALIZER;

static CUcontext ctx_of(CUstream st) {
    CUcontext ctx = NULL;
    CUresult rc = st == NULL || st == CU_STREAM_LEGACY || st == CU_STREAM_PER_THREAD ? drv.CtxGetCurrent(&ctx)
                                                                                      : drv.StreamGetCtx(st, &ctx);
    return rc == CUDA_SUCCESS ? ctx : NULL;
}

/* A context destroyed (its handle may come back for a new one): its module went with it. */
void emu_spin_forget(CUcontext ctx) {
    pthread_mutex_lock(&g_spin_mu);
    for (int i = 0; i < g_nspin; i++)
        if (g_spin[i].ctx == ctx) g_spin[i] = g_spin[--g_nspin], i--;
    pthread_mutex_unlock(&g_spin_mu);
}

static CUfunction spin_fn(CUcontext ctx) {
    CUcontext popped;
    CUfunction fn = NULL;
    if (!ctx) return NULL;
    int known = 0;
    pthread_mutex_lock(&g_spin_mu);
    for (int i = 0; i < g_nspin && !known; i++)
        if (g_spin[i].ctx == ctx) fn = g_spin[i].fn, known = 1;
    if (!known && drv.CtxPushCurrent(ctx) == CUDA_SUCCESS) {
        CUmodule mod;
        if (drv.ModuleLoadData(&mod, kSpinPtx) != CUDA_SUCCESS || drv.ModuleGetFunction(&fn, mod, "ccbemu_spin") != CUDA_SUCCESS)
            fn = NULL; /* remembered: a driver that refused the PTX once is not asked on every operation */
        drv.CtxPopCurrent(&popped);
        /* full: the slots are reused in turn (a process of more than 64 live contexts reloads) */
        int slot = g_nspin < MAX_SPIN_CTX ? g_nspin++ : g_next_evict++ % MAX_SPIN_CTX;
        g_spin[slot].ctx = ctx, g_spin[slot].fn = fn;
    }
    pthread_mutex_unlock(&g_spin_mu);
    return fn;
}

uint64_t emu_device_wait(CUstream st, uint64_t ns) {
    if (!ns) return 0;
    /* the wait kernel's own dispatch is part of the charge (a charge shorter than it queues nothing) */
    uint64_t own = emu_ns(cfg.native_kernel_ns);
    if (ns <= own) return ns;
    CUcontext ctx = ctx_of(st);
    unsigned long long arg = ns - own;
    void *params[] = {&arg};
    for (int attempt = 0; attempt < 2; attempt++) {
        CUfunction fn = spin_fn(ctx);
        if (!fn) break;
        CUresult rc = drv.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, st, params, NULL);
        if (rc == CUDA_SUCCESS) return ns;
        if (rc != 400 && rc != 201 && rc != 709) break; /* a stale module (invalid handle / context): load anew */
        emu_spin_forget(ctx);
    }
    /* No kernel (a driver that refuses the PTX): the host pays instead, which over-charges overlap; say so once. */
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "ccbridge emulator: cannot queue the collectives' device-side wait; their tolls are paid "
                        "on the host instead\n");
    emu_wait_until(emu_now() + ns);
    return ns;
}

/* ---- charges pending for the operation's own kernel ----
 * Per thread: an operation's one charge (any context: ctx NULL), or a group's one per GPU (its context). */
typedef struct { CUcontext ctx; CUstream stream; uint64_t ns; } pending;
static __thread pending *t_pend;
static __thread int t_npend, t_pcap;

/* Leave ns pending for stream st's operation (queued at once where the list cannot grow); returns ns, the charge */
static uint64_t pend(CUcontext ctx, CUstream st, uint64_t ns) {
    if (!ns) return 0;
    if (t_npend == t_pcap) {
        pending *grown = realloc(t_pend, (size_t)(t_pcap ? 2 * t_pcap : 4) * sizeof *grown);
        if (!grown) return emu_device_wait(st, ns);
        t_pend = grown, t_pcap = t_pcap ? 2 * t_pcap : 4;
    }
    t_pend[t_npend++] = (pending){ctx, st, ns};
    return ns;
}

static void take(int i, CUstream st) {
    uint64_t ns = t_pend[i].ns;
    memmove(&t_pend[i], &t_pend[i + 1], (size_t)(t_npend - i - 1) * sizeof *t_pend);
    t_npend--;
    emu_device_wait(st, ns);
}

void emu_coll_at_launch(CUstream st) {
    if (!t_npend) return;
    CUcontext ctx = NULL;
    int looked = 0;
    for (int i = 0; i < t_npend; i++) {
        if (t_pend[i].ctx) {
            if (!looked) ctx = ctx_of(st), looked = 1;
            if (t_pend[i].ctx != ctx) continue;
        }
        take(i, st);
        return;
    }
}

void emu_coll_settle(void) {
    while (t_npend) take(0, t_pend[0].stream);
}

/* ---- operations and groups ---- */
typedef int (*comm_int_fn)(void *, int *);
/* The communicator's size through the same library's ncclCommCount (real_fn: the operation's real entry, so a
 * second libnccl in the process answers for its own communicators), cached per entry point, misses too; and,
 * the first time a communicator of 2+ ranks is seen, this process's rank in it (ncclCommUserRank), which names
 * the process in a trace's summary (account pairs a job's ranks by it). */
#define MAX_LIBS 8
static struct { void *real; comm_int_fn count, rank; } g_count[MAX_LIBS];
static int g_ncount;
static pthread_mutex_t g_count_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_rank = -1, g_world;
int emu_rank(void) { return __atomic_load_n(&g_rank, __ATOMIC_RELAXED); }
int emu_world(void) { return __atomic_load_n(&g_world, __ATOMIC_RELAXED); }
static int ranks_of(void *comm, void *real_fn) {
    comm_int_fn count = NULL, rank = NULL;
    int found = 0;
    pthread_mutex_lock(&g_count_mu);
    for (int i = 0; i < g_ncount && !found; i++)
        if (g_count[i].real == real_fn) count = g_count[i].count, rank = g_count[i].rank, found = 1;
    if (!found) {
        Dl_info info;
        void *h = real_fn && dladdr(real_fn, &info) && info.dli_fname ? dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (h) count = (comm_int_fn)dlsym(h, "ncclCommCount"), rank = (comm_int_fn)dlsym(h, "ncclCommUserRank"), dlclose(h);
        if (g_ncount < MAX_LIBS) g_count[g_ncount].real = real_fn, g_count[g_ncount].count = count, g_count[g_ncount++].rank = rank;
    }
    pthread_mutex_unlock(&g_count_mu);
    int n = 0, r = -1;
    if (!(count && comm && count(comm, &n) == 0)) return 0;
    if (n > 1 && emu_world() == 0 && rank && rank(comm, &r) == 0 && r >= 0) {
        int none = 0;
        if (__atomic_compare_exchange_n(&g_world, &none, n, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            __atomic_store_n(&g_rank, r, __ATOMIC_RELAXED);
    }
    return n;
}

/* A one-rank communicator's operations cross no GPU: nothing to charge, unless the profile asks (calibration
 * on one GPU checks the charge itself there). ranks 0: not known (no ncclCommCount), charged. */
static int pays(const emu_coll *c) { return c->ranks != 1 || cfg.nccl_one_rank; }

/* NCCL's groups are per thread: this thread's nesting, and the operations its open group holds (grown on
 * demand: most threads never group, and a thread-local array would cost every thread of the program). */
/* rc of an operation that was queued: success, or in progress on a non-blocking communicator */
static int queued(int rc) { return rc == 0 || rc == 7; }

typedef struct { emu_coll c; uint64_t t_return; int rc; } held;
static __thread held *t_group;
static __thread int t_ngroup, t_cap;

static void write_line(const emu_coll *c, uint64_t t_return, int rc, int graph) {
    emu_record r = {c->api, -1, 0, c->t_enter, t_return, 0, 0, c->charged, c->bytes, NULL, c->stream,
                    REC_COLLECTIVE, rc, c->ranks, c->wire, graph, NULL};
    int *slot = ccbemu_site_slot(), now = *slot;
    *slot = c->site; /* the line names the call that issued the operation, also when its group's end writes it */
    emu_trace_record(&r);
    *slot = now;
}

/* An operation done (its group's end for a grouped one): one captured into a graph is noted under the graph, so
 * that each launch of it writes the line again (its GPU time is paid then, not now); then its line. */
static void record(const emu_coll *c, uint64_t t_return, int rc) {
    if (!c->t_enter && !charging()) return; /* neither a charge nor a line (no lookups on the program's path) */
    int captured = queued(rc) && emu_capturing(c->stream);
    if (captured) emu_graph_note_coll(c);
    if (__atomic_load_n(&emu_tracing, __ATOMIC_RELAXED) && c->t_enter)
        write_line(c, t_return, rc, captured ? GRAPH_CAPTURE : GRAPH_NONE);
}

void emu_coll_replayed(const emu_coll *c, CUstream st, uint64_t t) {
    if (!__atomic_load_n(&emu_tracing, __ATOMIC_RELAXED)) return;
    emu_coll r = *c;
    r.stream = st, r.t_enter = t;
    write_line(&r, t, 0, GRAPH_REPLAY);
}

void emu_coll_begin(emu_coll *c, int api, int op, size_t count, int dtype, void *comm, CUstream st, uint64_t t0,
                    void *real_fn) {
    size_t size = emu_nccl_type_size(dtype);
    memset(c, 0, sizeof *c);
    if (!charging() && !t0) return; /* neither a charge nor a line: no lookups on the program's path */
    c->api = api, c->op = op, c->stream = st, c->t_enter = t0, c->site = *ccbemu_site_slot();
    c->ctx = t_depth > 0 ? ctx_of(st) : NULL;
    c->bytes = size && count <= SIZE_MAX / size ? count * size : 0;
    c->ranks = ranks_of(comm, real_fn);
    c->wire = emu_wire_bytes(op, c->bytes, c->ranks);
    if (c->ranks > 1) emu_mgpu_on();
    if (t_depth > 0 || !charging() || !pays(c)) return; /* grouped: charged at the group's end */
    c->charged = pend(NULL, st, toll_ns(c->bytes) + bandwidth_ns(c->wire));
    if (!emu_capturing(st)) emu_work_submitted();
}

void emu_coll_end(emu_coll *c, int rc) {
    emu_coll_settle(); /* (inside the call's line, as a wait queued before the call was) */
    uint64_t t1 = c->t_enter ? emu_now() : 0;
    if (t_depth > 0) {
        if (t_ngroup == t_cap) {
            held *grown = realloc(t_group, (size_t)(t_cap ? 2 * t_cap : 16) * sizeof *grown);
            if (!grown) return; /* out of memory: this operation goes uncharged and unrecorded */
            t_group = grown, t_cap = t_cap ? 2 * t_cap : 16;
        }
        t_group[t_ngroup++] = (held){*c, t1, rc};
        return;
    }
    record(c, t1, rc);
}

void emu_group_start(void) { t_depth++; }


/* a held operation that the group's charge covers: queued, on a communicator that pays */
static int charged_in_group(int i) { return queued(t_group[i].rc) && pays(&t_group[i].c); }

void emu_group_end(void) {
    if (t_depth == 0 || --t_depth > 0) return; /* an unmatched end is NCCL's to refuse; an inner one waits */
    if (charging()) {
        /* one charge per GPU (context): its first operation carries the toll, each its own bandwidth term */
        for (int i = 0; i < t_ngroup; i++) {
            emu_coll *first = &t_group[i].c;
            if (!charged_in_group(i)) continue;
            int seen = 0;
            for (int j = 0; j < i && !seen; j++) seen = charged_in_group(j) && t_group[j].c.ctx == first->ctx;
            if (seen) continue;
            size_t bytes = 0;
            for (int j = i; j < t_ngroup; j++)
                if (charged_in_group(j) && t_group[j].c.ctx == first->ctx) bytes += t_group[j].c.bytes;
            uint64_t total = first->charged = toll_ns(bytes);
            for (int j = i; j < t_ngroup; j++)
                if (charged_in_group(j) && t_group[j].c.ctx == first->ctx) {
                    uint64_t b = bandwidth_ns(t_group[j].c.wire);
                    t_group[j].c.charged += b, total += b;
                }
            pend(first->ctx, first->stream, total);
            if (!emu_capturing(first->stream)) emu_work_submitted();
        }
    }
    for (int i = 0; i < t_ngroup; i++) record(&t_group[i].c, t_group[i].t_return, t_group[i].rc);
    t_ngroup = 0;
}

void emu_group_drop(void) {
    if (t_depth > 0 && --t_depth == 0) t_ngroup = 0;
}
