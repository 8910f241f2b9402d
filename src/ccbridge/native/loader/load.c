/*
 * ccbridge loader core: byte ranges of files to their final tensors.
 *
 * The bridge law says bandwidth lives in contexts and that contexts are
 * expensive to make: so a pool of worker threads, made once and prewarmed
 * (contexts created, staging buffers allocated and faulted in) before the
 * first byte is needed, serves any number of loads and is torn down by
 * whoever frees it, off the caller's critical path.
 *
 * A load is a list of items, one per tensor: a byte range of one file and
 * where it lands, in file and offset order. The chunks are never listed: each
 * file's items are cut on the grid of multiples of the chunk size (so reads
 * are page-aligned), and chunk g is one cell of one file's grid; a large
 * tensor spans several chunks and consecutive small tensors share one.
 * Workers claim chunks in order (so reads stay near-sequential), pread each
 * into one of their staging buffers and copy it out on their own stream; a
 * staging buffer is reused once the event recorded after its copies has
 * completed. Small chunks (a few MiB) keep the staging buffers in the CPU's
 * caches, so pread's writes and the DMA's reads stay off DRAM and only the
 * page cache is read from it (on a 16-core H100 host: 16 workers reached
 * 51 GB/s with 4 MiB chunks, 41 with 16 MiB).
 * Staging kinds: pinned or pageable buffers filled by pread; or none, the
 * copy reading the file's page-cache mapping as pageable memory (`mapped`:
 * under CC the CPU then encrypts straight from the page cache, one pass
 * over the bytes instead of two). Mapped chunks are checked first (map_in:
 * a read past the end of a file raises SIGBUS); a file truncated between
 * that check and the copy can still raise SIGBUS, as with any mmap-based
 * loader. (Registering the mapping for DMA instead measured
 * 3x slower than pinned staging on an H100 host and on an H200 host, where
 * the driver serialized the registrations: pinning pages costs more than
 * copying them; bench/registered_file.py.)
 * Three shapes:
 *
 *   contexts == 0  every worker on the device's primary context (the one
 *                  torch allocates in): copies go straight into the tensors.
 *   contexts > 0   workers spread over that many contexts of their own, each
 *                  with its own secure channel under CC; a chunk crosses once
 *                  into a device staging buffer of the worker's context and
 *                  its segments move to their tensors with cuMemcpyPeerAsync,
 *                  device-local copies that never cross the bridge (so many
 *                  small tensors pay one crossing's toll, not one each).
 *   device < 0     host target: chunks are read straight into their
 *                  destination; no CUDA at all.
 *
 * With contexts == 0 and pinned staging the copies are asynchronous, and
 * one thread issues all of them (the workers only read and queue their
 * filled buffers): on an H100 host 8-16 threads issuing copies into one
 * context moved 46-47 GB/s where one thread with as many streams moved 55
 * (the probe's concurrency family). Where a copy call holds its thread
 * (pageable or mapped staging, and every crossing under CC) each worker
 * issues its own, so that the calls overlap.
 *
 * A load can start before its destinations exist: the caller names how many
 * items (a prefix, in order) have their dst set at submit and publishes more
 * as it allocates them (ccb_pool_publish). A worker reads its chunk into
 * staging (and, with contexts of its own, moves it across into the device
 * staging buffer) before it waits for the chunk's items to be published, so
 * the first reads and crossings overlap the caller's allocation (a host
 * target waits first: it reads straight into the destination). A chunk is
 * copied once all its items are published (a tensor sharing its last chunk
 * with the next item waits for that item too), and publication names its
 * load: one meant for a load that ended is ignored.
 *
 * A tensor is reported done when its last chunk's copy has completed. The
 * first error stops the load; workers drain what they have in flight before
 * they go idle, so once ccb_pool_cancel() returns nothing writes to the
 * caller's memory any more. A failed or cancelled load leaves the pool as
 * it was: the next submit starts afresh. Only a failed prewarm (a context,
 * stream or buffer that could not be made) breaks the pool for good, and a
 * close (ccb_pool_close, which ccb_pool_free begins with): it ends every wait
 * on the pool and stops a prewarm still under way at each worker's next step,
 * so that a pool closed while it starts up is freed without waiting for it.
 */
#include "loader.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define SQ_CAP (CCB_MAX_WORKERS * CCB_MAX_BUFS) /* every slot queued at most once */

/* A staging slot's life: filled by its worker, copied out, retired by its worker. */
enum { SLOT_FREE, SLOT_QUEUED /* for the submitter */, SLOT_INFLIGHT /* copies issued, event recorded */,
       SLOT_DROPPED /* the load stopped before its copies were issued */ };

/* One file's part of the plan: its items and the grid cells they cover. */
typedef struct {
    size_t first_item, end_item;
    uint64_t cell0;     /* the first cell (file offset / chunk size) */
    size_t first_chunk; /* global index of its first chunk */
} file_plan;

typedef struct {
    const ccb_file *files;
    const ccb_item *items;
    int nfiles;
    size_t nitems, nchunks;
    uint64_t chunk;
    file_plan *fp;
} plan;

/* Chunk g: bytes [lo, hi) of one file, landing in items [item, end) (each clipped to the range). */
typedef struct {
    int file;
    uint64_t lo, hi;
    size_t item, end;
} chunk_ref;

typedef struct {
    ccb_pool *p;
    int id;
    CUcontext ctx;
    CUstream stream;
    void *host[CCB_MAX_BUFS];
    CUdeviceptr dstage[CCB_MAX_BUFS];
    CUevent ev[CCB_MAX_BUFS];
    int state[CCB_MAX_BUFS];        /* SLOT_*, of slot k, holding chunk inflight[k] */
    chunk_ref inflight[CCB_MAX_BUFS];
    uint64_t read_ns, copy_ns; /* added to by the worker, read by ccb_pool_stats at any time: relaxed atomics */
} worker;

struct ccb_pool {
    int device, nworkers, ncontexts, staging, nbuf;
    size_t chunk;
    CUdevice dev;
    CUcontext primary;
    CUcontext ctx[CCB_MAX_WORKERS];
    pthread_t thread[CCB_MAX_WORKERS];
    int started;
    worker w[CCB_MAX_WORKERS];

    /* the submitter (contexts == 0, pinned staging): a queue of filled slots, worker * CCB_MAX_BUFS + slot */
    int submit, sub_started, sq_stop;
    pthread_t sub;
    pthread_mutex_t sq_mu;
    pthread_cond_t sq_cv;
    unsigned sq_head, sq_tail;
    int sq[SQ_CAP];

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready, ctx_made, stop;
    int broken; /* a worker or the submitter could not prewarm: no load can run */
    int closing; /* ccb_pool_close: waits end, no load starts, the prewarm stops; written under mu */
    double t_new, prewarm_ns;

    /* the current load */
    plan pl;
    size_t next;      /* atomically claimed */
    size_t published; /* items [0, published) have their dst: written under mu, read with acquire */
    int32_t *remaining;
    int32_t *doneq;
    int dq_head, dq_tail;
    int job, busy, cancel;
    double t_submit, t_idle, bytes;

    int failed;
    int64_t err_item; /* first item of the chunk that failed, or -1 */
    char err[CCB_ERR_LEN];
};

/* First error wins; it stops the load. g_err is this thread's last message. */
static void pool_fail(ccb_pool *p, int64_t item) {
    pthread_mutex_lock(&p->mu);
    if (!p->failed) {
        __atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE); /* stopping() reads it without mu */
        p->err_item = item;
        memcpy(p->err, g_err, sizeof p->err);
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* A prewarm failure: the pool cannot serve any load. */
static void pool_break(ccb_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->broken = 1;
    pthread_mutex_unlock(&p->mu);
    pool_fail(p, -1);
}

static int is_closing(ccb_pool *p) { return __atomic_load_n(&p->closing, __ATOMIC_ACQUIRE); }

static int stopping(ccb_pool *p) {
    return __atomic_load_n(&p->failed, __ATOMIC_ACQUIRE) || __atomic_load_n(&p->cancel, __ATOMIC_ACQUIRE);
}

static void tensor_done(ccb_pool *p, int32_t t) {
    if (__atomic_sub_fetch(&p->remaining[t], 1, __ATOMIC_ACQ_REL) != 0) return;
    pthread_mutex_lock(&p->mu);
    p->doneq[p->dq_tail++] = t;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static int file_ended(uint64_t at) {
    set_err("file ended at offset %llu, before the bytes its header promises "
            "(truncated or rewritten during the load?)", (unsigned long long)at);
    return -1;
}

static int read_full(int fd, void *buf, uint64_t n, uint64_t off) {
    char *b = buf;
    while (n) {
        ssize_t r = pread(fd, b, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { set_err("read failed at offset %llu: %s", (unsigned long long)off, strerror(errno)); return -1; }
        if (r == 0) return file_ended(off);
        b += r; n -= (uint64_t)r; off += (uint64_t)r;
    }
    return 0;
}

static double now_ns(void) { return mono_ns(); }

/* Time since t into a worker's counter (ccb_pool_stats may read it during a load). */
static void add_ns(uint64_t *counter, double t) {
    double d = now_ns() - t;
    __atomic_fetch_add(counter, d > 0 ? (uint64_t)d : 0, __ATOMIC_RELAXED);
}

/* ---- the plan: chunks found from the items, never listed ---- */

/* Check the items and index them by file; count each tensor's chunks into remaining. */
static int plan_build(plan *pl, const ccb_file *files, int nfiles, const ccb_item *items, size_t nitems,
                      uint64_t chunk, int32_t *remaining, int ntensors) {
    memset(pl, 0, sizeof *pl);
    if (nfiles < 0 || chunk == 0) { set_err("bad plan: %d files, chunk %llu", nfiles, (unsigned long long)chunk); return -1; }
    if (nfiles && !(pl->fp = calloc((size_t)nfiles, sizeof *pl->fp))) { set_err("out of memory"); return -1; }
    pl->files = files; pl->items = items; pl->nfiles = nfiles; pl->nitems = nitems; pl->chunk = chunk;
    for (int t = 0; remaining && t < ntensors; t++) remaining[t] = 0;
    size_t i = 0;
    for (int f = 0; f < nfiles; f++) {
        file_plan *fp = &pl->fp[f];
        fp->first_item = i;
        fp->first_chunk = pl->nchunks;
        uint64_t end = 0;
        for (; i < nitems && items[i].file == f; i++) {
            const ccb_item *it = &items[i];
            if (it->nbytes == 0 || it->offset < end || it->offset + it->nbytes < it->offset ||
                it->tensor < 0 || it->tensor >= ntensors) {
                set_err("item %zu is malformed (file %d, offset %llu, %llu bytes, tensor %d): items must be "
                        "non-empty, in file and offset order, and not overlap", i, f,
                        (unsigned long long)it->offset, (unsigned long long)it->nbytes, it->tensor);
                return -1;
            }
            end = it->offset + it->nbytes;
            if (remaining) remaining[it->tensor] += (int32_t)((end - 1) / chunk - it->offset / chunk + 1);
        }
        fp->end_item = i;
        if (i > fp->first_item) {
            fp->cell0 = items[fp->first_item].offset / chunk;
            pl->nchunks += (size_t)((end - 1) / chunk - fp->cell0 + 1);
        }
    }
    if (i != nitems) {
        set_err("item %zu names file %d: items must be in file order, files 0..%d", i, items[i].file, nfiles - 1);
        return -1;
    }
    return 0;
}

static void plan_free(plan *pl) {
    free(pl->fp);
    pl->fp = NULL;
}

/* Chunk g of the plan; 0 when it holds no bytes (a gap between items). */
static int chunk_at(const plan *pl, size_t g, chunk_ref *c) {
    int lo_f = 0, hi_f = pl->nfiles - 1; /* the last file whose first chunk is <= g */
    while (lo_f < hi_f) {
        int mid = (lo_f + hi_f + 1) / 2;
        if (pl->fp[mid].first_chunk <= g) lo_f = mid; else hi_f = mid - 1;
    }
    const file_plan *fp = &pl->fp[lo_f];
    uint64_t cell_lo = (fp->cell0 + (g - fp->first_chunk)) * pl->chunk, cell_hi = cell_lo + pl->chunk;
    size_t a = fp->first_item, b = fp->end_item; /* the first item that ends after cell_lo */
    while (a < b) {
        size_t mid = a + (b - a) / 2;
        if (pl->items[mid].offset + pl->items[mid].nbytes <= cell_lo) a = mid + 1; else b = mid;
    }
    if (a == fp->end_item || pl->items[a].offset >= cell_hi) return 0;
    size_t e = a;
    while (e < fp->end_item && pl->items[e].offset < cell_hi) e++;
    const ccb_item *first = &pl->items[a], *last = &pl->items[e - 1];
    c->file = lo_f;
    c->lo = first->offset > cell_lo ? first->offset : cell_lo;
    c->hi = last->offset + last->nbytes < cell_hi ? last->offset + last->nbytes : cell_hi;
    c->item = a;
    c->end = e;
    return 1;
}

/* Item i's part of chunk c: file offset and length. */
static void clip(const plan *pl, const chunk_ref *c, size_t i, uint64_t *off, uint64_t *len) {
    const ccb_item *it = &pl->items[i];
    uint64_t lo = it->offset > c->lo ? it->offset : c->lo, end = it->offset + it->nbytes;
    *off = lo;
    *len = (end < c->hi ? end : c->hi) - lo;
}

/* Every segment of a plan as rows (chunk, item, file offset, length): for tests. */
long long ccb_plan_walk(const ccb_file *files, int nfiles, const ccb_item *items, size_t nitems, uint64_t chunk,
                        int ntensors, int64_t *rows, size_t max_rows) {
    plan pl;
    if (plan_build(&pl, files, nfiles, items, nitems, chunk, NULL, ntensors) != 0) { plan_free(&pl); return -1; }
    size_t n = 0;
    for (size_t g = 0; g < pl.nchunks; g++) {
        chunk_ref c;
        if (!chunk_at(&pl, g, &c)) continue;
        for (size_t i = c.item; i < c.end; i++, n++) {
            uint64_t off, len;
            clip(&pl, &c, i, &off, &len);
            if (n < max_rows) {
                int64_t *r = rows + 4 * n;
                r[0] = (int64_t)g; r[1] = (int64_t)i; r[2] = (int64_t)off; r[3] = (int64_t)len;
            }
        }
    }
    plan_free(&pl);
    return (long long)n;
}

/* ---- the workers ---- */

static void chunk_done(ccb_pool *p, const chunk_ref *c) {
    for (size_t i = c->item; i < c->end; i++) tensor_done(p, p->pl.items[i].tensor);
}

/* Slot k once the submitter has dealt with it: SLOT_FREE, SLOT_INFLIGHT or SLOT_DROPPED. */
static int settled(worker *w, int k) {
    int st;
    while ((st = __atomic_load_n(&w->state[k], __ATOMIC_ACQUIRE)) == SLOT_QUEUED) sched_yield();
    return st;
}

/* Wait for slot k's copies; their tensors may then be done. */
static int retire(worker *w, int k) {
    double t = now_ns();
    int st = settled(w, k);
    w->state[k] = SLOT_FREE;
    if (st != SLOT_INFLIGHT) return 0;
    CUresult rc = cu.EventSynchronize(w->ev[k]);
    add_ns(&w->copy_ns, t);
    if (rc != 0) { cu_fail(rc, "cuEventSynchronize"); pool_fail(w->p, (int64_t)w->inflight[k].item); return -1; }
    chunk_done(w->p, &w->inflight[k]);
    return 0;
}

/* Wait until chunk c's items have their destinations; -1 when the load stops first. Before it blocks the
 * worker retires its other slots, so that what has landed is reported while it waits (slot k is c's own). */
static int await_dst(worker *w, int k, const chunk_ref *c) {
    ccb_pool *p = w->p;
    if (__atomic_load_n(&p->published, __ATOMIC_ACQUIRE) >= c->end) return 0;
    for (int j = 0; j < p->nbuf && p->device >= 0; j++)
        if (j != k && retire(w, j) != 0) return -1;
    double t = now_ns();
    pthread_mutex_lock(&p->mu);
    while (p->published < c->end && !p->failed && !p->cancel) pthread_cond_wait(&p->cv, &p->mu);
    int ok = !p->failed && !p->cancel; /* a publish racing a cancel lands nothing more */
    pthread_mutex_unlock(&p->mu);
    add_ns(&w->copy_ns, t);
    return ok ? 0 : -1;
}

/* Host target: each segment is read straight into place. */
static int read_host(worker *w, const chunk_ref *c) {
    ccb_pool *p = w->p;
    if (await_dst(w, 0, c) != 0) return 1;
    double t = now_ns();
    int rc = 0;
    for (size_t i = c->item; i < c->end && rc == 0; i++) {
        const ccb_item *it = &p->pl.items[i];
        uint64_t off, len;
        clip(&p->pl, c, i, &off, &len);
        rc = read_full(p->pl.files[c->file].fd, (char *)(uintptr_t)it->dst + (off - it->offset), len, off);
    }
    add_ns(&w->read_ns, t);
    return rc;
}

/* Queue the copies of a chunk that sits in staging slot k (or, mapped, at src): -1 on a refused call,
 * 1 when the load stopped while the chunk's items waited for their destinations. */
static int copy_out(worker *w, int k, const chunk_ref *c, const char *src) {
    ccb_pool *p = w->p;
    double t = now_ns();
    if (p->ncontexts > 0) CK(cu.MemcpyHtoDAsync(w->dstage[k], src, c->hi - c->lo, w->stream));
    if (!p->submit) {
        add_ns(&w->copy_ns, t);
        if (await_dst(w, k, c) != 0) return 1; /* the submitter's slots were waited for when queued */
        t = now_ns();
    }
    for (size_t i = c->item; i < c->end; i++) {
        const ccb_item *it = &p->pl.items[i];
        uint64_t off, len;
        clip(&p->pl, c, i, &off, &len);
        CUdeviceptr dst = (CUdeviceptr)(it->dst + (off - it->offset));
        if (p->ncontexts == 0)
            CK(cu.MemcpyHtoDAsync(dst, src + (off - c->lo), len, w->stream));
        else
            CK(cu.MemcpyPeerAsync(dst, p->primary, w->dstage[k] + (off - c->lo), w->ctx, len, w->stream));
    }
    CK(cu.EventRecord(w->ev[k], w->stream));
    if (!p->submit) add_ns(&w->copy_ns, t); /* the worker's own copies (the submitter's are not timed) */
    return 0;
fail:
    if (!p->submit) add_ns(&w->copy_ns, t);
    return -1;
}

/* Hand a filled slot to the submitter. */
static void queue_slot(worker *w, int k) {
    ccb_pool *p = w->p;
    __atomic_store_n(&w->state[k], SLOT_QUEUED, __ATOMIC_RELEASE);
    pthread_mutex_lock(&p->sq_mu);
    p->sq[p->sq_tail++ % SQ_CAP] = w->id * CCB_MAX_BUFS + k;
    pthread_cond_signal(&p->sq_cv);
    pthread_mutex_unlock(&p->sq_mu);
}

/* Issue the copies of every queued slot, in queue order, until the pool stops. */
static void *submitter_main(void *arg) {
    ccb_pool *p = arg;
    CUresult rc = cu.CtxSetCurrent(p->primary);
    int ok = rc == 0;
    if (!ok) { cu_fail(rc, "cuCtxSetCurrent"); pool_break(p); }
    pthread_mutex_lock(&p->sq_mu);
    for (;;) {
        while (p->sq_head == p->sq_tail && !p->sq_stop) pthread_cond_wait(&p->sq_cv, &p->sq_mu);
        if (p->sq_head == p->sq_tail) break; /* stopped, and nothing left */
        int e = p->sq[p->sq_head++ % SQ_CAP];
        pthread_mutex_unlock(&p->sq_mu);
        worker *w = &p->w[e / CCB_MAX_BUFS];
        int k = e % CCB_MAX_BUFS, st = SLOT_DROPPED;
        if (ok && !stopping(p)) {
            if (copy_out(w, k, &w->inflight[k], w->host[k]) == 0) {
                st = SLOT_INFLIGHT;
            } else {
                pool_fail(p, (int64_t)w->inflight[k].item);
                cu.StreamSynchronize(w->stream); /* copies queued before the refusal */
            }
        }
        __atomic_store_n(&w->state[k], st, __ATOMIC_RELEASE);
        pthread_mutex_lock(&p->sq_mu);
    }
    pthread_mutex_unlock(&p->sq_mu);
    return NULL;
}

static size_t page_size(void) {
    static size_t page; /* atomic (relaxed): workers may race to fill it, all with the same value */
    size_t v = __atomic_load_n(&page, __ATOMIC_RELAXED);
    if (!v) {
        long n = sysconf(_SC_PAGESIZE);
        v = n > 0 ? (size_t)n : 4096;
        __atomic_store_n(&page, v, __ATOMIC_RELAXED);
    }
    return v;
}

static int g_no_populate; /* MADV_POPULATE_READ is Linux >= 5.14: EINVAL before */

/* Mapped staging: check that the chunk's bytes are still in the file before
 * the copy reads the mapping (reading past the end of a file raises SIGBUS).
 * MADV_POPULATE_READ faults the pages in and fails cleanly (EFAULT) past the
 * end. Where the kernel lacks it, fstat says whether the file still holds
 * the chunk: the same guarantee (a file truncated after the check can
 * still raise SIGBUS during the copy, as after a populate), without
 * prefaulting, which the copy then does itself. */
static int map_in(int fd, const char *src, const chunk_ref *c) {
    if (!__atomic_load_n(&g_no_populate, __ATOMIC_RELAXED)) {
        uintptr_t page = page_size(), a = (uintptr_t)src & ~(page - 1);
        uintptr_t b = ((uintptr_t)src + (c->hi - c->lo) + page - 1) & ~(page - 1);
        if (madvise((void *)a, b - a, MADV_POPULATE_READ) == 0) goto size; /* the page of the file's end passes */
        if (errno == EFAULT) return file_ended(c->lo);
        if (errno != EINVAL) {
            set_err("cannot read the file's pages at offset %llu: %s", (unsigned long long)c->lo, strerror(errno));
            return -1;
        }
        __atomic_store_n(&g_no_populate, 1, __ATOMIC_RELAXED);
    }
size:;
    struct stat st;
    if (fstat(fd, &st) != 0) { set_err("cannot stat the file: %s", strerror(errno)); return -1; }
    return (uint64_t)st.st_size < c->hi ? file_ended((uint64_t)st.st_size) : 0;
}

static void run_load(worker *w) {
    ccb_pool *p = w->p;
    int k = 0;
    while (!stopping(p)) {
        size_t g = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (g >= p->pl.nchunks) break;
        chunk_ref c;
        if (!chunk_at(&p->pl, g, &c)) continue;
        const ccb_file *f = &p->pl.files[c.file];
        double t;
        if (p->device < 0) {
            int rc = read_host(w, &c);
            if (rc > 0) break; /* stopped */
            if (rc != 0) { pool_fail(p, (int64_t)c.item); break; }
            chunk_done(p, &c);
            continue;
        }
        if (retire(w, k) != 0) break;
        t = now_ns();
        const char *src = w->host[k];
        int rc;
        if (p->staging == CCB_STAGE_MAPPED) {
            src = (const char *)(uintptr_t)(f->map + c.lo);
            rc = map_in(f->fd, src, &c);
        } else {
            rc = read_full(f->fd, w->host[k], c.hi - c.lo, c.lo);
        }
        add_ns(&w->read_ns, t);
        if (rc != 0) { pool_fail(p, (int64_t)c.item); break; }
        w->inflight[k] = c;
        if (p->submit) {
            rc = await_dst(w, k, &c); /* times its own wait */
            if (rc != 0) break; /* stopped: slot k stays free */
            queue_slot(w, k);
        } else {
            rc = copy_out(w, k, &c, src); /* times its copy calls; await_dst and retire their waits */
            if (rc > 0) {
                cu.StreamSynchronize(w->stream); /* the crossing into dstage[k] read host[k] */
                break;
            }
            if (rc != 0) {
                pool_fail(p, (int64_t)c.item);
                cu.StreamSynchronize(w->stream); /* copies queued before the refusal */
                break;
            }
            w->state[k] = SLOT_INFLIGHT;
        }
        k = (k + 1) % p->nbuf;
    }
    /* Drain: nothing of this worker may write after it reports idle. */
    for (int j = 0; j < p->nbuf && p->device >= 0; j++) {
        if (stopping(p)) {
            if (settled(w, j) == SLOT_INFLIGHT) cu.EventSynchronize(w->ev[j]);
            w->state[j] = SLOT_FREE;
        } else {
            retire(w, j);
        }
    }
}

/* -1 with g_err when a step fails, or quietly when the pool is closing: a close during the prewarm waits for
 * each worker's current step (a context, a staging buffer), not for the whole prewarm. */
static int worker_init(worker *w) {
    ccb_pool *p = w->p;
    if (p->device < 0) return 0;
    if (is_closing(p)) return -1;
    if (p->ncontexts == 0) {
        w->ctx = p->primary;
    } else {
        int c = w->id % p->ncontexts;
        if (w->id == c) {
            CUcontext popped;
            CUresult rc = cu.CtxCreate(&p->ctx[c], 0, p->dev);
            pthread_mutex_lock(&p->mu);
            p->ctx_made++;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            if (rc != 0) { cu_fail(rc, "cuCtxCreate"); return -1; }
            cu.CtxPopCurrent(&popped);
        } else {
            pthread_mutex_lock(&p->mu);
            while (p->ctx_made < p->ncontexts && !p->broken && !p->closing) pthread_cond_wait(&p->cv, &p->mu);
            int made = p->ctx_made == p->ncontexts; /* else ctx[c] may still be being written */
            pthread_mutex_unlock(&p->mu);
            if (!made || !p->ctx[c]) { set_err("context %d was not created", c); return -1; }
        }
        w->ctx = p->ctx[c];
    }
    CK(cu.CtxSetCurrent(w->ctx));
    CK(cu.StreamCreate(&w->stream, 1 /* CU_STREAM_NON_BLOCKING */));
    for (int k = 0; k < p->nbuf; k++) {
        if (is_closing(p)) return -1;
        if (p->staging == CCB_STAGE_MAPPED) {
            /* no host staging: the file's mapping is the source */
        } else if (p->staging == CCB_STAGE_PINNED) {
            CK(cu.MemHostAlloc(&w->host[k], p->chunk, 0));
        } else {
            if (posix_memalign(&w->host[k], 4096, p->chunk) != 0) {
                w->host[k] = NULL;
                set_err("out of host memory for a %zu-byte staging buffer", p->chunk);
                return -1;
            }
        }
        if (w->host[k]) memset(w->host[k], 0, p->chunk); /* fault it in now, not during the load */
        if (p->ncontexts > 0) CK(cu.MemAlloc(&w->dstage[k], p->chunk));
        /* spin-waited: with BLOCKING_SYNC, which frees the core for the other workers' preads,
         * the wake-ups cost more (47 vs 50 GB/s on a 16-core H100 host) */
        CK(cu.EventCreate(&w->ev[k], 2 /* CU_EVENT_DISABLE_TIMING */));
    }
    return 0;
fail:
    return -1;
}

static void worker_fini(worker *w) {
    ccb_pool *p = w->p;
    if (p->device < 0 || !w->ctx) return;
    cu.CtxSetCurrent(w->ctx);
    if (w->stream) cu.StreamSynchronize(w->stream);
    for (int k = 0; k < p->nbuf; k++) {
        if (w->ev[k]) cu.EventDestroy(w->ev[k]);
        if (w->dstage[k]) cu.MemFree(w->dstage[k]);
        if (w->host[k]) {
            if (p->staging == CCB_STAGE_PINNED) cu.MemFreeHost(w->host[k]);
            else free(w->host[k]);
        }
    }
    if (w->stream) cu.StreamDestroy(w->stream);
    cu.CtxSetCurrent(NULL);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    ccb_pool *p = w->p;
    int ok = worker_init(w) == 0;
    if (!ok && !is_closing(p)) pool_break(p); /* a prewarm stopped by a close breaks nothing: no load comes */
    pthread_mutex_lock(&p->mu);
    if (++p->ready == p->nworkers) p->prewarm_ns = now_ns() - p->t_new;
    pthread_cond_broadcast(&p->cv);
    int seen = 0;
    while (ok) {
        while (p->job == seen && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        seen = p->job;
        pthread_mutex_unlock(&p->mu);
        run_load(w);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) p->t_idle = now_ns();
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    worker_fini(w);
    return NULL;
}

const char *ccb_pool_error(ccb_pool *p) { return p->err; }
long long ccb_pool_error_item(ccb_pool *p) { return (long long)p->err_item; }

ccb_pool *ccb_pool_new(int device, int nworkers, int ncontexts, int staging, size_t chunk, int nbuf) {
    if (nworkers < 1 || nworkers > CCB_MAX_WORKERS) { set_err("workers must be 1..%d, got %d", CCB_MAX_WORKERS, nworkers); return NULL; }
    if (ncontexts < 0 || ncontexts > nworkers) { set_err("contexts must be 0..workers (%d), got %d", nworkers, ncontexts); return NULL; }
    if (nbuf < 1 || nbuf > CCB_MAX_BUFS) { set_err("staging buffers per worker must be 1..%d, got %d", CCB_MAX_BUFS, nbuf); return NULL; }
    if (staging < CCB_STAGE_PINNED || staging > CCB_STAGE_MAPPED) { set_err("unknown staging kind %d", staging); return NULL; }
    if (device < 0 && staging >= CCB_STAGE_MAPPED) { set_err("mapped staging needs a device target"); return NULL; }
    if (chunk < 4096) { set_err("chunk must be at least 4096 bytes, got %zu", chunk); return NULL; }
    if (device >= 0 && cu_open() != 0) return NULL;
    ccb_pool *p = calloc(1, sizeof *p);
    if (!p) { set_err("out of memory"); return NULL; }
    p->device = device; p->nworkers = nworkers; p->ncontexts = ncontexts;
    p->staging = staging; p->chunk = chunk; p->nbuf = nbuf; p->err_item = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_mutex_init(&p->sq_mu, NULL);
    pthread_cond_init(&p->sq_cv, NULL);
    p->submit = device >= 0 && ncontexts == 0 && staging == CCB_STAGE_PINNED;
    p->t_new = now_ns();
    if (device >= 0) {
        CK(cu.DeviceGet(&p->dev, device));
        CK(cu.DevicePrimaryCtxRetain(&p->primary, p->dev));
    }
    for (int i = 0; i < nworkers; i++) {
        p->w[i].p = p;
        p->w[i].id = i;
    }
    if (p->submit) {
        if (pthread_create(&p->sub, NULL, submitter_main, p) != 0) {
            set_err("cannot start the loader's submitter thread: %s", strerror(errno));
            p->nworkers = 0;
            goto fail;
        }
        p->sub_started = 1;
    }
    for (int i = 0; i < nworkers; i++) {
        if (pthread_create(&p->thread[i], NULL, worker_main, &p->w[i]) != 0) {
            set_err("cannot start loader worker thread %d: %s", i, strerror(errno));
            /* the workers started so far see stop and exit */
            pthread_mutex_lock(&p->mu);
            p->nworkers = i;
            pthread_mutex_unlock(&p->mu);
            goto fail;
        }
        p->started++;
    }
    return p;
fail:;
    char saved[CCB_ERR_LEN];
    memcpy(saved, g_err, sizeof saved);
    ccb_pool_free(p);
    memcpy(g_err, saved, sizeof saved);
    return NULL;
}

static struct timespec deadline_in(double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double s = ts.tv_sec + ts.tv_nsec / 1e9 + seconds;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    return ts;
}

/* 0 when every worker is ready, 1 on timeout, -1 when one failed (ccb_pool_error), -2 once the pool is
 * closing (before or during the wait: workers that stopped their prewarm count as done, not as ready). */
int ccb_pool_wait_ready(ccb_pool *p, double timeout_s) {
    struct timespec dl = deadline_in(timeout_s);
    pthread_mutex_lock(&p->mu);
    while (p->ready < p->nworkers && !p->broken && !p->closing)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) == ETIMEDOUT) break;
    int rc = p->closing ? -2 : p->broken ? -1 : p->ready < p->nworkers ? 1 : 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Start a load of items (see ccb_item) from files, items [0, nready) with
 * their destinations; the load's id (> 0, for ccb_pool_publish), or -1.
 * remaining (ntensors long) receives how many chunks each tensor spans and is
 * counted down; doneq (ntensors long) receives the finished tensors. The
 * arrays must outlive the load. */
int ccb_pool_submit(ccb_pool *p, const ccb_file *files, int nfiles, const ccb_item *items, size_t nitems,
                    size_t nready, int32_t *remaining, int32_t *doneq, int ntensors) {
    pthread_mutex_lock(&p->mu);
    int rc = -1;
    if (p->closing) set_err("the loader pool is closing");
    else if (p->broken) set_err("%s", p->err);
    else if (p->ready < p->nworkers) set_err("the loader pool is not ready");
    else if (p->busy) set_err("the loader pool is busy with another load");
    else {
        /* every worker is idle and drained: the last load's error or cancel ends here */
        __atomic_store_n(&p->failed, 0, __ATOMIC_RELEASE);
        p->err_item = -1;
        p->err[0] = 0;
        plan_free(&p->pl);
        if (plan_build(&p->pl, files, nfiles, items, nitems, p->chunk, remaining, ntensors) != 0) {
            plan_free(&p->pl);
            goto out;
        }
        for (int f = 0; f < nfiles && p->staging == CCB_STAGE_MAPPED; f++) {
            if (!files[f].map && p->pl.fp[f].end_item > p->pl.fp[f].first_item) {
                set_err("file %d has no mapping, and mapped staging copies from it", f);
                plan_free(&p->pl);
                goto out;
            }
        }
        p->next = 0;
        __atomic_store_n(&p->published, nready < nitems ? nready : nitems, __ATOMIC_RELEASE);
        p->doneq = doneq;
        p->dq_head = p->dq_tail = 0;
        p->cancel = 0;
        p->bytes = 0;
        for (size_t i = 0; i < nitems; i++) p->bytes += (double)items[i].nbytes;
        p->busy = p->nworkers;
        p->remaining = remaining;
        p->t_submit = now_ns();
        p->job = p->job == INT32_MAX ? 1 : p->job + 1;
        pthread_cond_broadcast(&p->cv);
        rc = p->job;
    }
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Tensors finished since the last call, into out (at most max): the count;
 * 0 on timeout; -1 on error (ccb_pool_error); -2 when the load is over and
 * everything was reported, or the pool is closing. */
int ccb_pool_next(ccb_pool *p, int32_t *out, int max, double timeout_s) {
    struct timespec dl = deadline_in(timeout_s);
    pthread_mutex_lock(&p->mu);
    int n = 0;
    for (;;) {
        if (p->closing) { n = -2; break; }
        if (p->failed) { n = -1; break; }
        while (p->dq_head < p->dq_tail && n < max) out[n++] = p->doneq[p->dq_head++];
        if (n) break;
        if (!p->busy) { n = -2; break; }
        if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Items [0, nready) of load `load` (submit's id) have their destinations; ignored once that load is over,
 * so that a publish meant for a load that failed never reaches the next one. */
void ccb_pool_publish(ccb_pool *p, int load, size_t nready) {
    pthread_mutex_lock(&p->mu);
    if (p->busy && load == p->job && nready > p->published) {
        __atomic_store_n(&p->published, nready < p->pl.nitems ? nready : p->pl.nitems, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

/* With mu held: stop the load and wait until every worker is idle (nothing of it writes any more). */
static void cancel_locked(ccb_pool *p) {
    __atomic_store_n(&p->cancel, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->cv); /* workers waiting for destinations */
    while (p->busy) pthread_cond_wait(&p->cv, &p->mu);
}

/* Stop the load and wait until no worker can write anything more. */
void ccb_pool_cancel(ccb_pool *p) {
    pthread_mutex_lock(&p->mu);
    cancel_locked(p);
    pthread_mutex_unlock(&p->mu);
}

/* Unlike a cancel, which ends one load, closing is for good: it also ends the waits that no load's end would
 * (ccb_pool_wait_ready during a prewarm) and stops the prewarm, so that a free soon after need not wait for it. */
void ccb_pool_close(ccb_pool *p) {
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->closing, 1, __ATOMIC_RELEASE);
    cancel_locked(p); /* its broadcast wakes every wait, and workers waiting for a context */
    pthread_mutex_unlock(&p->mu);
}

void ccb_pool_stats(ccb_pool *p, ccb_load_stats *s) {
    pthread_mutex_lock(&p->mu);
    memset(s, 0, sizeof *s);
    s->prewarm_ns = p->prewarm_ns;
    for (int i = 0; i < p->nworkers; i++) {
        s->read_ns += (double)__atomic_load_n(&p->w[i].read_ns, __ATOMIC_RELAXED);
        s->copy_ns += (double)__atomic_load_n(&p->w[i].copy_ns, __ATOMIC_RELAXED);
    }
    s->bytes = p->bytes;
    s->load_ns = p->busy ? 0 : p->t_idle - p->t_submit;
    pthread_mutex_unlock(&p->mu);
}

void ccb_pool_reset_stats(ccb_pool *p) {
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->nworkers; i++) {
        __atomic_store_n(&p->w[i].read_ns, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->w[i].copy_ns, 0, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Stop and join the workers, free their buffers, destroy the contexts. */
void ccb_pool_free(ccb_pool *p) {
    if (!p) return;
    ccb_pool_close(p);
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->thread[i], NULL);
    if (p->sub_started) { /* the workers have drained: nothing is queued */
        pthread_mutex_lock(&p->sq_mu);
        p->sq_stop = 1;
        pthread_cond_broadcast(&p->sq_cv);
        pthread_mutex_unlock(&p->sq_mu);
        pthread_join(p->sub, NULL);
    }
    for (int c = 0; c < p->ncontexts; c++)
        if (p->ctx[c]) cu.CtxDestroy(p->ctx[c]);
    if (p->primary) cu.DevicePrimaryCtxRelease(p->dev);
    plan_free(&p->pl);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->sq_mu);
    pthread_cond_destroy(&p->sq_cv);
    free(p);
}

/* The whole file mapped read-only (shared page cache); NULL with ccb_error(). */
void *ccb_map_file(int fd, size_t size) {
    void *p = mmap(NULL, size ? size : 1, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { set_err("cannot map the file: %s", strerror(errno)); return NULL; }
    return p;
}

void ccb_unmap_file(void *p, size_t size) { if (p) munmap(p, size ? size : 1); }
