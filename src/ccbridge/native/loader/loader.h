/*
 * The loader pool's C interface (load.c: how a pool of prewarmed workers
 * moves byte ranges of files into their tensors is told there). Part of
 * ccbridge._native with the probe core, whose ccb_error() (core/core.h)
 * holds the reason of a failed call here. ccbridge/bindings/loader.py
 * declares exactly these functions and structs through ctypes;
 * tests/test_bindings_twin.py holds the two to each other.
 */
#ifndef CCB_LOADER_H
#define CCB_LOADER_H
#include "../common/cudrv.h"

#include <stddef.h>
#include <stdint.h>

/* staging kinds: pread into pinned or pageable buffers, or copy from the file's page-cache mapping */
#define CCB_STAGE_PINNED 0
#define CCB_STAGE_PAGEABLE 1
#define CCB_STAGE_MAPPED 2
#define CCB_MAX_WORKERS 64
#define CCB_MAX_BUFS 8

/* One tensor's bytes: a range of one file and where it lands. A load's items are in file and offset order. */
typedef struct {
    uint64_t dst;    /* where the bytes go: device address, or host address for a host target */
    uint64_t offset; /* file offset of the first byte */
    uint64_t nbytes; /* > 0 */
    int32_t file;    /* index into the load's files */
    int32_t tensor;  /* reported through doneq once all its bytes have landed */
} ccb_item;

typedef struct {
    int32_t fd;
    int32_t pad_;
    uint64_t map; /* mapped staging: address of the file's byte 0 in its mapping, else 0 */
} ccb_file;

typedef struct {
    double prewarm_ns; /* from ccb_pool_new to every worker ready */
    double read_ns;    /* summed over workers: inside pread */
    double copy_ns;    /* summed over workers: inside copy calls, staging waits and waits for destinations */
    double bytes;      /* bytes delivered by the last load */
    double load_ns;    /* last load: submit to the last worker idle */
} ccb_load_stats;

typedef struct ccb_pool ccb_pool;

/* device < 0: a host target (no CUDA); ncontexts 0: the device's primary context. NULL with ccb_error(). */
CCB_API ccb_pool *ccb_pool_new(int device, int nworkers, int ncontexts, int staging, size_t chunk, int nbuf);
/* 0 when every worker is ready, 1 on timeout, -1 when one failed (ccb_pool_error), -2 once the pool is closing. */
CCB_API int ccb_pool_wait_ready(ccb_pool *p, double timeout_s);
/* Start a load of items from files; items [0, nready) have their dst set, the others get theirs before
 * ccb_pool_publish names them (workers read ahead and wait to copy). The load's id (> 0), or -1. remaining (ntensors long) receives how
 * many chunks each tensor spans and is counted down; doneq (ntensors long) receives the finished tensors.
 * The arrays must outlive the load. */
CCB_API int ccb_pool_submit(ccb_pool *p, const ccb_file *files, int nfiles, const ccb_item *items, size_t nitems,
                            size_t nready, int32_t *remaining, int32_t *doneq, int ntensors);
/* Items [0, nready) of load `load` (submit's id) now have their dst (written before this call); ignored
 * once that load is over. A chunk is copied once all its items are published. */
CCB_API void ccb_pool_publish(ccb_pool *p, int load, size_t nready);
/* Tensors finished since the last call, into out (at most max): the count; 0 on timeout; -1 on error
 * (ccb_pool_error); -2 when the load is over and everything was reported, or the pool is closing. */
CCB_API int ccb_pool_next(ccb_pool *p, int32_t *out, int max, double timeout_s);
/* Stop the load and wait until no worker can write anything more. */
CCB_API void ccb_pool_cancel(ccb_pool *p);
/* Close for good, before ccb_pool_free: the load is cancelled, waits return (wait_ready -2, next -2), submit
 * fails, and the prewarm stops at each worker's next step. Other threads' calls may still run until free. */
CCB_API void ccb_pool_close(ccb_pool *p);
CCB_API void ccb_pool_stats(ccb_pool *p, ccb_load_stats *s);
CCB_API void ccb_pool_reset_stats(ccb_pool *p);
/* Stop and join the workers, free their buffers, destroy the contexts. */
CCB_API void ccb_pool_free(ccb_pool *p);
/* The load's first error, and the first item of the chunk it concerns (-1: none). */
CCB_API const char *ccb_pool_error(ccb_pool *p);
CCB_API long long ccb_pool_error_item(ccb_pool *p);
/* Every segment of a plan as rows (chunk, item, file offset, length), at most max_rows of them: the count,
 * or -1 with ccb_error(). For tests. */
CCB_API long long ccb_plan_walk(const ccb_file *files, int nfiles, const ccb_item *items, size_t nitems, uint64_t chunk,
                                int ntensors, int64_t *rows, size_t max_rows);
/* The whole file mapped read-only (shared page cache); NULL with ccb_error(). */
CCB_API void *ccb_map_file(int fd, size_t size);
CCB_API void ccb_unmap_file(void *p, size_t size);

#endif
