/*
 * Growth (see grow.h): admission, one growth under the budgets, the retry the ladder calls.
 */
#include "core/grow.h"

#include "base/error.h"
#include "core/device/sizes.h"
#include "core/policy/classic.h"
#include "core/policy/expandable.h"
#include "core/services/sleep.h"

__attribute__((noinline)) bool grow_pool_fell_asleep(struct dev_alloc *d, struct bpool *pool, xseg_status *st)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp = dev_pool_owner(d, pool);
    if (!d->sleep.nasleep || !sleep_pool_asleep(d, pp))
        return false;
    *st = sleep_refuse(d, pp);
    return true;
}

xseg_status grow_capture_error(CUstream stream)
{
    return err_set(XSEG_ERROR_ILLEGAL_STATE,
                   "allocation on stream %p during stream capture needs a private pool "
                   "(xseg_begin_allocate_to_pool)", (void *)stream);
}

bool grow_holdable(struct dev_alloc *d, struct alloc_params *p, size_t size)
{
    p->alloc_size = sizes_growth(d, p->size);
    size_t limit = d->acct.set_fraction ? d->acct.allowed_memory_maximum : d->info.total_mem;
    size_t cap = group_budget_cap(d); /* memory_budget_mb, memory_group_budget_mb */
    return XSEG_LIKELY(size <= limit && size <= cap);
}

xseg_status grow_admit(struct dev_alloc *d, const struct alloc_params *p)
{
    xseg_status st = XSEG_SUCCESS;
    if (!dev_pool_owner(d, p->pool) && dev_stream_capturing(d, p->stream, &st)) {
        dev_capture_note(d, p->stream);
        dev_fast_off(d);
        return grow_capture_error(p->stream);
    }
    return st;
}

/* PyTorch's alloc_block: the fraction limit, then a new classic segment or expandable room. */
static xseg_status alloc_block(struct dev_alloc *d, struct alloc_params *p, bool is_retry)
{
    lock_assert_held(&d->lock);
    if (is_retry)
        d->acct.stats.num_alloc_retries++;
    if (d->use_expandable && !dev_pool_allocator(d, p->pool)) { /* an owned pool: classic segments */
        place_want(d, p->cls); /* S1: its class's segments, or any */
        xseg_status st = exp_allocate(d, p->pool, p->stream, p->size, &p->block);
        place_want(d, PLACE_SEG_ANY);
        return st;
    }
    if (!dev_fraction_allows(d, p->alloc_size))
        return XSEG_ERROR_OUT_OF_MEMORY;
    return classic_grow(d, p->pool, p->stream, p->alloc_size, grow_pool_fell_asleep, &p->block);
}

/* Measure the budgets (core/services/group.h) and put their limit in force for this growth of @p grow bytes. */
static __attribute__((noinline)) void budget_enter(struct dev_alloc *d, struct budget_view *v, size_t grow)
{
    lock_assert_held(&d->lock);
    group_budget_measure(d, v, grow);
    d->acct.set_budget = v->limit != SIZE_MAX;
    d->acct.budget_limit = v->limit;
}

/* The budgets stop being in force: the growth's intent is withdrawn, failed or not. */
static void budget_exit(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    d->acct.set_budget = false;
    group_note_reserved(d, false);
}

xseg_status grow_again(struct dev_alloc *d, struct alloc_params *p, unsigned how)
{
    xseg_status st;
    if (how & GROW_RETRY_RELOCKED) {
        if (grow_pool_fell_asleep(d, p->pool, &st))
            return st;
        if (p->budgeted)
            budget_enter(d, &p->bv, p->alloc_size); /* the figures moved meanwhile */
    }
    if ((how & GROW_RETRY_CACHE) && grow_recheck_cache(d, p))
        return XSEG_SUCCESS;
    return alloc_block(d, p, how & GROW_RETRY_COUNTED);
}

void grow_budget_end(struct dev_alloc *d) { budget_exit(d); }

xseg_status grow_try(struct dev_alloc *d, struct alloc_params *p)
{
    p->budgeted = XSEG_UNLIKELY(group_measure_on(d));
    if (p->budgeted)
        budget_enter(d, &p->bv, p->alloc_size);
    xseg_status st = alloc_block(d, p, false);
    if (st != XSEG_ERROR_OUT_OF_MEMORY && p->budgeted)
        budget_exit(d);
    return st;
}
