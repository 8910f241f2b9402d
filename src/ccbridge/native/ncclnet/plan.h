/* How the plugin cuts a message into records: shared by the plugin (conn.c) and the program that measures its
 * uncoupled bound (native/netbound/bound.c), so both seal and open records of one size. */
#ifndef CCB_NET_PLAN_H
#define CCB_NET_PLAN_H
#include <stddef.h>
#include <stdint.h>

#define RECORD_MIN (32u << 10)  /* a message up to this size is one record */
/* plaintext bytes per record, at most: 512 KiB moved 4-10% more than 256 KiB at 4 MiB messages over 8 lanes, with
 * 40% fewer context switches (fewer hand-offs a byte; bench/RESULTS.md 2026-11-28 session 25) */
#define RECORD_MAX (512u << 10)

/* records of a message of `size` bytes over `nlanes`: count and record size */
uint32_t record_plan(size_t size, int nlanes, size_t *record);
#endif
