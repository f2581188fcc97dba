/* debug_stale_access for the pinned host cache: the FIFO, the pattern, the checks (hostquar.h). */
#include "core/services/hostquar.h"

#include <string.h>

#include "base/hostmem.h"
#include "base/vec.h"
#include "core/process/history.h"

/* A finding for @p it at offset @p off (its stacks referenced again: the finding outlives it). */
static void hq_finding(struct hq_state *q, const struct hq_item *it, size_t off, const char *when)
{
    if (q->nfound >= QUAR_MAX_FINDINGS || !VEC_RESERVE(q->found, q->capfound, q->nfound + 1)) {
        q->dropped++;
        return;
    }
    q->found[q->nfound++] = (struct quar_item){
        .addr = it->addr,
        .size = it->size,
        .requested = it->requested,
        .pool = QUAR_POOL_HOST,
        .filled = true,
        .reported = true,
        .alloc_stack = it->alloc_stack,
        .free_stack = it->free_stack,
        .freed_us = it->freed_us,
        .found_us = hist_now_us(),
        .first_offset = off,
        .when = when,
    };
    hist_stack_ref(it->alloc_stack);
    hist_stack_ref(it->free_stack);
    q->reported++;
}

/* Check item @p it (host memory: read in place). Returns 1 for a new finding. */
static size_t hq_check(struct hq_state *q, struct hq_item *it, const char *when)
{
    q->checked++;
    if (it->reported)
        return 0;
    size_t f = quar_first_changed((const unsigned char *)it->addr, it->size);
    if (f == it->size)
        return 0;
    it->reported = true;
    hq_finding(q, it, f, when);
    return 1;
}

/* The oldest block leaves: back to the cache through @p release. */
static void hq_leave_oldest(struct hq_state *q, hq_release_fn release)
{
    struct hq_item *it = &q->q[q->head];
    q->bytes -= it->size;
    hist_stack_unref(it->alloc_stack);
    hist_stack_unref(it->free_stack);
    void *blk = it->blk;
    q->head++;
    if (--q->n == 0)
        q->head = 0;
    release(blk);
}

/* Keep the bound: the oldest leave (each checked first) down to 7/8 of it, so that exits come in
 * batches rather than one a free; never the newest (at most the bound by itself). */
static size_t hq_trim(struct hq_state *q, size_t bound, const char *when, hq_release_fn release)
{
    if (q->bytes <= bound && q->n <= QUAR_MAX_BLOCKS)
        return 0;
    size_t low = bound - bound / 8, lown = QUAR_MAX_BLOCKS - QUAR_MAX_BLOCKS / 8, found = 0;
    while (q->n > 1 && (q->bytes > low || q->n > lown)) {
        found += hq_check(q, &q->q[q->head], when);
        hq_leave_oldest(q, release);
    }
    return found;
}

bool hostquar_enter(struct hq_state *q, size_t bound, void *blk, void *addr, size_t size, size_t requested,
                    struct hstack *alloc_stack, struct hstack *free_stack, hq_release_fn release)
{
    if (size > bound)
        return false;
    if (q->head + q->n == q->cap && q->head) {
        memmove(q->q, q->q + q->head, q->n * sizeof *q->q);
        q->head = 0;
    }
    if (!VEC_RESERVE(q->q, q->cap, q->n + 1))
        return false;
    memset(addr, QUAR_POISON, size); /* its streams are done with it: a host write, no driver call */
    q->q[q->head + q->n++] = (struct hq_item){
        .blk = blk,
        .addr = (uintptr_t)addr,
        .size = size,
        .requested = requested,
        .alloc_stack = alloc_stack,
        .free_stack = free_stack,
        .freed_us = hist_now_us(),
    };
    q->bytes += size;
    q->entered++;
    (void)hq_trim(q, bound, "quarantine exit", release);
    return true;
}

size_t hostquar_check_all(struct hq_state *q, const char *when, bool drain, hq_release_fn release)
{
    size_t found = 0;
    for (size_t i = 0; i < q->n; i++)
        found += hq_check(q, &q->q[q->head + i], when);
    while (drain && q->n)
        hq_leave_oldest(q, release);
    return found;
}

void hostquar_take(struct hq_state *q, struct quar_batch *out)
{
    *out = (struct quar_batch){-1, q->found, q->nfound};
    q->found = NULL;
    q->nfound = q->capfound = 0;
}

void hostquar_destroy(struct hq_state *q)
{
    for (size_t i = 0; i < q->nfound; i++) {
        hist_stack_unref(q->found[i].alloc_stack);
        hist_stack_unref(q->found[i].free_stack);
    }
    xs_free(q->found);
    xs_free(q->q);
    q->found = NULL;
    q->q = NULL;
    q->head = q->n = q->cap = q->bytes = q->nfound = q->capfound = 0;
}
