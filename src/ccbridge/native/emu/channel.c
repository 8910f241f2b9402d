/*
 * The per-context secure channel: how one crossing (a host<->device copy)
 * goes over the emulated bridge.
 *
 *  1. Order: crossings of one context take a ticket and go one at a time, in
 *     issue order, whatever stream or thread issued them. Contexts (and so
 *     processes) have channels of their own.
 *  2. Asynchrony revoked: an event marks the copy's place in its stream. A
 *     D2H (and any blocking API) waits until the stream reaches it; an H2D
 *     waits only if work is still queued ahead of it. A D2H that moves bytes
 *     waits on the GPU: its channel copies queue behind the place, and the
 *     host waits once, for the bytes (a host wait for the place and then one
 *     for the copies cost a second wake-up and submission, ~11 us on an H200,
 *     that a native D2H does not pay). The channel's timing events say when
 *     the place was reached, for the trace and the pacing.
 *  3. The transfer: pinned memory is copied by DMA on the channel's private
 *     stream while the lanes seal the same bytes with AES-256-GCM; pageable
 *     memory goes through the driver's own pageable path (it stages through
 *     pinned buffers of its own), timed, and the lanes seal it on the host.
 *  4. Pacing: the crossing ends no sooner than its bytes over the channel's
 *     bandwidth, than its share of the machine-wide bridge, and (pageable)
 *     than its native copy's time over the published CC ratio, plus the
 *     toll. Real work that takes longer (a busy CPU) makes it longer.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

typedef struct channel {
    CUcontext ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next_ticket, serving;
    CUstream pstream;
    CUevent pos, mark, ev[2]; /* mark, ev: timed (mark: the channel stream got past a D2H's place) */
    void *scratch;         /* pinned: measure_d2h_call's copies land here */
    lanes *lanes;
    uint64_t d2h_call_ns;  /* this machine's native small async D2H, its call (0: not measured yet) */
    double pageable_ns_per_byte[2]; /* [dir] the last sustained pageable crossing's native copy (pageable_floor) */
    int idle;              /* the crossing in hand found its stream idle: no GPU-side wait, no mark */
    uint64_t released_at;  /* when the last crossing gave the channel up (ticket_done) */
    struct channel *next;
} channel;

static channel *g_channels;
static pthread_mutex_t g_channels_mu = PTHREAD_MUTEX_INITIALIZER;

int emu_host_kind(const void *p) {
    int type = 0;
    if (drv.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS &&
        type == CU_MEMORYTYPE_HOST)
        return MEM_PINNED;
    return MEM_PAGEABLE;
}

int emu_is_host(CUdeviceptr p, int *mem) {
    int type = 0;
    if (drv.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CUDA_SUCCESS) {
        *mem = MEM_PAGEABLE; /* unknown to the driver: ordinary host memory */
        return 1;
    }
    *mem = MEM_PINNED;
    return type == CU_MEMORYTYPE_HOST;
}

int emu_capturing(CUstream s) {
    int status = 0;
    if (drv.StreamIsCapturing(s, &status) != CUDA_SUCCESS) return 1; /* let the real call decide */
    return status != 0;
}

static CUresult stream_ctx(CUstream s, CUcontext *ctx) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return drv.CtxGetCurrent(ctx);
    return drv.StreamGetCtx(s, ctx);
}

/* Find or make the channel of ctx; its driver objects live in ctx. */
static channel *channel_get(CUcontext ctx, CUresult *rc) {
    pthread_mutex_lock(&g_channels_mu);
    channel *ch = g_channels;
    while (ch && ch->ctx != ctx) ch = ch->next;
    if (ch) { pthread_mutex_unlock(&g_channels_mu); return ch; }
    ch = calloc(1, sizeof *ch);
    CUcontext cur = NULL, popped;
    int pushed = 0;
    *rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (!ch) goto fail;
    ch->ctx = ctx;
    pthread_mutex_init(&ch->mu, NULL);
    pthread_cond_init(&ch->cv, NULL);
    if ((*rc = drv.CtxGetCurrent(&cur)) != CUDA_SUCCESS) goto fail;
    if (cur != ctx) {
        if ((*rc = drv.CtxPushCurrent(ctx)) != CUDA_SUCCESS) goto fail;
        pushed = 1;
    }
    if ((*rc = drv.StreamCreate(&ch->pstream, 1 /* CU_STREAM_NON_BLOCKING */)) != CUDA_SUCCESS) goto fail;
    if ((*rc = drv.EventCreate(&ch->pos, 2 /* CU_EVENT_DISABLE_TIMING */)) != CUDA_SUCCESS) goto fail;
    CUevent *timed[] = {&ch->mark, &ch->ev[0], &ch->ev[1]};
    for (int i = 0; i < 3; i++)
        if ((*rc = drv.EventCreate(timed[i], 0)) != CUDA_SUCCESS) goto fail;
    if (!(ch->lanes = emu_lanes_new(cfg.lanes))) { *rc = CUDA_ERROR_OUT_OF_MEMORY; goto fail; }
    if (pushed) drv.CtxPopCurrent(&popped);
    ch->next = g_channels;
    g_channels = ch;
    pthread_mutex_unlock(&g_channels_mu);
    return ch;
fail:
    if (pushed) drv.CtxPopCurrent(&popped);
    if (ch) emu_lanes_free(ch->lanes);
    free(ch); /* driver objects made so far die with the context */
    pthread_mutex_unlock(&g_channels_mu);
    return NULL;
}

/* A destroyed context takes its driver objects with it; drop our record. */
void emu_channel_forget(CUcontext ctx) {
    pthread_mutex_lock(&g_channels_mu);
    for (channel **pp = &g_channels; *pp; pp = &(*pp)->next) {
        if ((*pp)->ctx == ctx) {
            channel *ch = *pp;
            *pp = ch->next;
            emu_lanes_free(ch->lanes);
            free(ch);
            break;
        }
    }
    pthread_mutex_unlock(&g_channels_mu);
}

void emu_channels_reset(void) {
    pthread_mutex_lock(&g_channels_mu);
    while (g_channels) {
        channel *ch = g_channels;
        g_channels = ch->next;
        emu_lanes_free(ch->lanes);
        free(ch);
    }
    pthread_mutex_unlock(&g_channels_mu);
}

/* Returns when the channel became this crossing's: when the crossing before it gave it up. */
static uint64_t ticket_take(channel *ch) {
    pthread_mutex_lock(&ch->mu);
    uint64_t t = ch->next_ticket++;
    while (ch->serving != t) pthread_cond_wait(&ch->cv, &ch->mu);
    uint64_t freed = ch->released_at;
    pthread_mutex_unlock(&ch->mu);
    return freed;
}

static void ticket_done(channel *ch) {
    pthread_mutex_lock(&ch->mu);
    ch->released_at = emu_now();
    ch->serving++;
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
}

#define TRY(call)                         \
    do {                                  \
        if ((rc = (call)) != CUDA_SUCCESS) \
            return rc;                    \
    } while (0)
#define TRY_CIPHER(call)                     \
    do {                                     \
        if ((call) != 0) return CUDA_ERROR_UNKNOWN; \
    } while (0)

/* A D2H's first host wait: for `landed`, recorded after its first copy on the channel stream, which
 * waited on the GPU for the copy's place in the caller's stream (cross()). When the place was reached:
 * the host's wake-up less the GPU's time from ch->mark (the stream got past the place) to `landed`.
 * The wake-up is late by the host's own latency only, so the estimate is never early. */
static CUresult first_wait(channel *ch, CUevent landed, uint64_t *t_ready) {
    static int warned;
    CUresult rc = drv.EventSynchronize(landed);
    if (rc != CUDA_SUCCESS || ch->idle) return rc; /* idle: the place was reached at the call (or when the channel came free) */
    uint64_t wake = emu_now();
    float ms = 0;
    CUresult e = drv.EventElapsedTime(&ms, ch->mark, landed);
    if (e == CUDA_SUCCESS) {
        uint64_t d = emu_ns((double)ms * 1e6);
        *t_ready = d < wake ? wake - d : 0;
        return CUDA_SUCCESS;
    }
    /* the bytes are in: not the caller's error; the late estimate only moves the pacing later */
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "ccbridge emulator: cuEventElapsedTime failed (%d); a D2H's stream wait is taken to end "
                        "when its first bytes landed\n", e);
    *t_ready = wake;
    return CUDA_SUCCESS;
}

/* A pageable crossing of at least this many bytes is bandwidth-bound: its native copy's time sets the rate. Below
 * it the copy's fixed latency dominates, which the published bandwidth ratio does not scale (0.211 for a D2H put
 * a 16-byte `.cpu()` ~60 us over a pinned one's toll on an H100). The probe's SUSTAINED_BYTES, where calibrate
 * compares bandwidths with native (probe/transfer.py; a CPU test holds the two equal). */
#define SUSTAINED_BYTES (16u << 20)

/* When a pageable crossing of `bytes` may end, its native copy having run from `from` to `landed`: its bytes at
 * this host's native pageable rate times the published CC-on/CC-off ratio. The rate is the crossing's own where
 * it is sustained (which sets the channel's rate for smaller ones), else the channel's last sustained crossing's
 * (none yet: no floor). Timed crossing by crossing, so the cap follows this host's pageable path as it drifts
 * (15-30% between minutes on an H100 host, where a snapshot at the program's start let copies beat native x
 * ratio: bench/RESULTS.md, runs K and L). 0: no floor. */
static uint64_t pageable_floor(channel *ch, int dir, size_t bytes, uint64_t from, uint64_t landed) {
    if (bytes >= SUSTAINED_BYTES && landed > from) ch->pageable_ns_per_byte[dir] = (double)(landed - from) / (double)bytes;
    double per = ch->pageable_ns_per_byte[dir];
    return per > 0 ? from + emu_ns((double)bytes * per / cfg.cc_ratio[dir][MEM_PAGEABLE]) : 0;
}

/* Pageable memory: the driver's own pageable copy, timed for the floor (a pageable D2H returns once its bytes are
 * in; an H2D once they are staged, and the stream synchronize covers its DMA). The lanes seal the bytes on the host
 * after the copy, so that the copy meets the caches as a native one would (sealing first, the cipher's read warmed
 * them for it); the floor counts from the copy's start, so the seal is hidden while it takes less than the floor's
 * margin, T x (1/ratio - 1). A D2H's copy starts when its stream reaches it (the channel stream waits on the GPU,
 * as a pinned one's does). */
static CUresult pageable(channel *ch, const emu_copy *c, uint64_t *cipher, uint64_t *t_ready, uint64_t *floor_end) {
    CUresult rc;
    uint64_t t0 = emu_now();
    if (c->dir == DIR_H2D) {
        TRY(drv.MemcpyHtoDAsync(c->dev, c->host, c->bytes, ch->pstream));
        TRY(drv.StreamSynchronize(ch->pstream));
        *floor_end = pageable_floor(ch, DIR_H2D, c->bytes, t0, emu_now());
        TRY_CIPHER(emu_lanes_run(ch->lanes, c->host, NULL, c->bytes, cipher));
        return CUDA_SUCCESS;
    }
    TRY(drv.MemcpyDtoHAsync(c->host, c->dev, c->bytes, ch->pstream));
    uint64_t landed = emu_now();
    TRY(drv.EventRecord(ch->ev[0], ch->pstream));
    TRY(first_wait(ch, ch->ev[0], t_ready));
    *floor_end = pageable_floor(ch, DIR_D2H, c->bytes, *t_ready > t0 ? *t_ready : t0, landed);
    TRY_CIPHER(emu_lanes_run(ch->lanes, c->host, NULL, c->bytes, cipher));
    return CUDA_SUCCESS;
}

/* Pinned memory: DMA straight from/to the caller's buffer; the lanes seal the
 * bytes (H2D: while the DMA runs; D2H: each chunk as it lands). */
static CUresult direct(channel *ch, const emu_copy *c, uint64_t *cipher, uint64_t *t_ready) {
    CUresult rc;
    unsigned char *host = c->host;
    if (c->dir == DIR_H2D) {
        TRY(drv.MemcpyHtoDAsync(c->dev, host, c->bytes, ch->pstream));
        TRY_CIPHER(emu_lanes_run(ch->lanes, host, NULL, c->bytes, cipher));
        return drv.StreamSynchronize(ch->pstream);
    }
    const size_t C = cfg.chunk_bytes;
    size_t nchunks = (c->bytes + C - 1) / C;
    for (size_t i = 0; i < nchunks && i < 2; i++) {
        size_t off = i * C, n = c->bytes - off < C ? c->bytes - off : C;
        TRY(drv.MemcpyDtoHAsync(host + off, c->dev + off, n, ch->pstream));
        TRY(drv.EventRecord(ch->ev[i], ch->pstream));
    }
    for (size_t i = 0; i < nchunks; i++) {
        int b = (int)(i & 1);
        size_t off = i * C, n = c->bytes - off < C ? c->bytes - off : C;
        TRY(i == 0 ? first_wait(ch, ch->ev[0], t_ready) : drv.EventSynchronize(ch->ev[b]));
        size_t nx = off + 2 * C;
        if (nx < c->bytes) {
            size_t m = c->bytes - nx < C ? c->bytes - nx : C;
            TRY(drv.MemcpyDtoHAsync(host + nx, c->dev + nx, m, ch->pstream));
            TRY(drv.EventRecord(ch->ev[b], ch->pstream));
        }
        TRY_CIPHER(emu_lanes_run(ch->lanes, host + off, NULL, n, cipher));
    }
    return CUDA_SUCCESS;
}

/* A 2D/3D/batch copy, issued as the caller described it; pageable host memory is timed for the floor and sealed
 * after its copy, as pageable() does. */
static CUresult opaque_work(channel *ch, const emu_opaque *o, uint64_t *cipher, uint64_t *t_ready, uint64_t *floor_end) {
    CUresult rc;
    uint64_t t0 = emu_now();
    TRY(o->issue(o->arg, ch->pstream));
    if (o->dir == DIR_D2H) {
        uint64_t issued = emu_now(); /* (pageable: the bytes are in) */
        TRY(drv.EventRecord(ch->ev[0], ch->pstream));
        TRY(first_wait(ch, ch->ev[0], t_ready)); /* all of the copy is in */
        if (o->mem == MEM_PAGEABLE)
            *floor_end = pageable_floor(ch, DIR_D2H, o->bytes, *t_ready > t0 ? *t_ready : t0, issued);
    } else if (o->mem == MEM_PAGEABLE) {
        TRY(drv.StreamSynchronize(ch->pstream));
        *floor_end = pageable_floor(ch, DIR_H2D, o->bytes, t0, emu_now());
    }
    for (size_t i = 0; i < o->nspans; i++) TRY_CIPHER(emu_lanes_run(ch->lanes, o->spans[i].p, NULL, o->spans[i].len, cipher));
    return o->dir == DIR_D2H || o->mem == MEM_PAGEABLE ? CUDA_SUCCESS : drv.StreamSynchronize(ch->pstream);
}

typedef struct {
    int api, dir, mem, sync_call;
    size_t bytes;
    CUstream stream;
    const emu_copy *copy;
    const emu_opaque *opaque;
} crossing;

/* On an error the copies issued before it may still be reading or writing
 * the caller's memory: wait for all of them before the caller gets its
 * buffers back (a D2H's copies wait on the GPU for their stream: so does
 * this). (The lanes never outlive emu_lanes_run, error or not.) A D2H sets
 * *t_ready: when its stream reached it; a pageable crossing sets *floor_end
 * (pageable_floor). */
static CUresult transfer(channel *ch, const crossing *x, uint64_t *cipher, uint64_t *t_ready, uint64_t *floor_end) {
    if (!x->copy && !x->opaque) return CUDA_SUCCESS; /* a charge: the bytes move elsewhere (a graph's copy node) */
    CUresult rc = x->copy ? (x->mem == MEM_PINNED ? direct(ch, x->copy, cipher, t_ready)
                                                  : pageable(ch, x->copy, cipher, t_ready, floor_end))
                          : opaque_work(ch, x->opaque, cipher, t_ready, floor_end);
    if (rc != CUDA_SUCCESS) drv.StreamSynchronize(ch->pstream);
    return rc;
}

/* A native small async D2H on this machine, its call: the fastest of a few. A D2H crossing's tolls start
 * where the native copy would have returned to its caller. Natively its completion then overlaps whatever the
 * caller does until it synchronizes (through torch, the ~5 us of Python before the synchronize hide nearly all
 * of it: the synchronize waits 0.7 us longer than an empty one on an H100); under CC the call blocks for the
 * round trip, and the tolls are that round trip's cost over CC-off, the copy's own mechanics inside them.
 * (Starting them after the copy and a host wait for it, ~7.6 us, put a 32-byte `.to()` + synchronize 5-6 us
 * over its published delta, which was taken at that level: a 17 us CC-off copy is no C loop.) */
static CUresult measure_d2h_call(channel *ch, CUdeviceptr src, size_t bytes) {
    CUresult rc;
    if (!ch->scratch) TRY(drv.MemHostAlloc(&ch->scratch, 32, 1 /* CU_MEMHOSTALLOC_PORTABLE: pinned for ch->ctx too */));
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 12; i++) { /* (the first calls on a fresh stream are slower) */
        uint64_t t0 = emu_now();
        TRY(drv.MemcpyDtoHAsync(ch->scratch, src, bytes < 32 ? bytes : 32, ch->pstream));
        uint64_t d = emu_now() - t0;
        if (d < best) best = d;
        TRY(drv.EventRecord(ch->ev[0], ch->pstream));
        TRY(drv.EventSynchronize(ch->ev[0]));
    }
    ch->d2h_call_ns = best ? best : 1;
    return CUDA_SUCCESS;
}

static int nonblocking(CUstream s) {
    unsigned flags = 0;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return 0;
    return drv.StreamGetFlags(s, &flags) == CUDA_SUCCESS && (flags & 1 /* CU_STREAM_NON_BLOCKING */);
}

static CUresult cross(const crossing *x) {
    uint64_t t_enter = emu_now(), cipher = 0;
    CUcontext ctx = NULL;
    CUresult rc = stream_ctx(x->stream, &ctx);
    if (rc != CUDA_SUCCESS) return rc;
    channel *ch = channel_get(ctx, &rc);
    if (!ch) return rc;
    uint64_t freed = ticket_take(ch);
    /* (on the channel's first copy, either way: a D2H reads its source, an H2D its destination before the
     * crossing writes it, into the channel's own scratch buffer) */
    if (!ch->d2h_call_ns && x->copy && x->copy->bytes && emu_on()) {
        rc = measure_d2h_call(ch, x->copy->dev, x->copy->bytes);
        if (rc != CUDA_SUCCESS) {
            drv.StreamSynchronize(ch->pstream); /* nothing of ours left reading into the scratch buffer */
            ticket_done(ch);
            return rc;
        }
        freed = emu_now(); /* (the measuring is the emulator's, not this copy's) */
    }
    uint64_t t_lock = emu_now();
    /* Asynchrony revoked: find (and, where the law says so, wait for) the copy's place in its stream. */
    /* (a graph's H2D is staged when the graph is submitted, before anything in its stream: no place to wait for) */
    int charge_h2d = !x->copy && !x->opaque && x->dir == DIR_H2D;
    /* a D2H that moves bytes: the channel stream waits for the place on the GPU; transfer() waits on the host
     * (mark: when the channel stream got past the place) */
    int gpu_wait = x->dir == DIR_D2H && (x->copy || x->opaque);
    /* an idle non-blocking stream (everything before the copy done) is at the copy's place now: nothing to wait
     * for. Not the legacy or per-thread default stream, nor a blocking one: a copy there also waits for work
     * in other streams (the legacy stream's implicit synchronization) that the stream's own query does not see */
    ch->idle = gpu_wait && nonblocking(x->stream) && drv.StreamQuery(x->stream) == CUDA_SUCCESS;
    if (ch->idle) gpu_wait = 0;
    rc = charge_h2d || ch->idle ? CUDA_SUCCESS : drv.EventRecord(ch->pos, x->stream);
    if (rc == CUDA_SUCCESS && gpu_wait) {
        rc = drv.StreamWaitEvent(ch->pstream, ch->pos, 0);
        /* (should the mark fail, the channel stream holds a wait and no copy: nothing touches the caller's memory) */
        if (rc == CUDA_SUCCESS) rc = drv.EventRecord(ch->mark, ch->pstream);
    } else if (rc == CUDA_SUCCESS && !charge_h2d && !ch->idle) {
        int wait = x->dir == DIR_D2H || x->sync_call;
        if (!wait) {
            CUresult q = drv.EventQuery(ch->pos);
            wait = q == CUDA_ERROR_NOT_READY;
            if (q != CUDA_SUCCESS && !wait) rc = q;
        }
        if (wait && rc == CUDA_SUCCESS) rc = drv.EventSynchronize(ch->pos);
    }
    /* an idle stream was at the copy's place on entry; the copy could start once the channel was free (the
     * emulator's own work until now, finding the context, the channel and the stream's state, is no part of
     * the bridge's cost: on an H100 it put a 32-byte D2H 4-5 us over its published delta). Otherwise a
     * GPU-side wait: transfer() finds it. */
    uint64_t t_ready = ch->idle ? (freed > t_enter ? freed : t_enter) : emu_now();
    uint64_t bus_end = 0, floor_end = 0;
    if (rc == CUDA_SUCCESS) {
        rc = transfer(ch, x, &cipher, &t_ready, &floor_end);
        if (t_ready < t_lock && !ch->idle) t_ready = t_lock; /* (the place was recorded after t_lock) */
        /* the bridge is shared from when the stream reached the copy, as the channel's pacing */
        if (rc == CUDA_SUCCESS && cfg.system_gbps[x->dir] > 0)
            bus_end = emu_bus_reserve(x->dir, t_ready, emu_ns((double)x->bytes / cfg.system_gbps[x->dir]));
    }
    uint64_t toll = 0;
    if (rc == CUDA_SUCCESS) {
        double gbps = emu_chan_gbps(x->dir, x->mem);
        uint64_t end = emu_now();
        uint64_t paced = t_ready + (gbps > 0 ? emu_ns((double)x->bytes / gbps) : 0);
        if (floor_end > paced) paced = floor_end;
        toll = emu_ns(cfg.toll_ns[x->dir]);
        if (x->dir == DIR_D2H) {
            /* the tolls (the copy's and the round trip's) start where a native copy's call would have returned
             * (measure_d2h_call says why); the channel's own work until then (done by `end`) is inside them, never on top */
            uint64_t model = ch->d2h_call_ns ? t_ready + ch->d2h_call_ns : end; /* (unmeasured: as before) */
            if (paced > model) model = paced;
            if (bus_end > model) model = bus_end;
            toll += emu_roundtrip_due(1);
            emu_wait_until(model + toll > end ? model + toll : end);
        } else {
            if (paced > end) end = paced;
            if (bus_end > end) end = bus_end;
            emu_wait_until(end + toll);
            emu_work_submitted();
        }
    }
    ticket_done(ch);
    emu_record r = {x->api, x->dir, x->mem, t_enter, emu_now(), t_ready > t_lock ? t_ready - t_lock : 0, t_lock - t_enter, toll,
                    x->bytes, ctx, x->stream, REC_CROSSING, rc};
    emu_stat_add(x->dir, x->mem, x->bytes, r.t_return - r.t_enter, cipher);
    emu_trace_record(&r);
    return rc;
}

CUresult emu_cross(const emu_copy *c) {
    crossing x = {c->api, c->dir, emu_host_kind(c->host), c->sync_call, c->bytes, c->stream, c, NULL};
    return cross(&x);
}

CUresult emu_charge(int api, int dir, int mem, size_t bytes, CUstream stream) {
    crossing x = {api, dir, mem, 0, bytes, stream, NULL, NULL};
    return cross(&x);
}

CUresult emu_cross_opaque(const emu_opaque *o) {
    crossing x = {o->api, o->dir, o->mem, o->sync_call, o->bytes, o->stream, NULL, o};
    return cross(&x);
}
