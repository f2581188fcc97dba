/* The bump arena of never-freed host structs (base/arena.h). */
#include "base/arena.h"

#include <stdint.h>
#include <sys/mman.h>

#include "base/assert.h"
#include "base/hugemem.h"

#if defined(__SANITIZE_ADDRESS__)
#define ARENA_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_LSAN 1
#endif
#endif
#ifdef ARENA_LSAN
#include <sanitizer/lsan_interface.h>
#endif

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older kernels answer EINVAL, and khugepaged collapses later */
#endif

/* Advise [p, p + n) to huge pages or away from them; a kernel without them refuses, harmlessly. */
static void arena_advise(char *p, size_t n, bool huge)
{
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
    (void)madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
    (void)p;
    (void)n;
    (void)huge;
#endif
}

/* Bytes one reservation spans (0: too large). */
static size_t arena_span(const struct arena *a)
{
    size_t n = a->reserve ? a->reserve : ARENA_RESERVE;
    if (n > SIZE_MAX / 4)
        return 0;
    return (n + HUGEMEM_PAGE - 1) & ~(HUGEMEM_PAGE - 1);
}

/* A new reservation, PROT_NONE (no commit charge even where overcommit is strict), 2 MiB-aligned. */
static bool arena_reserve(struct arena *a)
{
    size_t n = arena_span(a);
    if (!n || (a->base && a->nold == ARENA_OLD_MAX))
        return false;
    char *raw = mmap(NULL, n + HUGEMEM_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return false;
    char *p = (char *)(((uintptr_t)raw + HUGEMEM_PAGE - 1) & ~(uintptr_t)(HUGEMEM_PAGE - 1));
    size_t head = (size_t)(p - raw), tail = HUGEMEM_PAGE - head;
    if ((head && munmap(raw, head) != 0) || (tail && munmap(p + n, tail) != 0)) {
        munmap(raw, n + HUGEMEM_PAGE);
        return false;
    }
    arena_advise(p, n, a->huge);
#ifdef ARENA_LSAN
    /* Heap objects referenced only from structs here (a block's side struct) are not leaks. */
    __lsan_register_root_region(p, n);
#endif
    /* A full reservation's ranges still on 4 KiB pages stay so (khugepaged may collapse them). */
    if (a->base)
        a->old[a->nold++] = a->base;
    a->base = a->next = a->writable = p;
    a->end = p + n;
    a->collapse = a->collapse_end = p;
    return true;
}

/* Move up to @p n of the ranges written before the threshold onto huge pages. */
static void arena_collapse(struct arena *a, int n)
{
    for (; n > 0 && a->collapse < a->collapse_end; n--, a->collapse += HUGEMEM_PAGE) {
        if (madvise(a->collapse, HUGEMEM_PAGE, MADV_COLLAPSE) == 0) {
            a->collapsed++;
        } else {
            a->collapse_end = a->collapse; /* unsupported, or no huge page to be had: stop trying */
            break;
        }
    }
}

void *arena_take(struct arena *a, size_t bytes)
{
    xseg_assert(bytes && bytes % 16 == 0 && bytes <= HUGEMEM_PAGE / 2);
    if (a->broken)
        return NULL;
    if (!a->base || (size_t)(a->end - a->next) < bytes) {
        if (!arena_reserve(a)) {
            a->broken = true;
            return NULL;
        }
    }
    bool turn = false; /* this take crossed the threshold or made a new range writable */
    if (!a->huge && HUGEMEM_PAGE * a->huge_div <= a->used + bytes) {
        /* From here new ranges fault in as huge pages; the ones written so far follow two a take
         * that crosses here or makes a new range writable (their contents copied by the kernel,
         * their addresses kept). */
        a->huge = turn = true;
        arena_advise(a->base, (size_t)(a->end - a->base), true);
        a->collapse = a->base;
        a->collapse_end = a->writable;
    }
    while ((size_t)(a->writable - a->next) < bytes) {
        if (mprotect(a->writable, HUGEMEM_PAGE, PROT_READ | PROT_WRITE) != 0)
            return NULL; /* out of commit where overcommit is strict; the arena stays usable */
        a->writable += HUGEMEM_PAGE;
        turn = true;
    }
    if (turn && a->huge)
        arena_collapse(a, 2);
    void *p = a->next;
    a->next += bytes;
    a->used += bytes;
    return p;
}

static void arena_unmap(char *p, size_t n)
{
#ifdef ARENA_LSAN
    __lsan_unregister_root_region(p, n);
#endif
    munmap(p, n);
}

void arena_release(struct arena *a)
{
    size_t n = arena_span(a);
    for (unsigned i = 0; i < a->nold; i++)
        arena_unmap(a->old[i], n);
    if (a->base)
        arena_unmap(a->base, n);
    *a = (struct arena){.reserve = a->reserve, .huge_div = a->huge_div};
}
