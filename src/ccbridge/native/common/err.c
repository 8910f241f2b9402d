/* The native core's error slot (cudrv.h: g_err, set_err), apart from the driver table so that a test's fake
 * driver (tests/fake_cuda_loader.c) links the same one. */
#include "cudrv.h"

#include <stdarg.h>
#include <stdio.h>

__thread char g_err[CCB_ERR_LEN];

void set_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
}
