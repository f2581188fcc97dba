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

/* Row flags (besides the retry's RECLAIM_* bits):
 * RUNG_PRESSURE: memory the rung unmaps goes straight to the retry, which maps only the granules
 *   the request needs, not whole pages (exp_recycle_begin, with expandable_segments_recycle, never
 *   during a capture): one bracket spans consecutive such rungs, give and retry, and never a lock
 *   given back, so a RECLAIM_RELOCKED rung's bracket holds its retry alone;
 * RUNG_BUDGETED: the rung runs while the growth's budgets are in force (they end before the first
 *   rung without it). */
enum { RUNG_PRESSURE = 1u << 8, RUNG_BUDGETED = 1u << 9 };

struct rung {
    const char *name;
    bool (*applies)(const struct dev_alloc *d, const struct reclaim_growth *g);
    enum rung_gave (*give)(struct dev_alloc *d, struct reclaim_growth *g);
    /* The rung's sentence of the OOM message (NULL: none): its own report, one shape for all. */
    void (*note)(const struct dev_alloc *d, char *buf, size_t n);
    unsigned flags; /* RECLAIM_* for its retry, RUNG_* */
};

static bool recycling(const struct dev_alloc *d) { return d->use_expandable && d->cfg.expandable_segments_recycle; }

/* Nothing is freed during a capture: cuMemFree or an unmap would invalidate it. */
static bool no_capture(const struct dev_alloc *d, const struct reclaim_growth *g)
{
    (void)d;
    return !g->capture;
}

/* Trim under pressure (expandable_segments_recycle, core/services/trim.h): only what the request
 * needs, runs of streams known idle first, waiting at most once per stream. PyTorch goes straight
 * to the releases below, which give back every cached block. */
static bool trim_applies(const struct dev_alloc *d, const struct reclaim_growth *g)
{
    return !g->capture && recycling(d);
}

static enum rung_gave trim_give(struct dev_alloc *d, struct reclaim_growth *g)
{
    size_t got = 0;
    return trim_pressure(d, g->size, &got) == XSEG_SUCCESS && got ? RUNG_GAVE : RUNG_NOTHING;
}

/* One cached oversize block large enough, or several (PyTorch's release_available_cached_blocks). */
static enum rung_gave oversize_give(struct dev_alloc *d, struct reclaim_growth *g)
{
    return release_available_cached_blocks(d, g->pool, g->stream, g->size) ? RUNG_GAVE : RUNG_NOTHING;
}

/* Every cached block (PyTorch's release_cached_blocks, empty_cache); the retry is counted. A host
 * OOM on the way still released what it could. */
static enum rung_gave release_all_give(struct dev_alloc *d, struct reclaim_growth *g)
{
    (void)g;
    xseg_status rs = release_cached_blocks(d, NULL);
    return rs == XSEG_SUCCESS || rs == XSEG_ERROR_OUT_OF_MEMORY ? RUNG_GAVE : RUNG_NOTHING;
}

/* Partly used pages re-backed by granule chunks, their free granules given back
 * (expandable_segments_defrag, core/policy/expandable.h), a round a retry. */
static bool defrag_applies(const struct dev_alloc *d, const struct reclaim_growth *g)
{
    return !g->capture && d->use_expandable && d->cfg.expandable_segments_defrag;
}

static enum rung_gave defrag_give(struct dev_alloc *d, struct reclaim_growth *g)
{
    bool more = false;
    if (!exp_defragment(d, g->size, &more))
        return RUNG_NOTHING;
    return more ? RUNG_GAVE_MORE : RUNG_GAVE;
}

/* The memory group's members give their cache way (core/services/group.h), the lock given back
 * meanwhile. The growth then maps only the granules it needs: the members gave what the request
 * lacks, not a whole page more. */
static bool give_way_applies(const struct dev_alloc *d, const struct reclaim_growth *g)
{
    return !g->capture && group_on(d);
}

static enum rung_gave give_way_give(struct dev_alloc *d, struct reclaim_growth *g)
{
    return group_give_way(d, g->alloc_size, g->bv) ? RUNG_GAVE : RUNG_NOTHING;
}

/* Spill (spill_to_host, core/services/spill.h): pages of live blocks to host memory at their
 * addresses, a round a retry, while pages move. Its own rules decide during a capture. */
static bool spill_applies(const struct dev_alloc *d, const struct reclaim_growth *g)
{
    (void)g;
    return d->cfg.spill_to_host;
}

/* A round asks for what the retry maps: in the pressure bracket (RUNG_PRESSURE) the request's
 * granules, else whole pages (PyTorch's path). Not alloc_size: that is a classic segment's size
 * (20 MiB for a 1-10 MiB request), and only expandable pages spill. */
static enum rung_gave spill_give(struct dev_alloc *d, struct reclaim_growth *g)
{
    size_t need = g->size;
    if (!recycling(d)) {
        size_t page = g->pool->is_small ? BLOCK_SMALL_BUFFER : d->cfg.expandable_page_size;
        need = (need + page - 1) / page * page;
    }
    return spill_make_room(d, need) == XSEG_SUCCESS ? RUNG_GAVE_MORE : RUNG_NOTHING;
}

/* The ladder, in order. A new rung is a row (and its work, in its module). */
static const struct rung ladder[] = {
    {"trim", trim_applies, trim_give, NULL, RUNG_PRESSURE | RUNG_BUDGETED},
    {"release oversize", no_capture, oversize_give, NULL, RUNG_PRESSURE | RUNG_BUDGETED},
    {"release all", no_capture, release_all_give, NULL, RECLAIM_COUNTED | RUNG_PRESSURE | RUNG_BUDGETED},
    {"defrag", defrag_applies, defrag_give, NULL, RUNG_BUDGETED},
    {"give-way", give_way_applies, give_way_give, group_oom_info,
     RECLAIM_RELOCKED | RECLAIM_CACHE | RUNG_PRESSURE | RUNG_BUDGETED},
    {"spill", spill_applies, spill_give, spill_oom_info, RUNG_PRESSURE},
};

#define RECLAIM_AGAIN_BITS (RECLAIM_COUNTED | RECLAIM_CACHE | RECLAIM_RELOCKED)

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

static void budget_end(struct dev_alloc *d, struct reclaim_growth *g, bool *in_force)
{
    if (*in_force) {
        g->budget_end(d, g);
        *in_force = false;
    }
}

xseg_status reclaim_run(struct dev_alloc *d, struct reclaim_growth *g)
{
    lock_assert_held(&d->lock);
    xseg_status st = XSEG_ERROR_OUT_OF_MEMORY;
    bool open = false, budget = g->bv != NULL;
    for (size_t i = 0; i < sizeof ladder / sizeof ladder[0] && st == XSEG_ERROR_OUT_OF_MEMORY; i++) {
        const struct rung *r = &ladder[i];
        bool press = (r->flags & RUNG_PRESSURE) && !g->capture, relocked = r->flags & RECLAIM_RELOCKED;
        if (!press)
            pressure(d, &open, false);
        if (!(r->flags & RUNG_BUDGETED))
            budget_end(d, g, &budget);
        if (!r->applies(d, g))
            continue;
        for (enum rung_gave gave = RUNG_GAVE_MORE; st == XSEG_ERROR_OUT_OF_MEMORY && gave == RUNG_GAVE_MORE;) {
            pressure(d, &open, press && !relocked); /* a give that unlocks gets no bracket */
            gave = r->give(d, g);
            if (gave == RUNG_NOTHING)
                break;
            pressure(d, &open, press);
            st = g->again(d, g, r->flags & RECLAIM_AGAIN_BITS);
        }
    }
    pressure(d, &open, false);
    budget_end(d, g, &budget);
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
