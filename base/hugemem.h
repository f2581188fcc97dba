/*
 * Host memory for the allocator's largest tables (the live map's slots at many live blocks; the
 * block structs use base/arena.h), in 2 MiB-aligned anonymous mappings advised to transparent
 * huge pages.
 *
 * Why: at a million live blocks the map (8-byte slots, ~15 MB) and the block structs (80 bytes
 * each, ~85 MB) span ~25,000 4 KiB pages, so a free's lookups miss the TLB as well as the cache, and under a hypervisor each
 * TLB miss is a two-dimensional page walk. On 2 MiB pages the same tables need ~50 TLB entries.
 * Only tables large enough that a whole 2 MiB page costs them little use this; callers decide.
 */
#ifndef XSEG_BASE_HUGEMEM_H
#define XSEG_BASE_HUGEMEM_H

#include <stddef.h>

#define HUGEMEM_PAGE ((size_t)2 << 20) /* the huge page size advised for (x86-64's and arm64's PMD) */

/* @p bytes (a positive multiple of HUGEMEM_PAGE) of zeroed memory, HUGEMEM_PAGE-aligned and
 * advised MADV_HUGEPAGE. NULL when the mapping fails or the kernel takes no such advice (then the
 * caller uses calloc: huge pages are a speed-up, never a requirement). */
void *hugemem_alloc(size_t bytes);
/* Give back a hugemem_alloc of @p bytes (the same count). */
void hugemem_free(void *p, size_t bytes);
/* @p bytes rounded down to a multiple of HUGEMEM_PAGE, at least one page. */
static inline size_t hugemem_floor(size_t bytes)
{
    size_t n = bytes / HUGEMEM_PAGE;
    return (n ? n : 1) * HUGEMEM_PAGE;
}

#endif
