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

static int64_t stat_of(const char *key)
{
    int64_t v = -1;
    xseg_status st = xseg_stat(0, key, &v);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_stat(%s): %s", key, xseg_last_error());
    return v;
}

/* Compare one table row, as the seed prints it: "%.3f" of GiB. */
static void row(const char *tag, const char *alloc, const char *active, const char *split, const char *reserved)
{
    const char *keys[4] = {"allocated_bytes.large_pool.current", "active_bytes.large_pool.current",
                           "inactive_split_bytes.large_pool.current", "reserved_bytes.large_pool.current"};
    const char *want[4] = {alloc, active, split, reserved};
    for (int i = 0; i < 4; i++) {
        char got[32];
        snprintf(got, sizeof got, "%.3f", (double)stat_of(keys[i]) / (double)GiB);
        if (strcmp(got, want[i]) != 0)
            fail_msg("%s: %s is %s GiB, the seed's table says %s", tag, keys[i], got, want[i]);
    }
}

static void *xmalloc(size_t size, CUstream stream)
{
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, stream);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_malloc(%zu): %s", size, xseg_last_error());
    assert_non_null(p);
    return p;
}

static void xfree(void *p)
{
    xseg_status st = xseg_free(p);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_free(%p): %s", p, xseg_last_error());
}

static void setup_mode(const char *config)
{
    xseg_status st = xseg_init(config);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_init(%s): %s", config, xseg_last_error());
    if (!tu_gpu_available())
        skip();
}

/* The statistics example: x1..x5, two streams, record_stream, empty_cache. */
static void test_statistics_table(void **state)
{
    (void)state;
    setup_mode("expandable_segments:False");
    CUstream stream;
    tu_assert_cu(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    void *x1 = xmalloc(4 * GiB, NULL);
    row("After alloc x1", "4.000", "4.000", "0.000", "4.000");
    xfree(x1);
    row("After del x1", "0.000", "0.000", "0.000", "4.000");
    void *x2 = xmalloc(1 * GiB, NULL);
    row("After alloc x2", "1.000", "1.000", "3.000", "4.000");
    xfree(x2);
    row("After del x2", "0.000", "0.000", "0.000", "4.000");
    void *x3 = xmalloc(1 * GiB, NULL);
    row("After alloc x3", "1.000", "1.000", "3.000", "4.000");
    /* `stream` still has work queued on x3 when it is deleted (held on the emulator). */
    bool held = tu_stream_hold(stream);
    assert_int_equal(xseg_record_stream(x3, stream), XSEG_SUCCESS);
    xfree(x3);
    row("After del x3", "0.000", "1.000", "3.000", "4.000");
    if (held)
        tu_stream_release(stream);
    else
        tu_assert_cu(drv->cuStreamSynchronize(stream));
    void *t1 = xmalloc(1, NULL);
    xfree(t1);
    row("After alloc t1", "0.000", "0.000", "0.000", "4.000");
    /* t1 went to the small pool: one 2 MiB segment there. */
    assert_int_equal(stat_of("reserved_bytes.small_pool.current"), (int64_t)(2 * MiB));
    void *x4 = xmalloc(1 * GiB, stream);
    row("After alloc x4", "1.000", "1.000", "0.000", "5.000");
    int64_t syncs = stat_of("num_sync_all_streams");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    row("After empty cache", "1.000", "1.000", "0.000", "1.000");
    assert_int_equal(stat_of("num_sync_all_streams"), syncs + 1);
    assert_int_equal(stat_of("reserved_bytes.small_pool.current"), 0);
    void *x5 = xmalloc(1 * GiB, stream);
    row("After alloc x5", "2.000", "2.000", "0.000", "2.000");

    /* Counters of the whole run: segments 4G, 2M, 1G, 1G allocated; 4G and 2M freed. */
    assert_int_equal(stat_of("num_device_alloc"), 4);
    assert_int_equal(stat_of("num_device_free"), 2);
    assert_int_equal(stat_of("segment.all.current"), 2);
    assert_int_equal(stat_of("allocation.all.allocated"), 6);
    assert_int_equal(stat_of("requested_bytes.all.current"), (int64_t)(2 * GiB));
    xfree(x4);
    xfree(x5);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(stat_of("reserved_bytes.all.current"), 0);
    tu_assert_cu(drv->cuStreamDestroy(stream));
}

/* The fragmentation example, classic: the 6 GiB remainder is inactive split and stays. */
static void test_fragmentation_classic(void **state)
{
    (void)state;
    setup_mode("expandable_segments:False");
    void *temp = xmalloc(8 * GiB, NULL);
    xfree(temp);
    row("After del temp", "0.000", "0.000", "0.000", "8.000");
    void *small = xmalloc(1 * GiB, NULL);
    void *x = xmalloc(1 * GiB, NULL);
    row("After alloc x", "2.000", "2.000", "6.000", "8.000");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    row("After empty cache", "2.000", "2.000", "6.000", "8.000");
    xfree(small);
    xfree(x);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    row("After freeing all", "0.000", "0.000", "0.000", "0.000");
}

/* The same with expandable segments: 410 pages of 20 MiB; empty_cache keeps 103 pages. */
static void test_fragmentation_expandable(void **state)
{
    (void)state;
    setup_mode("expandable_segments:True");
    void *temp = xmalloc(8 * GiB, NULL);
    assert_int_equal(stat_of("num_device_alloc"), 410);
    xfree(temp);
    row("After del temp", "0.000", "0.000", "0.000", "8.008");
    void *small = xmalloc(1 * GiB, NULL);
    void *x = xmalloc(1 * GiB, NULL);
    row("After alloc x", "2.000", "2.000", "0.000", "8.008");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    row("After empty cache", "2.000", "2.000", "0.000", "2.012");
    assert_int_equal(stat_of("reserved_bytes.large_pool.current"), (int64_t)(103 * 20 * MiB));
    assert_int_equal(stat_of("num_device_free"), 410 - 103);
    /* segment.* and inactive_split* are not kept for expandable blocks. */
    assert_int_equal(stat_of("segment.all.allocated"), 0);
    assert_int_equal(stat_of("inactive_split.all.current"), 0);
    xfree(small);
    xfree(x);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    row("After freeing all", "0.000", "0.000", "0.000", "0.000");
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
