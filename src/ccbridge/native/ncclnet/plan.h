/* How the plugin cuts a message into records: shared by the plugin (conn.c) and the program that measures its
 * uncoupled bound (native/netbound/bound.c), so both seal and open records of one size. */
#ifndef CCB_NET_PLAN_H
#define CCB_NET_PLAN_H
#include <stddef.h>
#include <stdint.h>

#define RECORD_MIN (32u << 10)  /* a message up to this size is one record */
#define RECORD_MAX (256u << 10) /* plaintext bytes per record, at most */

/* records of a message of `size` bytes over `nlanes`: count and record size */
uint32_t record_plan(size_t size, int nlanes, size_t *record);
#endif
