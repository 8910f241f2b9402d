/*
 * libnccl-net-ccbridge.so: an NCCL net plugin (NCCL_NET_PLUGIN=ccbridge) that
 * carries every byte between ranks as authenticated AES-256-GCM records over
 * TCP (conn.c), keyed from the job's group secret (keys.c, the formats of
 * ccbridge.secure). One virtual device: the interface NCCL_SOCKET_IFNAME
 * names, else the first up non-loopback one, else loopback. Host memory
 * only: NCCL stages GPU data through host buffers for it.
 *
 * Exports ncclNetPlugin_v11 (NCCL 2.28) and ncclNetPlugin_v10 (NCCL 2.27);
 * everything else is hidden.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net.h"

#define HANDLE_MAGIC 0x4e424343u /* "CCBN" */
#define HANDLE_VERSION 3 /* with the hello's (conn.c MAGIC): 3 since records of up to 512 KiB */

_Static_assert(sizeof(net_handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large for NCCL");
_Static_assert(offsetof(net_handle, addr) == 24 && offsetof(net_handle, stage) == 56, "handle layout (tests rely on it)");
_Static_assert(offsetof(ccbNetProperties_v11, maxMultiRequestSize) == sizeof(ccbNetProperties_v10),
               "v11 properties extend v10's");

static ncclDebugLogger_t logger;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int dev_ready;
static net_addr dev_addr;
static char dev_name[IF_NAMESIZE + 1];

void net_log(int warn, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (logger) logger(warn ? NCCL_LOG_WARN : NCCL_LOG_INFO, NCCL_INIT | NCCL_NET, "ccbridge-net", 0, "%s", msg);
    else if (warn) fprintf(stderr, "NCCL WARN %s\n", msg);
}

/* ---- the device: one interface ---- */

/* NCCL_SOCKET_IFNAME's syntax: comma-separated prefixes, "^" excludes, "=" exact */
static int if_matches(const char *name, const char *spec) {
    int exclude = *spec == '^', exact;
    spec += exclude;
    exact = *spec == '=';
    spec += exact;
    int hit = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", spec);
    for (char *save, *tok = strtok_r(list, ",", &save); tok && !hit; tok = strtok_r(NULL, ",", &save))
        hit = exact ? !strcmp(name, tok) : !strncmp(name, tok, strlen(tok));
    return exclude ? !hit : hit;
}

static int pick_interface(void) {
    struct ifaddrs *all, *lo = NULL, *best = NULL;
    if (getifaddrs(&all)) return -1;
    const char *spec = getenv("NCCL_SOCKET_IFNAME");
    for (int family = AF_INET; family; family = family == AF_INET ? AF_INET6 : 0) {
        for (struct ifaddrs *a = all; a && !best; a = a->ifa_next) {
            if (!a->ifa_addr || a->ifa_addr->sa_family != family || !(a->ifa_flags & IFF_UP)) continue;
            int loop = (a->ifa_flags & IFF_LOOPBACK) != 0;
            if (spec && *spec) { if (if_matches(a->ifa_name, spec)) best = a; }
            else if (loop) { if (!lo) lo = a; }
            else if (strncmp(a->ifa_name, "docker", 6)) best = a;
        }
    }
    if (!best && !(spec && *spec)) best = lo;
    if (best) {
        memcpy(&dev_addr, best->ifa_addr, best->ifa_addr->sa_family == AF_INET ? sizeof dev_addr.in : sizeof dev_addr.in6);
        snprintf(dev_name, sizeof dev_name, "%s", best->ifa_name);
    }
    freeifaddrs(all);
    return best ? 0 : -1;
}

static int link_speed_mbps(void) {
    const char *s = getenv("CCBRIDGE_NET_SPEED_MBPS");
    if (s && atoi(s) > 0) return atoi(s);
    char path[64];
    int mbps = 0;
    snprintf(path, sizeof path, "/sys/class/net/%s/speed", dev_name);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%d", &mbps) != 1) mbps = 0;
        fclose(f);
    }
    return mbps > 0 ? mbps : 10000;
}

/* ---- init: the key and the device ---- */

typedef struct { uint8_t secret[KEY_BYTES]; } net_ctx;
static net_ctx v10_ctx; /* v10 has one process-wide context */

static ncclResult_t init_common(net_ctx *ctx, ncclDebugLogger_t log) {
    char err[600];
    pthread_mutex_lock(&init_mu);
    if (log) logger = log;
    ncclResult_t rc = ncclSuccess;
    if (crypto_load(err, sizeof err)) {
        net_log(1, "NET/ccbridge: %s", err);
        rc = ncclSystemError;
    } else if (key_load(ctx->secret, err, sizeof err)) {
        net_log(1, "NET/ccbridge: %s", err);
        rc = ncclInvalidUsage;
    } else if (!dev_ready && pick_interface()) {
        net_log(1, "NET/ccbridge: no usable interface (NCCL_SOCKET_IFNAME=%s)", getenv("NCCL_SOCKET_IFNAME") ?: "");
        rc = ncclSystemError;
    } else if (!dev_ready) {
        dev_ready = 1;
        /* what it runs with, out-of-range and non-numeric settings already fallen back (pluginenv.settings's
         * words: `ccbridge env` and `bench net` say the same) */
        int turns = turns_wanted();
        net_log(0, "NET/ccbridge: AES-256-GCM records over TCP on %s; lanes %d, %s %d, spin %ld us", dev_name,
                lanes_wanted(), turns ? "turns" : "pipeline", turns ? turns : pipeline_wanted(), spin_us_wanted());
    }
    pthread_mutex_unlock(&init_mu);
    return rc;
}

static ncclResult_t init_v11(void **ctx, uint64_t commId, ccbNetCommConfig *config, ncclDebugLogger_t log,
                             ncclProfilerCallback_t prof) {
    (void)commId, (void)config, (void)prof;
    net_ctx *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    ncclResult_t rc = init_common(c, log);
    if (rc != ncclSuccess) { free(c); return rc; }
    *ctx = c;
    return ncclSuccess;
}

static ncclResult_t finalize_v11(void *ctx) {
    if (ctx) { wipe(ctx, sizeof(net_ctx)); free(ctx); }
    return ncclSuccess;
}

static ncclResult_t init_v10(ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
    (void)prof;
    return init_common(&v10_ctx, log);
}

static ncclResult_t devices(int *ndev) {
    *ndev = 1;
    return ncclSuccess;
}

static ncclResult_t properties_v11(int dev, ccbNetProperties_v11 *p) {
    if (dev != 0) return ncclInternalError;
    memset(p, 0, sizeof *p);
    p->v10 = (ccbNetProperties_v10){
        .name = dev_name, .pciPath = NULL, .guid = 0, .ptrSupport = NCCL_PTR_HOST, .speed = link_speed_mbps(),
        .maxComms = 65536, .maxRecvs = 1, .netDeviceType = NCCL_NET_DEVICE_HOST,
        .netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION, .vProps = {.ndevs = 1, .devs = {0}},
        .maxP2pBytes = 1ull << 40, .maxCollBytes = 1ull << 40,
    };
    p->maxMultiRequestSize = 1;
    return ncclSuccess;
}

static ncclResult_t properties_v10(int dev, ccbNetProperties_v10 *p) {
    ccbNetProperties_v11 full;
    ncclResult_t rc = properties_v11(dev, &full);
    if (rc == ncclSuccess) *p = full.v10;
    return rc;
}

/* ---- connection setup: listen, then connect / accept until they return a comm ---- */

typedef struct {
    int fd, nlanes;
    uint8_t secret[KEY_BYTES], listen_id[16];
    comm *pending; /* its lanes accepted so far, still in their handshakes */
} listen_comm;

static ncclResult_t do_listen(net_ctx *ctx, int dev, void *handle, void **out) {
    if (dev != 0 || !ctx) return ncclInternalError;
    listen_comm *l = calloc(1, sizeof *l);
    net_handle *h = handle;
    if (!l) return ncclSystemError;
    memset(h, 0, sizeof *h);
    net_addr a = dev_addr;
    socklen_t len = a.sa.sa_family == AF_INET ? sizeof a.in : sizeof a.in6;
    if (a.sa.sa_family == AF_INET) a.in.sin_port = 0; else a.in6.sin6_port = 0;
    l->fd = socket(a.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || bind(l->fd, &a.sa, len) || listen(l->fd, 64) || getsockname(l->fd, &a.sa, &len) ||
        crypto_random(l->listen_id, 16)) {
        net_log(1, "NET/ccbridge: listen on %s: %s", dev_name, strerror(errno));
        if (l->fd >= 0) close(l->fd);
        free(l);
        return ncclSystemError;
    }
    memcpy(l->secret, ctx->secret, KEY_BYTES);
    l->nlanes = lanes_wanted();
    h->magic = HANDLE_MAGIC, h->version = HANDLE_VERSION, h->addr = a, h->nlanes = (uint32_t)l->nlanes;
    memcpy(h->listen_id, l->listen_id, 16);
    *out = l;
    return ncclSuccess;
}

/* a comm in its handshake: ready (hand it out), failed (reap it), or not yet */
static ncclResult_t settle(comm **pending, void **out) {
    int s = atomic_load(&(*pending)->state);
    if (s == COMM_HANDSHAKE) return ncclSuccess;
    comm *c = *pending;
    *pending = NULL;
    if (s == COMM_READY) { *out = c; return ncclSuccess; }
    ncclResult_t rc = comm_error(c) != ncclSuccess ? comm_error(c) : ncclSystemError;
    comm_close(c);
    return rc;
}

/* the connecting side's half-made connections, by the token it keeps in its copy of the handle */
typedef struct staged { uint64_t token; comm *c; struct staged *next; } staged;
static pthread_mutex_t stage_mu = PTHREAD_MUTEX_INITIALIZER;
static staged *stages;

static comm *stage_find(uint64_t token) {
    comm *c = NULL;
    pthread_mutex_lock(&stage_mu);
    for (staged *s = stages; token && s && !c; s = s->next) if (s->token == token) c = s->c;
    pthread_mutex_unlock(&stage_mu);
    return c;
}

static uint64_t stage_add(comm *c) {
    staged *s = calloc(1, sizeof *s);
    if (!s) return 0;
    while (!s->token)
        if (crypto_random(&s->token, sizeof s->token)) { free(s); return 0; }
    s->c = c;
    pthread_mutex_lock(&stage_mu);
    s->next = stages, stages = s;
    pthread_mutex_unlock(&stage_mu);
    return s->token;
}

static void stage_remove(uint64_t token) {
    pthread_mutex_lock(&stage_mu);
    for (staged **p = &stages; *p; p = &(*p)->next) {
        if ((*p)->token == token) {
            staged *s = *p;
            *p = s->next;
            free(s);
            break;
        }
    }
    pthread_mutex_unlock(&stage_mu);
}

static ncclResult_t do_connect(net_ctx *ctx, int dev, void *handle, void **sendComm) {
    net_handle *h = handle;
    *sendComm = NULL;
    if (dev != 0 || !ctx) return ncclInternalError;
    if (h->magic != HANDLE_MAGIC || h->version != HANDLE_VERSION || h->nlanes < 1 || h->nlanes > MAX_LANES) {
        net_log(1, "NET/ccbridge: connect: not a ccbridge handle of this version (every rank needs "
                   "NCCL_NET_PLUGIN=ccbridge and the same ccbridge)");
        return ncclInvalidUsage;
    }
    /* a token not ours (the listener writes 0; anything else came from the wire) starts afresh */
    comm *c = stage_find(h->stage);
    if (!c) {
        if (!(c = comm_new(1, (int)h->nlanes, &h->addr, ctx->secret, h->listen_id))) return ncclSystemError;
        if (!(h->stage = stage_add(c))) { comm_close(c); return ncclSystemError; }
        comm_start_lanes(c); /* a failure shows in c's state */
    }
    ncclResult_t rc = settle(&c, sendComm);
    if (!c) { stage_remove(h->stage); h->stage = 0; }
    return rc;
}

static ncclResult_t do_accept(void *listenComm, void **recvComm) {
    listen_comm *l = listenComm;
    *recvComm = NULL;
    if (!l->pending && !(l->pending = comm_new(0, l->nlanes, NULL, l->secret, l->listen_id))) return ncclSystemError;
    while (l->pending->accepted < l->nlanes) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ncclSuccess;
            net_log(1, "NET/ccbridge: accept: %s", strerror(errno));
            return ncclSystemError;
        }
        if (comm_add_socket(l->pending, fd)) return settle(&l->pending, recvComm);
    }
    return settle(&l->pending, recvComm);
}

static ncclResult_t listen_v11(void *ctx, int dev, void *handle, void **l) { return do_listen(ctx, dev, handle, l); }
static ncclResult_t listen_v10(int dev, void *handle, void **l) { return do_listen(&v10_ctx, dev, handle, l); }
static ncclResult_t connect_v11(void *ctx, int dev, void *handle, void **s, ccbNetDeviceHandle **dh) {
    (void)dh;
    return do_connect(ctx, dev, handle, s);
}
static ncclResult_t connect_v10(int dev, ccbNetCommConfig *cfg, void *handle, void **s, ccbNetDeviceHandle **dh) {
    (void)cfg, (void)dh;
    return do_connect(&v10_ctx, dev, handle, s);
}
static ncclResult_t accept_any(void *l, void **r, ccbNetDeviceHandle **dh) {
    (void)dh;
    return do_accept(l, r);
}

static ncclResult_t close_listen(void *p) {
    listen_comm *l = p;
    if (l->pending) comm_close(l->pending);
    close(l->fd);
    wipe(l, sizeof *l);
    free(l);
    return ncclSuccess;
}

static ncclResult_t close_comm(void *c) {
    if (c) comm_close(c);
    return ncclSuccess;
}

/* ---- memory registration: host buffers need none ---- */

static int host_mr = NCCL_PTR_HOST;

static ncclResult_t reg_mr(void *c, void *data, size_t size, int type, void **mhandle) {
    (void)c, (void)data, (void)size;
    if (type != NCCL_PTR_HOST) return ncclInternalError; /* we never offered NCCL_PTR_CUDA */
    *mhandle = &host_mr;
    return ncclSuccess;
}

static ncclResult_t dereg_mr(void *c, void *mhandle) {
    (void)c, (void)mhandle;
    return ncclSuccess;
}

/* ---- data path ---- */

static ncclResult_t isend(void *sendComm, void *data, size_t size, int tag, void *mh, void *ph, void **request) {
    (void)tag, (void)mh, (void)ph;
    comm *c = sendComm;
    if (comm_error(c) != ncclSuccess) return comm_error(c);
    *request = comm_post(c, data, size);
    return ncclSuccess;
}

static ncclResult_t irecv(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mh, void **ph,
                          void **request) {
    (void)tags, (void)mh, (void)ph;
    comm *c = recvComm;
    if (n != 1) return ncclInternalError; /* maxRecvs is 1 */
    if (comm_error(c) != ncclSuccess) return comm_error(c);
    *request = comm_post(c, data[0], sizes[0]);
    return ncclSuccess;
}

static ncclResult_t iflush(void *recvComm, int n, void **data, int *sizes, void **mh, void **request) {
    (void)recvComm, (void)n, (void)data, (void)sizes, (void)mh;
    *request = NULL; /* host memory: nothing to flush */
    return ncclSuccess;
}

static ncclResult_t test(void *request, int *done, int *sizes) {
    req *r = request;
    *done = 0;
    if (atomic_load(&r->state) == REQ_DONE) {
        *done = 1;
        if (sizes) sizes[0] = (int)r->size;
        atomic_store(&r->state, REQ_FREE);
        return ncclSuccess;
    }
    ncclResult_t err = comm_error(r->c);
    if (err == ncclSuccess) return ncclSuccess; /* still moving */
    atomic_store(&r->state, REQ_FREE);         /* the connection failed under it */
    return err;
}

/* ---- the exported tables ---- */

#define DATA_PATH                                                                                           \
    .accept = accept_any, .regMr = reg_mr, .regMrDmaBuf = NULL, .deregMr = dereg_mr, .isend = isend,        \
    .irecv = irecv, .iflush = iflush, .test = test, .closeSend = close_comm, .closeRecv = close_comm,       \
    .closeListen = close_listen, .getDeviceMr = NULL, .irecvConsumed = NULL, .makeVDevice = NULL

NET_API ccbNet_v11 ncclNetPlugin_v11 = {
    .name = "ccbridge", .init = init_v11, .devices = devices, .getProperties = properties_v11,
    .listen = listen_v11, .connect = connect_v11, DATA_PATH, .finalize = finalize_v11, .setNetAttr = NULL,
};

NET_API ccbNet_v10 ncclNetPlugin_v10 = {
    .name = "ccbridge", .init = init_v10, .devices = devices, .getProperties = properties_v10,
    .listen = listen_v10, .connect = connect_v10, DATA_PATH,
};
