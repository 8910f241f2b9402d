/*
 * Accounting: a CSV line per crossing, launch and synchronize (when a trace
 * prefix is set: ccbridge run --record) and counters per hooked entry point,
 * summarised as JSON when the process ends. Files are <prefix>.<pid>.csv and
 * <prefix>.<pid>.summary.json, so processes (and forked children) never share one.
 *
 * The CSV's schema is EMU_TRACE_SCHEMA / EMU_TRACE_COLUMNS (emu.h), the same
 * for record-only, emulated and real CC-on runs; emulate/trace.py reads it
 * and tests/test_trace_schema.py holds the two together.
 *
 * The launch path must stay cheap (record-only overhead: <= 2% on GPU-bound
 * work, <= 5% on an eager decode loop): each thread formats its lines into a
 * buffer of its own with no lock and no syscall, and writes the buffer with
 * one write() (O_APPEND) when it fills, when the thread ends and at exit.
 * The one atomic flag per buffer only keeps the exit flush from tearing a
 * line that its thread is writing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "emu.h"

#define MAX_API 160
/* Calls per hook row, in shards a cache line apart: threads that call the same hook at once (one thread per GPU
 * issuing its all_reduce) would otherwise pass one cache line between cores on every call. A thread's shard comes
 * from its stack's address (threads' stacks lie megabytes apart): no thread-local lookup. */
#define CALL_SHARDS 16
static struct { _Atomic uint64_t n[MAX_API]; } __attribute__((aligned(64))) g_calls[CALL_SHARDS];
static unsigned call_shard(void) {
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0) >> 20;
    return (unsigned)((sp * 0x9E3779B97F4A7C15ull) >> 60) % CALL_SHARDS;
}
static struct { _Atomic uint64_t count, bytes, blocked_ns, cipher_bytes; } g_stat[2][2];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the file */
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER; /* the buffer registry; order: g_reg_mu, a buffer's mu, g_mu */
static int g_opened; /* this process has opened its CSV (a reopen appends) */
static char g_prefix[512];
static char g_csv_path[600];
static int g_fd = -1;
static int g_failed;              /* this process's CSV failed: no more lines */
static _Atomic unsigned g_gen;    /* bumped by fork (in the child) and by every (re)open of a trace */
int emu_tracing;                  /* a trace prefix is set and not paused: record (atomic loads and stores) */

/* A trace that cannot be written is said once, not lost silently; err is the errno of the failure. */
static void write_failed(const char *what, const char *path, int err) {
    fprintf(stderr, "ccbridge emulator: cannot write trace %s%s: %s\n", what, path, strerror(err));
}

void emu_count(int api) {
    if (api >= 0 && api < MAX_API) atomic_fetch_add_explicit(&g_calls[call_shard()].n[api], 1, memory_order_relaxed);
}

uint64_t emu_calls(int api) {
    uint64_t sum = 0;
    for (int s = 0; api >= 0 && api < MAX_API && s < CALL_SHARDS; s++) sum += atomic_load(&g_calls[s].n[api]);
    return sum;
}

void emu_stat_add(int dir, int mem, size_t bytes, uint64_t blocked_ns, uint64_t cipher_bytes) {
    atomic_fetch_add(&g_stat[dir][mem].cipher_bytes, cipher_bytes);
    atomic_fetch_add(&g_stat[dir][mem].count, 1);
    atomic_fetch_add(&g_stat[dir][mem].bytes, bytes);
    atomic_fetch_add(&g_stat[dir][mem].blocked_ns, blocked_ns);
}

/* ---- the file: opened by the first flush of each process ---- */
static int write_all(const char *p, size_t n) { /* g_mu held; 0 or an errno */
    while (n) {
        ssize_t k = write(g_fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : EIO;
        p += k, n -= (size_t)k;
    }
    return 0;
}

static void fail_csv(int err) { /* g_mu held */
    write_failed("", g_csv_path, err);
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
    g_failed = 1;
}

static int open_csv(void) { /* g_mu held; 0 when the file is ready */
    if (g_fd >= 0 || g_failed || !g_prefix[0]) return g_fd >= 0 ? 0 : -1;
    snprintf(g_csv_path, sizeof g_csv_path, "%s.%d.csv", g_prefix, (int)getpid());
    g_fd = open(g_csv_path, (g_opened++ ? 0 : O_TRUNC) | O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_fd < 0) { fail_csv(errno); return -1; }
    char head[256];
    int n = snprintf(head, sizeof head, "# ccbridge trace schema %d, profile %s, emulate %d\n%s\n", EMU_TRACE_SCHEMA,
                     cfg.profile, cfg.emulate, EMU_TRACE_COLUMNS);
    int err = write_all(head, (size_t)n);
    if (err) { fail_csv(err); return -1; }
    return 0;
}

static void csv_write(const char *p, size_t n) {
    pthread_mutex_lock(&g_mu);
    if (open_csv() == 0) {
        int err = write_all(p, n);
        if (err) fail_csv(err);
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- per-thread buffers ---- */
#define TBUF_BYTES (64 << 10)
#define LINE_MAX_BYTES 400 /* a line's most bytes: 14 numbers, two pointers, a hook name */
#define MAX_THREADS 1024
typedef struct {
    pthread_mutex_t mu;
    unsigned gen;
    long tid;
    size_t n;
    char data[TBUF_BYTES];
} tbuf;
static tbuf *g_bufs[MAX_THREADS]; /* g_mu */
static __thread tbuf *t_buf;
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

static void flush_buf(tbuf *b) { /* the caller owns b (busy) */
    if (b->n) csv_write(b->data, b->n);
    b->n = 0;
}

static void thread_end(void *p) {
    tbuf *b = p;
    pthread_mutex_lock(&g_reg_mu); /* flush_all holds it while it touches any buffer */
    for (int i = 0; i < MAX_THREADS; i++) if (g_bufs[i] == b) g_bufs[i] = NULL;
    pthread_mutex_unlock(&g_reg_mu);
    pthread_mutex_lock(&b->mu);
    if (b->gen == atomic_load(&g_gen)) flush_buf(b);
    pthread_mutex_unlock(&b->mu);
    free(b);
    t_buf = NULL;
}
static void make_key(void) { pthread_key_create(&g_key, thread_end); }

/* This thread's buffer, registered; NULL if none can be had (the line is then written directly). */
static tbuf *my_buf(void) {
    unsigned gen = atomic_load_explicit(&g_gen, memory_order_relaxed);
    if (t_buf && t_buf->gen == gen) return t_buf;
    if (t_buf) { t_buf->n = 0; t_buf->gen = gen; t_buf->tid = syscall(SYS_gettid); } /* inherited by fork, or an old trace's */
    else {
        pthread_once(&g_key_once, make_key);
        if (!(t_buf = calloc(1, sizeof *t_buf))) return NULL;
        pthread_mutex_init(&t_buf->mu, NULL);
        t_buf->gen = gen;
        t_buf->tid = syscall(SYS_gettid);
        pthread_setspecific(g_key, t_buf);
    }
    pthread_mutex_lock(&g_reg_mu);
    int i = 0;
    while (i < MAX_THREADS && g_bufs[i] && g_bufs[i] != t_buf) i++;
    if (i < MAX_THREADS) g_bufs[i] = t_buf;
    pthread_mutex_unlock(&g_reg_mu);
    return t_buf;
}

/* ---- formatting without stdio: this is on every launch ---- */
static char *put_u64(char *o, uint64_t v) {
    char t[20];
    int k = 0;
    do t[k++] = (char)('0' + v % 10); while (v /= 10);
    while (k) *o++ = t[--k];
    return o;
}
static char *put_ptr(char *o, const void *p) { /* 0x... as %p writes it; "" for none */
    uintptr_t v = (uintptr_t)p;
    if (!v) return o;
    char t[16];
    int k = 0;
    while (v) t[k++] = "0123456789abcdef"[v & 15], v >>= 4;
    *o++ = '0', *o++ = 'x';
    while (k) *o++ = t[--k];
    return o;
}
static char *put_str(char *o, const char *s) {
    size_t n = strlen(s);
    if (n > 64) n = 64;
    memcpy(o, s, n);
    return o + n;
}

/* The Python call site the site recorder last noted on this thread: it writes the slot, format() reads
 * it on the same thread, which is inside a driver call and cannot run Python meanwhile. */
static __thread int t_site = -1;
int *ccbemu_site_slot(void) { return &t_site; }

static const char *const kKind[] = {"crossing", "launch", "sync", "context", "alloc", "collective", "mark", "query",
                                    "timing"};
static const char *const kGraph[] = {"", "capture", "replay"};
static size_t format(char *o0, const emu_record *r, long tid) {
    char *o = o0;
    o = put_u64(o, r->t_enter), *o++ = ',';
    o = put_u64(o, r->t_return), *o++ = ',';
    o = put_u64(o, (uint64_t)tid), *o++ = ',';
    o = put_ptr(o, r->ctx), *o++ = ',';
    o = put_ptr(o, r->stream), *o++ = ',';
    o = put_str(o, r->label ? r->label : emu_api_name(r->api) ? emu_api_name(r->api) : "?"), *o++ = ',';
    o = put_str(o, kKind[r->kind]), *o++ = ',';
    if (r->dir >= 0) o = put_str(o, r->dir == DIR_H2D ? "h2d" : "d2h");
    *o++ = ',';
    if (r->dir >= 0 || r->kind == REC_QUERY) o = put_str(o, r->mem == MEM_PINNED ? "pinned" : "pageable");
    *o++ = ',';
    o = put_u64(o, r->bytes), *o++ = ',';
    o = put_u64(o, r->blocked_channel_ns), *o++ = ',';
    o = put_u64(o, r->blocked_stream_ns), *o++ = ',';
    o = put_u64(o, r->toll_ns), *o++ = ',';
    o = put_u64(o, (uint64_t)(unsigned)r->rc), *o++ = ',';
    if (t_site >= 0) o = put_u64(o, (uint64_t)t_site);
    *o++ = ',';
    if (r->kind == REC_COLLECTIVE) o = put_u64(o, (uint64_t)r->ranks);
    *o++ = ',';
    if (r->kind == REC_COLLECTIVE) o = put_u64(o, r->wire_bytes);
    *o++ = ',';
    if (r->kind == REC_COLLECTIVE) o = put_str(o, kGraph[r->graph]);
    *o++ = '\n';
    return (size_t)(o - o0);
}

void emu_trace_record(const emu_record *r) {
    if (!__atomic_load_n(&emu_tracing, __ATOMIC_RELAXED)) return;
    tbuf *b = my_buf();
    if (!b) {
        char line[LINE_MAX_BYTES];
        csv_write(line, format(line, r, syscall(SYS_gettid)));
        return;
    }
    pthread_mutex_lock(&b->mu); /* uncontended but for a flush_all */
    b->n += format(b->data + b->n, r, b->tid);
    if (b->n > TBUF_BYTES - LINE_MAX_BYTES) flush_buf(b);
    pthread_mutex_unlock(&b->mu);
}

/* A name a program writes into its trace (a CSV field): a word of at most 32 letters, digits, '.', '_' or '-'. */
static int trace_name_ok(const char *name) {
    size_t n = name ? strlen(name) : 0;
    return n && n <= 32 && strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

/* A line the program writes itself, from t_enter to now, kind `kind`, api its name. */
static int program_line(const char *name, int kind, uint64_t t_enter) {
    emu_init();
    if (!trace_name_ok(name) || !__atomic_load_n(&emu_tracing, __ATOMIC_RELAXED)) return 0;
    uint64_t t = emu_now();
    if (t_enter > t) return 0;
    emu_record r = {-1, -1, 0, t_enter, t, 0, 0, 0, 0, NULL, NULL, kind, 0};
    r.label = name;
    emu_trace_record(&r);
    return 1;
}

/* A point the program names (Python: ccbridge.mark), e.g. where its steady state begins and ends: account
 * compares each process between its marks. A bad name (trace_name_ok), or no trace being written, writes
 * nothing and answers 0. */
int ccbemu_mark(const char *name) {
    return program_line(name, REC_MARK, emu_now());
}

/* A wait the program did itself, from t_enter (CLOCK_MONOTONIC ns) to now, polling what the driver calls it makes
 * do not show (an event queried between sleeps, so that a dead peer can time out): a sync line named `name`, so
 * that account finds the wait in a call, as it finds a blocking synchronize's. 0 where a mark would write none. */
int ccbemu_waited(const char *name, uint64_t t_enter) {
    return program_line(name, REC_SYNC, t_enter);
}

/* Every thread's lines so far, in the file (exit, tests). */
static void flush_all(void) {
    unsigned gen = atomic_load(&g_gen);
    pthread_mutex_lock(&g_reg_mu);
    for (int i = 0; i < MAX_THREADS; i++) {
        tbuf *b = g_bufs[i];
        if (!b) continue;
        pthread_mutex_lock(&b->mu);
        if (b->gen == gen) flush_buf(b);
        pthread_mutex_unlock(&b->mu);
    }
    pthread_mutex_unlock(&g_reg_mu);
}

static void before_fork(void) { pthread_mutex_lock(&g_reg_mu); pthread_mutex_lock(&g_mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&g_mu); pthread_mutex_unlock(&g_reg_mu); }
static void after_fork_child(void) {
    /* the parent's file and unflushed lines stay the parent's; the child opens its own on its first flush */
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
    g_failed = 0;
    g_opened = 0;
    memset(g_bufs, 0, sizeof g_bufs); /* the other threads are gone; their buffers are the parent's */
    atomic_fetch_add(&g_gen, 1);
    memset(g_calls, 0, sizeof g_calls);
    memset(g_stat, 0, sizeof g_stat);
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_reg_mu);
}

/* g_mu held: this process's CSV, if open, closed; the next flush opens one again */
static void close_csv(void) {
    if (g_fd >= 0 && close(g_fd) != 0) write_failed("", g_csv_path, errno);
    g_fd = -1;
    g_failed = 0;
}

/* Start tracing to prefix ("" = off), ending the CSV of an earlier trace (tests re-initialise). */
void emu_trace_open(const char *prefix) {
    flush_all();
    pthread_mutex_lock(&g_mu);
    close_csv();
    g_opened = 0;
    atomic_fetch_add(&g_gen, 1); /* the buffers start again */
    snprintf(g_prefix, sizeof g_prefix, "%s", prefix);
    __atomic_store_n(&emu_tracing, prefix[0] != 0, __ATOMIC_RELAXED);
    static int registered;
    if (!registered++) pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    pthread_mutex_unlock(&g_mu);
}

/* Recording of a region: paused, hooks write no lines (the trace stays open; the summary's per-hook call
 * counts and crossing totals still count every call). Returns 1 if it was recording. */
int ccbemu_trace_pause(int paused) {
    pthread_mutex_lock(&g_mu);
    int was = __atomic_load_n(&emu_tracing, __ATOMIC_RELAXED);
    __atomic_store_n(&emu_tracing, !paused && g_prefix[0] != 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_mu);
    return was;
}

static int env_int(const char *name, int none) {
    const char *v = getenv(name);
    char *end;
    long k = v && *v ? strtol(v, &end, 10) : -1;
    return v && *v && !*end && k >= 0 && k < 1 << 20 ? (int)k : none;
}

int emu_summary_json(char *buf, size_t len) {
    size_t n = 0;
#define PUT(...) do { int k_ = snprintf(buf + n, n < len ? len - n : 0, __VA_ARGS__); if (k_ > 0) n += (size_t)k_; } while (0)
    PUT("{\"pid\": %d, \"profile\": \"%s\", \"emulate\": %d, \"calls\": {", (int)getpid(), cfg.profile, cfg.emulate);
    int first = 1;
    for (int i = 0; i < MAX_API; i++) {
        uint64_t c = emu_calls(i);
        if (!c || !emu_api_name(i)) continue;
        PUT("%s\"%s\": %llu", first ? "" : ", ", emu_api_name(i), (unsigned long long)c);
        first = 0;
    }
    PUT("}, \"crossings\": {");
    for (int d = 0; d < 2; d++)
        for (int m = 0; m < 2; m++)
            PUT("%s\"%s_%s\": {\"count\": %llu, \"bytes\": %llu, \"blocked_ns\": %llu, \"cipher_bytes\": %llu}", d + m ? ", " : "",
                d == DIR_H2D ? "h2d" : "d2h", m == MEM_PINNED ? "pinned" : "pageable",
                (unsigned long long)atomic_load(&g_stat[d][m].count), (unsigned long long)atomic_load(&g_stat[d][m].bytes),
                (unsigned long long)atomic_load(&g_stat[d][m].blocked_ns), (unsigned long long)atomic_load(&g_stat[d][m].cipher_bytes));
    /* the rank: NCCL's, else the launcher's RANK (torchrun); account pairs a job's processes by it */
    int rank = emu_rank(), world = emu_world();
    if (rank < 0) rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", 0);
    PUT("}, \"rank\": %d, \"ranks\": %d}\n", rank, world);
#undef PUT
    return n < len ? 0 : -1;
}

/* Write <prefix>.<pid>.summary.json; a failure is reported, never silent. */
static void write_summary(void) {
    static char buf[16384];
    char path[600];
    snprintf(path, sizeof path, "%s.%d.summary.json", g_prefix, (int)getpid());
    if (emu_summary_json(buf, sizeof buf) != 0) { write_failed("summary ", path, ENOBUFS); return; }
    FILE *f = fopen(path, "w");
    if (!f) { write_failed("summary ", path, errno); return; }
    errno = 0;
    int bad = fputs(buf, f) == EOF, err = errno;
    if (fclose(f) != 0 && !bad) bad = 1, err = errno;
    if (bad) write_failed("summary ", path, err ? err : EIO);
}

void emu_trace_close(void) {
    if (!g_prefix[0]) return;
    flush_all();
    pthread_mutex_lock(&g_mu);
    write_summary();
    close_csv();
    pthread_mutex_unlock(&g_mu);
}

void emu_stats_reset(void) {
    memset(g_calls, 0, sizeof g_calls);
    memset(g_stat, 0, sizeof g_stat);
}
