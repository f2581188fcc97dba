/*
 * Growth: what a cache miss does to get memory (PyTorch's alloc_block and the steps around it in
 * DeviceCachingAllocator::malloc). The request as the slow path carries it (struct alloc_params,
 * PyTorch's AllocParams); the admission that refuses what no device can hold before anything is
 * sized for it; one growth under the budgets in force (core/services/group.h): a new classic
 * segment (core/policy/classic.h) or room in an expandable one (core/policy/expandable.h); and,
 * when the growth is refused, the reclaim ladder (core/reclaim.h) with this module's retry as its
 * callback. core/alloc.c's malloc_policy calls them in that order. Device lock held on entry and
 * on return (given back inside the ladder by the group's give-way).
 */
#ifndef XSEG_CORE_GROW_H
#define XSEG_CORE_GROW_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/blockops.h"
#include "core/reclaim.h"
#include "core/services/group.h"

/* Everything the slow path needs about one request (PyTorch's AllocParams). */
struct alloc_params {
    size_t size;       /* rounded request */
    size_t alloc_size; /* size of a new classic segment */
    CUstream stream;
    struct bpool *pool;
    struct block *block; /* the block found or made */
    bool top;            /* predicted long-lived: carved from the top (core/device/placement.h) */
    uint8_t cls;         /* the segments a growth may use (placement.h's S1: PLACE_SEG_*) */
};

/* The cache again, before a growth (frees may have come while the lock was given back): p->block,
 * taken out of the free index (blockops' bops_take_free). */
static inline bool grow_cached(struct dev_alloc *d, struct alloc_params *p)
{
    return (p->block = bops_take_free(d, p->pool, p->stream, p->size, p->top)) != NULL;
}

/* Did @p pool stop being awake while the lock was given back (a sleep begun by another thread or
 * by a free-memory callback)? Then *@p st is the refusal malloc_prepare would have given: its
 * blocks and holes lie in pages a sleep is giving back. */
bool grow_pool_fell_asleep(struct dev_alloc *d, struct bpool *pool, xseg_status *st);

/* The error of an allocation on capturing stream @p stream that no private pool takes. */
xseg_status grow_capture_error(CUstream stream);

/* A cache miss that may grow (@p size: the bytes asked for): sizes its growth (p->alloc_size) and
 * refuses what can never be held — the device (or the memory fraction, a budget) too small, before
 * any segment metadata is sized for it (2^54 bytes would cost gigabytes of page tables) and before
 * the OOM path empties the cache for nothing — and an unrouted request on a capturing stream (a
 * routed one may grow its private pool during a capture). */
xseg_status grow_admit(struct dev_alloc *d, struct alloc_params *p, size_t size);

/* A growth malloc_policy tries: its request, and the ladder's view of it (core/reclaim.h). */
struct growth {
    struct reclaim_growth g; /* first: the ladder's callbacks get it back */
    struct alloc_params *p;
    struct budget_view bv;
};

/* A new classic segment, or room in an expandable one, for @p p: p->block on success. Under a
 * budget, measured now (one cuMemGetInfo a growth) and left in force when the growth is refused
 * (OUT_OF_MEMORY): grow_reclaim's ladder ends it. */
xseg_status grow_try(struct dev_alloc *d, struct alloc_params *p, struct growth *gr);

/* The growth of @p gr was refused: the reclaim ladder gives memory back and grows again, rung by
 * rung. XSEG_ERROR_OUT_OF_MEMORY when no rung gave enough (the report is the caller's). */
xseg_status grow_reclaim(struct dev_alloc *d, struct growth *gr);

#endif
