/*
 * A bump arena for host structs that are never given back one by one (block structs): carved in
 * order from reserved address space, resident only as far as it is touched, and moved in place
 * onto 2 MiB huge pages once a page is a small share of it.
 *
 * Why: a calloc'd slab stays on 4 KiB pages for good, so at a million live blocks the ~420,000
 * structs made before huge pages pay (32 MiB of 80-byte structs; base/hugemem.h) kept missing
 * the TLB. Here the first megabytes start on 4 KiB pages (advised MADV_NOHUGEPAGE, so that a
 * small process holds no 2 MiB page even where transparent huge pages are always on); from the
 * threshold the arena is advised MADV_HUGEPAGE, new ranges fault in as huge pages, and the ranges
 * already written are collapsed (MADV_COLLAPSE) two per new range, so no call stalls for more than
 * two 2 MiB copies.
 * The addresses never change: pointers into the arena stay valid throughout.
 *
 * Not thread-safe: its owner serializes the calls (the device lock). arena_release gives it all
 * back at once (xseg_shutdown).
 */
#ifndef XSEG_BASE_ARENA_H
#define XSEG_BASE_ARENA_H

#include <stdbool.h>
#include <stddef.h>

/* Address space one reservation spans (a full one is followed by another): 1 GiB, ~13 million
 * 80-byte structs. Only the part handed out is made writable, and only what is touched resident. */
#define ARENA_RESERVE ((size_t)1 << 30)

struct arena {
    char *base;      /* the current reservation, HUGEMEM_PAGE-aligned; NULL before the first take */
    char *next;      /* its first byte not handed out */
    char *writable;  /* the end of its read-write part (HUGEMEM_PAGE steps) */
    char *end;       /* the end of the reservation */
    char *collapse;  /* ranges [collapse, collapse_end) of this reservation still on 4 KiB pages */
    char *collapse_end;
    size_t reserve;  /* bytes a reservation spans: ARENA_RESERVE, or less (tests); 0: ARENA_RESERVE */
    size_t used;     /* bytes handed out, in every reservation */
    /* Huge pages once one is at most 1/huge_div of the bytes handed out (16: from 32 MiB); 0 makes
     * them start at the next take. */
    size_t huge_div;
    bool huge;       /* advised MADV_HUGEPAGE (the current reservation and any later one) */
    bool broken;     /* a reservation failed: no more tries, callers use calloc */
    size_t collapsed; /* 2 MiB ranges moved onto huge pages by MADV_COLLAPSE */
    /* The full reservations before the current one, for arena_release: after ARENA_OLD_MAX of
     * them (16 GiB of structs) the arena is broken and callers use calloc. */
#define ARENA_OLD_MAX 15
    char *old[ARENA_OLD_MAX];
    unsigned nold;
};

#define ARENA_INIT {.huge_div = 16}

/* @p bytes (a multiple of 16, at most 1 MiB) of zeroed memory, 16-byte aligned, for good. NULL
 * when no address space can be reserved or the kernel refuses to make it writable (then the
 * caller uses calloc: the arena is a speed-up, never a requirement). */
void *arena_take(struct arena *a, size_t bytes);
/* Unmap every reservation (whatever was handed out is gone) and start again as ARENA_INIT with
 * the same reserve and huge_div. */
void arena_release(struct arena *a);

#endif
