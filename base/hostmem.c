/* The host-allocation seam and its test hooks (base/hostmem.h). */
#include "base/hostmem.h"

#include <string.h>

XSEG_HIDDEN _Atomic bool hostmem_armed;
static _Atomic unsigned long hostmem_count; /* calls since hostmem_fail_nth */
static _Atomic unsigned long hostmem_nth;   /* the call to fail (0: none) */
static _Atomic bool hostmem_hit;            /* the nth call was failed */

bool hostmem_fail_now(void)
{
    unsigned long k = atomic_fetch_add(&hostmem_count, 1) + 1;
    if (k != atomic_load(&hostmem_nth))
        return false;
    atomic_store(&hostmem_hit, true);
    return true;
}

char *xs_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xs_malloc(n);
    return p ? memcpy(p, s, n) : NULL;
}

void hostmem_fail_nth(unsigned long n)
{
    atomic_store(&hostmem_armed, false);
    atomic_store(&hostmem_count, 0);
    atomic_store(&hostmem_nth, n);
    atomic_store(&hostmem_hit, false);
    atomic_store(&hostmem_armed, true);
}

void hostmem_disarm(void) { atomic_store(&hostmem_armed, false); }

unsigned long hostmem_calls(void) { return atomic_load(&hostmem_count); }

bool hostmem_failed(void) { return atomic_load(&hostmem_hit); }
