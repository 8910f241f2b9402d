/*
 * Clocks and waits, and the machine-wide bridge.
 *
 * Every process of a machine shares the guest's bounce-buffer path, so the
 * bridge's aggregate ceiling is one resource for all of them: a page of
 * shared memory holds, per direction, the time at which the bridge is next
 * free, and a crossing reserves its share of it with one compare-and-swap.
 * A third timeline holds the context lifecycle tolls, which are paid one at a
 * time machine-wide (EMU_LIFECYCLE in emu.h says why).
 * CLOCK_MONOTONIC is the same clock in every process.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

uint64_t emu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeping is coarse (timer slack); the last 150 us are spun. */
void emu_wait_until(uint64_t deadline) {
    const uint64_t spin = 150000;
    uint64_t now = emu_now();
    if (now + spin < deadline) {
        uint64_t t = deadline - spin;
        struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
        }
    }
    while (emu_now() < deadline) {
    }
}

uint64_t emu_ns(double ns) { return ns > 0 ? ns < (double)EMU_NS_MAX ? (uint64_t)ns : EMU_NS_MAX : 0; }

void emu_spin_for(uint64_t ns) {
    if (ns) emu_wait_until(emu_now() + ns);
}

typedef struct { _Atomic uint64_t free_at[3]; } bus_page;
static bus_page *g_bus;
static bus_page g_local_bus; /* if shared memory is unavailable: this process only */
static pthread_once_t g_bus_once = PTHREAD_ONCE_INIT;

static int g_bus_local_only;
void emu_bus_local(void) { /* tests: a bus of this process alone, starting free */
    g_bus_local_only = 1;
    g_bus = &g_local_bus;
    for (int i = 0; i < 3; i++) atomic_store(&g_local_bus.free_at[i], 0);
}

static void bus_open(void) {
    if (g_bus_local_only) return;
    char name[64];
    snprintf(name, sizeof name, "/ccbridge-emu-bus-%u", (unsigned)getuid());
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, sizeof(bus_page)) == 0) {
        void *p = mmap(NULL, sizeof(bus_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) g_bus = p;
    }
    if (fd >= 0) close(fd);
    if (!g_bus) {
        fprintf(stderr, "ccbridge emulator: no shared memory for the machine-wide bridge; "
                        "its ceiling applies per process\n");
        g_bus = &g_local_bus;
    }
}

uint64_t emu_bus_reserve(int dir, uint64_t from, uint64_t ns) {
    pthread_once(&g_bus_once, bus_open);
    uint64_t old = atomic_load(&g_bus->free_at[dir]);
    for (;;) {
        uint64_t start = old > from ? old : from;
        if (atomic_compare_exchange_weak(&g_bus->free_at[dir], &old, start + ns)) return start + ns;
    }
}


double emu_chan_gbps(int dir, int mem) {
    double g = cfg.chan_gbps[dir][mem], floor = mem == MEM_PINNED ? cfg.native_pinned_gbps[dir] * cfg.cc_ratio[dir][mem] : 0;
    return g > 0 && floor > 0 && floor < g ? floor : g;
}

static uint64_t g_submitted;        /* submissions of this process, counted */
static __thread uint64_t t_seen;    /* g_submitted at this thread's last round trip */
void emu_work_submitted(void) { __atomic_fetch_add(&g_submitted, 1, __ATOMIC_RELAXED); }
uint64_t emu_roundtrip_due(int always) {
    uint64_t now = __atomic_load_n(&g_submitted, __ATOMIC_RELAXED);
    int was = now != t_seen;
    t_seen = now;
    if (!emu_on() || !(was || always)) return 0;
    return emu_ns(cfg.sync_toll_ns);
}
uint64_t emu_roundtrip(int always) {
    uint64_t ns = emu_roundtrip_due(always);
    if (ns) emu_spin_for(ns);
    return ns;
}
