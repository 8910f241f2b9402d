/*
 * What the host side of a load can do without the GPU: the page cache into
 * staging buffers, by T threads claiming chunks of the files in order (as the
 * loader's workers do), each with two staging buffers used in turn.
 *
 *   cc -O2 -pthread -o /tmp/host_read bench/host_read.c
 *   /tmp/host_read MODE THREADS CHUNK_MIB FILE...      one JSON line
 *
 * MODE: pread   pread into the buffers
 *       mmap    MADV_POPULATE_READ a chunk of the file's mapping, memcpy it
 *       mem     memcpy from an anonymous buffer as large as the files (the
 *               machine's copy bandwidth, no page cache)
 * and "+thp" to stage in transparent huge pages (else 4 KiB pages, as
 * cuMemHostAlloc gives), e.g. pread+thp. The files should be in the page
 * cache (read them once first).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define MAX_FILES 64

enum { PREAD, MMAP, MEM };
static const char *modes[] = {"pread", "mmap", "mem"};
static int mode = -1, huge, nfiles;
static size_t chunk;
static int fds[MAX_FILES];
static size_t sizes[MAX_FILES];
static char *maps[MAX_FILES];
static size_t nchunks, starts[MAX_FILES + 1]; /* chunk index where file i begins */
static size_t next_chunk;
static pthread_barrier_t ready; /* the clock starts once every thread has its buffers */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static char *buffer(size_t n, int thp) {
    size_t align = thp ? 2u << 20 : 4096;
    n = (n + align - 1) / align * align;
    char *p = aligned_alloc(align, n);
    if (!p) die("aligned_alloc");
    if (madvise(p, n, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0) die("madvise");
    memset(p, 1, n);
    return p;
}

static void *worker(void *arg) {
    (void)arg;
    char *buf[2] = {buffer(chunk, huge), buffer(chunk, huge)};
    pthread_barrier_wait(&ready);
    for (int k = 0;; k ^= 1) {
        size_t i = __atomic_fetch_add(&next_chunk, 1, __ATOMIC_RELAXED);
        if (i >= nchunks) break;
        int f = 0;
        while (i >= starts[f + 1]) f++;
        size_t off = (i - starts[f]) * chunk, n = sizes[f] - off < chunk ? sizes[f] - off : chunk;
        if (mode == PREAD) {
            for (size_t got = 0; got < n;) {
                ssize_t r = pread(fds[f], buf[k] + got, n - got, (off_t)(off + got));
                if (r <= 0) die("pread");
                got += (size_t)r;
            }
        } else {
            if (mode == MMAP && madvise(maps[f] + off, n, MADV_POPULATE_READ) != 0) die("MADV_POPULATE_READ");
            memcpy(buf[k], maps[f] + off, n);
        }
    }
    free(buf[0]);
    free(buf[1]);
    return NULL;
}

int main(int argc, char **argv) {
    size_t len = argc > 1 ? strcspn(argv[1], "+") : 0;
    if (argc > 1) {
        huge = strcmp(argv[1] + len, "+thp") == 0;
        for (int m = 0; m < 3 && (huge || argv[1][len] == 0); m++)
            if (strlen(modes[m]) == len && strncmp(argv[1], modes[m], len) == 0) mode = m;
    }
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    chunk = argc > 3 ? (size_t)atoi(argv[3]) << 20 : 0;
    if (argc < 5 || mode < 0 || threads < 1 || threads > 256 || chunk == 0) {
        fprintf(stderr, "usage: %s pread|mmap|mem[+thp] THREADS(1-256) CHUNK_MIB FILE...\n", argv[0]);
        return 2;
    }
    size_t total = 0;
    for (int i = 4; i < argc; i++, nfiles++) {
        struct stat st;
        if (nfiles == MAX_FILES) { fprintf(stderr, "at most %d files\n", MAX_FILES); return 2; }
        if ((fds[nfiles] = open(argv[i], O_RDONLY)) < 0 || fstat(fds[nfiles], &st) != 0) die(argv[i]);
        sizes[nfiles] = (size_t)st.st_size;
        starts[nfiles] = nchunks;
        nchunks += (sizes[nfiles] + chunk - 1) / chunk;
        total += sizes[nfiles];
        if (mode == MMAP && (maps[nfiles] = mmap(NULL, sizes[nfiles], PROT_READ, MAP_SHARED, fds[nfiles], 0)) == MAP_FAILED)
            die("mmap");
        if (mode == MEM) maps[nfiles] = buffer(sizes[nfiles], 1);
    }
    starts[nfiles] = nchunks;
    pthread_t t[256];
    pthread_barrier_init(&ready, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, worker, NULL) != 0) die("pthread_create");
    pthread_barrier_wait(&ready);
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    double dt = now() - t0;
    printf("{\"mode\": \"%s%s\", \"threads\": %d, \"chunk_mib\": %zu, \"bytes\": %zu, \"s\": %.4f, \"gbps\": %.2f}\n",
           modes[mode], huge ? "+thp" : "", threads, chunk >> 20, total, dt, total / dt / 1e9);
    return 0;
}
