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
/* The armed slow half: counts this call; true when it is the one to fail. */
bool hostmem_fail_now(void);

static inline bool hostmem_fail(void)
{
    return XSEG_UNLIKELY(atomic_load_explicit(&hostmem_armed, memory_order_relaxed)) && hostmem_fail_now();
}

static inline void *xs_malloc(size_t n) { return hostmem_fail() ? NULL : malloc(n); }
static inline void *xs_calloc(size_t n, size_t size) { return hostmem_fail() ? NULL : calloc(n, size); }
static inline void *xs_realloc(void *p, size_t n) { return hostmem_fail() ? NULL : realloc(p, n); }
static inline void *xs_aligned_alloc(size_t align, size_t n)
{
    return hostmem_fail() ? NULL : aligned_alloc(align, n);
}
static inline void xs_free(void *p) { free(p); }
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
 */
void hostmem_fail_nth(unsigned long n);
void hostmem_disarm(void);
unsigned long hostmem_calls(void);
bool hostmem_failed(void);

#endif
