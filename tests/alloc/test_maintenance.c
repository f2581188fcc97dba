/*
 * The maintenance calls that skip what cannot matter (issue 77 item 3) against the walk over every
 * free block they replaced, on seeded random heaps (several streams, both pools, a private pool,
 * classic or expandable segments):
 *   - release_cached_blocks and trim look only at the free blocks of at least release_floor bytes
 *     (bpool_collect_free_from): that list is the full walk's (bpool_collect_free) blocks of that
 *     size, in the same order, and no smaller block could give anything back (a whole classic
 *     segment, a whole granule of an expandable one), so the same blocks go back in the same order;
 *   - xseg_empty_cache gives back exactly what the walk finds releasable: reserved_bytes falls by
 *     the walk's releasable bytes, segment and num_device_free (classic) by its whole segments, and
 *     afterwards the walk finds nothing releasable left;
 *   - xseg_cache_info (and bpool_largest_free under it) answers the walk's largest free block over
 *     every pool, private pools included (PyTorch's cacheInfo).
 * XSEG_TEST_SEED=<n> replays one seed; `test_maintenance NAME` runs one mode.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/hostmem.h"
#include "core/device/check.h"
#include "core/device/fast.h"
#include "core/policy/expandable.h"
#include "core/runtime.h"
#include "tests/common/testutil.h"
#include "vmm/driver.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define NSTREAMS 3
#define MAX_LIVE 600

static uint64_t rng;
static size_t n_info, n_empty, released_bytes, released_segs, priv_free; /* what the run covered */
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static size_t rnd_below(size_t n) { return (size_t)(rnd() % n); }

/* What the walk says empty_cache gives back of @p b: a whole classic segment, or the whole chunks
 * inside a free expandable block of an awake pool (release_blocks_memo's two passes). */
static size_t releasable(const struct block *b)
{
    if (!b->expandable)
        return block_is_split(b) ? 0 : b->size;
    return b->seg->asleep ? 0 : exp_whole_page_bytes(b);
}

struct walk_totals {
    size_t largest;      /* the largest free block of every pool (0: none) */
    size_t bytes;        /* what empty_cache would give back (pools it releases) */
    int64_t whole_segs;  /* classic segments among those */
};

/* One pool: the subset walk against the full one, the index's largest against the walk's. */
static void check_pool(struct dev_alloc *d, struct bpool *p, bool released, struct walk_totals *t)
{
    struct block **all, **sub;
    size_t nall, nsub;
    assert_true(bpool_collect_free(p, &all, &nall));
    assert_true(bpool_collect_free_from(p, d->release_floor, &sub, &nsub));
    size_t j = 0, largest = 0;
    for (size_t i = 0; i < nall; i++) {
        struct block *b = all[i];
        if (b->size > largest)
            largest = b->size;
        if (b->size >= d->release_floor) {
            assert_true(j < nsub);
            assert_ptr_equal(sub[j], b); /* the same blocks, in index order */
            j++;
        } else {
            assert_int_equal(releasable(b), 0); /* skipped: nothing in it could go back */
            assert_true(b->expandable ? exp_whole_page_bytes(b) == 0 : block_is_split(b));
        }
        if (released) {
            t->bytes += releasable(b);
            t->whole_segs += !b->expandable && !block_is_split(b);
        }
    }
    assert_int_equal(j, nsub);
    const struct block *lb = bpool_largest_free(p);
    assert_int_equal(lb ? lb->size : 0, largest);
    if (largest > t->largest)
        t->largest = largest;
    xs_free(all);
    xs_free(sub);
}

static struct walk_totals walk_all(struct dev_alloc *d)
{
    struct walk_totals t = {0};
    dev_lock(d, DEV_NEED_SLOTS); /* the slots settled: every free block is in its index */
    check_pool(d, &d->large, true, &t);
    check_pool(d, &d->small, true, &t);
    for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
        check_pool(d, &pp->large, pp->use_count == 0, &t);
        check_pool(d, &pp->small, pp->use_count == 0, &t);
        priv_free += pp->large.nfree + pp->small.nfree;
    }
    dev_unlock(d);
    return t;
}

static void check_cache_info(struct dev_alloc *d)
{
    struct walk_totals t = walk_all(d);
    size_t largest = 1; /* not 0: no driver guess */
    assert_int_equal(xseg_cache_info(0, &largest), XSEG_SUCCESS);
    assert_int_equal(largest, t.largest > 1 ? t.largest : 1);
    n_info++;
}

static void check_empty_cache(struct dev_alloc *d, bool classic)
{
    struct walk_totals t = walk_all(d);
    xseg_device_stats s0, s1;
    assert_int_equal(xseg_get_stats(0, &s0), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_get_stats(0, &s1), XSEG_SUCCESS);
    assert_int_equal(s0.reserved_bytes[XSEG_STAT_ALL].current - s1.reserved_bytes[XSEG_STAT_ALL].current,
                     (int64_t)t.bytes);
    if (classic) {
        assert_int_equal(s0.segment[XSEG_STAT_ALL].current - s1.segment[XSEG_STAT_ALL].current, t.whole_segs);
        assert_int_equal(s1.num_device_free - s0.num_device_free, t.whole_segs);
    }
    struct walk_totals after = walk_all(d);
    assert_int_equal(after.bytes, 0); /* the walk finds nothing left to give back */
    n_empty++;
    released_bytes += t.bytes;
    released_segs += (size_t)t.whole_segs;
}

static int route_all(struct CUstream_st *stream, void *user)
{
    (void)stream;
    (void)user;
    return 1;
}

static void run(bool classic)
{
    const char *env = getenv("XSEG_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : 0x77u + (classic ? 1u : 0u);
    rng = seed | 1;
    n_info = n_empty = released_bytes = released_segs = priv_free = 0;
    print_message("maintenance: %s seed %" PRIu64 "\n", classic ? "classic" : "expandable", seed);
    tu_xseg_init_or_skip(classic ? "expandable_segments:False" : "expandable_segments:True");
    struct dev_alloc *d;
    assert_int_equal(rt_device(0, &d), XSEG_SUCCESS);
    CUstream streams[NSTREAMS] = {NULL};
    for (int s = 1; s < NSTREAMS; s++)
        tu_assert_cu(drv->cuStreamCreate(&streams[s], CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    bool pool_live = true;
    void *live[MAX_LIVE];
    size_t nlive = 0;
    unsigned steps = (unsigned)tu_steps(4000, 600);
    for (unsigned step = 0; step < steps; step++) {
        size_t r = rnd_below(100);
        if (nlive < MAX_LIVE && (r < 55 || nlive == 0)) {
            size_t k = rnd_below(10), size;
            if (k < 5)
                size = 512 * (1 + rnd_below(128)); /* small pool */
            else if (k < 8)
                size = MiB + rnd_below(5 * MiB);
            else if (k < 9)
                size = 10 * MiB + rnd_below(14 * MiB);
            else
                size = 2 * MiB * (1 + rnd_below(6)); /* whole granules */
            bool to_pool = pool_live && rnd_below(6) == 0;
            if (to_pool)
                assert_int_equal(xseg_begin_allocate_to_pool(0, pool, route_all, NULL), XSEG_SUCCESS);
            live[nlive++] = tu_malloc(size, streams[rnd_below(NSTREAMS)]);
            if (to_pool)
                assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
        } else if (nlive) {
            size_t i = rnd_below(nlive);
            tu_free(live[i]);
            live[i] = live[--nlive];
        }
        if (pool_live && step == steps / 2) {
            assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS); /* its cache becomes releasable */
            pool_live = false;
        }
        if (step % 37 == 0)
            check_cache_info(d);
        if (step % 211 == 0)
            check_empty_cache(d, classic);
    }
    check_cache_info(d);
    check_empty_cache(d, classic);
    while (nlive)
        tu_free(live[--nlive]);
    check_cache_info(d);
    check_empty_cache(d, classic);
    for (int s = 1; s < NSTREAMS; s++)
        tu_assert_cu(drv->cuStreamDestroy(streams[s]));
    print_message("maintenance: %u steps, %zu cache_info and %zu empty_cache checks, %zu MiB and %zu "
                  "classic segments given back, %zu private-pool free blocks seen\n",
                  steps, n_info, n_empty, released_bytes >> 20, released_segs, priv_free);
    /* The heaps exercised what the checks compare: releases of both kinds, a private pool. */
    assert_true(released_bytes > 0 && priv_free > 0);
    if (classic)
        assert_true(released_segs > 0);
}

static void test_maintenance_classic(void **state)
{
    (void)state;
    run(true);
}

static void test_maintenance_expandable(void **state)
{
    (void)state;
    run(false);
}

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "80G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maintenance_classic),
        cmocka_unit_test(test_maintenance_expandable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
