/*
 * A fake libnccl for the emulator's CPU tests (tests/test_emulator_nccl_cpu.py builds it as libnccl.so.2).
 *
 * A communicator of n ranks whose every rank holds the same data: a sum all-reduce gives n x the input, an
 * all-gather n copies, a reduce-scatter n x this rank's slice; a send lands in a mailbox a recv empties. Buffers
 * are host memory (the fake driver's device memory is). Each operation is counted, so a test can tell that the
 * hook reached the real entry point exactly once per call; groups are counted likewise.
 *
 * As the real one, an operation may launch its kernel through the driver entry point it was handed (the
 * interposer's hooked cuLaunchKernel, as NCCL gets it through cuGetProcAddress): fake_nccl_launch_with. Then each
 * operation launches two 1-us kernels on its stream (or the stream given), at its call or, grouped, at the
 * outermost group end (there the last queued first); on another thread, as a non-blocking communicator's launch
 * is (returning ncclInProgress); or none. Around its first launch it notes the fake driver's last wait kernel, so
 * a test can tell where the interposer queued the operation's wait. fake_nccl_fail_next: the next operation
 * returns that error and launches nothing.
 *
 * FAKE_NCCL_RENDEZVOUS=FILE (a multi-process test's ranks, one file a job): each all-reduce waits in its call until
 * every rank of the communicator has made as many, as a real one's kernel waits for the last rank. Without it no
 * rank waits for another, and a rank that falls behind stays behind.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct { int nranks, rank; long long *calls; } comm; /* calls: FAKE_NCCL_RENDEZVOUS's, one count a rank */
typedef struct { char internal[128]; } ncclUniqueId;

static long long g_ops, g_group_starts, g_group_ends;
static unsigned char g_mail[1 << 20];
static size_t g_mail_n;

static size_t tsize(int t) {
    static const unsigned char k[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return t >= 0 && t < 12 ? k[t] : 0;
}

/* dst = src x n, elementwise, for the types the tests use (int8/uint8, int32, float32); others copied */
static void times(void *dst, const void *src, size_t count, int t, int n) {
    if (t == 2) for (size_t i = 0; i < count; i++) ((int32_t *)dst)[i] = ((const int32_t *)src)[i] * n;
    else if (t == 7) for (size_t i = 0; i < count; i++) ((float *)dst)[i] = ((const float *)src)[i] * (float)n;
    else if (t == 0 || t == 1) for (size_t i = 0; i < count; i++) ((uint8_t *)dst)[i] = (uint8_t)(((const uint8_t *)src)[i] * n);
    else memmove(dst, src, count * tsize(t));
}

/* ---- kernel launches ---- */
enum { NO_KERNEL, KERNEL, KERNEL_ELSEWHERE };
typedef int launch_fn(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                      void **);
static launch_fn *g_launch;
static unsigned long long (*g_last_spin)(void);
static void *g_launch_stream;
static int g_mode, g_fail_rc, g_depth, g_nheld;
static void *g_held[64];
static unsigned long long g_spin_entry, g_spin_before, g_spin_after;
static char g_kernel; /* its handle: not the fake driver's wait kernel */

void fake_nccl_launch_with(void *launch, void *last_spin, void *stream, int mode) {
    g_launch = (launch_fn *)launch, g_last_spin = (unsigned long long (*)(void))last_spin;
    g_launch_stream = stream, g_mode = mode, g_depth = g_nheld = 0;
}
void fake_nccl_fail_next(int rc) { g_fail_rc = rc; }
/* the fake driver's last wait (ns) as the last operation began, just before its first launch, just after it */
unsigned long long fake_nccl_spin_seen(int when) {
    return when == 0 ? g_spin_entry : when == 1 ? g_spin_before : g_spin_after;
}

static unsigned long long last_spin(void) { return g_last_spin ? g_last_spin() : 0; }
static int g_noted; /* the first launch of the operation (or group) noted the wait kernel around it */
static void note_anew(void) { g_noted = 0, g_spin_before = g_spin_after = 0; }
static void *launch_on(void *st) {
    for (int k = 0; k < 2; k++) {
        int note = !g_noted;
        g_noted = 1;
        if (note) g_spin_before = last_spin();
        g_launch(&g_kernel, 1, 1, 1, 1, 1, 1, 0, g_launch_stream ? g_launch_stream : st, NULL, NULL);
        if (note) g_spin_after = last_spin();
    }
    return NULL;
}
static void launch(void *st) {
    if (g_mode == KERNEL) launch_on(st);
    else if (g_mode == KERNEL_ELSEWHERE) {
        pthread_t t;
        if (pthread_create(&t, NULL, launch_on, st) == 0) pthread_join(t, NULL);
    }
}
/* an operation issued: its error, or 0 with its kernel launched (or held for the group's end) */
static int issue(void *st) {
    g_ops++;
    g_spin_entry = last_spin();
    int rc = g_fail_rc;
    g_fail_rc = 0;
    if (rc || !g_launch) return rc;
    if (g_depth > 0) {
        if (g_nheld < 64) g_held[g_nheld++] = st;
    } else note_anew(), launch(st);
    return 0;
}
/* what a queued operation returns: in progress where its launch is another thread's */
static int queued(void) { return g_launch && g_mode == KERNEL_ELSEWHERE && g_depth == 0 ? 7 : 0; }
#define ISSUE(st)                  \
    do {                           \
        int rc_ = issue(st);       \
        if (rc_) return rc_;       \
    } while (0)

int ncclCommInitRank(comm **c, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    if (!(*c = malloc(sizeof **c))) return 1;
    (*c)->nranks = nranks, (*c)->rank = rank, (*c)->calls = NULL;
    const char *path = getenv("FAKE_NCCL_RENDEZVOUS");
    if (path && nranks > 1) {
        size_t len = (size_t)nranks * sizeof(long long);
        int fd = open(path, O_RDWR | O_CREAT, 0600);
        void *m = MAP_FAILED;
        if (fd >= 0 && ftruncate(fd, (off_t)len) == 0) m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0) close(fd);
        if (m == MAP_FAILED) return free(*c), 2;
        (*c)->calls = m;
    }
    return 0;
}
/* FAKE_NCCL_RENDEZVOUS: this rank's all-reduce counted, then a wait for every rank's (10 s at most: an error) */
static int rendezvous(comm *c) {
    if (!c->calls) return 0;
    long long mine = __atomic_add_fetch(&c->calls[c->rank], 1, __ATOMIC_SEQ_CST);
    struct timespec pause = {0, 20000};
    for (int spins = 0; spins < 500000; spins++) {
        int behind = 0;
        for (int r = 0; r < c->nranks; r++) behind |= __atomic_load_n(&c->calls[r], __ATOMIC_SEQ_CST) < mine;
        if (!behind) return 0;
        nanosleep(&pause, NULL);
    }
    return 5;
}
int ncclCommCount(const comm *c, int *n) { if (!c) return 4; *n = c->nranks; return 0; }
int ncclCommUserRank(const comm *c, int *r) { if (!c) return 4; *r = c->rank; return 0; }
int ncclCommDestroy(comm *c) {
    if (c && c->calls) munmap(c->calls, (size_t)c->nranks * sizeof(long long));
    free(c);
    return 0;
}

int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, comm *c, void *st) {
    if (rendezvous(c)) return 5;
    ISSUE(st);
    if (op == 0) times(r, s, n, t, c->nranks); else memmove(r, s, n * tsize(t));
    return queued();
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, comm *c, void *st) {
    (void)op;
    ISSUE(st);
    times(r, (const char *)s + (size_t)c->rank * n * tsize(t), n, t, c->nranks);
    return queued();
}
int ncclAllGather(const void *s, void *r, size_t n, int t, comm *c, void *st) {
    ISSUE(st);
    for (int k = 0; k < c->nranks; k++) memmove((char *)r + (size_t)k * n * tsize(t), s, n * tsize(t));
    return queued();
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
    (void)root; (void)c;
    ISSUE(st);
    memmove(r, s, n * tsize(t));
    return queued();
}
/* As the real one (NCCL 2.28): ncclBcast is ncclBroadcast in place, called through the PLT, so a preloaded
 * interposer sees that inner call too */
int ncclBcast(void *b, size_t n, int t, int root, comm *c, void *st) { return ncclBroadcast(b, b, n, t, root, c, st); }
int ncclAlltoAll(const void *s, void *r, size_t n, int t, comm *c, void *st) {
    ISSUE(st);
    for (int k = 0; k < c->nranks; k++) memmove((char *)r + (size_t)k * n * tsize(t), (const char *)s + (size_t)c->rank * n * tsize(t), n * tsize(t));
    return queued();
}
int ncclGather(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
    (void)root;
    ISSUE(st);
    for (int k = 0; k < c->nranks; k++) memmove((char *)r + (size_t)k * n * tsize(t), s, n * tsize(t));
    return queued();
}
int ncclScatter(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
    (void)root;
    ISSUE(st);
    memmove(r, (const char *)s + (size_t)c->rank * n * tsize(t), n * tsize(t));
    return queued();
}
int ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, comm *c, void *st) {
    (void)root;
    ISSUE(st);
    if (op == 0) times(r, s, n, t, c->nranks); else memmove(r, s, n * tsize(t));
    return queued();
}
int ncclSend(const void *s, size_t n, int t, int peer, comm *c, void *st) {
    (void)peer; (void)c;
    ISSUE(st);
    g_mail_n = n * tsize(t) < sizeof g_mail ? n * tsize(t) : sizeof g_mail;
    memcpy(g_mail, s, g_mail_n);
    return queued();
}
int ncclRecv(void *r, size_t n, int t, int peer, comm *c, void *st) {
    (void)peer; (void)c;
    ISSUE(st);
    size_t want = n * tsize(t);
    memcpy(r, g_mail, want < g_mail_n ? want : g_mail_n);
    return queued();
}
int ncclGroupStart(void) { g_group_starts++; g_depth++; return 0; }
int ncclGroupEnd(void) {
    g_group_ends++;
    if (g_depth > 0 && --g_depth == 0) {
        int n = g_nheld;
        g_nheld = 0;
        note_anew();
        while (n > 0) launch(g_held[--n]);
        if (g_launch && g_mode == KERNEL_ELSEWHERE) return 7;
    }
    return 0;
}
int ncclGroupSimulateEnd(void *info) {
    (void)info;
    g_group_ends++;
    if (g_depth > 0 && --g_depth == 0) g_nheld = 0; /* runs nothing */
    return 0;
}

long long fake_nccl_ops(void) { return g_ops; }
long long fake_nccl_groups(void) { return g_group_starts * 1000 + g_group_ends; }
