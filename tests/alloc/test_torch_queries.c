/*
 * The queries PyTorch's allocator interface makes and xseg answers for the adapter
 * (python/xseg/_torch_adapter.cpp): accumulated-statistics reset, the largest cached block
 * (cacheInfo), the base allocation of a classic block (getBaseAllocation), and a pool use without
 * a route (createOrIncrefPool). One process per test: each starts from an empty allocator in the
 * segment mode it names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)

static void must_contain(const char *what)
{
    const char *msg = xseg_last_error();
    if (!strstr(msg, what))
        fail_msg("error message \"%s\" does not contain \"%s\"", msg, what);
}

/* Every counter's .allocated/.freed and the num_* counts restart from 0; current values and peaks
 * stay; later changes count from there; memory_summary shows the same numbers. */
static void test_reset_accumulated(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    void *keep = tu_malloc(4096, NULL);     /* small pool: its own 2 MiB segment */
    void *gone = tu_malloc(30 * MiB, NULL); /* its own segment, released by empty_cache */
    tu_free(gone);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    xseg_device_stats s;
    assert_int_equal(xseg_get_stats(0, &s), XSEG_SUCCESS);
    assert_true(s.allocation[XSEG_STAT_ALL].allocated >= 2);
    assert_true(s.num_device_free >= 1);
    int64_t cur = s.allocated_bytes[XSEG_STAT_ALL].current, peak = s.allocated_bytes[XSEG_STAT_ALL].peak;

    assert_int_equal(xseg_reset_accumulated_stats(0), XSEG_SUCCESS);
    assert_int_equal(xseg_get_stats(0, &s), XSEG_SUCCESS);
    const xseg_stat_counter *c = (const xseg_stat_counter *)(const void *)&s;
    size_t ncounters = offsetof(xseg_device_stats, oversize_segments) / sizeof *c + 1;
    for (size_t i = 0; i < ncounters; i++) {
        assert_int_equal(c[i].allocated, 0);
        assert_int_equal(c[i].freed, 0);
    }
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.num_sync_all_streams, 0);
    assert_int_equal(s.num_device_alloc, 0);
    assert_int_equal(s.num_device_free, 0);
    assert_int_equal(s.allocated_bytes[XSEG_STAT_ALL].current, cur);
    assert_int_equal(s.allocated_bytes[XSEG_STAT_ALL].peak, peak);
    assert_int_equal(tu_stat("allocation.all.allocated"), 0);

    void *p = tu_malloc(MiB + 512, NULL);
    tu_free(p);
    assert_int_equal(tu_stat("allocation.all.allocated"), 1);
    assert_int_equal(tu_stat("allocation.all.freed"), 1);
    assert_int_equal(tu_stat("allocation.large_pool.allocated"), 1);
    assert_int_equal(tu_stat("num_device_alloc"), 1); /* a new 20 MiB segment */
    assert_int_equal(tu_stat("allocated_bytes.all.current"), cur);
    assert_int_equal(tu_stat("allocation.all.current"), 1);
    tu_free(keep);
    assert_int_equal(tu_stat("allocation.all.freed"), 2);
    assert_int_equal(tu_stat("allocation.all.current"), 0);
    /* A peak reset after it keeps the accumulated counts. */
    assert_int_equal(xseg_reset_peak_stats(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("allocation.all.allocated"), 1);
    assert_int_equal(xseg_reset_accumulated_stats(-1), XSEG_SUCCESS);
    assert_int_equal(tu_stat("allocation.all.allocated"), 0);
    assert_int_equal(xseg_reset_accumulated_stats(99), XSEG_ERROR_INVALID_DEVICE);
}

/* cacheInfo: the largest free mapped block of any pool; a 0 on entry starts from the driver's
 * free memory; a larger value passed in stays. */
static void test_cache_info(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    size_t largest = 1;
    assert_int_equal(xseg_cache_info(0, &largest), XSEG_SUCCESS);
    assert_int_equal(largest, 1); /* nothing cached yet */

    void *a = tu_malloc(30 * MiB, NULL), *b = tu_malloc(12 * MiB, NULL);
    tu_free(a);
    largest = 1;
    assert_int_equal(xseg_cache_info(0, &largest), XSEG_SUCCESS);
    assert_int_equal(largest, 30 * MiB);
    largest = 1000 * MiB;
    assert_int_equal(xseg_cache_info(0, &largest), XSEG_SUCCESS);
    assert_int_equal(largest, 1000 * MiB);

    /* A private pool's cache counts too. */
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *c = tu_malloc(64 * MiB, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    tu_free(c);
    largest = 1;
    assert_int_equal(xseg_cache_info(0, &largest), XSEG_SUCCESS);
    assert_int_equal(largest, 64 * MiB);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);

    /* 0 on entry: at least the driver's free memory. */
    size_t dfree = 0, dtotal = 0;
    tu_assert_cu(drv->cuMemGetInfo(&dfree, &dtotal));
    largest = 0;
    assert_int_equal(xseg_cache_info(0, &largest), XSEG_SUCCESS);
    assert_true(largest >= 64 * MiB);
    assert_true(largest >= dfree / 2); /* free memory can move between the two reads on a GPU */

    assert_int_equal(xseg_cache_info(0, NULL), XSEG_ERROR_INVALID_VALUE);
    must_contain("largest_block");
    assert_int_equal(xseg_cache_info(99, &largest), XSEG_ERROR_INVALID_DEVICE);
    tu_free(b);
}

/* A classic block's segment: the cuMemAlloc range that holds it (a 20 MiB segment split into the
 * 6 MiB block and the rest). */
static void test_base_allocation_classic(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    void *a = tu_malloc(6 * MiB, NULL), *b = tu_malloc(6 * MiB, NULL);
    void *base = NULL;
    size_t size = 0;
    assert_int_equal(xseg_base_allocation(a, &base, &size), XSEG_SUCCESS);
    assert_true((char *)base <= (char *)a && (char *)a + 6 * MiB <= (char *)base + size);
    void *base_b = NULL;
    assert_int_equal(xseg_base_allocation(b, &base_b, NULL), XSEG_SUCCESS);
    assert_ptr_equal(base_b, base); /* both come from the one 20 MiB segment */
    assert_int_equal(size, 20 * MiB);
    /* The snapshot's segment is the same range. */
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    assert_int_equal(snap->nsegments, 1);
    assert_int_equal(snap->segments[0].address, (uintptr_t)base);
    assert_int_equal(snap->segments[0].total_size, size);
    xseg_snapshot_free(snap);

    assert_int_equal(xseg_base_allocation((char *)a + 512, &base, &size), XSEG_ERROR_INVALID_VALUE);
    must_contain("not a live allocation");
    assert_int_equal(xseg_base_allocation(NULL, &base, &size), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_base_allocation(a, NULL, &size), XSEG_ERROR_INVALID_VALUE);
    tu_free(a);
    assert_int_equal(xseg_base_allocation(a, &base, &size), XSEG_ERROR_INVALID_VALUE);
    tu_free(b);
}

/* An expandable block has no base allocation cuIpcGetMemHandle could share. */
static void test_base_allocation_expandable(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    void *a = tu_malloc(6 * MiB, NULL);
    void *base = (void *)1;
    size_t size = 7;
    assert_int_equal(xseg_base_allocation(a, &base, &size), XSEG_ERROR_NOT_SUPPORTED);
    must_contain("expandable");
    must_contain("xseg_ipc_export");
    assert_ptr_equal(base, (void *)1);
    assert_int_equal(size, 7);
    tu_free(a);
}

/* A retained pool: one use, no route (allocations stay in the default pools), dropped by release;
 * retains add up with the uses of begins. */
static void test_pool_retain(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    int n = -1;
    assert_int_equal(xseg_pool_retain(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_use_count(0, pool, &n), XSEG_SUCCESS);
    assert_int_equal(n, 1);
    void *p = tu_malloc(4 * MiB, NULL); /* not routed: default pool */
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    for (size_t i = 0; i < snap->nsegments; i++) {
        assert_int_equal(snap->segments[i].pool_id[0], 0);
        assert_int_equal(snap->segments[i].pool_id[1], 0);
    }
    xseg_snapshot_free(snap);
    tu_free(p);

    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *q = tu_malloc(4 * MiB, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_use_count(0, pool, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_retain(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_use_count(0, pool, &n), XSEG_SUCCESS);
    assert_int_equal(n, 0);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_ERROR_INVALID_VALUE);
    tu_free(q); /* returns to its pool, which goes at the next empty_cache */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_ERROR_INVALID_VALUE);
    must_contain("no pool");

    xseg_pool_id def = {0, 0};
    assert_int_equal(xseg_pool_retain(0, def), XSEG_ERROR_INVALID_VALUE);
    must_contain("default pool");
    assert_int_equal(xseg_pool_retain(99, pool), XSEG_ERROR_INVALID_DEVICE);
}

static bool holds(void *const *ptrs, size_t n, const void *p)
{
    for (size_t i = 0; i < n; i++)
        if (ptrs[i] == p)
            return true;
    return false;
}

/* xseg_pool_live_blocks: the pool's allocated blocks of both sizes, not its freed ones, not the
 * default pool's nor another pool's; snprintf-style counting; the refusals. */
static void test_pool_live_blocks(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    xseg_pool_id pool, other;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_create(&other), XSEG_SUCCESS);
    void *ptrs[8] = {0};
    size_t n = 99;
    assert_int_equal(xseg_pool_live_blocks(0, pool, ptrs, 8, &n), XSEG_ERROR_INVALID_VALUE); /* never used */
    must_contain("no pool");

    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *small = tu_malloc(4096, NULL), *large = tu_malloc(6 * MiB, NULL), *gone = tu_malloc(2 * MiB, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, other, NULL, NULL), XSEG_SUCCESS);
    void *theirs = tu_malloc(4096, NULL);
    assert_int_equal(xseg_end_allocate_to_pool(0, other), XSEG_SUCCESS);
    void *dflt = tu_malloc(4096, NULL);
    tu_free(gone);

    assert_int_equal(xseg_pool_live_blocks(0, pool, NULL, 0, &n), XSEG_SUCCESS); /* counting only */
    assert_int_equal(n, 2);
    assert_int_equal(xseg_pool_live_blocks(0, pool, ptrs, 1, &n), XSEG_SUCCESS); /* room for one */
    assert_int_equal(n, 2);
    assert_true(ptrs[0] == small || ptrs[0] == large);
    assert_null(ptrs[1]);
    assert_int_equal(xseg_pool_live_blocks(0, pool, ptrs, 8, &n), XSEG_SUCCESS);
    assert_int_equal(n, 2);
    assert_true(holds(ptrs, n, small) && holds(ptrs, n, large));
    assert_false(holds(ptrs, n, gone) || holds(ptrs, n, theirs) || holds(ptrs, n, dflt));
    assert_int_equal(xseg_pool_live_blocks(0, other, ptrs, 8, &n), XSEG_SUCCESS);
    assert_int_equal(n, 1);
    assert_ptr_equal(ptrs[0], theirs);

    assert_int_equal(xseg_pool_live_blocks(0, pool, NULL, 0, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_pool_live_blocks(0, pool, NULL, 4, &n), XSEG_ERROR_INVALID_VALUE);
    xseg_pool_id def = {0, 0};
    assert_int_equal(xseg_pool_live_blocks(0, def, ptrs, 8, &n), XSEG_ERROR_INVALID_VALUE);
    must_contain("default pool");
    assert_int_equal(xseg_pool_live_blocks(99, pool, ptrs, 8, &n), XSEG_ERROR_INVALID_DEVICE);

    tu_free(small);
    tu_free(large);
    tu_free(theirs);
    tu_free(dflt);
    assert_int_equal(xseg_pool_live_blocks(0, pool, ptrs, 8, &n), XSEG_SUCCESS);
    assert_int_equal(n, 0);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, other), XSEG_SUCCESS);
}

static const struct tu_named_test all_tests[] = {
    TU_NAMED(test_reset_accumulated),
    TU_NAMED(test_cache_info),
    TU_NAMED(test_base_allocation_classic),
    TU_NAMED(test_base_allocation_expandable),
    TU_NAMED(test_pool_retain),
    TU_NAMED(test_pool_live_blocks),
};

int main(int argc, char **argv)
{
    return tu_run_named("torch_queries", all_tests, sizeof all_tests / sizeof all_tests[0], argc, argv);
}
