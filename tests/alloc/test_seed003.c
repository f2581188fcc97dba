/*
 * Seed 003 ("Understanding Caching Allocator Statistics", and its fragmentation example) through
 * the public API: the printed tables of Allocated / Active / InactiveSplit / Reserved (GiB, three
 * decimals) after each step, exactly. The tables track the large pool (the tiny t1 allocation
 * lives in the small pool and does not show), so the large_pool keys are compared; the small
 * pool is checked on the side.
 *
 * Each table runs in its own process (argv[1] selects it): the tables start from an empty
 * allocator.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* The statistics example: x1..x5, two streams, record_stream, empty_cache. */
static void test_statistics_table(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    CUstream stream;
    tu_assert_cu(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    void *x1 = tu_malloc(4 * GiB, NULL);
    tu_seed_row("After alloc x1", "4.000", "4.000", "0.000", "4.000");
    tu_free(x1);
    tu_seed_row("After del x1", "0.000", "0.000", "0.000", "4.000");
    void *x2 = tu_malloc(1 * GiB, NULL);
    tu_seed_row("After alloc x2", "1.000", "1.000", "3.000", "4.000");
    tu_free(x2);
    tu_seed_row("After del x2", "0.000", "0.000", "0.000", "4.000");
    void *x3 = tu_malloc(1 * GiB, NULL);
    tu_seed_row("After alloc x3", "1.000", "1.000", "3.000", "4.000");
    /* `stream` still has work queued on x3 when it is deleted (held on the emulator). */
    bool held = tu_stream_hold(stream);
    assert_int_equal(xseg_record_stream(x3, stream), XSEG_SUCCESS);
    tu_free(x3);
    tu_seed_row("After del x3", "0.000", "1.000", "3.000", "4.000");
    if (held)
        tu_stream_release(stream);
    else
        tu_assert_cu(drv->cuStreamSynchronize(stream));
    void *t1 = tu_malloc(1, NULL);
    tu_free(t1);
    tu_seed_row("After alloc t1", "0.000", "0.000", "0.000", "4.000");
    /* t1 went to the small pool: one 2 MiB segment there. */
    assert_int_equal(tu_stat("reserved_bytes.small_pool.current"), (int64_t)(2 * MiB));
    void *x4 = tu_malloc(1 * GiB, stream);
    tu_seed_row("After alloc x4", "1.000", "1.000", "0.000", "5.000");
    int64_t syncs = tu_stat("num_sync_all_streams");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After empty cache", "1.000", "1.000", "0.000", "1.000");
    assert_int_equal(tu_stat("num_sync_all_streams"), syncs + 1);
    assert_int_equal(tu_stat("reserved_bytes.small_pool.current"), 0);
    void *x5 = tu_malloc(1 * GiB, stream);
    tu_seed_row("After alloc x5", "2.000", "2.000", "0.000", "2.000");

    /* Counters of the whole run: segments 4G, 2M, 1G, 1G allocated; 4G and 2M freed. */
    assert_int_equal(tu_stat("num_device_alloc"), 4);
    assert_int_equal(tu_stat("num_device_free"), 2);
    assert_int_equal(tu_stat("segment.all.current"), 2);
    assert_int_equal(tu_stat("allocation.all.allocated"), 6);
    assert_int_equal(tu_stat("requested_bytes.all.current"), (int64_t)(2 * GiB));
    tu_free(x4);
    tu_free(x5);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    tu_assert_cu(drv->cuStreamDestroy(stream));
}

/* The fragmentation example, classic: the 6 GiB remainder is inactive split and stays. */
static void test_fragmentation_classic(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    void *temp = tu_malloc(8 * GiB, NULL);
    tu_free(temp);
    tu_seed_row("After del temp", "0.000", "0.000", "0.000", "8.000");
    void *small = tu_malloc(1 * GiB, NULL);
    void *x = tu_malloc(1 * GiB, NULL);
    tu_seed_row("After alloc x", "2.000", "2.000", "6.000", "8.000");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After empty cache", "2.000", "2.000", "6.000", "8.000");
    tu_free(small);
    tu_free(x);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After freeing all", "0.000", "0.000", "0.000", "0.000");
}

/* The same with expandable segments: 410 pages of 20 MiB; empty_cache keeps 103 pages. */
static void test_fragmentation_expandable(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    void *temp = tu_malloc(8 * GiB, NULL);
    assert_int_equal(tu_stat("num_device_alloc"), 410);
    tu_free(temp);
    tu_seed_row("After del temp", "0.000", "0.000", "0.000", "8.008");
    void *small = tu_malloc(1 * GiB, NULL);
    void *x = tu_malloc(1 * GiB, NULL);
    tu_seed_row("After alloc x", "2.000", "2.000", "0.000", "8.008");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After empty cache", "2.000", "2.000", "0.000", "2.012");
    assert_int_equal(tu_stat("reserved_bytes.large_pool.current"), (int64_t)(103 * 20 * MiB));
    assert_int_equal(tu_stat("num_device_free"), 410 - 103);
    /* segment.* and inactive_split* are not kept for expandable blocks. */
    assert_int_equal(tu_stat("segment.all.allocated"), 0);
    assert_int_equal(tu_stat("inactive_split.all.current"), 0);
    tu_free(small);
    tu_free(x);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After freeing all", "0.000", "0.000", "0.000", "0.000");
    struct cudaemu_live live;
    if (tu_live(&live)) {
        assert_int_equal(live.handles, 0);
        assert_int_equal(live.mapped_bytes, 0);
        assert_int_equal(live.reservations, 0);
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_statistics_table),
        cmocka_unit_test(test_fragmentation_classic),
        cmocka_unit_test(test_fragmentation_expandable),
    };
    const char *only = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (only && !strstr(all[i].name, only))
            continue;
        const struct CMUnitTest one[] = {all[i]};
        int rc = _cmocka_run_group_tests(all[i].name, one, 1, NULL, NULL);
        if (rc)
            return rc;
        if (!only)
            break; /* the tables need a fresh allocator: one per process */
    }
    return 0;
}
