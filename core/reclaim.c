/*
 * The refused-growth ladder (see reclaim.h): one row a rung, and the loop that climbs it.
 */
#include "core/reclaim.h"

#include <string.h>

#include "core/policy/expandable.h"
#include "core/policy/release.h"
#include "core/services/group.h"
#include "core/services/spill.h"
#include "core/services/trim.h"

/* What a rung's give reports: RUNG_GAVE (try the growth again), RUNG_GAVE_MORE (try again, and
 * should that fail, this rung may give more), RUNG_NOTHING (the next rung). */
enum rung_gave { RUNG_NOTHING, RUNG_GAVE, RUNG_GAVE_MORE };

/* Row flags (besides the retry's GROW_RETRY_* bits, core/grow.h):
 * RUNG_PRESSURE: memory the rung unmaps goes straight to the retry, which maps only the granules
 *   the request needs, not whole pages (exp_recycle_begin, with expandable_segments_recycle, never
 *   during a capture): one bracket spans consecutive such rungs, give and retry, and never a lock
 *   given back, so a GROW_RETRY_RELOCKED rung's bracket holds its retry alone;
 * RUNG_BUDGETED: the rung runs while the growth's budgets are in force (they end before the first
 *   rung without it). */
enum { RUNG_PRESSURE = 1u << 8, RUNG_BUDGETED = 1u << 9 };

struct rung {
    const char *name;
    bool (*applies)(const struct dev_alloc *d, const struct alloc_params *p);
    enum rung_gave (*give)(struct dev_alloc *d, struct alloc_params *p);
    /* The rung's sentence of the OOM message (NULL: none): its own report, one shape for all. */
    void (*note)(const struct dev_alloc *d, char *buf, size_t n);
    unsigned flags; /* GROW_RETRY_* for its retry, RUNG_* */
};

static bool recycling(const struct dev_alloc *d) { return d->use_expandable && d->cfg.expandable_segments_recycle; }

/* Nothing is freed during a capture: cuMemFree or an unmap would invalidate it. */
static bool no_capture(const struct dev_alloc *d, const struct alloc_params *p)
{
    (void)d;
    return !p->capture;
}

/* Trim under pressure (expandable_segments_recycle, core/services/trim.h): only what the request
 * needs, runs of streams known idle first, waiting at most once per stream. PyTorch goes straight
 * to the releases below, which give back every cached block. */
static bool trim_applies(const struct dev_alloc *d, const struct alloc_params *p)
{
    return !p->capture && recycling(d);
}

static enum rung_gave trim_give(struct dev_alloc *d, struct alloc_params *p)
{
    size_t got = 0;
    return trim_pressure(d, p->size, &got) == XSEG_SUCCESS && got ? RUNG_GAVE : RUNG_NOTHING;
}

/* One cached oversize block large enough, or several (PyTorch's release_available_cached_blocks). */
static enum rung_gave oversize_give(struct dev_alloc *d, struct alloc_params *p)
{
    return release_available_cached_blocks(d, p->pool, p->stream, p->size) ? RUNG_GAVE : RUNG_NOTHING;
}

/* Every cached block (PyTorch's release_cached_blocks, empty_cache); the retry is counted. A host
 * OOM on the way still released what it could. */
static enum rung_gave release_all_give(struct dev_alloc *d, struct alloc_params *p)
{
    (void)p;
    xseg_status rs = release_cached_blocks(d, NULL);
    return rs == XSEG_SUCCESS || rs == XSEG_ERROR_OUT_OF_MEMORY ? RUNG_GAVE : RUNG_NOTHING;
}

/* Partly used pages re-backed by granule chunks, their free granules given back
 * (expandable_segments_defrag, core/policy/expandable.h), a round a retry. */
static bool defrag_applies(const struct dev_alloc *d, const struct alloc_params *p)
{
    return !p->capture && d->use_expandable && d->cfg.expandable_segments_defrag;
}

static enum rung_gave defrag_give(struct dev_alloc *d, struct alloc_params *p)
{
    bool more = false;
    if (!exp_defragment(d, p->size, &more))
        return RUNG_NOTHING;
    return more ? RUNG_GAVE_MORE : RUNG_GAVE;
}

/* The memory group's members give their cache way (core/services/group.h), the lock given back
 * meanwhile. The growth then maps only the granules it needs: the members gave what the request
 * lacks, not a whole page more. */
static bool give_way_applies(const struct dev_alloc *d, const struct alloc_params *p)
{
    return !p->capture && group_on(d);
}

static enum rung_gave give_way_give(struct dev_alloc *d, struct alloc_params *p)
{
    return group_give_way(d, p->alloc_size, p->budgeted ? &p->bv : NULL) ? RUNG_GAVE : RUNG_NOTHING;
}

/* Spill (spill_to_host, core/services/spill.h): pages of live blocks to host memory at their
 * addresses, a round a retry, while pages move. Its own rules decide during a capture. */
static bool spill_applies(const struct dev_alloc *d, const struct alloc_params *p)
{
    (void)p;
    return d->cfg.spill_to_host;
}

/* A round asks for what the retry maps: in the pressure bracket (RUNG_PRESSURE) the request's
 * granules, else whole pages (PyTorch's path). Not alloc_size: that is a classic segment's size
 * (20 MiB for a 1-10 MiB request), and only expandable pages spill. */
static enum rung_gave spill_give(struct dev_alloc *d, struct alloc_params *p)
{
    size_t need = p->size;
    if (!recycling(d)) {
        size_t page = p->pool->is_small ? BLOCK_SMALL_BUFFER : d->cfg.expandable_page_size;
        need = (need + page - 1) / page * page;
    }
    return spill_make_room(d, need) == XSEG_SUCCESS ? RUNG_GAVE_MORE : RUNG_NOTHING;
}

/* The ladder, in order. A new rung is a row (and its work, in its module). */
static const struct rung ladder[] = {
    {"trim", trim_applies, trim_give, NULL, RUNG_PRESSURE | RUNG_BUDGETED},
    {"release oversize", no_capture, oversize_give, NULL, RUNG_PRESSURE | RUNG_BUDGETED},
    {"release all", no_capture, release_all_give, NULL, GROW_RETRY_COUNTED | RUNG_PRESSURE | RUNG_BUDGETED},
    {"defrag", defrag_applies, defrag_give, NULL, RUNG_BUDGETED},
    {"give-way", give_way_applies, give_way_give, group_oom_info,
     GROW_RETRY_RELOCKED | GROW_RETRY_CACHE | RUNG_PRESSURE | RUNG_BUDGETED},
    {"spill", spill_applies, spill_give, spill_oom_info, RUNG_PRESSURE},
};

#define RUNG_RETRY_BITS (GROW_RETRY_COUNTED | GROW_RETRY_CACHE | GROW_RETRY_RELOCKED)

/* The pressure bracket (RUNG_PRESSURE): opened at most once a bracket, closed before a rung
 * without it, before a give that gives the lock back, and when the ladder ends. */
static void pressure(struct dev_alloc *d, bool *open, bool want)
{
    if (want && !*open && recycling(d)) {
        exp_recycle_begin(d); /* handles unmapped from here on go to this growth */
        *open = true;
    } else if (!want && *open) {
        exp_recycle_end(d); /* what the growth did not take goes back to the driver */
        *open = false;
    }
}

static void budget_end(struct dev_alloc *d, bool *in_force)
{
    if (*in_force) {
        grow_budget_end(d);
        *in_force = false;
    }
}

xseg_status reclaim_run(struct dev_alloc *d, struct alloc_params *p)
{
    lock_assert_held(&d->lock);
    p->capture = dev_capture_underway(d);
    if (!p->capture)
        p->cls = PLACE_SEG_ANY; /* S1: under pressure, either kind of segment */
    xseg_status st = XSEG_ERROR_OUT_OF_MEMORY;
    bool open = false, budget = p->budgeted;
    for (size_t i = 0; i < sizeof ladder / sizeof ladder[0] && st == XSEG_ERROR_OUT_OF_MEMORY; i++) {
        const struct rung *r = &ladder[i];
        bool press = (r->flags & RUNG_PRESSURE) && !p->capture, relocked = r->flags & GROW_RETRY_RELOCKED;
        if (!press)
            pressure(d, &open, false);
        if (!(r->flags & RUNG_BUDGETED))
            budget_end(d, &budget);
        if (!r->applies(d, p))
            continue;
        for (enum rung_gave gave = RUNG_GAVE_MORE; st == XSEG_ERROR_OUT_OF_MEMORY && gave == RUNG_GAVE_MORE;) {
            pressure(d, &open, press && !relocked); /* a give that unlocks gets no bracket */
            gave = r->give(d, p);
            if (gave == RUNG_NOTHING)
                break;
            pressure(d, &open, press);
            st = grow_again(d, p, r->flags & RUNG_RETRY_BITS);
        }
    }
    pressure(d, &open, false);
    budget_end(d, &budget);
    return st;
}

void reclaim_oom_info(const struct dev_alloc *d, char *buf, size_t n)
{
    size_t used = 0;
    if (n)
        buf[0] = '\0';
    for (size_t i = 0; i < sizeof ladder / sizeof ladder[0] && used + 1 < n; i++)
        if (ladder[i].note) {
            ladder[i].note(d, buf + used, n - used);
            used += strlen(buf + used);
        }
}
