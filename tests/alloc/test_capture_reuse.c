/*
 * graph_capture_record_stream_reuse beyond the seed's tables, through the public API: which
 * blocks the captured graph lets xseg reuse during a capture, and what happens when the driver's
 * graph calls fail. Active bytes (allocated + freed but not yet reusable) tell reused from
 * deferred.
 */
#include <pthread.h>
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

static CUstream new_stream(void)
{
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

static void wait_stream(CUstream b, CUstream a)
{
    CUevent e;
    tu_assert_cu(drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    tu_assert_cu(drv->cuEventRecord(e, a));
    tu_assert_cu(drv->cuStreamWaitEvent(b, e, 0));
    tu_assert_cu(drv->cuEventDestroy(e));
}

static int64_t active(void) { return tu_stat("active_bytes.all.current"); }

/* A small allocation on @p s: where the reuse check runs. */
static void poke(CUstream s)
{
    void *t = tu_malloc(512, s);
    tu_free(t);
}

static int setup(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False,graph_capture_record_stream_reuse:True");
    return 0;
}

static void finish(CUstream s, xseg_pool_id pool)
{
    CUgraph g = NULL;
    if (xseg_capture_end(0, s, &g) != XSEG_SUCCESS)
        fail_msg("xseg_capture_end: %s", xseg_last_error());
    assert_non_null(g);
    poke(NULL); /* deferred frees are processed after the capture */
    tu_assert_cu(drv->cuGraphDestroy(g));
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(active(), 0);
}

/* Three side streams: each block becomes reusable exactly when its stream joins back. */
static void test_each_join_frees_its_block(void **state)
{
    (void)state;
    CUstream s = new_stream(), side[3] = {new_stream(), new_stream(), new_stream()};
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    assert_true(tu_stream_work(s));
    void *x[3];
    for (int i = 0; i < 3; i++) {
        x[i] = tu_malloc(4 * MiB, s);
        wait_stream(side[i], s);
        assert_int_equal(xseg_record_stream(x[i], side[i]), XSEG_SUCCESS);
        assert_true(tu_stream_work(side[i]));
        assert_true(tu_stream_work(side[i]));
    }
    int64_t base = active();
    for (int i = 0; i < 3; i++)
        tu_free(x[i]);
    poke(s);
    assert_int_equal(active(), base); /* no stream joined: nothing reusable */
    /* Work on s after the frees does not order the side streams either. */
    assert_true(tu_stream_work(s));
    poke(s);
    assert_int_equal(active(), base);
    wait_stream(s, side[1]);
    poke(s);
    assert_int_equal(active(), base - (int64_t)(4 * MiB));
    wait_stream(s, side[2]);
    wait_stream(s, side[0]);
    poke(s);
    assert_int_equal(active(), base - (int64_t)(12 * MiB));
    /* The reused memory is handed out again within the capture: no new segment. */
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    void *y = tu_malloc(4 * MiB, s);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved);
    tu_free(y);
    finish(s, pool);
    for (int i = 0; i < 3; i++)
        tu_assert_cu(drv->cuStreamDestroy(side[i]));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* A block used on a stream outside the capture, and a default-pool block allocated before the
 * capture, wait for the end of the capture whatever the graph says. */
static void test_outside_uses_wait(void **state)
{
    (void)state;
    CUstream s = new_stream(), side = new_stream(), outside = new_stream();
    void *before = tu_malloc(4 * MiB, s); /* default pool */
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *a = tu_malloc(4 * MiB, s);
    assert_int_equal(xseg_record_stream(a, outside), XSEG_SUCCESS);
    wait_stream(side, s);
    assert_int_equal(xseg_record_stream(before, side), XSEG_SUCCESS);
    assert_true(tu_stream_work(side));
    wait_stream(s, side);
    int64_t base = active();
    tu_free(a);
    tu_free(before);
    poke(s);
    assert_int_equal(active(), base);
    finish(s, pool);
    tu_assert_cu(drv->cuStreamDestroy(outside));
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* The option off: the same joined program defers to the end of the capture. */
static void test_option_off(void **state)
{
    (void)state;
    assert_int_equal(xseg_set_config("graph_capture_record_stream_reuse:False"), XSEG_SUCCESS);
    CUstream s = new_stream(), side = new_stream();
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *a = tu_malloc(4 * MiB, s);
    wait_stream(side, s);
    assert_int_equal(xseg_record_stream(a, side), XSEG_SUCCESS);
    assert_true(tu_stream_work(side));
    wait_stream(s, side);
    int64_t base = active();
    tu_free(a);
    poke(s);
    assert_int_equal(active(), base);
    finish(s, pool);
    assert_int_equal(xseg_set_config("graph_capture_record_stream_reuse:True"), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* The driver's graph calls fail: the block is not reused while they fail (never reused early,
 * never lost), the capture stays valid, and xseg stays usable. Afterwards it is deferred to the
 * end of the capture (its marker could not be placed: @p retried false), or reused by the next
 * walk (a node whose dependencies could not be read is read again: @p retried true). */
static void graph_call_fails(const char *entry, bool retried)
{
    tu_require_emulator_or_skip();
    CUstream s = new_stream(), side = new_stream();
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *a = tu_malloc(4 * MiB, s);
    wait_stream(side, s);
    assert_int_equal(xseg_record_stream(a, side), XSEG_SUCCESS);
    assert_true(tu_stream_work(side));
    wait_stream(s, side);
    int64_t base = active();
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail(entry, 1, CUDA_ERROR_OUT_OF_MEMORY));
    tu_free(a);
    poke(s);
    assert_int_equal(active(), base);
    tu_fail_clear(); /* first: a failed check would leave it armed for the next test (one process) */
    tu_assert_fired_n(fired, 1, "%s during the walk", entry);
    poke(s);
    assert_int_equal(active(), base - (retried ? (int64_t)(4 * MiB) : 0));
    finish(s, pool);
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

static void test_add_empty_node_fails(void **state)
{
    (void)state;
    graph_call_fails("cuGraphAddEmptyNode", false);
}

static void test_update_dependencies_fails(void **state)
{
    (void)state;
    graph_call_fails("cuStreamUpdateCaptureDependencies", false);
}

static void test_capture_info_fails(void **state)
{
    (void)state;
    graph_call_fails("cuStreamGetCaptureInfo", false);
}

/* A failed dependency read stops that walk; the next walk reads the node again and reuses the
 * block. */
static void test_node_dependencies_fail(void **state)
{
    (void)state;
    graph_call_fails("cuGraphNodeGetDependencies", true);
}

/* A use on the legacy default stream, during the capture of a blocking stream: xseg must not ask
 * the driver about the legacy stream (that would invalidate the capture: STREAM_CAPTURE_IMPLICIT);
 * the block simply waits for the end of the capture. */
static void test_legacy_stream_use(void **state)
{
    (void)state;
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, 0)); /* blocking: synchronizes with the legacy stream */
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *a = tu_malloc(4 * MiB, s);
    assert_int_equal(xseg_record_stream(a, NULL), XSEG_SUCCESS);
    int64_t base = active();
    tu_free(a);
    poke(s);
    assert_int_equal(active(), base);
    finish(s, pool); /* fails if the capture was invalidated */
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* The program breaks the stream order: it replaces the capture stream's dependencies
 * (cuStreamUpdateCaptureDependencies SET) by a node that does not descend from them. What the
 * walk remembered (x's marker on s) no longer precedes the stream: x must not be reused when the
 * side stream joins, only once the program makes the marker a dependency again. */
static void test_stream_order_broken(void **state)
{
    (void)state;
    CUstream s = new_stream(), side = new_stream();
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    assert_true(tu_stream_work(s));
    void *x = tu_malloc(4 * MiB, s);
    wait_stream(side, s);
    assert_int_equal(xseg_record_stream(x, side), XSEG_SUCCESS);
    assert_true(tu_stream_work(side));
    assert_true(tu_stream_work(s)); /* x used on s after the fork */
    int64_t base = active();
    tu_free(x);
    poke(s); /* walks s: its marker is remembered */
    assert_int_equal(active(), base);
    CUstreamCaptureStatus st;
    CUgraph g = NULL;
    const CUgraphNode *deps = NULL;
    size_t n = 0;
    tu_assert_cu(drv->cuStreamGetCaptureInfo(s, &st, NULL, &g, &deps, NULL, &n));
    assert_int_equal(n, 1);
    CUgraphNode marker = deps[0], root;
    tu_assert_cu(drv->cuGraphAddEmptyNode(&root, g, NULL, 0));
    tu_assert_cu(drv->cuStreamUpdateCaptureDependencies(s, &root, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    wait_stream(s, side);
    poke(s);
    assert_int_equal(active(), base); /* the side stream joined, but s's use is not ordered */
    tu_assert_cu(drv->cuStreamUpdateCaptureDependencies(s, &marker, NULL, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
    poke(s);
    assert_int_equal(active(), base - (int64_t)(4 * MiB));
    finish(s, pool);
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* Many blocks and a long capture: every joined block is reused, each node's dependencies are
 * read at most once, and the walks stop once they found what they look for: the side stream's
 * kernels (4 of the 6 nodes of a layer) are never read. */
static void test_long_capture(void **state)
{
    (void)state;
    CUstream s = new_stream(), side = new_stream();
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    size_t layers = tu_scaled(500, 20);
    unsigned long reads0 = tu_call_count("cuGraphNodeGetDependencies");
    for (size_t i = 0; i < layers; i++) {
        void *x = tu_malloc(1 * MiB, s);
        wait_stream(side, s);
        assert_int_equal(xseg_record_stream(x, side), XSEG_SUCCESS);
        for (int k = 0; k < 4; k++)
            assert_true(tu_stream_work(side));
        wait_stream(s, side);
        tu_free(x);
        poke(s);
        assert_true(tu_stream_work(s));
    }
    /* One 2 MiB small-pool segment serves every layer. */
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(2 * MiB));
    if (tu_emulated()) {
        size_t nodes = 0;
        CUstreamCaptureStatus st;
        CUgraph g = NULL;
        tu_assert_cu(drv->cuStreamGetCaptureInfo(s, &st, NULL, &g, NULL, NULL, NULL));
        tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &nodes));
        unsigned long reads = tu_call_count("cuGraphNodeGetDependencies") - reads0;
        print_message("long capture: %zu nodes, %lu dependency lists read\n", nodes, reads);
        assert_true(reads <= nodes / 2);
    }
    finish(s, pool);
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* Two threads capture at once (THREAD_LOCAL), each forking, joining and freeing record_stream'ed
 * blocks: each capture reuses its own blocks (the device lock serializes the bookkeeping; TSan
 * checks it), both captures stay valid, and memory stays at one small segment per capture. */
struct cap_thread {
    size_t layers;
    int ok;
};

static void *capture_thread(void *arg)
{
    struct cap_thread *ct = arg;
    tu_ctx_set();
    CUstream s, side;
    if (drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING))
        return NULL;
    xseg_pool_id pool = {0, 0};
    if (xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != XSEG_SUCCESS)
        return NULL;
    CUevent e;
    if (drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING))
        return NULL;
    bool ok = true;
    for (size_t i = 0; i < ct->layers && ok; i++) {
        void *x = NULL, *t = NULL;
        ok = xseg_malloc(&x, 1 * MiB, 0, s) == XSEG_SUCCESS && drv->cuEventRecord(e, s) == CUDA_SUCCESS &&
             drv->cuStreamWaitEvent(side, e, 0) == CUDA_SUCCESS && xseg_record_stream(x, side) == XSEG_SUCCESS &&
             tu_stream_work(side) && drv->cuEventRecord(e, side) == CUDA_SUCCESS &&
             drv->cuStreamWaitEvent(s, e, 0) == CUDA_SUCCESS && xseg_free(x) == XSEG_SUCCESS &&
             xseg_malloc(&t, 512, 0, s) == XSEG_SUCCESS && xseg_free(t) == XSEG_SUCCESS && tu_stream_work(s);
    }
    CUgraph g = NULL;
    ok = xseg_capture_end(0, s, &g) == XSEG_SUCCESS && g && ok;
    if (g)
        ok = drv->cuGraphDestroy(g) == CUDA_SUCCESS && ok;
    ok = xseg_release_pool(0, pool) == XSEG_SUCCESS && ok;
    ok = drv->cuEventDestroy(e) == CUDA_SUCCESS && drv->cuStreamDestroy(side) == CUDA_SUCCESS &&
         drv->cuStreamDestroy(s) == CUDA_SUCCESS && ok;
    ct->ok = ok;
    return NULL;
}

static void test_two_threads(void **state)
{
    (void)state;
    assert_int_equal(xseg_reset_peak_stats(0), XSEG_SUCCESS);
    struct cap_thread ct[2] = {{tu_scaled(200, 10), 0}, {tu_scaled(200, 10), 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, capture_thread, &ct[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_true(ct[0].ok && ct[1].ok);
    /* Every 1 MiB block was reused within its capture: one 2 MiB small segment per capture. */
    assert_true(tu_stat("reserved_bytes.all.peak") <= (int64_t)(4 * MiB));
    poke(NULL);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(active(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_join_frees_its_block),
        cmocka_unit_test(test_outside_uses_wait),
        cmocka_unit_test(test_option_off),
        cmocka_unit_test(test_add_empty_node_fails),
        cmocka_unit_test(test_update_dependencies_fails),
        cmocka_unit_test(test_capture_info_fails),
        cmocka_unit_test(test_node_dependencies_fail),
        cmocka_unit_test(test_legacy_stream_use),
        cmocka_unit_test(test_stream_order_broken),
        cmocka_unit_test(test_long_capture),
        cmocka_unit_test(test_two_threads),
    };
    return cmocka_run_group_tests_name("capture-reuse", tests, setup, NULL);
}
