/*
 * Accounting: a CSV line per crossing (when a trace prefix is set) and
 * counters per hooked entry point, summarised as JSON when the process ends.
 * Files are <prefix>.<pid>.csv and <prefix>.<pid>.summary.json, so processes
 * (and forked children) never share one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "emu.h"

#define MAX_API 160
static _Atomic uint64_t g_calls[MAX_API];
static struct { _Atomic uint64_t count, bytes, blocked_ns, cipher_bytes; } g_stat[2][2];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_csv;
static pid_t g_pid;
static char g_prefix[512];
static char g_csv_path[600];

/* A trace that cannot be written is said once, not lost silently; err is the errno of the failure. */
static void write_failed(const char *what, const char *path, int err) {
    fprintf(stderr, "ccbridge emulator: cannot write trace %s%s: %s\n", what, path, strerror(err));
}

/* g_mu held: stop the CSV after a failed write (the summary is still written at exit). */
static void csv_check(int written) {
    if (written >= 0 && !ferror(g_csv)) return;
    write_failed("", g_csv_path, errno ? errno : EIO);
    fclose(g_csv);
    g_csv = NULL;
    g_pid = -1; /* no reopening: this process's CSV is off */
}

void emu_count(int api) {
    if (api >= 0 && api < MAX_API) atomic_fetch_add_explicit(&g_calls[api], 1, memory_order_relaxed);
}

uint64_t emu_calls(int api) { return api >= 0 && api < MAX_API ? atomic_load(&g_calls[api]) : 0; }

void emu_stat_add(int dir, int mem, size_t bytes, uint64_t blocked_ns, uint64_t cipher_bytes) {
    atomic_fetch_add(&g_stat[dir][mem].cipher_bytes, cipher_bytes);
    atomic_fetch_add(&g_stat[dir][mem].count, 1);
    atomic_fetch_add(&g_stat[dir][mem].bytes, bytes);
    atomic_fetch_add(&g_stat[dir][mem].blocked_ns, blocked_ns);
}

static void open_csv(void) { /* g_mu held */
    g_pid = getpid();
    snprintf(g_csv_path, sizeof g_csv_path, "%s.%d.csv", g_prefix, (int)g_pid);
    g_csv = fopen(g_csv_path, "w");
    if (!g_csv) {
        write_failed("", g_csv_path, errno);
        g_pid = -1;
        return;
    }
    errno = 0;
    csv_check(fprintf(g_csv, "t_enter_ns,t_return_ns,tid,ctx,stream,api,dir,mem,bytes,blocked_channel_ns,blocked_stream_ns,toll_ns\n"));
}

static void before_fork(void) { pthread_mutex_lock(&g_mu); if (g_csv) fflush(g_csv); }
static void after_fork_parent(void) { pthread_mutex_unlock(&g_mu); }
static void after_fork_child(void) {
    g_csv = NULL; /* the parent's FILE stays the parent's; the child opens its own on first use */
    g_pid = 0;
    memset(g_calls, 0, sizeof g_calls);
    memset(g_stat, 0, sizeof g_stat);
    pthread_mutex_unlock(&g_mu);
}

/* g_mu held: this process's CSV, if open, closed (a late write error reported); the next crossing opens one again */
static void close_csv(void) {
    if (g_csv && g_pid == getpid()) {
        errno = 0;
        if (fclose(g_csv) != 0) write_failed("", g_csv_path, errno ? errno : EIO);
    }
    g_csv = NULL;
    g_pid = 0;
}

/* Start tracing to prefix ("" = off), ending the CSV of an earlier trace (tests re-initialise). */
void emu_trace_open(const char *prefix) {
    pthread_mutex_lock(&g_mu);
    close_csv();
    snprintf(g_prefix, sizeof g_prefix, "%s", prefix);
    static int registered;
    if (!registered++) pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    pthread_mutex_unlock(&g_mu);
}

void emu_trace_crossing(const emu_record *r) {
    if (!g_prefix[0]) return;
    pthread_mutex_lock(&g_mu);
    pid_t pid = getpid();
    if (g_pid != pid && g_pid != -1) open_csv(); /* first crossing of this process (-1: its CSV failed) */
    errno = 0;
    if (g_csv && g_pid == pid)
        csv_check(fprintf(g_csv, "%llu,%llu,%ld,%p,%p,%s,%s,%s,%zu,%llu,%llu,%llu\n", (unsigned long long)r->t_enter,
                (unsigned long long)r->t_return, (long)syscall(SYS_gettid), r->ctx, r->stream, emu_api_name(r->api),
                r->dir == DIR_H2D ? "h2d" : "d2h", r->mem == MEM_PINNED ? "pinned" : "pageable", r->bytes,
                (unsigned long long)r->blocked_channel_ns, (unsigned long long)r->blocked_stream_ns,
                (unsigned long long)r->toll_ns));
    pthread_mutex_unlock(&g_mu);
}

int emu_summary_json(char *buf, size_t len) {
    size_t n = 0;
#define PUT(...) do { int k_ = snprintf(buf + n, n < len ? len - n : 0, __VA_ARGS__); if (k_ > 0) n += (size_t)k_; } while (0)
    PUT("{\"pid\": %d, \"profile\": \"%s\", \"emulate\": %d, \"calls\": {", (int)getpid(), cfg.profile, cfg.emulate);
    int first = 1;
    for (int i = 0; i < MAX_API; i++) {
        uint64_t c = atomic_load(&g_calls[i]);
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
    PUT("}}\n");
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
    pthread_mutex_lock(&g_mu);
    if (g_prefix[0]) {
        write_summary();
        close_csv();
    }
    pthread_mutex_unlock(&g_mu);
}

void emu_stats_reset(void) {
    memset(g_calls, 0, sizeof g_calls);
    memset(g_stat, 0, sizeof g_stat);
}
