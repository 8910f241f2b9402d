/*
 * Stress of the loader pool's publish protocol (native/loader/load.c), for
 * ThreadSanitizer (and ASan). Each load: random items over one or two temp
 * files of random bytes; submit with nready 0 (or a short prefix); a
 * publisher thread writes items' dst and publishes in random steps (past the
 * end at times), and at times "runs out of memory": stops with some dst
 * written but unpublished and cancels; a consumer thread calls ccb_pool_next
 * and at times cancels midway (and cancels after an error, as the Python
 * loader does); the main thread at times truncates a file mid-load or before
 * submit, publishes stale counts before submit and after the end, and at
 * times frees the pool while workers wait for destinations (and at times closes a
 * new pool during its prewarm: waits end at once and the workers stop there). Then, on the same
 * pool, the next load; right after its submit the main thread at times
 * publishes everything under an id that is not the running load's (the last
 * load's, a future one, 0): a publish meant for a load that is over must
 * never reach the next one, whose unpublished items still have dst 0.
 *
 * Checked: no byte is written to an unpublished destination (dst 0, or a
 * range of an item the publisher has not published) or after the load is
 * over (next said -2, or cancel returned: destinations then released); no
 * copy left queued once the pool is idle; every tensor reported at most once,
 * with its bytes right; on success every tensor reported, every byte right.
 * Mapped staging of a file cut before the load never reports zeros as its
 * bytes (6f61bd3). A watchdog aborts when nothing is reported for HANG_S
 * seconds (a hang; 60 by default), and a publisher that waits for a tensor
 * whose chunks are all published aborts after as long.
 * Shapes are taken in turn, so a run of a few seconds reaches each; the last
 * line counts loads per shape ("loads by shape: host N ok M, ...").
 *
 *   loader_stress MODE SECONDS SEED [HANG_S]
 *       MODE: host (device -1, the real pread path), gpu (fake_cuda_loader.c:
 *       five device shapes), all
 * Built and run by tests/test_load_stress_cpu.py (load.c as in ccbridge._native,
 * with pread renamed: -Dpread=ccbt_pread):
 *   gcc -g -O1 -std=gnu11 -U_FORTIFY_SOURCE -fsanitize=thread -Dpread=ccbt_pread -c \
 *       src/ccbridge/native/loader/load.c -o load.o
 *   gcc -g -O1 -std=gnu11 -fsanitize=thread tests/loader_stress.c tests/fake_cuda_loader.c load.o \
 *       -lpthread -o loader_stress
 * From review helper-45's harness (review-publish:tsan/).
 */
#define _GNU_SOURCE
#include "../src/ccbridge/native/loader/loader.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

extern int ccbt_fail_rate;      /* fake_cuda_loader.c: 1 in N driver calls fails (0: none) */
extern int ccbt_prewarm_delay_ms; /* fake_cuda_loader.c: how long each prewarm step takes */
long ccbt_pending_ops(void);    /* fake_cuda_loader.c */

/* ---- what a write may touch: the current load's arena, item by item ---- */
static uintptr_t g_lo, g_hi;    /* atomic: the arena of the running load */
static int g_closed;            /* atomic: the load is over; its destinations are released */
static size_t g_pub;            /* atomic: items the publisher has published (stored before ccb_pool_publish) */
static size_t g_nitems;
static size_t *g_dstoff;        /* item i lands at arena + g_dstoff[i], items in order */
static const ccb_item *g_items;
static char g_where[256];       /* the load being run, for a failure report (under g_where_mu: the watchdog reads it) */
static pthread_mutex_t g_where_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_progress;         /* atomic */
static int g_stats_during_load; /* CCBT_STATS: call ccb_pool_stats from the consumer during the load */
static double g_hang_s = 60;    /* no progress for this long: a hang */

static void die(const char *what, const void *dst, size_t n) {
    char where[sizeof g_where];
    pthread_mutex_lock(&g_where_mu);
    memcpy(where, g_where, sizeof where);
    pthread_mutex_unlock(&g_where_mu);
    fprintf(stderr, "HARNESS FAILURE: %s (dst %p, %zu bytes) during %s\n", what, dst, n, where);
    fflush(stderr);
    abort();
}

void ccbt_check_write(const void *dst, size_t n, const char *who) {
    uintptr_t a = (uintptr_t)dst;
    if (a < (1u << 20)) die(who[0] == 'p' ? "pread into an unpublished destination (dst 0)" : "copy into an unpublished destination (dst 0)", dst, n);
    uintptr_t lo = __atomic_load_n(&g_lo, __ATOMIC_ACQUIRE), hi = __atomic_load_n(&g_hi, __ATOMIC_ACQUIRE);
    if (a < lo || a >= hi) return; /* the pool's own staging */
    if (__atomic_load_n(&g_closed, __ATOMIC_ACQUIRE)) die("write into a destination after the load was over", dst, n);
    if (a + n > hi) die("write past the arena", dst, n);
    size_t off = a - lo, l = 0, r = g_nitems; /* the item holding off */
    while (r - l > 1) {
        size_t m = (l + r) / 2;
        if (g_dstoff[m] <= off) l = m; else r = m;
    }
    if (l >= __atomic_load_n(&g_pub, __ATOMIC_ACQUIRE)) die("write into an item not yet published", dst, n);
    if (off + n > g_dstoff[l] + g_items[l].nbytes) die("write past its item", dst, n);
}

/* load.c's pread (compiled with -Dpread=ccbt_pread): checked, delayed, short and interrupted at times */
static __thread unsigned t_seed;
static unsigned trnd(void) {
    if (!t_seed) t_seed = (unsigned)(uintptr_t)&t_seed * 2654435761u ^ (unsigned)time(NULL);
    return (unsigned)rand_r(&t_seed);
}
ssize_t ccbt_pread(int fd, void *buf, size_t n, off_t off) {
    ccbt_check_write(buf, n, "pread");
    unsigned r = trnd() % 32;
    if (r == 0) usleep(trnd() % 300);
    if (r == 1) { errno = EINTR; return -1; }
    if (r == 2 && n > 1) n = 1 + trnd() % (n - 1);
    return pread(fd, buf, n, off);
}

/* ---- one load ---- */
typedef struct {
    ccb_pool *p;
    int id;                 /* ccb_pool_submit's */
    int mapped;
    unsigned seed;
    int nfiles, fd[2];
    size_t fsize[2];
    unsigned char *data[2];
    void *map[2];
    ccb_file files[2];
    ccb_item *items;
    size_t nitems, nready;
    size_t *dstoff;
    int ntensors;
    int32_t *remaining, *doneq;
    int *reported;
    unsigned char *arena;
    size_t arena_sz;
    long pub_cancel_at;     /* publisher: stop and cancel when this many are published (-1: never) */
    long pub_stop_at;       /* publisher: stop (no cancel) here: the pool is freed meanwhile (-1: never) */
    long cons_cancel_after; /* consumer: cancel after this many tensors (-1: never) */
    int no_consumer;
    int progress;           /* publisher: after each publish, wait until every tensor whose chunks are all published
                               is reported (what a waiting worker must not hold back) */
    size_t chunk;
    size_t *need;           /* per tensor: the items that must be published before all its chunks can land */
    int consumer_over;      /* atomic */
    /* outcome */
    int pub_cancelled, cons_cancelled, failed, ended;
    long got;
    char err[CCB_ERR_LEN];
} load_t;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* Every tensor whose chunks hold only items [0, end) must be reported without any further publish. */
static void await_due(load_t *L, size_t end) {
    double dl = now_s() + g_hang_s;
    for (int t = 0; t < L->ntensors; t++) {
        if (L->need[t] > end) continue;
        while (!__atomic_load_n(&L->reported[t], __ATOMIC_ACQUIRE)) {
            if (__atomic_load_n(&L->consumer_over, __ATOMIC_ACQUIRE)) return; /* failed or cancelled */
            if (now_s() > dl) {
                fprintf(stderr, "tensor %d (all its chunks published: %zu of %zu items) not reported in %.0f s\n", t, end,
                        L->nitems, g_hang_s);
                die("progress: a published tensor held back while the publisher waits", NULL, 0);
            }
            usleep(200);
        }
    }
}

static void *publisher(void *arg) {
    load_t *L = arg;
    unsigned s = L->seed * 7 + 1;
    size_t pos = L->nready;
    while (pos < L->nitems) {
        if (L->pub_stop_at >= 0 && (long)pos >= L->pub_stop_at) return NULL;
        if (L->pub_cancel_at >= 0 && (long)pos >= L->pub_cancel_at) {
            /* "out of memory" mid-allocation: some dst written, not published; the loader cancels */
            size_t extra = rand_r(&s) % 3;
            for (size_t i = pos; i < pos + extra && i < L->nitems; i++) L->items[i].dst = (uint64_t)(uintptr_t)(L->arena + L->dstoff[i]);
            if (rand_r(&s) % 2) usleep(rand_r(&s) % 500);
            ccb_pool_cancel(L->p);
            L->pub_cancelled = 1;
            return NULL;
        }
        size_t step = 1 + rand_r(&s) % (L->nitems / 3 + 1), end = pos + step > L->nitems ? L->nitems : pos + step;
        for (size_t i = pos; i < end; i++) L->items[i].dst = (uint64_t)(uintptr_t)(L->arena + L->dstoff[i]);
        unsigned r = rand_r(&s) % 8;
        if (r < 3) usleep(rand_r(&s) % 400);
        else if (r < 5) sched_yield();
        __atomic_store_n(&g_pub, end, __ATOMIC_RELEASE);
        size_t say = end == L->nitems && rand_r(&s) % 3 == 0 ? end + rand_r(&s) % 5 : end; /* past the end: clamped */
        ccb_pool_publish(L->p, L->id, say);
        if (rand_r(&s) % 4 == 0) ccb_pool_publish(L->p, L->id, pos); /* a smaller count: ignored */
        pos = end;
        if (L->progress && end < L->nitems) await_due(L, end);
    }
    return NULL;
}

static void *consumer(void *arg) {
    load_t *L = arg;
    unsigned s = L->seed * 13 + 5;
    int32_t out[16];
    for (;;) {
        int max = 1 + rand_r(&s) % 16;
        int n = ccb_pool_next(L->p, out, max, (rand_r(&s) % 4) * 0.02);
        if (g_stats_during_load) { ccb_load_stats st; ccb_pool_stats(L->p, &st); }
        if (n == -2) { L->ended = 1; __atomic_store_n(&L->consumer_over, 1, __ATOMIC_RELEASE); break; }
        if (n == -1) {
            snprintf(L->err, sizeof L->err, "%s", ccb_pool_error(L->p));
            L->failed = 1;
            __atomic_store_n(&L->consumer_over, 1, __ATOMIC_RELEASE);
            ccb_pool_cancel(L->p); /* as the loader does before it drops the tensors */
            break;
        }
        for (int i = 0; i < n; i++) {
            if (out[i] < 0 || out[i] >= L->ntensors) die("a tensor index out of range", NULL, (size_t)out[i]);
            __atomic_add_fetch(&L->reported[out[i]], 1, __ATOMIC_RELEASE);
            L->got++;
        }
        if (n > 0) __atomic_add_fetch(&g_progress, 1, __ATOMIC_RELAXED);
        if (L->cons_cancel_after >= 0 && L->got >= L->cons_cancel_after && !L->cons_cancelled) {
            __atomic_store_n(&L->consumer_over, 1, __ATOMIC_RELEASE);
            ccb_pool_cancel(L->p);
            L->cons_cancelled = 1;
        }
    }
    return NULL;
}

static void make_file(load_t *L, int f, unsigned *s, size_t chunk, int *tensor) {
    char path[] = "/dev/shm/ccbt-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); exit(2); }
    unlink(path);
    uint64_t off = rand_r(s) % 2 ? 0 : rand_r(s) % (2 * chunk);
    int n = 1 + rand_r(s) % 24;
    for (int i = 0; i < n; i++) {
        if (rand_r(s) % 3 == 0) off += rand_r(s) % chunk; /* a gap */
        unsigned r = rand_r(s) % 10;
        uint64_t nb = r < 5 ? 1 + rand_r(s) % (chunk / 2) : r < 8 ? 1 + rand_r(s) % (2 * chunk) : 1 + rand_r(s) % (5 * chunk);
        ccb_item *it = &L->items[L->nitems];
        it->dst = 0; it->offset = off; it->nbytes = nb; it->file = f;
        if (L->nitems == 0 || rand_r(s) % 6) (*tensor)++; /* else: one more piece of the same tensor */
        it->tensor = *tensor - 1;
        L->nitems++;
        off += nb;
    }
    size_t size = off + rand_r(s) % chunk;
    unsigned char *d = malloc(size ? size : 1);
    for (size_t i = 0; i < size; i++) d[i] = (unsigned char)rand_r(s);
    for (size_t w = 0; w < size;) {
        ssize_t k = write(fd, d + w, size - w);
        if (k <= 0) { perror("write"); exit(2); }
        w += (size_t)k;
    }
    L->fd[f] = fd; L->fsize[f] = size; L->data[f] = d;
    L->map[f] = NULL;
    L->files[f].fd = fd; L->files[f].pad_ = 0; L->files[f].map = 0;
    if (L->mapped) {
        L->map[f] = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (L->map[f] == MAP_FAILED) { perror("mmap"); exit(2); }
        L->files[f].map = (uint64_t)(uintptr_t)L->map[f];
    }
}

typedef struct { long loads, ok, failed, pub_cancel, cons_cancel, freed, truncs, stale, prewarm_closed; } tally;

/* One load on pool p (which this may free: then *p is NULL); *last is the id of the pool's last load (0: none),
 * and becomes this one's. */
static void one_load(ccb_pool **pp, int *last, unsigned seed, size_t chunk, int mapped, int may_free, tally *T) {
    load_t L;
    memset(&L, 0, sizeof L);
    L.p = *pp; L.seed = seed; L.mapped = mapped;
    unsigned s = seed;
    L.items = calloc(48, sizeof *L.items);
    L.nfiles = rand_r(&s) % 4 == 0 ? 2 : 1;
    int tensor = 0;
    for (int f = 0; f < L.nfiles; f++) make_file(&L, f, &s, chunk, &tensor);
    L.ntensors = tensor;
    L.dstoff = calloc(L.nitems, sizeof *L.dstoff);
    for (size_t i = 0; i < L.nitems; i++) { L.dstoff[i] = L.arena_sz; L.arena_sz += L.items[i].nbytes; }
    L.arena = malloc(L.arena_sz);
    memset(L.arena, 0xA5, L.arena_sz);
    L.chunk = chunk;
    L.need = calloc((size_t)L.ntensors, sizeof *L.need);
    for (size_t i = 0; i < L.nitems; i++) { /* the end item of the last chunk that item i touches */
        const ccb_item *it = &L.items[i];
        uint64_t cell_hi = ((it->offset + it->nbytes - 1) / chunk + 1) * chunk;
        size_t e = i + 1;
        while (e < L.nitems && L.items[e].file == it->file && L.items[e].offset < cell_hi) e++;
        if (e > L.need[it->tensor]) L.need[it->tensor] = e;
    }
    L.remaining = calloc((size_t)L.ntensors, sizeof *L.remaining);
    L.doneq = calloc((size_t)L.ntensors, sizeof *L.doneq);
    L.reported = calloc((size_t)L.ntensors, sizeof *L.reported);
    L.nready = rand_r(&s) % 4 == 0 ? rand_r(&s) % (L.nitems + 1) : 0;
    for (size_t i = 0; i < L.nready; i++) L.items[i].dst = (uint64_t)(uintptr_t)(L.arena + L.dstoff[i]);
    L.pub_cancel_at = L.pub_stop_at = L.cons_cancel_after = -1;
    unsigned r = rand_r(&s) % 16;
    int do_free = 0, trunc_mid = 0, trunc_before = 0;
    if (r == 0) L.pub_cancel_at = (long)(rand_r(&s) % L.nitems);
    else if (r == 1) L.cons_cancel_after = (long)(rand_r(&s) % L.ntensors);
    else if (r == 2 && may_free) { do_free = 1; L.pub_stop_at = (long)(rand_r(&s) % L.nitems); L.no_consumer = 1; }
    else if (r == 3 && !mapped) trunc_mid = 1;
    else if (r >= 8) L.progress = 1;
    else if (r == 4) { /* truncated before the load */
        int f = rand_r(&s) % L.nfiles;
        if (ftruncate(L.fd[f], (off_t)(rand_r(&s) % (L.fsize[f] + 1))) != 0) perror("ftruncate");
        T->truncs++;
        trunc_before = 1;
    }
    pthread_mutex_lock(&g_where_mu);
    snprintf(g_where, sizeof g_where, "load seed %u: %zu items, %d tensors, %d files, chunk %zu, nready %zu, mapped %d, "
             "pub_cancel_at %ld, cons_cancel_after %ld, free %d, trunc_mid %d, trunc_before %d, progress %d", seed, L.nitems, L.ntensors, L.nfiles,
             chunk, L.nready, mapped, L.pub_cancel_at, L.cons_cancel_after, do_free, trunc_mid, trunc_before, L.progress);
    pthread_mutex_unlock(&g_where_mu);

    g_nitems = L.nitems; g_dstoff = L.dstoff; g_items = L.items;
    __atomic_store_n(&g_pub, L.nready, __ATOMIC_RELEASE);
    __atomic_store_n(&g_closed, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&g_lo, (uintptr_t)L.arena, __ATOMIC_RELEASE);
    __atomic_store_n(&g_hi, (uintptr_t)L.arena + L.arena_sz, __ATOMIC_RELEASE);

    ccb_pool_publish(L.p, *last, rand_r(&s) % (L.nitems + 3)); /* before submit: no load runs, ignored */
    L.id = ccb_pool_submit(L.p, L.files, L.nfiles, L.items, L.nitems, L.nready, L.remaining, L.doneq, L.ntensors);
    if (L.id <= 0) {
        fprintf(stderr, "submit failed (%d): %s (%s)\n", L.id, g_err, g_where);
        abort();
    }
    if (L.id == *last) die("submit gave the last load's id again", NULL, (size_t)L.id);
    if (rand_r(&s) % 3 == 0) {
        /* A publish meant for another load: the last one (its owner still allocating after it failed or was
         * cancelled; 0 on a new pool), or an id not handed out yet. The items past nready have dst 0: if this
         * reached the load, a worker would write there (repro_stale_publish.c of the review). */
        int stale = rand_r(&s) % 2 ? *last : L.id + 1 + (int)(rand_r(&s) % 3);
        ccb_pool_publish(L.p, stale, L.nitems + rand_r(&s) % 3);
        T->stale++;
    }
    *last = L.id;
    pthread_t pub, con;
    pthread_create(&pub, NULL, publisher, &L);
    if (!L.no_consumer) pthread_create(&con, NULL, consumer, &L);
    if (trunc_mid) {
        usleep(rand_r(&s) % 3000);
        int f = rand_r(&s) % L.nfiles;
        if (ftruncate(L.fd[f], (off_t)(rand_r(&s) % (L.fsize[f] + 1))) != 0) perror("ftruncate");
        T->truncs++;
    }
    pthread_join(pub, NULL);
    if (do_free) {
        usleep(rand_r(&s) % 2000);
        ccb_pool_free(L.p); /* workers may wait for destinations that will never come */
        *pp = NULL;
        T->freed++;
    } else {
        pthread_join(con, NULL);
    }
    /* over: nothing may write into the destinations from here on */
    __atomic_store_n(&g_closed, 1, __ATOMIC_RELEASE);
    long pend = ccbt_pending_ops();
    if (pend) { fprintf(stderr, "%ld copies still queued after the load was over\n", pend); die("copies left in flight", NULL, 0); }

    int success = L.ended && !L.failed && !L.pub_cancelled && !L.cons_cancelled && !do_free;
    for (int t = 0; t < L.ntensors; t++) {
        if (L.reported[t] > 1) die("a tensor reported twice", NULL, (size_t)t);
        if (success && L.reported[t] != 1) {
            fprintf(stderr, "tensor %d not reported (got %ld of %d)\n", t, L.got, L.ntensors);
            die("a tensor never reported on a load that succeeded", NULL, (size_t)t);
        }
    }
    for (size_t i = 0; i < L.nitems; i++) {
        const ccb_item *it = &L.items[i];
        if (!L.reported[it->tensor]) continue;
        if (memcmp(L.arena + L.dstoff[i], L.data[it->file] + it->offset, it->nbytes) != 0) {
            /* mapped && trunc_before: before 6f61bd3, map_in passed a chunk that ends inside the file's last page */
            fprintf(stderr, "item %zu (tensor %d) bytes differ%s\n", i, it->tensor,
                    mapped && trunc_before ? " (mapped staging, file cut before the load: zeros past its end?)" : "");
            die("wrong bytes in a tensor reported done", L.arena + L.dstoff[i], it->nbytes);
        }
    }
    if (success && L.got != L.ntensors) die("count of reported tensors", NULL, (size_t)L.got);
    if (!do_free) {
        ccb_pool_publish(L.p, L.id, L.nitems); /* after the end: ignored */
        ccb_load_stats st;
        ccb_pool_stats(L.p, &st);
        if (success && st.bytes <= 0) die("stats bytes", NULL, 0);
    }
    T->loads++;
    if (success) T->ok++;
    if (L.failed) T->failed++;
    if (L.pub_cancelled) T->pub_cancel++;
    if (L.cons_cancelled) T->cons_cancel++;
    __atomic_add_fetch(&g_progress, 1, __ATOMIC_RELAXED);

    __atomic_store_n(&g_lo, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&g_hi, 0, __ATOMIC_RELEASE);
    for (int f = 0; f < L.nfiles; f++) {
        if (L.map[f]) munmap(L.map[f], L.fsize[f]);
        close(L.fd[f]);
        free(L.data[f]);
    }
    free(L.need); free(L.arena); free(L.items); free(L.dstoff); free(L.remaining); free(L.doneq); free(L.reported);
}

static void *watchdog(void *arg) {
    (void)arg;
    long last = -1;
    int still = 0;
    for (;;) {
        sleep(1);
        long now = __atomic_load_n(&g_progress, __ATOMIC_RELAXED);
        if (now != last) { last = now; still = 0; continue; }
        if (++still == (int)g_hang_s + 5) { /* after await_due's own report, which says more */
            pthread_mutex_lock(&g_where_mu); /* held: the report and the abort are the last this process does */
            fprintf(stderr, "HANG: no progress for %d s during %s\n", still, g_where);
            fflush(stderr);
            abort();
        }
    }
    return NULL;
}

const char *ccb_error_text(void);

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "host";
    double seconds = argc > 2 ? atof(argv[2]) : 10;
    unsigned seed = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : (unsigned)time(NULL);
    if (argc > 4) g_hang_s = atof(argv[4]);
    if (!(g_hang_s >= 1)) { fprintf(stderr, "HANG_S must be at least 1\n"); return 2; }
    g_stats_during_load = getenv("CCBT_STATS") != NULL;
    int host = !strcmp(mode, "host") || !strcmp(mode, "all"), gpu = !strcmp(mode, "gpu") || !strcmp(mode, "all");
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tally T = {0};
    long pools = 0;
    static const struct { int device, contexts, staging; const char *name; } shapes[] = {
        {-1, 0, CCB_STAGE_PINNED, "host"},         {-1, 0, CCB_STAGE_PAGEABLE, "host-pageable"},
        {0, 0, CCB_STAGE_PINNED, "submitter"},     {0, 0, CCB_STAGE_PAGEABLE, "primary-pageable"},
        {0, 0, CCB_STAGE_MAPPED, "primary-mapped"}, {0, 2, CCB_STAGE_PINNED, "2ctx-pinned"},
        {0, 2, CCB_STAGE_MAPPED, "2ctx-mapped"},
    };
    unsigned s = seed;
    long per_shape[7] = {0}, loads_of[7] = {0}, ok_of[7] = {0};
    int k = -1;
    for (unsigned iter = 0;; iter++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > seconds) break;
        do k = (k + 1) % 7; while (!(shapes[k].device < 0 ? host : gpu)); /* in turn: every shape in a short run */
        int workers = 1 + rand_r(&s) % 5, nbuf = 1 + rand_r(&s) % 3;
        int contexts = shapes[k].contexts > workers ? workers : shapes[k].contexts;
        size_t chunk = 4096u << (rand_r(&s) % 3);
        ccbt_fail_rate = shapes[k].device >= 0 && rand_r(&s) % 4 == 0 ? 150 : 0;
        int early = shapes[k].device >= 0 && rand_r(&s) % 8 == 0; /* closed during its prewarm */
        __atomic_store_n(&ccbt_prewarm_delay_ms, early, __ATOMIC_RELAXED); /* 1 ms a step: the close finds them at it */
        ccb_pool *p = ccb_pool_new(shapes[k].device, workers, contexts, shapes[k].staging, chunk, nbuf);
        if (!p) { fprintf(stderr, "pool_new: %s\n", g_err); return 2; }
        if (early) { /* workers stop their prewarm part-way: what they made is freed (ASan), no wait outlives it */
            ccb_pool_close(p);
            int32_t out[1];
            if (ccb_pool_wait_ready(p, 30) != -2 || ccb_pool_next(p, out, 1, 30) != -2) {
                fprintf(stderr, "a wait on a closing pool did not end at once\n");
                return 2;
            }
            ccb_pool_free(p);
            T.prewarm_closed++;
            __atomic_add_fetch(&g_progress, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (rand_r(&s) % 2 && ccb_pool_wait_ready(p, 30) != 0) { fprintf(stderr, "not ready\n"); return 2; }
        pools++;
        per_shape[k]++;
        int nloads = 1 + rand_r(&s) % 12, last = 0;
        for (int l = 0; l < nloads && p; l++) {
            if (ccb_pool_wait_ready(p, 30) != 0) { fprintf(stderr, "not ready\n"); return 2; }
            long ok = T.ok;
            one_load(&p, &last, seed * 1000003u + iter * 101u + (unsigned)l, chunk,
                     shapes[k].staging == CCB_STAGE_MAPPED, 1, &T);
            loads_of[k]++;
            ok_of[k] += T.ok - ok;
        }
        if (p) ccb_pool_free(p);
    }
    printf("seed %u: %ld pools, %ld loads: %ld succeeded, %ld failed, %ld cancelled by the publisher, %ld by the "
           "consumer, %ld pools freed mid-load, %ld truncations, %ld publishes under another load's id, %ld pools "
           "closed in their prewarm\n", seed, pools, T.loads, T.ok, T.failed, T.pub_cancel, T.cons_cancel, T.freed,
           T.truncs, T.stale, T.prewarm_closed);
    printf("loads by shape:");
    for (int j = 0, n = 0; j < 7; j++)
        if (shapes[j].device < 0 ? host : gpu)
            printf("%s %s %ld ok %ld (%ld pools)", n++ ? "," : "", shapes[j].name, loads_of[j], ok_of[j], per_shape[j]);
    printf("\n");
    return 0;
}
