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

/* ---- Deferred memory recycling during capture and graph_capture_record_stream_reuse ----
 * The seed's example: x1 (allocated in the capture) is used on a side stream that forks from the
 * capture stream (side_stream.wait_stream(current_stream)), marked with record_stream, and the
 * side stream joins back (current_stream.wait_stream(side_stream)) before x1 is deleted. */

static CUstream new_stream(void)
{
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

/* b.wait_stream(a): b waits on an event recorded on a (in a capture: a fork or a join). */
static void wait_stream(CUstream b, CUstream a)
{
    CUevent e;
    tu_assert_cu(drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    tu_assert_cu(drv->cuEventRecord(e, a));
    tu_assert_cu(drv->cuStreamWaitEvent(b, e, 0));
    tu_assert_cu(drv->cuEventDestroy(e));
}

static xseg_pool_id capture_begin(CUstream s)
{
    xseg_pool_id pool = {0, 0};
    if (xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL) != XSEG_SUCCESS)
        fail_msg("xseg_capture_begin: %s", xseg_last_error());
    return pool;
}

/* Leave the graph context (the capture must have stayed valid), destroy the graph later. */
static CUgraph capture_end(CUstream s)
{
    CUgraph g = NULL;
    if (xseg_capture_end(0, s, &g) != XSEG_SUCCESS)
        fail_msg("xseg_capture_end: %s", xseg_last_error());
    assert_non_null(g);
    return g;
}

static void graph_done(CUgraph g, xseg_pool_id pool)
{
    tu_assert_cu(drv->cuGraphDestroy(g));
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
}

/* Nodes of type @p type in @p g, but @p except. */
static size_t graph_nodes_of(CUgraph g, CUgraphNodeType type, CUgraphNode except)
{
    size_t n = 0;
    tu_assert_cu(drv->cuGraphGetNodes(g, NULL, &n));
    CUgraphNode *v = calloc(n ? n : 1, sizeof *v);
    assert_non_null(v);
    tu_assert_cu(drv->cuGraphGetNodes(g, v, &n));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        tu_assert_cu(drv->cuGraphNodeGetType(v[i], &t));
        k += t == type && v[i] != except;
    }
    free(v);
    return k;
}

/* The node tu_stream_work just added to the capture on @p s (the stream's only dependency). */
static CUgraphNode work_node(CUstream s)
{
    CUstreamCaptureStatus st;
    const CUgraphNode *deps = NULL;
    size_t n = 0;
    tu_assert_cu(drv->cuStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &n));
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(n, 1);
    return deps[0];
}

/* @p join: the side stream joins back before x1 is deleted (the seed's example); otherwise only
 * after x2, just before the capture ends (the streams "remain diverged" while it matters). */
static void deferred_capture(bool reuse, bool join)
{
    tu_xseg_init_or_skip(reuse ? "expandable_segments:False,graph_capture_record_stream_reuse:True"
                               : "expandable_segments:False,graph_capture_record_stream_reuse:False");
    CUstream s = new_stream(), side = new_stream();
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    xseg_pool_id pool = capture_begin(s);
    void *x1 = tu_malloc(4 * GiB, s);
    tu_seed_row("After alloc x1", "4.000", "4.000", "0.000", "4.000");
    wait_stream(side, s); /* fork */
    assert_int_equal(xseg_record_stream(x1, side), XSEG_SUCCESS);
    assert_true(tu_stream_work(side)); /* x1.fill_(1) on side: an empty node of the test's */
    CUgraphNode fill = work_node(side);
    if (join)
        wait_stream(s, side);
    tu_free(x1);
    tu_seed_row("After del x1", "0.000", "4.000", "0.000", "4.000");
    void *t1 = tu_malloc(1, s);
    tu_free(t1);
    bool reused = reuse && join;
    tu_seed_row("After alloc t1", "0.000", reused ? "0.000" : "4.000", "0.000", "4.000");
    void *x2 = tu_malloc(4 * GiB, s);
    tu_seed_row("After alloc x2", "4.000", reused ? "4.000" : "8.000", "0.000", reused ? "4.000" : "8.000");
    if (!join) {
        /* Joined at last, still in the capture: with the option, the next allocation frees x1. */
        wait_stream(s, side);
        void *t3 = tu_malloc(1, s);
        tu_free(t3);
        tu_seed_row("After join, alloc t3", "4.000", reuse ? "4.000" : "8.000", "0.000", "8.000");
    }
    CUgraph g = capture_end(s);
    /* With the option, a free in the capture leaves its marker: an empty node on x1's stream;
     * without it, no empty node but the test's own work node. */
    assert_int_equal(graph_nodes_of(g, CU_GRAPH_NODE_TYPE_EMPTY, fill) > 0, reuse);
    void *t2 = tu_malloc(1, NULL); /* after the capture: deferred frees are processed */
    tu_seed_row("After alloc t2", "4.000", "4.000", "0.000", reused ? "4.000" : "8.000");
    tu_free(t2);
    tu_free(x2);
    graph_done(g, pool);
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* USE_GRAPH=1 without the option: x1 waits for the end of the capture; Reserved doubles. */
static void test_deferred_graph(void **state)
{
    (void)state;
    deferred_capture(false, true);
}

/* With graph_capture_record_stream_reuse:True: Reserved stays at 4.000 through t2. */
static void test_deferred_graph_reuse(void **state)
{
    (void)state;
    deferred_capture(true, true);
}

/* Streams that do not rejoin: the graph gives no order, so no reuse (as without the option). */
static void test_deferred_graph_unjoined(void **state)
{
    (void)state;
    deferred_capture(true, false);
}

/* ---- Gradient accumulator cross-stream memory growth ----
 * The seed's example as the allocation sequence it explains: x (4 GiB) on the current stream;
 * step() = accum (5) backward passes, each allocating the intermediate x * 2 (4 GiB), freeing it,
 * and allocating the gradient in its place; the first gradient becomes x.grad, later ones are
 * accumulated into it and freed; x.grad = None at the end. Warmup runs on side_stream (the
 * AccumulateGrad node's canonical stream): producer and consumer agree, nothing is recorded.
 * The capture runs on another stream (torch.cuda.graph's own) into a private pool: gradients are
 * produced there and consumed on side_stream, so each one (and x.grad, accumulated into there)
 * is record_stream'ed on side_stream, which never takes part in the capture. */
static void grad_step(CUstream produce, CUstream consume, bool record, int accum, const char *const rows[][4])
{
    void *grad = NULL;
    for (int i = 0; i < accum; i++) {
        void *tmp = tu_malloc(4 * GiB, produce); /* x * 2 */
        tu_free(tmp);
        void *g = tu_malloc(4 * GiB, produce);  /* the gradient, in the intermediate's place */
        if (!grad) {
            grad = g; /* x.grad = g: no accumulation, nothing crosses streams */
        } else {
            if (record) {
                assert_int_equal(xseg_record_stream(g, consume), XSEG_SUCCESS);
                assert_int_equal(xseg_record_stream(grad, consume), XSEG_SUCCESS);
            }
            tu_free(g); /* accumulated into x.grad */
        }
        char tag[16];
        snprintf(tag, sizeof tag, "Step %d", i);
        tu_seed_row(tag, rows[i][0], rows[i][1], rows[i][2], rows[i][3]);
    }
    tu_free(grad); /* x.grad = None */
}

/* @p reuse: graph_capture_record_stream_reuse on changes nothing here: side_stream is outside the
 * capture, so the graph cannot order its uses. */
static void gradient_accumulator(bool reuse)
{
    tu_xseg_init_or_skip(reuse ? "expandable_segments:False,graph_capture_record_stream_reuse:True"
                               : "expandable_segments:False");
    CUstream side = new_stream(), cap = new_stream();
    void *x = tu_malloc(4 * GiB, NULL);
    tu_seed_row("Before warmup", "4.000", "4.000", "0.000", "4.000");
    static const char *const warm[][4] = {
        {"8.000", "8.000", "0.000", "8.000"},  {"8.000", "8.000", "0.000", "12.000"},
        {"8.000", "8.000", "0.000", "12.000"}, {"8.000", "8.000", "0.000", "12.000"},
        {"8.000", "8.000", "0.000", "12.000"},
    };
    grad_step(side, side, false, 5, warm);
    tu_seed_row("After warmup", "4.000", "4.000", "0.000", "12.000");
    wait_stream(NULL, side); /* torch.cuda.current_stream().wait_stream(side_stream) */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* torch.cuda.graph() on entry */
    tu_seed_row("Before capture", "4.000", "4.000", "0.000", "4.000");
    xseg_pool_id pool = capture_begin(cap);
    static const char *const captured[][4] = {
        {"8.000", "8.000", "0.000", "8.000"},   {"8.000", "12.000", "0.000", "12.000"},
        {"8.000", "16.000", "0.000", "16.000"}, {"8.000", "20.000", "0.000", "20.000"},
        {"8.000", "24.000", "0.000", "24.000"},
    };
    grad_step(cap, side, true, 5, captured);
    CUgraph g = capture_end(cap);
    tu_seed_row("After capture", "4.000", "24.000", "0.000", "24.000");
    /* The deferred gradients are recycled after the capture, into the graph's pool. */
    void *t = tu_malloc(1, NULL);
    tu_free(t);
    assert_int_equal(tu_stat("active_bytes.large_pool.current"), (int64_t)(4 * GiB));
    assert_int_equal(tu_stat("reserved_bytes.large_pool.current"), (int64_t)(24 * GiB));
    tu_free(x);
    graph_done(g, pool);
    tu_assert_cu(drv->cuStreamDestroy(cap));
    tu_assert_cu(drv->cuStreamDestroy(side));
}

static void test_gradient_accumulator(void **state)
{
    (void)state;
    gradient_accumulator(false);
}

static void test_gradient_accumulator_reuse(void **state)
{
    (void)state;
    gradient_accumulator(true);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_statistics_table),
        cmocka_unit_test(test_fragmentation_classic),
        cmocka_unit_test(test_fragmentation_expandable),
        /* capture: deferred recycling, graph_capture_record_stream_reuse, gradient accumulator */
        cmocka_unit_test(test_deferred_graph),
        cmocka_unit_test(test_deferred_graph_reuse),
        cmocka_unit_test(test_deferred_graph_unjoined),
        cmocka_unit_test(test_gradient_accumulator),
        cmocka_unit_test(test_gradient_accumulator_reuse),
    };
    const char *only = argc > 1 ? argv[1] : NULL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (only && strcmp(all[i].name + strlen("test_"), only) != 0)
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
