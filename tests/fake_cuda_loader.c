/*
 * For tests/loader_stress.c (the loader pool's stress, built by
 * tests/test_load_stress_cpu.py): a stand-in for common/cudrv.c: the driver table filled with a fake CUDA
 * whose "device" memory is host memory and whose streams are real threads,
 * so that load.c's device paths (submitter, worker copies, contexts with
 * device staging and peer copies) run, asynchronously, without a GPU and
 * under ThreadSanitizer.
 *
 * Stricter than the real driver where it matters: every copy, pageable or
 * not, reads its source when the stream gets to it (not at the call), and
 * streams add random delays, so a slot reused before its event is waited for,
 * or a copy left queued when the pool says it is idle, shows up.
 *
 * Hooks for the harness: ccbt_check_write() is called for every byte range a
 * copy writes (the harness aborts on a write to an unpublished or released
 * destination); ccbt_pending_ops() counts copies and event records queued but
 * not yet done; ccbt_fail_rate makes 1 in N copy calls (refused at issue) or
 * event waits (after the wait) return an error; ccbt_prewarm_delay_ms makes
 * each prewarm step (a context, a staging allocation) take that long.
 * Also built alone as a shared library with load.c (tests/test_load_pool_cpu.py
 * drives a pool on it from Python): ccbt_check_write then checks nothing.
 */
#include "../src/ccbridge/native/common/cudrv.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ccb_driver cu; /* g_err and set_err: common/err.c, as in the core */

/* loader_stress.c's check overrides this one */
__attribute__((weak)) void ccbt_check_write(const void *dst, size_t n, const char *who) { (void)dst, (void)n, (void)who; }
int ccbt_fail_rate;                                                    /* 0: no injected errors */
int ccbt_prewarm_delay_ms;                                             /* atomic; 0: prewarm steps are instant */
static long g_pending;                                                 /* atomic */
long ccbt_pending_ops(void) { return __atomic_load_n(&g_pending, __ATOMIC_ACQUIRE); }

int cu_fail(CUresult rc, const char *what) {
    int len = (int)strcspn(what, "(");
    set_err("%.*s failed: fake error (%d)", len, what, rc);
    return -1;
}

static __thread unsigned t_seed;
static unsigned rnd(void) {
    if (!t_seed) t_seed = (unsigned)(uintptr_t)&t_seed ^ (unsigned)mono_ns();
    return (unsigned)rand_r(&t_seed);
}
static int inject(void) { return ccbt_fail_rate > 0 && rnd() % (unsigned)ccbt_fail_rate == 0; }
static void prewarm_step(void) {
    int ms = __atomic_load_n(&ccbt_prewarm_delay_ms, __ATOMIC_RELAXED);
    if (ms > 0) usleep((useconds_t)ms * 1000);
}

typedef struct fev {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long rec, done;
} fev;

typedef struct op {
    int kind; /* 0 copy, 1 event */
    void *dst;
    const void *src;
    size_t n;
    fev *ev;
    unsigned long gen;
    struct op *next;
} op;

typedef struct fstream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op *head, *tail;
    int busy, stop;
    pthread_t th;
} fstream;

static void *stream_main(void *arg) {
    fstream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        unsigned r = rnd() % 16;
        if (r == 0) usleep(rnd() % 200);
        else if (r < 4) sched_yield();
        if (o->kind == 0) {
            ccbt_check_write(o->dst, o->n, "copy");
            memcpy(o->dst, o->src, o->n);
            __atomic_sub_fetch(&g_pending, 1, __ATOMIC_RELEASE);
        } else {
            __atomic_sub_fetch(&g_pending, 1, __ATOMIC_RELEASE);
            pthread_mutex_lock(&o->ev->mu);
            if (o->gen > o->ev->done) o->ev->done = o->gen;
            pthread_cond_broadcast(&o->ev->cv);
            pthread_mutex_unlock(&o->ev->mu);
        }
        free(o);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void enqueue(fstream *s, op *o) {
    __atomic_add_fetch(&g_pending, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&s->mu);
    o->next = NULL;
    if (s->tail) s->tail->next = o; else s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static CUresult f_Init(unsigned f) { (void)f; return 0; }
static CUresult f_GetErrorName(CUresult rc, const char **s) { (void)rc; *s = "FAKE_ERROR"; return 0; }
static CUresult f_DeviceGet(CUdevice *d, int i) { *d = i; return 0; }
static CUresult f_PrimaryRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)(uintptr_t)0x1000; return 0; }
static CUresult f_PrimaryRelease(CUdevice d) { (void)d; return 0; }
static long g_ctx_id = 0x2000;
static CUresult f_CtxCreate(CUcontext *c, unsigned f, CUdevice d) {
    (void)f; (void)d;
    prewarm_step();
    *c = (CUcontext)(uintptr_t)__atomic_add_fetch(&g_ctx_id, 16, __ATOMIC_RELAXED);
    return 0;
}
static CUresult f_CtxDestroy(CUcontext c) { (void)c; return 0; }
static CUresult f_CtxPop(CUcontext *c) { if (c) *c = NULL; return 0; }
static CUresult f_CtxSet(CUcontext c) { (void)c; return 0; }
static CUresult f_MemAlloc(CUdeviceptr *p, size_t n) {
    prewarm_step();
    void *m = malloc(n);
    *p = (CUdeviceptr)(uintptr_t)m;
    return m ? 0 : 2;
}
static CUresult f_MemFree(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
static CUresult f_MemHostAlloc(void **p, size_t n, unsigned f) {
    (void)f;
    prewarm_step();
    *p = malloc(n);
    return *p ? 0 : 2;
}
static CUresult f_MemFreeHost(void *p) { free(p); return 0; }
static CUresult copy_async(void *dst, const void *src, size_t n, CUstream s) {
    if (inject()) return 1; /* refused at issue: nothing queued */
    op *o = calloc(1, sizeof *o);
    o->kind = 0; o->dst = dst; o->src = src; o->n = n;
    enqueue(s, o);
    return 0;
}
static CUresult f_HtoD(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    return copy_async((void *)(uintptr_t)d, s, n, st);
}
static CUresult f_Peer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
    (void)dc; (void)sc;
    return copy_async((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, st);
}
static CUresult f_StreamCreate(CUstream *out, unsigned f) {
    (void)f;
    fstream *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->th, NULL, stream_main, s);
    *out = s;
    return 0;
}
static CUresult f_StreamSync(CUstream st) {
    fstream *s = st;
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return 0;
}
static CUresult f_StreamDestroy(CUstream st) {
    fstream *s = st;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return 0;
}
static CUresult f_EventCreate(CUevent *out, unsigned f) {
    (void)f;
    fev *e = calloc(1, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    *out = e;
    return 0;
}
static CUresult f_EventDestroy(CUevent ev) {
    fev *e = ev;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    return 0;
}
static CUresult f_EventRecord(CUevent ev, CUstream st) {
    fev *e = ev;
    op *o = calloc(1, sizeof *o);
    o->kind = 1; o->ev = e;
    pthread_mutex_lock(&e->mu);
    o->gen = ++e->rec;
    pthread_mutex_unlock(&e->mu);
    enqueue(st, o);
    return 0;
}
static CUresult f_EventSync(CUevent ev) {
    fev *e = ev;
    pthread_mutex_lock(&e->mu);
    while (e->done < e->rec) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return inject() ? 3 : 0; /* an error reported after the work completed */
}

static void fill(void) {
    cu.Init = f_Init;
    cu.GetErrorName = f_GetErrorName;
    cu.DeviceGet = f_DeviceGet;
    cu.DevicePrimaryCtxRetain = f_PrimaryRetain;
    cu.DevicePrimaryCtxRelease = f_PrimaryRelease;
    cu.CtxCreate = f_CtxCreate;
    cu.CtxDestroy = f_CtxDestroy;
    cu.CtxPopCurrent = f_CtxPop;
    cu.CtxSetCurrent = f_CtxSet;
    cu.MemAlloc = f_MemAlloc;
    cu.MemFree = f_MemFree;
    cu.MemHostAlloc = f_MemHostAlloc;
    cu.MemFreeHost = f_MemFreeHost;
    cu.MemcpyHtoDAsync = f_HtoD;
    cu.MemcpyPeerAsync = f_Peer;
    cu.StreamCreate = f_StreamCreate;
    cu.StreamDestroy = f_StreamDestroy;
    cu.StreamSynchronize = f_StreamSync;
    cu.EventCreate = f_EventCreate;
    cu.EventDestroy = f_EventDestroy;
    cu.EventRecord = f_EventRecord;
    cu.EventSynchronize = f_EventSync;
}

int cu_open(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill);
    return 0;
}
