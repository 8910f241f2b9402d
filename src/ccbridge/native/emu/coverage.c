/*
 * Coverage: every driver entry point a program resolved, and what it is to
 * the bridge (ccbridge run --coverage).
 *
 * Seen through dlsym on the driver, cuGetProcAddress[_v2] (the exact variant
 * the driver handed out), the hooks' own call counters (programs linked
 * against libcuda call the exports directly), and at the end the dynamic
 * relocations of every loaded object that name a driver function (linked
 * programs' imports that have no hook).
 *
 * The classification is made here, once; Python only reads it:
 *   hooked        a row of the hook table (hooks.c);
 *   MISSING       not hooked, but of a hooked family (the same name but for
 *                 _vN/_ptsz/_ptds): it crosses, launches, synchronizes or
 *                 pays a lifecycle toll, and this variant escapes emulation;
 *   harmless      the allow-list below: entry points that do none of those;
 *   unclassified  anything else (reported, so that the lists can grow).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"

/* Families (names without _vN/_ptsz/_ptds) that neither cross the bridge,
 * launch nor synchronize. A trailing '*' matches a prefix. Checked after the
 * hooked families, so a prefix here never hides a MISSING variant. */
static const char *const kHarmless[] = {
    "cuInit", "cuDriverGetVersion", "cuGetErrorString", "cuGetErrorName", "cuDeviceGet*", "cuDeviceTotalMem",
    "cuDeviceComputeCapability", "cuDeviceCanAccessPeer", "cuDevicePrimaryCtxGetState", "cuDevicePrimaryCtxSetFlags",
    "cuCtxGet*", "cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxSetLimit", "cuCtxSetCacheConfig",
    "cuCtxSetFlags", "cuCtxDisablePeerAccess", "cuCtxResetPersistingL2Cache",
    "cuCtxRecordEvent", "cuCtxWaitEvent", "cuModule*", "cuLibrary*", "cuKernel*", "cuLink*", "cuFunc*",
    "cuOccupancy*", "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFree",
    "cuMemFreeAsync", "cuMemFreeHost", "cuMemGetInfo", "cuMemGetAddressRange", "cuMemHostGetDevicePointer",
    "cuMemHostGetFlags", "cuMemHostUnregister", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
    "cuMemSetAccess", "cuMemGetAccess", "cuMemAddressReserve", "cuMemAddressFree", "cuMemGetAllocation*",
    "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemRetainAllocationHandle", "cuMemPool*",
    "cuMemGetHandleForAddressRange", "cuMemcpyDtoD", "cuMemcpyDtoDAsync", "cuMemcpyAtoD", "cuMemcpyDtoA",
    "cuMemcpyAtoA", "cuMemcpyPeer", "cuMemcpyPeerAsync", "cuMemcpy3DPeer", "cuMemcpy3DPeerAsync", "cuMemset*",
    "cuPointer*", "cuStreamCreate", "cuStreamCreateWithPriority", "cuStreamDestroy", "cuStreamGet*",
    "cuStreamSetAttribute", "cuStreamCopyAttributes", "cuStreamQuery", "cuStreamWaitEvent", "cuStreamIsCapturing",
    "cuStreamBeginCapture", "cuStreamBeginCaptureToGraph", "cuStreamEndCapture", "cuStreamUpdateCaptureDependencies",
    "cuThreadExchangeStreamCaptureMode", "cuEventCreate", "cuEventDestroy", "cuEventRecord", "cuEventRecordWithFlags",
    "cuEventQuery", "cuGraph*", "cuUserObject*", "cuArray*", "cuMipmappedArray*",
    "cuTexObject*", "cuSurfObject*", "cuTexRef*", "cuSurfRef*", "cuIpc*", "cuProfiler*", "cuDeviceGraphMemTrim",
};

/* name without _ptsz/_ptds and then _vN */
static void family(const char *name, char *out, size_t len) {
    snprintf(out, len, "%s", name);
    size_t n = strlen(out);
    if (n > 5 && (!strcmp(out + n - 5, "_ptsz") || !strcmp(out + n - 5, "_ptds"))) out[n -= 5] = 0;
    char *v = strrchr(out, '_');
    if (v && v[1] == 'v' && isdigit((unsigned char)v[2])) {
        const char *d = v + 2;
        while (isdigit((unsigned char)*d)) d++;
        if (!*d) *v = 0;
    }
}

static int harmless(const char *fam) {
    for (size_t i = 0; i < sizeof kHarmless / sizeof kHarmless[0]; i++) {
        const char *h = kHarmless[i];
        size_t n = strlen(h);
        if (h[n - 1] == '*' ? strncmp(fam, h, n - 1) == 0 : strcmp(fam, h) == 0) return 1;
    }
    return 0;
}

static int hooked_family(const char *fam) {
    char f[128];
    const char *n;
    for (int i = 0; (n = emu_api_name(i)); i++) {
        family(n, f, sizeof f);
        if (!strcmp(f, fam)) return 1;
    }
    return 0;
}

int emu_cov_class(const char *name) {
    if (emu_hook_index(name) >= 0) return COV_HOOKED;
    char fam[128];
    family(name, fam, sizeof fam);
    if (hooked_family(fam)) return COV_MISSING;
    return harmless(fam) ? COV_HARMLESS : COV_UNCLASSIFIED;
}

static const char *const kClass[] = {"hooked", "harmless", "MISSING", "unclassified"};
static const char *const kVia[] = {"dlsym", "cuGetProcAddress", "linked", "called"};

/* ---- the names seen: open addressing, never removed ---- */
#define SEEN_MAX 2048
static struct { char name[96]; unsigned via; } g_seen[SEEN_MAX];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

int emu_is_driver_name(const char *name) {
    return name && name[0] == 'c' && name[1] == 'u' && isupper((unsigned char)name[2]);
}

void emu_cov_seen(const char *name, int via) {
    if (!emu_is_driver_name(name) || strlen(name) >= sizeof g_seen[0].name) return;
    unsigned h = 5381;
    for (const char *p = name; *p; p++) h = h * 33 + (unsigned char)*p;
    pthread_mutex_lock(&g_mu);
    for (unsigned k = 0; k < SEEN_MAX; k++) {
        unsigned i = (h + k) % SEEN_MAX;
        if (!g_seen[i].name[0]) strcpy(g_seen[i].name, name);
        if (!strcmp(g_seen[i].name, name)) { g_seen[i].via |= 1u << via; break; }
    }
    pthread_mutex_unlock(&g_mu);
}

/* The name the driver exports at exactly p (dladdr), else NULL. */
const char *emu_cov_exact_name(void *p) {
    Dl_info info;
    return p && dladdr(p, &info) && info.dli_saddr == p ? info.dli_sname : NULL;
}

/* Linked programs: every loaded object's relocations naming a driver function. */
static int scan_object(struct dl_phdr_info *info, size_t size, void *self) {
    (void)size;
    if (info->dlpi_name && self && strcmp(info->dlpi_name, self) == 0) return 0; /* this library */
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn) return 0;
    uintptr_t strtab = 0, symtab = 0, rel[2] = {0, 0};
    size_t relsz[2] = {0, 0};
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_STRTAB: strtab = dyn->d_un.d_ptr; break;
        case DT_SYMTAB: symtab = dyn->d_un.d_ptr; break;
        case DT_JMPREL: rel[0] = dyn->d_un.d_ptr; break;
        case DT_PLTRELSZ: relsz[0] = dyn->d_un.d_val; break;
        case DT_RELA: rel[1] = dyn->d_un.d_ptr; break;
        case DT_RELASZ: relsz[1] = dyn->d_un.d_val; break;
        }
    }
    /* glibc relocates these in place, except in objects whose dynamic section is read-only (the vDSO) */
#define ADJ(x) ((x) && (x) < info->dlpi_addr ? (x) + info->dlpi_addr : (x))
    strtab = ADJ(strtab), symtab = ADJ(symtab), rel[0] = ADJ(rel[0]), rel[1] = ADJ(rel[1]);
#undef ADJ
    if (!strtab || !symtab) return 0;
    for (int t = 0; t < 2; t++) {
        const ElfW(Rela) *r = (const void *)rel[t];
        for (size_t i = 0; r && i < relsz[t] / sizeof *r; i++) {
            const ElfW(Sym) *s = (const ElfW(Sym) *)symtab + ELF64_R_SYM(r[i].r_info);
            const char *name = (const char *)strtab + s->st_name;
            if (ELF64_R_SYM(r[i].r_info) && s->st_shndx == SHN_UNDEF && emu_is_driver_name(name) &&
                emu_driver_has(name))
                emu_cov_seen(name, COV_VIA_LINKED);
        }
    }
    return 0;
}

int emu_coverage_json(char *buf, size_t len) {
    Dl_info self;
    dl_iterate_phdr(scan_object, dladdr((void *)emu_coverage_json, &self) ? (void *)self.dli_fname : NULL);
    const char *n;
    for (int i = 0; (n = emu_api_name(i)); i++)
        if (emu_calls(i)) emu_cov_seen(n, COV_VIA_CALLED);
    size_t o = 0;
#define PUT(...) do { int k_ = snprintf(buf + o, o < len ? len - o : 0, __VA_ARGS__); if (k_ > 0) o += (size_t)k_; } while (0)
    PUT("{\"schema\": %d, \"pid\": %d, \"profile\": \"%s\", \"symbols\": {", EMU_COVERAGE_SCHEMA, (int)getpid(), cfg.profile);
    int first = 1;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < SEEN_MAX; i++) {
        if (!g_seen[i].name[0]) continue;
        int c = emu_cov_class(g_seen[i].name), h = emu_hook_index(g_seen[i].name);
        PUT("%s\n  \"%s\": {\"class\": \"%s\", \"calls\": ", first ? "" : ",", g_seen[i].name, kClass[c]);
        if (h >= 0) PUT("%llu", (unsigned long long)emu_calls(h)); else PUT("null");
        PUT(", \"via\": [");
        for (int v = 0, f = 1; v < 4; v++)
            if (g_seen[i].via & (1u << v)) { PUT("%s\"%s\"", f ? "" : ", ", kVia[v]); f = 0; }
        PUT("]}");
        first = 0;
    }
    pthread_mutex_unlock(&g_mu);
    PUT("\n}}\n");
#undef PUT
    return o < len ? 0 : -1;
}

void emu_coverage_reset(void) {
    pthread_mutex_lock(&g_mu);
    memset(g_seen, 0, sizeof g_seen);
    pthread_mutex_unlock(&g_mu);
}

/* <prefix>.<pid>.coverage.json at exit; a failure is said, never silent. */
void emu_coverage_write(void) {
    if (!cfg.coverage[0]) return;
    static char buf[1 << 18];
    char path[600];
    snprintf(path, sizeof path, "%s.%d.coverage.json", cfg.coverage, (int)getpid());
    FILE *f = NULL;
    if (emu_coverage_json(buf, sizeof buf) != 0 || !(f = fopen(path, "w")) || fputs(buf, f) == EOF) {
        fprintf(stderr, "ccbridge emulator: cannot write coverage %s\n", path);
        if (f) fclose(f);
        return;
    }
    if (fclose(f) != 0) fprintf(stderr, "ccbridge emulator: cannot write coverage %s\n", path);
}
