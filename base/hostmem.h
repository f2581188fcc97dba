/*
 * The host-allocation seam: every host allocation of the library (base, vmm, core, api) goes
 * through these, so a test can fail any one of them (the host-OOM sweep, tests/alloc). The arena
 * and hugemem mmap paths are not here: they fall back on their own.
 *
 * Each is libc's call of the same name, with one difference: while a test armed the fault
 * (hostmem_fail_nth), the Nth allocating call from then on returns NULL. xs_free never fails and
 * is not counted. The disarmed cost is one relaxed load of a flag.
 */
#ifndef XSEG_BASE_HOSTMEM_H
#define XSEG_BASE_HOSTMEM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include "base/common.h"

/* Set while a test counts or fails seam calls (base/hostmem.c). */
extern XSEG_HIDDEN _Atomic bool hostmem_armed;
/* The armed halves (base/hostmem.c): count the call, fail it when it is the nth, and keep the
 * count of live allocations (hostmem_live). */
enum { HOSTMEM_MALLOC, HOSTMEM_CALLOC, HOSTMEM_REALLOC, HOSTMEM_ALIGNED };
void *hostmem_armed_alloc(int kind, void *p, size_t a, size_t b);
void hostmem_armed_free(void *p);
#define HOSTMEM_ARMED() XSEG_UNLIKELY(atomic_load_explicit(&hostmem_armed, memory_order_relaxed))

static inline void *xs_malloc(size_t n)
{
    return HOSTMEM_ARMED() ? hostmem_armed_alloc(HOSTMEM_MALLOC, NULL, n, 0) : malloc(n);
}
static inline void *xs_calloc(size_t n, size_t size)
{
    return HOSTMEM_ARMED() ? hostmem_armed_alloc(HOSTMEM_CALLOC, NULL, n, size) : calloc(n, size);
}
static inline void *xs_realloc(void *p, size_t n)
{
    return HOSTMEM_ARMED() ? hostmem_armed_alloc(HOSTMEM_REALLOC, p, n, 0) : realloc(p, n);
}
static inline void *xs_aligned_alloc(size_t align, size_t n)
{
    return HOSTMEM_ARMED() ? hostmem_armed_alloc(HOSTMEM_ALIGNED, NULL, align, n) : aligned_alloc(align, n);
}
static inline void xs_free(void *p)
{
    if (HOSTMEM_ARMED())
        hostmem_armed_free(p);
    else
        free(p);
}
/* strdup through the seam (NULL when the copy cannot be allocated). */
char *xs_strdup(const char *s);

/*
 * Test hooks (internal symbols; tests link the internal library as tests/unit does). Not in
 * include/xseg.h: no program should fail its allocator on purpose.
 *
 * hostmem_fail_nth(n): from now, count every allocating seam call (from any thread), and fail
 * the nth (1-based; 0 counts without failing). Only that one call fails: the later ones succeed,
 * as when memory comes back. hostmem_disarm(): stop counting. hostmem_calls(): calls counted
 * since the last hostmem_fail_nth; hostmem_failed(): whether the nth was reached and failed.
 * hostmem_live(): allocations made through the seam since the last hostmem_fail_nth minus those
 * given back (xs_free) while armed: armed before xseg's first call, 0 after xseg_shutdown says
 * xseg holds no host memory (tests/alloc/test_shutdown_leaks.c).
 */
void hostmem_fail_nth(unsigned long n);
void hostmem_disarm(void);
unsigned long hostmem_calls(void);
bool hostmem_failed(void);
long hostmem_live(void);

#endif
