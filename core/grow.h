/*
 * Growth: what a cache miss does to get memory (PyTorch's alloc_block and the steps around it in
 * DeviceCachingAllocator::malloc). The request every malloc carries (struct alloc_params, PyTorch's
 * AllocParams, built by alloc_params_init alone); the admission that refuses what no device can
 * hold before anything is sized for it; one growth under the budgets in force
 * (core/services/group.h): a new classic segment (core/policy/classic.h) or room in an expandable
 * one (core/policy/expandable.h); and the retry the reclaim ladder (core/reclaim.h, above this
 * module) calls after each rung that gave. core/alloc.c's malloc_policy calls them in that order.
 * Device lock held on entry and on return.
 */
#ifndef XSEG_CORE_GROW_H
#define XSEG_CORE_GROW_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/blockops.h"
#include "core/services/group.h"

/* One malloc's request (PyTorch's AllocParams): what the cache search, the policy, the growth and
 * the reclaim ladder read of it, and what they leave in it. */
struct alloc_params {
    size_t size;         /* rounded request */
    size_t alloc_size;   /* size of a new classic segment (grow_holdable; 0 before) */
    CUstream stream;
    struct bpool *pool;
    struct block *block; /* the block found or made */
    bool top;            /* predicted long-lived: carved from the top (core/device/placement.h) */
    uint8_t cls;         /* the segments a growth may use (placement.h's S1: PLACE_SEG_*) */
    bool capture;        /* the ladder's: a capture was underway at the refusal, nothing may be freed */
    bool budgeted;       /* grow_try's: the budgets were measured for this growth (bv) */
    struct budget_view bv; /* the budgets of this growth; read only while budgeted */
};

/* The pool a request of @p rounded bytes draws from: @p priv's (NULL: the device's), small or
 * large by size. */
static inline struct bpool *alloc_params_pool(struct dev_alloc *d, struct priv_pool *priv, size_t rounded)
{
    if (XSEG_UNLIKELY(priv))
        return rounded <= BLOCK_SMALL_SIZE ? &priv->small : &priv->large;
    return rounded <= BLOCK_SMALL_SIZE ? &d->small : &d->large;
}

/* The request of @p rounded bytes on @p stream from @p pool (@p top: predicted long-lived), no
 * block yet, any segment class, no growth measured: every request is built here. In line always:
 * the fast path keeps it in registers (passing a request by address cost every cached pair of the
 * device lock instructions; the stores its path never reads fold away). */
static inline __attribute__((always_inline)) void alloc_params_init(struct alloc_params *p, size_t rounded,
                                                                    struct bpool *pool, CUstream stream, bool top)
{
    p->size = rounded;
    p->alloc_size = 0;
    p->stream = stream;
    p->pool = pool;
    p->block = NULL;
    p->top = top;
    p->cls = PLACE_SEG_ANY;
    p->capture = false;
    p->budgeted = false;
}

/* How the ladder (core/reclaim.h) tries the growth again after a rung gave (grow_again's @p how). */
enum {
    GROW_RETRY_COUNTED = 1u << 0,  /* the retry counts in num_alloc_retries (PyTorch's is_retry) */
    GROW_RETRY_CACHE = 1u << 1,    /* look in the cache first: frees may have come meanwhile */
    GROW_RETRY_RELOCKED = 1u << 2, /* the lock was given back: a pool that fell asleep refuses, the
                                    * budgets are measured again */
};

/* The cache again before a growth, once frees may have come (the lock given back, a quarantine
 * emptied, a rung's give): p->block, taken out of the free index (blockops' bops_take_free). */
static inline bool grow_recheck_cache(struct dev_alloc *d, struct alloc_params *p)
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
 * says whether it can ever be held. False when the device (or the memory fraction, a budget) is
 * too small, before any segment metadata is sized for it (2^54 bytes would cost gigabytes of page
 * tables) and before the OOM path empties the cache for nothing: the caller reports it
 * (core/oom.h, above this module). */
bool grow_holdable(struct dev_alloc *d, struct alloc_params *p, size_t size);

/* A holdable miss's admission: an unrouted request on a capturing stream is refused (a routed one
 * may grow its private pool during a capture), as is a stream the driver cannot query. */
xseg_status grow_admit(struct dev_alloc *d, const struct alloc_params *p);

/* A new classic segment, or room in an expandable one, for @p p: p->block on success. Under a
 * budget (p->budgeted), measured now (one cuMemGetInfo a growth) and left in force when the growth
 * is refused (OUT_OF_MEMORY): the ladder ends it (grow_budget_end). */
xseg_status grow_try(struct dev_alloc *d, struct alloc_params *p);

/* The growth of @p p again, after a ladder's rung gave (lock held, kept): XSEG_SUCCESS,
 * XSEG_ERROR_OUT_OF_MEMORY (the next rung), or an error that ends the malloc. @p how: GROW_RETRY_*
 * bits. */
xseg_status grow_again(struct dev_alloc *d, struct alloc_params *p, unsigned how);

/* The budgets grow_try measured stop being in force (only when p->budgeted; once, by the ladder,
 * before its first rung that runs outside them or when it ends). */
void grow_budget_end(struct dev_alloc *d);

#endif
