/*
 * Garbage collection during a stream capture (issue 31, finding 8): classic segments, a memory
 * fraction and garbage_collection_threshold, a GLOBAL capture into a private pool whose growth
 * would trigger the collection of the default pool's aged cached blocks. cuMemFree during a
 * GLOBAL capture invalidates it (the driver's rule, cudaemu's too): nothing may be freed while a
 * capture is underway, so the capture ends with a graph, and the collection runs after it.
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

static size_t reserved(void)
{
    xseg_device_stats st;
    assert_int_equal(xseg_get_stats(0, &st), XSEG_SUCCESS);
    return (size_t)st.reserved_bytes[XSEG_STAT_ALL].current;
}

static void test_gc_skipped_during_capture(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False,garbage_collection_threshold:0.5");
    /* A 256 MiB cap, GC above 128 MiB reserved, whatever the device's size. */
    tu_set_memory_cap(256 * MiB);
    /* 160 MiB of cached, unsplit, aged classic blocks in the default pool. */
    void *p[8];
    for (int i = 0; i < 8; i++)
        p[i] = tu_malloc(20 * MiB, NULL);
    for (int i = 0; i < 8; i++)
        tu_free(p[i]);
    assert_true(reserved() >= 160 * MiB);

    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool = {0, 0};
    if (xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL) != XSEG_SUCCESS)
        fail_msg("xseg_capture_begin: %s", xseg_last_error());
    /* A private-pool cache miss: the search ticks the GC clock, and the reserve is over the
     * threshold. Freeing a cached block now would invalidate the capture. */
    void *q = NULL;
    if (xseg_malloc(&q, 30 * MiB, 0, s) != XSEG_SUCCESS)
        fail_msg("xseg_malloc during capture: %s", xseg_last_error());
    size_t during = reserved();
    assert_true(during >= 190 * MiB); /* nothing of the default pool was given back */
    CUgraph g = NULL;
    if (xseg_capture_end(0, s, &g) != XSEG_SUCCESS)
        fail_msg("xseg_capture_end: %s", xseg_last_error());
    assert_non_null(g);
    size_t nnodes = 0;
    tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &nnodes)); /* a graph the driver knows */
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_free(q);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);

    /* After the capture, a cache miss collects again: the reserve goes back down. */
    void *r = tu_malloc(40 * MiB, NULL);
    assert_true(reserved() < during);
    tu_free(r);
    tu_assert_cu(drv->cuStreamDestroy(s));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
}

int main(void)
{
    if (!getenv("CUDAEMU_TOTAL_MEM"))
        setenv("CUDAEMU_TOTAL_MEM", "1G", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gc_skipped_during_capture)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
