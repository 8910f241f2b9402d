/*
 * The probe core's C interface (probe.c): the timing loops that Python
 * overhead would distort, and the error and clock convention that the whole
 * native core shares (ccbridge._native holds this, loader/ and gcm/gcm_host.c).
 * ccbridge/bindings/core.py declares exactly these functions and structs
 * through ctypes; tests/test_bindings_twin.py holds the two to each other and
 * tests/test_native_symbols.py the export list to the CCB_API lines here.
 *
 * Every function returning int gives 0, or -1 with the reason in ccb_error().
 */
#ifndef CCB_CORE_H
#define CCB_CORE_H
#include "../common/cudrv.h"

#include <stddef.h>

/* copy directions */
#define CCB_H2D 0
#define CCB_D2H 1
#define CCB_D2D 2
/* host memory of a session */
#define CCB_PINNED 0
#define CCB_PAGEABLE 1
/* ccb_semantics: where the copy goes relative to the queued spin */
#define CCB_SAME_STREAM 0
#define CCB_IDLE_STREAM 1
#define CCB_EVENT_WAIT 2
/* ccb_launch modes */
#define CCB_LAUNCH_PIPELINED 0
#define CCB_LAUNCH_WAIT 1
#define CCB_LAUNCH_GRAPH 2
#define CCB_MAX_STREAMS 64
/* GPU timers (ccb_kernel_gap, ccbridge/gputimer.py): CUDA events, or %globaltimer stamps */
#define CCB_TIMER_EVENTS 0
#define CCB_TIMER_GLOBALTIMER 1

/* One context (primary or its own) with its streams and one host + one device buffer per stream. */
typedef struct ccb_session ccb_session;

typedef struct {
    double start_ns, end_ns; /* CLOCK_MONOTONIC, comparable across processes */
    double incall_ns;        /* time the host thread spent inside copy calls */
    double bytes;
} ccb_copy_out;

typedef struct {
    double remaining_ns; /* queued GPU work left when the copy was issued */
    double call_ns;      /* how long the copy call took to return */
    double done_ns;      /* issue to completion of everything */
} ccb_sem_out;

/* This thread's last error message (the whole native core's). */
CCB_API const char *ccb_error(void);
/* CLOCK_MONOTONIC in ns. */
CCB_API double ccb_now_ns(void);
/* Load the CUDA driver (once). */
CCB_API int ccb_open(void);
CCB_API int ccb_device_count(int *count);
CCB_API ccb_session *ccb_session_open(int device, int own_context, int kind, size_t max_bytes, int nstreams);
CCB_API void ccb_session_close(ccb_session *s);
CCB_API int ccb_verify(ccb_session *s, size_t bytes);
CCB_API int ccb_copy(ccb_session *s, int dir, size_t bytes, int nstreams, int iters, int sync_every,
                     double *samples_ns, ccb_copy_out *out);
CCB_API int ccb_workers(ccb_session **sessions, const int *streams, int n, int dir, size_t bytes, int iters,
                        int warmup, ccb_copy_out *outs);
CCB_API int ccb_launch(ccb_session *s, int mode, int n, double *ns_per_kernel);
CCB_API int ccb_kernel_gap(ccb_session *s, int reps, int timer, double *ns);
/* Queue a %globaltimer stamp (8 bytes, ns) at device address at on stream st of the calling thread's current
 * context (a framework's: torch's primary context), the stamp kernel loaded there once. */
CCB_API int ccb_stamp(void *st, unsigned long long at);
/* What a CC driver answers about this session's pinned memory, asked as a program asks (the driver's exported
 * cuPointerGetAttribute: memory type, 1 host / 2 device, and is-managed), and whether a device view of it
 * (cuMemHostGetDevicePointer) sees a write the host makes after the view was taken (1 live, 0 stale). */
CCB_API int ccb_pinned_answers(ccb_session *s, int *memory_type, int *is_managed, int *view_live);
CCB_API int ccb_semantics(ccb_session *s, int dir, int relation, size_t bytes, double spin_ns, ccb_sem_out *out);
CCB_API int ccb_ctx_lifecycle(int device, int n, double *create_ns, double *destroy_ns);
CCB_API int ccb_pinned_slots(ccb_session *s, size_t bytes, int count, double *alloc_ns, double *free_ns);
CCB_API int ccb_peer_rate(int src, int dst, size_t bytes, int iters, double *bytes_per_s);

#endif
