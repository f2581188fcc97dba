/* The failure half of base/assert.h. */
#include <stdio.h>
#include <stdlib.h>

#include "base/assert.h"

_Noreturn void assert_fail(const char *cond, const char *file, int line, const char *func)
{
    fprintf(stderr, "xseg: assertion failed: %s (%s:%d, %s)\n", cond, file, line, func);
    fflush(stderr);
    abort();
}
