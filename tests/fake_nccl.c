/*
 * A fake libnccl for the emulator's CPU tests (tests/test_emulator_nccl_cpu.py builds it as libnccl.so.2).
 *
 * A communicator of n ranks whose every rank holds the same data: a sum all-reduce gives n x the input, an
 * all-gather n copies, a reduce-scatter n x this rank's slice; a send lands in a mailbox a recv empties. Buffers
 * are host memory (the fake driver's device memory is). Each operation is counted, so a test can tell that the
 * hook reached the real entry point exactly once per call; groups are counted likewise.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int nranks, rank; } comm;
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

int ncclCommInitRank(comm **c, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    if (!(*c = malloc(sizeof **c))) return 1;
    (*c)->nranks = nranks, (*c)->rank = rank;
    return 0;
}
int ncclCommCount(const comm *c, int *n) { if (!c) return 4; *n = c->nranks; return 0; }
int ncclCommUserRank(const comm *c, int *r) { if (!c) return 4; *r = c->rank; return 0; }
int ncclCommDestroy(comm *c) { free(c); return 0; }

int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, comm *c, void *st) {
    (void)st;
    g_ops++;
    if (op == 0) times(r, s, n, t, c->nranks); else memmove(r, s, n * tsize(t));
    return 0;
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, comm *c, void *st) {
    (void)st; (void)op;
    g_ops++;
    times(r, (const char *)s + (size_t)c->rank * n * tsize(t), n, t, c->nranks);
    return 0;
}
int ncclAllGather(const void *s, void *r, size_t n, int t, comm *c, void *st) {
    (void)st;
    g_ops++;
    for (int k = 0; k < c->nranks; k++) memmove((char *)r + (size_t)k * n * tsize(t), s, n * tsize(t));
    return 0;
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
    (void)root; (void)c; (void)st;
    g_ops++;
    memmove(r, s, n * tsize(t));
    return 0;
}
/* As the real one (NCCL 2.28): ncclBcast is ncclBroadcast in place, called through the PLT, so a preloaded
 * interposer sees that inner call too */
int ncclBcast(void *b, size_t n, int t, int root, comm *c, void *st) { return ncclBroadcast(b, b, n, t, root, c, st); }
int ncclAlltoAll(const void *s, void *r, size_t n, int t, comm *c, void *st) {
    (void)st;
    g_ops++;
    for (int k = 0; k < c->nranks; k++) memmove((char *)r + (size_t)k * n * tsize(t), (const char *)s + (size_t)c->rank * n * tsize(t), n * tsize(t));
    return 0;
}
int ncclGather(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
    (void)root; (void)st;
    g_ops++;
    for (int k = 0; k < c->nranks; k++) memmove((char *)r + (size_t)k * n * tsize(t), s, n * tsize(t));
    return 0;
}
int ncclScatter(const void *s, void *r, size_t n, int t, int root, comm *c, void *st) {
    (void)root; (void)st;
    g_ops++;
    memmove(r, (const char *)s + (size_t)c->rank * n * tsize(t), n * tsize(t));
    return 0;
}
int ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, comm *c, void *st) {
    (void)root; (void)st;
    g_ops++;
    if (op == 0) times(r, s, n, t, c->nranks); else memmove(r, s, n * tsize(t));
    return 0;
}
int ncclSend(const void *s, size_t n, int t, int peer, comm *c, void *st) {
    (void)peer; (void)c; (void)st;
    g_ops++;
    g_mail_n = n * tsize(t) < sizeof g_mail ? n * tsize(t) : sizeof g_mail;
    memcpy(g_mail, s, g_mail_n);
    return 0;
}
int ncclRecv(void *r, size_t n, int t, int peer, comm *c, void *st) {
    (void)peer; (void)c; (void)st;
    g_ops++;
    size_t want = n * tsize(t);
    memcpy(r, g_mail, want < g_mail_n ? want : g_mail_n);
    return 0;
}
int ncclGroupStart(void) { g_group_starts++; return 0; }
int ncclGroupEnd(void) { g_group_ends++; return 0; }
int ncclGroupSimulateEnd(void *info) { (void)info; g_group_ends++; return 0; }

long long fake_nccl_ops(void) { return g_ops; }
long long fake_nccl_groups(void) { return g_group_starts * 1000 + g_group_ends; }
