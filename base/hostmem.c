/* The host-allocation seam and its test hooks (base/hostmem.h). */
#include "base/hostmem.h"

#include <string.h>

XSEG_HIDDEN _Atomic bool hostmem_armed;
static _Atomic unsigned long hostmem_count; /* calls since hostmem_fail_nth */
static _Atomic unsigned long hostmem_nth;   /* the call to fail (0: none) */
static _Atomic bool hostmem_hit;            /* the nth call was failed */

static _Atomic long hostmem_nlive;          /* allocations minus frees since hostmem_fail_nth */

/* Counts this call; true when it is the one to fail. */
static bool hostmem_fail_now(void)
{
    unsigned long k = atomic_fetch_add(&hostmem_count, 1) + 1;
    if (k != atomic_load(&hostmem_nth))
        return false;
    atomic_store(&hostmem_hit, true);
    return true;
}

void *hostmem_armed_alloc(int kind, void *p, size_t a, size_t b)
{
    if (hostmem_fail_now())
        return NULL;
    void *q = kind == HOSTMEM_MALLOC    ? malloc(a)
              : kind == HOSTMEM_CALLOC  ? calloc(a, b)
              : kind == HOSTMEM_REALLOC ? realloc(p, a)
                                        : aligned_alloc(a, b);
    if (q && !(kind == HOSTMEM_REALLOC && p)) /* a realloc of a live block makes none */
        atomic_fetch_add(&hostmem_nlive, 1);
    return q;
}

void hostmem_armed_free(void *p)
{
    if (p)
        atomic_fetch_sub(&hostmem_nlive, 1);
    free(p);
}

long hostmem_live(void) { return atomic_load(&hostmem_nlive); }

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
    atomic_store(&hostmem_nlive, 0);
    atomic_store(&hostmem_armed, true);
}

void hostmem_disarm(void) { atomic_store(&hostmem_armed, false); }

unsigned long hostmem_calls(void) { return atomic_load(&hostmem_count); }

bool hostmem_failed(void) { return atomic_load(&hostmem_hit); }
