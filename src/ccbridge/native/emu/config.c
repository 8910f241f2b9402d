/* Profile parameters: "key=value" lines written by the launcher (ccbridge run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

emu_config cfg;
int emu_paused;

/* For measurements paired within one process (calibrate's framework rows): the same process with and without
 * the bridge's costs, free of the few-us differences between processes. A count of the pauses held, so nested
 * and concurrent regions end only when the last one does; the configuration is loaded first, so a pause taken
 * before the program's first CUDA call answers as the profile says. */
int ccbemu_emulate_pause(int pause) {
    emu_init();
    int was = emu_on();
    if (pause) {
        __atomic_fetch_add(&emu_paused, 1, __ATOMIC_RELAXED);
    } else {
        int n = __atomic_load_n(&emu_paused, __ATOMIC_RELAXED);
        while (n > 0 && !__atomic_compare_exchange_n(&emu_paused, &n, n - 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
    }
    return was;
}

void emu_config_defaults(emu_config *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->profile, "passthrough");
    for (int d = 0; d < 2; d++)
        for (int m = 0; m < 2; m++) c->cc_ratio[d][m] = 1.0;
    c->lanes = 1;
    c->chunk_bytes = 4u << 20;
    c->mgpu_launch_factor = 1.0;
    c->nvlink_kept = 1.0;
    c->nvls = 1;
    c->dilation = 1.0;
}

/* Projection: the emulated costs as the target pays them in dilated time. The floor against this machine's
 * native bandwidth (native x ratio) dilates with the rates: the ratios are divided too. The wait kernel's own
 * dispatch (native_kernel_ns) is this GPU's, not dilated. */
void emu_dilate(emu_config *c) {
    double r = c->dilation;
    if (!(r > 1)) return;
    for (int d = 0; d < 2; d++) {
        c->toll_ns[d] *= r, c->system_gbps[d] /= r;
        for (int m = 0; m < 2; m++) c->chan_gbps[d][m] /= r, c->cc_ratio[d][m] /= r;
    }
    c->launch_toll_ns *= r, c->sync_toll_ns *= r, c->nccl_toll_ns *= r;
    c->ctx_create_ns *= r, c->ctx_destroy_ns *= r, c->host_alloc_toll_ns *= r;
}

/* Host work, dilated: the calling thread's CPU time since its last hooked call returned, stretched to r times
 * (the thread waits (r - 1) x it on entry). Time inside hooked calls is not host work (a synchronize spinning
 * in the driver waits for the GPU), nor are sleeps, I/O and other threads' and processes' work (README). */
static __thread uint64_t t_cpu_mark; /* this thread's CPU ns at its last hooked call's return; 0: none yet */
static uint64_t cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
int emu_dilate_enter(void) {
    if (!(cfg.dilation > 1)) return 0;
    uint64_t now = cpu_now();
    if (t_cpu_mark && now > t_cpu_mark) emu_spin_for(emu_ns((double)(now - t_cpu_mark) * (cfg.dilation - 1)));
    t_cpu_mark = cpu_now(); /* (the wait's own spinning is no host work of the program's) */
    return 0;
}
void emu_dilate_reset(void) { t_cpu_mark = 0; }
void emu_dilate_leave(int *unused) {
    (void)unused;
    if (cfg.dilation > 1) t_cpu_mark = cpu_now();
}

typedef enum { T_DOUBLE, T_INT, T_SIZE, T_US, T_S, T_STR } ktype;
/* Each number's range, in the unit of its key: a value outside it (NaN, inf,
 * 1e300 included) refuses the configuration rather than running with a
 * garbage toll. The same ranges as emulate/profiles.py; a CPU test holds the
 * two tables together (tests/test_emulator_cpu.py). */
static const struct { const char *key; ktype t; size_t off; size_t cap; double min, max; } kKeys[] = {
#define F(k, t, field, lo, hi) {k, t, offsetof(emu_config, field), 0, lo, hi}
#define STR(k, field) {k, T_STR, offsetof(emu_config, field), sizeof cfg.field, 0, 0}
    STR("profile", profile),
    F("emulate", T_INT, emulate, 0, 1),
    F("h2d_pinned_gbps", T_DOUBLE, chan_gbps[DIR_H2D][MEM_PINNED], 0, 1e4),
    F("h2d_pageable_gbps", T_DOUBLE, chan_gbps[DIR_H2D][MEM_PAGEABLE], 0, 1e4),
    F("d2h_pinned_gbps", T_DOUBLE, chan_gbps[DIR_D2H][MEM_PINNED], 0, 1e4),
    F("d2h_pageable_gbps", T_DOUBLE, chan_gbps[DIR_D2H][MEM_PAGEABLE], 0, 1e4),
    F("h2d_system_gbps", T_DOUBLE, system_gbps[DIR_H2D], 0, 1e4),
    F("d2h_system_gbps", T_DOUBLE, system_gbps[DIR_D2H], 0, 1e4),
    F("h2d_toll_us", T_US, toll_ns[DIR_H2D], 0, 1e7),
    F("d2h_toll_us", T_US, toll_ns[DIR_D2H], 0, 1e7),
    F("h2d_pinned_ratio", T_DOUBLE, cc_ratio[DIR_H2D][MEM_PINNED], 1e-3, 1),
    F("d2h_pinned_ratio", T_DOUBLE, cc_ratio[DIR_D2H][MEM_PINNED], 1e-3, 1),
    F("h2d_pageable_ratio", T_DOUBLE, cc_ratio[DIR_H2D][MEM_PAGEABLE], 1e-3, 1),
    F("d2h_pageable_ratio", T_DOUBLE, cc_ratio[DIR_D2H][MEM_PAGEABLE], 1e-3, 1),
    F("launch_toll_us", T_US, launch_toll_ns, 0, 1e7),
    F("mgpu_launch_factor", T_DOUBLE, mgpu_launch_factor, 1, 100),
    F("multi_gpu", T_INT, multi_gpu, 0, 1),
    F("nccl_toll_us", T_US, nccl_toll_ns, 0, 1e7),
    F("nccl_toll_max_bytes", T_SIZE, nccl_toll_max_bytes, 0, 1ull << 50),
    F("nccl_one_rank", T_INT, nccl_one_rank, 0, 1),
    F("nvlink_kept", T_DOUBLE, nvlink_kept, 1e-3, 1),
    F("nvls", T_INT, nvls, 0, 1),
    F("sync_toll_us", T_US, sync_toll_ns, 0, 1e7),
    F("ctx_create_s", T_S, ctx_create_ns, 0, 600),
    F("ctx_destroy_s", T_S, ctx_destroy_ns, 0, 600),
    F("host_alloc_toll_us", T_US, host_alloc_toll_ns, 0, 1e7),
    F("refuse_host_register", T_INT, refuse_host_register, 0, 1),
    F("pinned_reports_managed", T_INT, pinned_reports_managed, 0, 1),
    F("lanes", T_INT, lanes, 1, 64),
    F("chunk_bytes", T_SIZE, chunk_bytes, 4096, 1 << 30),
    STR("trace", trace),
    STR("coverage", coverage),
    /* machine facts measured by the launcher, not profile parameters (pageable: timed on each crossing) */
    F("native_h2d_pinned_gbps", T_DOUBLE, native_pinned_gbps[DIR_H2D], 0, 1e4),
    F("native_d2h_pinned_gbps", T_DOUBLE, native_pinned_gbps[DIR_D2H], 0, 1e4),
    F("native_nvlink_gbps", T_DOUBLE, native_nvlink_gbps, 0, 1e5),
    F("native_kernel_ns", T_DOUBLE, native_kernel_ns, 0, 1e6),
    /* projection (ccbridge run --project): the dilation r and the target's link rate */
    F("dilation", T_DOUBLE, dilation, 1, 1000),
    F("target_nvlink_gbps", T_DOUBLE, target_nvlink_gbps, 0, 1e5),
#undef F
#undef STR
};

int emu_config_parse(emu_config *c, const char *text, char *err, size_t errlen) {
    int lineno = 0;
    const char *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        char line[700];
        lineno++;
        if (n >= sizeof line) { snprintf(err, errlen, "line %d is too long", lineno); return -1; }
        memcpy(line, p, n);
        line[n] = 0;
        p += n + (eol ? 1 : 0);
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) { snprintf(err, errlen, "line %d: expected key=value, got '%s'", lineno, s); return -1; }
        *eq = 0;
        const char *key = s, *val = eq + 1;
        size_t i = 0, nk = sizeof kKeys / sizeof kKeys[0];
        while (i < nk && strcmp(kKeys[i].key, key) != 0) i++;
        if (i == nk) { snprintf(err, errlen, "line %d: unknown parameter '%s'", lineno, key); return -1; }
        void *dst = (char *)c + kKeys[i].off;
        if (kKeys[i].t == T_STR) {
            if (strlen(val) >= kKeys[i].cap) { snprintf(err, errlen, "line %d: value of %s too long", lineno, key); return -1; }
            strcpy(dst, val);
            continue;
        }
        char *end;
        double v = strtod(val, &end); /* an overflow is +-HUGE_VAL: outside every range */
        if (end == val || *end) {
            snprintf(err, errlen, "line %d: %s needs a number, got '%s'", lineno, key, val);
            return -1;
        }
        int whole = kKeys[i].t == T_INT || kKeys[i].t == T_SIZE;
        /* written so that NaN fails too */
        if (!(v >= kKeys[i].min && v <= kKeys[i].max) || (whole && v != (double)(long long)v)) {
            snprintf(err, errlen, "line %d: %s must be %s in [%.15g, %.15g], got '%s'", lineno, key,
                     whole ? "a whole number" : "a number", kKeys[i].min, kKeys[i].max, val);
            return -1;
        }
        switch (kKeys[i].t) { /* in range: every conversion below is defined */
        case T_DOUBLE: *(double *)dst = v; break;
        case T_US: *(double *)dst = v * 1e3; break;
        case T_S: *(double *)dst = v * 1e9; break;
        case T_INT: *(int *)dst = (int)v; break;
        case T_SIZE: *(size_t *)dst = (size_t)v; break;
        default: break;
        }
    }
    return 0;
}
