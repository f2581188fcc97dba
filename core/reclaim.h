/*
 * The refused-growth ladder (PyTorch's chain in DeviceCachingAllocator::malloc, RMM's retry loop):
 * when the driver, the memory fraction or a budget refuses a growth, each rung that applies gives
 * memory back, then the growth is tried again; the first success ends the ladder. The rungs, in
 * order: trim under pressure (core/services/trim.h), release oversize blocks, release every cached
 * block (core/policy/release.h), defragment (core/policy/expandable.h), the memory group's
 * give-way (core/services/group.h), spill to host memory (core/services/spill.h).
 *
 * A rung's work is its module's function; core/reclaim.c holds one row a rung (its name, when it
 * applies, the call that gives, how the growth is tried again, the OOM message's sentence) and the
 * loop. A new rung is a function in its module and a row there.
 *
 * Locking: the device lock is held on entry and on return; a rung may give it back meanwhile (the
 * give-way does: the retry then checks the pool again and measures the budgets again).
 */
#ifndef XSEG_CORE_RECLAIM_H
#define XSEG_CORE_RECLAIM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/device.h"

struct budget_view;
struct reclaim_growth;

/* How a growth is tried again after a rung gave (bits of reclaim_growth.again's @p how). */
enum {
    RECLAIM_COUNTED = 1u << 0,  /* the retry counts in num_alloc_retries (PyTorch's is_retry) */
    RECLAIM_CACHE = 1u << 1,    /* look in the cache first: frees may have come meanwhile */
    RECLAIM_RELOCKED = 1u << 2, /* the lock was given back: a pool that fell asleep refuses, the
                                 * budgets are measured again */
};

/* The growth refused, as the ladder sees it: core/grow.c's, which tries it again. */
struct reclaim_growth {
    struct bpool *pool;
    CUstream stream;
    size_t size;            /* the rounded request */
    size_t alloc_size;      /* the growth that was refused */
    struct budget_view *bv; /* the budgets in force for this growth (NULL: none) */
    bool capture;           /* a capture was underway at the refusal: nothing may be freed */
    /* Grow again (lock held, kept): XSEG_SUCCESS, XSEG_ERROR_OUT_OF_MEMORY (the next rung), or an
     * error that ends the malloc. @p how: RECLAIM_* bits. */
    xseg_status (*again)(struct dev_alloc *d, struct reclaim_growth *g, unsigned how);
    /* The budgets stop being in force (before the first rung that runs outside them, or when the
     * ladder ends); called once, only with bv set. */
    void (*budget_end)(struct dev_alloc *d, struct reclaim_growth *g);
};

/* Climb the ladder for @p g (its first growth was refused with OUT_OF_MEMORY): XSEG_SUCCESS once a
 * retry succeeded, XSEG_ERROR_OUT_OF_MEMORY when no rung gave enough, or a retry's other error. The
 * budgets (g->bv) have ended on return. */
xseg_status reclaim_run(struct dev_alloc *d, struct reclaim_growth *g);

/* The OOM message's rung sentences, in ladder order ("" when no rung has one to say): what each
 * rung reports of its state (the group's members, the spilled bytes or why spill failed). */
void reclaim_oom_info(const struct dev_alloc *d, char *buf, size_t n);

#endif
