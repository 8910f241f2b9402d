/* The record plan (plan.h): about size / nlanes in 4 KiB steps, between RECORD_MIN and RECORD_MAX. */
#include "plan.h"

uint32_t record_plan(size_t size, int nlanes, size_t *record) {
    if (size <= RECORD_MIN) { *record = size; return 1; }
    size_t r = (size + (size_t)nlanes - 1) / (size_t)nlanes;
    r = (r + 4095) & ~(size_t)4095;
    r = r < RECORD_MIN ? RECORD_MIN : r > RECORD_MAX ? RECORD_MAX : r;
    *record = r;
    return (uint32_t)((size + r - 1) / r);
}
