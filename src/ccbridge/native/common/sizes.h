/*
 * Byte counts as the command-line tools take them ("4M", "256K", "2G"), for the native programs
 * (native/netbound/bound.c) and the bench tools built beside them (bench/ncclnet_stream.c).
 */
#ifndef CCB_SIZES_H
#define CCB_SIZES_H
#include <stdlib.h>

static inline size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1 << 10; break;
    case 'M': case 'm': v *= 1 << 20; break;
    case 'G': case 'g': v *= 1 << 30; break;
    }
    return (size_t)v;
}
#endif
