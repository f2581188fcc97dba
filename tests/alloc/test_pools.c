/*
 * Private memory pools and CUDA-graph capture through the public API.
 *
 * The seed 003 tables that involve pools or capture, exactly as the seed prints them (GiB, three
 * decimals, large pool), each in its own process (argv[1] = the table's test name): the tables
 * start from an empty allocator. Where the seed's program enters torch.cuda.graph(), which calls
 * empty_cache on entry and captures on a side stream of its own, the test calls xseg_empty_cache
 * and captures (xseg_capture_begin, GLOBAL mode) on one non-blocking side stream shared by all
 * captures, as torch.cuda.graph does. PyTorch's torch.randn(1024, 1024, 1024) is 4 GiB of fp32.
 *
 * Then (argv[1] = "functional"): pool sharing across two captures, a pool released while its
 * tensors are alive, stream filters and their LIFO order, bad use, allocations on a capturing
 * stream that no pool matches, the OOM path during a capture and the OOM message, and a
 * statistics oracle with pools in the mix (xseg_get_stats against a snapshot, after every step
 * of a random sequence of allocations, frees, begins, ends, releases and empty_cache).
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

static const xseg_pool_id NO_POOL = {0, 0};

static CUstream new_stream(void)
{
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

/* torch.cuda.graph(g, pool=...): begin a GLOBAL capture on @p s into *pool ({0,0}: a new one). */
static void capture_begin(CUstream s, xseg_pool_id *pool)
{
    xseg_status st = xseg_capture_begin(0, s, pool, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_capture_begin: %s", xseg_last_error());
    assert_false(pool->first == 0 && pool->second == 0);
}

/* Leaving the graph context: the capture must have stayed valid (no unsafe call inside it). */
static CUgraph capture_end(CUstream s)
{
    CUgraph g = NULL;
    xseg_status st = xseg_capture_end(0, s, &g);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_capture_end: %s", xseg_last_error());
    assert_non_null(g);
    return g;
}

/* del graph: destroy it and drop its use of the pool. */
static void graph_destroy(CUgraph g, xseg_pool_id pool)
{
    tu_assert_cu(drv->cuGraphDestroy(g));
    xseg_status st = xseg_release_pool(0, pool);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_release_pool: %s", xseg_last_error());
}

static bool in_pool(void *ptr, xseg_pool_id pool)
{
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    bool found = false, match = false;
    for (size_t i = 0; i < snap->nsegments && !found; i++) {
        const xseg_segment_info *s = &snap->segments[i];
        for (size_t j = 0; j < s->nblocks; j++) {
            if (s->blocks[j].address == (uint64_t)(uintptr_t)ptr) {
                found = true;
                match = s->pool_id[0] == pool.first && s->pool_id[1] == pool.second;
                break;
            }
        }
    }
    xseg_snapshot_free(snap);
    assert_true(found);
    return match;
}

static void check_all_returned(void)
{
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), 0);
    struct cudaemu_live live;
    if (tu_live(&live)) {
        assert_int_equal(live.handles, 0);
        assert_int_equal(live.mapped_bytes, 0);
        assert_int_equal(live.reservations, 0);
        assert_int_equal(live.allocs, 0);
    }
}

/* ---- seed 003 tables ---------------------------------------------------------------------- */

/* "Intermediate Tensors Can't Be Reused Across Memory Pools": two graphs, two pools. */
static void test_separate_pools(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    CUstream cs = new_stream();
    void *x1 = tu_malloc(4 * GiB, NULL), *x2 = tu_malloc(4 * GiB, NULL);
    tu_seed_row("After alloc x1, x2", "8.000", "8.000", "0.000", "8.000");
    xseg_pool_id p1 = NO_POOL, p2 = NO_POOL;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    capture_begin(cs, &p1);
    void *intermediate1 = tu_malloc(4 * GiB, cs), *out1 = tu_malloc(4 * GiB, cs);
    tu_free(intermediate1);
    tu_seed_row("After del intermediate1", "12.000", "12.000", "0.000", "16.000");
    CUgraph g1 = capture_end(cs);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    capture_begin(cs, &p2);
    assert_false(p1.first == p2.first && p1.second == p2.second);
    void *intermediate2 = tu_malloc(4 * GiB, cs), *out2 = tu_malloc(4 * GiB, cs);
    assert_ptr_not_equal(intermediate2, intermediate1); /* graph 1's pool keeps it */
    tu_free(intermediate2);
    tu_seed_row("After del intermediate2", "16.000", "16.000", "0.000", "24.000");
    CUgraph g2 = capture_end(cs);
    assert_true(in_pool(out1, p1) && in_pool(out2, p2) && in_pool(x1, NO_POOL));
    tu_free(out1);
    tu_free(out2);
    tu_free(x1);
    tu_free(x2);
    graph_destroy(g1, p1);
    graph_destroy(g2, p2);
    check_all_returned();
}

/* The same with graph2 sharing graph1's pool (pool=graph1.pool()): "Total: ~20GB". */
static void test_shared_pool(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    CUstream cs = new_stream();
    void *x1 = tu_malloc(4 * GiB, NULL), *x2 = tu_malloc(4 * GiB, NULL);
    xseg_pool_id p1 = NO_POOL;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    capture_begin(cs, &p1);
    void *intermediate1 = tu_malloc(4 * GiB, cs), *out1 = tu_malloc(4 * GiB, cs);
    tu_free(intermediate1);
    tu_seed_row("After del intermediate1", "12.000", "12.000", "0.000", "16.000");
    CUgraph g1 = capture_end(cs);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    xseg_pool_id shared = p1;
    capture_begin(cs, &shared);
    assert_memory_equal(&shared, &p1, sizeof p1);
    int uses = 0;
    assert_int_equal(xseg_pool_use_count(0, p1, &uses), XSEG_SUCCESS);
    assert_int_equal(uses, 2);
    void *intermediate2 = tu_malloc(4 * GiB, cs), *out2 = tu_malloc(4 * GiB, cs);
    assert_ptr_equal(intermediate2, intermediate1); /* reuses intermediate1's memory */
    tu_free(intermediate2);
    tu_seed_row("After del intermediate2", "16.000", "16.000", "0.000", "20.000");
    CUgraph g2 = capture_end(cs);
    /* Destroying graph 1 leaves the pool to graph 2: nothing is released. */
    graph_destroy(g1, p1);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After del graph1, empty cache", "16.000", "16.000", "0.000", "20.000");
    graph_destroy(g2, p1);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    /* intermediate's 4 GiB goes; out1 and out2 stay valid in the pool until freed. */
    tu_seed_row("After del graph2, empty cache", "16.000", "16.000", "0.000", "16.000");
    tu_free(out1);
    tu_free(out2);
    tu_free(x1);
    tu_free(x2);
    check_all_returned();
    assert_int_equal(xseg_pool_use_count(0, p1, &uses), XSEG_SUCCESS);
    assert_int_equal(uses, 0);
    assert_int_equal(xseg_release_pool(0, p1), XSEG_ERROR_INVALID_VALUE); /* forgotten */
}

/* "Intermediate Tensors After Capture Can't Reuse Graph Pool Memory", USE_GRAPH=1. */
static void test_after_capture_graph(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    CUstream cs = new_stream();
    void *x1 = tu_malloc(4 * GiB, NULL), *t1 = tu_malloc(4 * GiB, NULL);
    tu_free(t1);
    tu_seed_row("After alloc x1, del t1", "4.000", "4.000", "0.000", "8.000");
    xseg_pool_id pool = NO_POOL;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* torch.cuda.graph() on entry */
    capture_begin(cs, &pool);
    tu_seed_row("After enter context", "4.000", "4.000", "0.000", "4.000");
    void *t2 = tu_malloc(4 * GiB, cs), *out1 = tu_malloc(4 * GiB, cs);
    tu_free(t2);
    tu_seed_row("After alloc out1, del t2", "8.000", "8.000", "0.000", "12.000");
    CUgraph g = capture_end(cs);
    void *t3 = tu_malloc(4 * GiB, NULL);
    tu_free(t3);
    tu_seed_row("After alloc t3, del t3", "8.000", "8.000", "0.000", "16.000");
    tu_free(out1);
    tu_free(x1);
    graph_destroy(g, pool);
    check_all_returned();
}

/* The same program with USE_GRAPH=0 (nullcontext): one global pool, t3 reuses t2. */
static void test_after_capture_no_graph(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    void *x1 = tu_malloc(4 * GiB, NULL), *t1 = tu_malloc(4 * GiB, NULL);
    tu_free(t1);
    tu_seed_row("After alloc x1, del t1", "4.000", "4.000", "0.000", "8.000");
    tu_seed_row("After enter context", "4.000", "4.000", "0.000", "8.000");
    void *t2 = tu_malloc(4 * GiB, NULL), *out1 = tu_malloc(4 * GiB, NULL);
    tu_free(t2);
    tu_seed_row("After alloc out1, del t2", "8.000", "8.000", "0.000", "12.000");
    void *t3 = tu_malloc(4 * GiB, NULL);
    tu_free(t3);
    tu_seed_row("After alloc t3, del t3", "8.000", "8.000", "0.000", "12.000");
    tu_free(out1);
    tu_free(x1);
    check_all_returned();
}

/* "Memory Fragmentation Across Pools" in the three configurations the seed prints. */
static void fragmentation(const char *config, const char *const rows[4][4])
{
    tu_xseg_init_or_skip(config);
    CUstream cs = new_stream();
    void *temp = tu_malloc(8 * GiB, NULL);
    tu_free(temp);
    tu_seed_row("After del temp", rows[0][0], rows[0][1], rows[0][2], rows[0][3]);
    void *small = tu_malloc(1 * GiB, NULL), *x = tu_malloc(1 * GiB, NULL);
    tu_seed_row("After alloc x", rows[1][0], rows[1][1], rows[1][2], rows[1][3]);
    xseg_pool_id pool = NO_POOL;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* torch.cuda.graph() on entry */
    tu_seed_row("After empty cache", rows[2][0], rows[2][1], rows[2][2], rows[2][3]);
    capture_begin(cs, &pool);
    void *intermediate = tu_malloc(1 * GiB, cs), *out = tu_malloc(1 * GiB, cs);
    tu_free(intermediate);
    tu_seed_row("After del intermediate", rows[3][0], rows[3][1], rows[3][2], rows[3][3]);
    CUgraph g = capture_end(cs);
    assert_true(in_pool(out, pool) && in_pool(x, NO_POOL));
    tu_free(out);
    tu_free(small);
    tu_free(x);
    graph_destroy(g, pool);
    check_all_returned();
}

static void test_fragmentation_classic(void **state)
{
    (void)state;
    static const char *const rows[4][4] = {{"0.000", "0.000", "0.000", "8.000"},
                                           {"2.000", "2.000", "6.000", "8.000"},
                                           {"2.000", "2.000", "6.000", "8.000"},
                                           {"3.000", "3.000", "6.000", "10.000"}};
    fragmentation("expandable_segments:False", rows);
}

static void test_fragmentation_max_split(void **state)
{
    (void)state;
    static const char *const rows[4][4] = {{"0.000", "0.000", "0.000", "8.000"},
                                           {"2.000", "2.000", "0.000", "10.000"},
                                           {"2.000", "2.000", "0.000", "2.000"},
                                           {"3.000", "3.000", "0.000", "4.000"}};
    fragmentation("expandable_segments:False,max_split_size_mb:128", rows);
}

static void test_fragmentation_expandable(void **state)
{
    (void)state;
    static const char *const rows[4][4] = {{"0.000", "0.000", "0.000", "8.008"},
                                           {"2.000", "2.000", "0.000", "8.008"},
                                           {"2.000", "2.000", "0.000", "2.012"},
                                           {"3.000", "3.000", "0.000", "4.023"}};
    fragmentation("expandable_segments:True", rows);
}

/* Expandable segments during capture: reserved grows and never shrinks while capturing; the
 * pool's memory goes only after the graph is deleted and the cache emptied. */
static void test_capture_expandable(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    CUstream cs = new_stream();
    xseg_pool_id pool = NO_POOL;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    capture_begin(cs, &pool);
    void *temp = tu_malloc(8 * GiB, cs);
    tu_free(temp);
    tu_seed_row("After del temp", "0.000", "0.000", "0.000", "8.008");
    void *x = tu_malloc(2 * GiB, cs);
    tu_seed_row("After alloc x", "2.000", "2.000", "0.000", "8.008");
    void *y = tu_malloc(8 * GiB, cs);
    tu_seed_row("After alloc y", "10.000", "10.000", "0.000", "10.000");
    tu_free(x);
    tu_free(y);
    tu_seed_row("After del x, y", "0.000", "0.000", "0.000", "10.000");
    void *z = tu_malloc(16 * GiB, cs);
    tu_seed_row("After alloc z", "16.000", "16.000", "0.000", "16.016");
    tu_free(z);
    tu_seed_row("After del z", "0.000", "0.000", "0.000", "16.016");
    int64_t frees = tu_stat("num_device_free");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After empty cache", "0.000", "0.000", "0.000", "16.016");
    assert_int_equal(tu_stat("num_device_free"), frees); /* nothing unmapped */
    CUgraph g = capture_end(cs);
    graph_destroy(g, pool);
    tu_seed_row("After del graph", "0.000", "0.000", "0.000", "16.016");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_seed_row("After empty cache", "0.000", "0.000", "0.000", "0.000");
    check_all_returned();
}

/* "Deferred Memory Recycling": x1 is used on a side stream (record_stream) and freed. */
static void deferred(bool graph)
{
    tu_xseg_init_or_skip("expandable_segments:False");
    CUstream stream = new_stream(), side = new_stream();
    xseg_pool_id pool = NO_POOL;
    if (graph) {
        assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
        capture_begin(stream, &pool);
    }
    void *x1 = tu_malloc(4 * GiB, stream);
    tu_seed_row("After alloc x1", "4.000", "4.000", "0.000", "4.000");
    assert_int_equal(xseg_record_stream(x1, side), XSEG_SUCCESS);
    tu_free(x1);
    tu_seed_row("After del x1", "0.000", "4.000", "0.000", "4.000");
    void *t1 = tu_malloc(1, stream); /* polls events, unless capturing */
    tu_free(t1);
    if (graph)
        tu_seed_row("After alloc t1", "0.000", "4.000", "0.000", "4.000");
    else
        tu_seed_row("After alloc t1", "0.000", "0.000", "0.000", "4.000");
    void *x2 = tu_malloc(4 * GiB, stream);
    if (graph)
        tu_seed_row("After alloc x2", "4.000", "8.000", "0.000", "8.000");
    else
        tu_seed_row("After alloc x2", "4.000", "4.000", "0.000", "4.000");
    CUgraph g = graph ? capture_end(stream) : NULL;
    void *t2 = tu_malloc(1, NULL); /* after the capture: deferred frees are processed */
    if (graph)
        tu_seed_row("After alloc t2", "4.000", "4.000", "0.000", "8.000");
    else
        tu_seed_row("After alloc t2", "4.000", "4.000", "0.000", "4.000");
    tu_free(t2);
    tu_free(x2);
    if (graph)
        graph_destroy(g, pool);
    check_all_returned();
}

static void test_deferred_graph(void **state)
{
    (void)state;
    deferred(true);
}

static void test_deferred_no_graph(void **state)
{
    (void)state;
    deferred(false);
}

/* "cudaFree Is Suppressed During Capture": x1 freed inside the context. */
static void free_during(bool graph)
{
    tu_xseg_init_or_skip("expandable_segments:False");
    CUstream stream = new_stream();
    xseg_pool_id pool = NO_POOL;
    void *x1 = tu_malloc(4 * GiB, NULL);
    tu_seed_row("After alloc x1", "4.000", "4.000", "0.000", "4.000");
    if (graph) {
        assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
        capture_begin(stream, &pool);
    }
    void *x2 = tu_malloc(4 * GiB, stream);
    tu_seed_row("After alloc x2", "8.000", "8.000", "0.000", "8.000");
    tu_free(x1);
    tu_seed_row("After del x1", "4.000", "4.000", "0.000", "8.000");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    if (graph)
        tu_seed_row("After empty cache", "4.000", "4.000", "0.000", "8.000");
    else
        tu_seed_row("After empty cache", "4.000", "4.000", "0.000", "4.000");
    void *x3 = tu_malloc(4 * GiB, stream);
    if (graph)
        tu_seed_row("After alloc x3", "8.000", "8.000", "0.000", "12.000");
    else
        tu_seed_row("After alloc x3", "8.000", "8.000", "0.000", "8.000");
    CUgraph g = graph ? capture_end(stream) : NULL;
    tu_free(x2);
    tu_free(x3);
    if (graph)
        graph_destroy(g, pool);
    check_all_returned();
}

static void test_free_during_capture(void **state)
{
    (void)state;
    free_during(true);
}

static void test_free_no_capture(void **state)
{
    (void)state;
    free_during(false);
}

/* ---- functional checks (one process, each test leaves nothing behind) --------------------- */

static int group_setup(void **state)
{
    (void)state;
    return xseg_init("expandable_segments:True") == XSEG_SUCCESS ? 0 : -1;
}

static void use_mode(const char *config)
{
    if (!tu_gpu_available())
        skip();
    assert_int_equal(xseg_set_config(config), XSEG_SUCCESS);
}

/* A pool released while its tensors are alive keeps them valid; their memory returns to the
 * driver at the first empty_cache after they are freed. */
static void released_while_live(const char *config)
{
    use_mode(config);
    CUstream cs = new_stream();
    xseg_pool_id pool = NO_POOL;
    capture_begin(cs, &pool);
    void *a = tu_malloc(24 * MiB, cs), *b = tu_malloc(64 * 1024, cs), *t = tu_malloc(40 * MiB, cs);
    tu_free(t);
    CUgraph g = capture_end(cs);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)a, 24 * MiB, 0xa11));
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)b, 64 * 1024, 0xb22));
    graph_destroy(g, pool);
    int uses = -1;
    assert_int_equal(xseg_pool_use_count(0, pool, &uses), XSEG_SUCCESS);
    assert_int_equal(uses, 0);
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    /* The default pool never takes the released pool's cached 40 MiB. */
    void *c = tu_malloc(40 * MiB, cs);
    assert_true(in_pool(c, NO_POOL));
    assert_true(tu_stat("reserved_bytes.all.current") > reserved);
    tu_free(c);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    /* Only the live tensors' memory (and pages they share) is left. */
    assert_true(tu_check((CUdeviceptr)(uintptr_t)a, 24 * MiB, 0xa11));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)b, 64 * 1024, 0xb22));
    assert_true(in_pool(a, pool) && in_pool(b, pool));
    assert_true(tu_stat("reserved_bytes.all.current") < reserved);
    assert_true(tu_stat("reserved_bytes.all.current") >= (int64_t)(24 * MiB + 64 * 1024));
    tu_free(a);
    assert_true(tu_check((CUdeviceptr)(uintptr_t)b, 64 * 1024, 0xb22));
    tu_free(b);
    check_all_returned();
    assert_int_equal(xseg_release_pool(0, pool), XSEG_ERROR_INVALID_VALUE); /* forgotten */
    tu_assert_cu(drv->cuStreamDestroy(cs));
}

static void test_released_while_live_expandable(void **state)
{
    (void)state;
    released_while_live("expandable_segments:True");
}

static void test_released_while_live_classic(void **state)
{
    (void)state;
    released_while_live("expandable_segments:False");
}

static int only_stream(struct CUstream_st *stream, void *user) { return stream == (CUstream)user; }

/* Filters choose the streams; routes are matched newest first; NULL routes every stream. */
static void test_stream_filters(void **state)
{
    (void)state;
    use_mode("expandable_segments:True");
    CUstream s1 = new_stream(), s2 = new_stream();
    xseg_pool_id pa, pb;
    assert_int_equal(xseg_pool_create(&pa), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_create(&pb), XSEG_SUCCESS);
    assert_false(pa.first == pb.first && pa.second == pb.second);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pa, only_stream, s1), XSEG_SUCCESS);
    void *a1 = tu_malloc(3 * MiB, s1), *d2 = tu_malloc(3 * MiB, s2), *d0 = tu_malloc(1000, NULL);
    assert_true(in_pool(a1, pa));
    assert_true(in_pool(d2, NO_POOL) && in_pool(d0, NO_POOL));
    /* A newer route for every stream takes precedence, also over s1. */
    assert_int_equal(xseg_begin_allocate_to_pool(0, pb, NULL, NULL), XSEG_SUCCESS);
    void *b1 = tu_malloc(3 * MiB, s1), *b0 = tu_malloc(1000, NULL);
    assert_true(in_pool(b1, pb) && in_pool(b0, pb));
    assert_int_equal(xseg_end_allocate_to_pool(0, pb), XSEG_SUCCESS);
    void *a1b = tu_malloc(1000, s1), *d2b = tu_malloc(1000, s2);
    assert_true(in_pool(a1b, pa) && in_pool(d2b, NO_POOL));
    assert_int_equal(xseg_end_allocate_to_pool(0, pa), XSEG_SUCCESS);
    void *d1 = tu_malloc(3 * MiB, s1);
    assert_true(in_pool(d1, NO_POOL));
    /* A freed block of a pool is reused by that pool only: a1's 3 MiB goes back to pa. */
    tu_free(a1);
    void *d1b = tu_malloc(3 * MiB, s1);
    assert_ptr_not_equal(d1b, a1);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pa, only_stream, s1), XSEG_SUCCESS);
    void *a1c = tu_malloc(3 * MiB, s1);
    assert_ptr_equal(a1c, a1);
    assert_int_equal(xseg_end_allocate_to_pool(0, pa), XSEG_SUCCESS);
    void *all[] = {d2, d0, b1, b0, a1b, d2b, d1, d1b, a1c};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tu_free(all[i]);
    /* pa was begun twice: two uses. */
    assert_int_equal(xseg_release_pool(0, pa), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pa), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pb), XSEG_SUCCESS);
    check_all_returned();
    tu_assert_cu(drv->cuStreamDestroy(s1));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

static void expect_error(xseg_status got, xseg_status want, const char *needle)
{
    if (got != want)
        fail_msg("got %s, expected %s (%s)", xseg_status_name(got), xseg_status_name(want), xseg_last_error());
    if (!strstr(xseg_last_error(), needle))
        fail_msg("message \"%s\" does not mention \"%s\"", xseg_last_error(), needle);
}

/* Bad use gives a clear error and changes nothing. */
static void test_bad_use(void **state)
{
    (void)state;
    use_mode("expandable_segments:True");
    CUstream s = new_stream();
    xseg_pool_id p, unknown;
    assert_int_equal(xseg_pool_create(&p), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_create(&unknown), XSEG_SUCCESS);
    int uses = -1;

    expect_error(xseg_begin_allocate_to_pool(0, NO_POOL, NULL, NULL), XSEG_ERROR_INVALID_VALUE, "default pool");
    expect_error(xseg_end_allocate_to_pool(0, p), XSEG_ERROR_ILLEGAL_STATE, "not recording");
    expect_error(xseg_release_pool(0, unknown), XSEG_ERROR_INVALID_VALUE, "no pool");
    expect_error(xseg_begin_allocate_to_pool(5, p, NULL, NULL), XSEG_ERROR_INVALID_DEVICE, "invalid device");
    assert_int_equal(xseg_pool_use_count(0, p, &uses), XSEG_SUCCESS);
    assert_int_equal(uses, 0);

    assert_int_equal(xseg_begin_allocate_to_pool(0, p, only_stream, s), XSEG_SUCCESS);
    expect_error(xseg_begin_allocate_to_pool(0, p, NULL, NULL), XSEG_ERROR_ILLEGAL_STATE, "already recording");
    expect_error(xseg_release_pool(0, p), XSEG_ERROR_ILLEGAL_STATE, "still recording");
    assert_int_equal(xseg_pool_use_count(0, p, &uses), XSEG_SUCCESS);
    assert_int_equal(uses, 1);
    /* The failed begin added no route: the only route still matches s only. */
    void *q = tu_malloc(1000, NULL), *r = tu_malloc(1000, s);
    assert_true(in_pool(q, NO_POOL) && in_pool(r, p));
    assert_int_equal(xseg_end_allocate_to_pool(0, p), XSEG_SUCCESS);
    expect_error(xseg_end_allocate_to_pool(0, p), XSEG_ERROR_ILLEGAL_STATE, "not recording");
    assert_int_equal(xseg_release_pool(0, p), XSEG_SUCCESS);
    expect_error(xseg_release_pool(0, p), XSEG_ERROR_INVALID_VALUE, "no users left"); /* r is alive */
    tu_free(q);
    tu_free(r);

    /* The capture pair. */
    xseg_pool_id cp = NO_POOL;
    CUgraph g = (CUgraph)(uintptr_t)1;
    expect_error(xseg_capture_begin(0, NULL, &cp, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_ERROR_INVALID_VALUE,
                 "legacy default stream");
    expect_error(xseg_capture_begin(0, s, &cp, 7), XSEG_ERROR_INVALID_VALUE, "capture mode 7");
    expect_error(xseg_capture_begin(0, s, NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_ERROR_INVALID_VALUE, "pool");
    expect_error(xseg_capture_end(0, s, &g), XSEG_ERROR_ILLEGAL_STATE, "no capture begun");
    assert_null(g);
    assert_true(cp.first == 0 && cp.second == 0);
    capture_begin(s, &cp);
    xseg_pool_id again = cp;
    CUstream s2 = new_stream();
    expect_error(xseg_capture_begin(0, s2, &again, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_ERROR_ILLEGAL_STATE,
                 "already recording");
    xseg_pool_id other = NO_POOL;
    expect_error(xseg_capture_begin(0, s, &other, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_ERROR_ILLEGAL_STATE,
                 "already has a capture");
    assert_true(other.first == 0 && other.second == 0);
    expect_error(xseg_end_allocate_to_pool(0, cp), XSEG_ERROR_ILLEGAL_STATE, "xseg_capture_end");
    CUstreamCaptureStatus cs;
    tu_assert_cu(drv->cuStreamIsCapturing(s2, &cs));
    assert_int_equal(cs, CU_STREAM_CAPTURE_STATUS_NONE);
    g = capture_end(s);
    graph_destroy(g, cp);
    /* A driver failure to begin changes nothing (the pool is not left behind). */
    xseg_pool_id failp = NO_POOL;
    tu_assert_cu(drv->cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_RELAXED));
    assert_int_equal(xseg_capture_begin(0, s2, &failp, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_ERROR_DRIVER);
    assert_true(failp.first == 0 && failp.second == 0);
    tu_assert_cu(drv->cuStreamEndCapture(s2, &g));
    tu_assert_cu(drv->cuGraphDestroy(g));
    /* A capture the program invalidated (an unsafe call of its own): ending it reports the
     * driver's error, still stops routing, and leaves the use to release. */
    xseg_pool_id ip = NO_POOL;
    capture_begin(s, &ip);
    CUdeviceptr raw = 0;
    tu_assert_cu_eq(drv->cuMemAlloc(&raw, 1 << 20), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    g = (CUgraph)(uintptr_t)1;
    expect_error(xseg_capture_end(0, s, &g), XSEG_ERROR_DRIVER, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
    assert_null(g);
    expect_error(xseg_end_allocate_to_pool(0, ip), XSEG_ERROR_ILLEGAL_STATE, "not recording");
    assert_int_equal(xseg_release_pool(0, ip), XSEG_SUCCESS);
    check_all_returned();
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* An allocation on a capturing stream that no pool matches fails clearly, whether or not other
 * pools record; the capture is not disturbed. */
static void test_capturing_stream_without_pool(void **state)
{
    (void)state;
    use_mode("expandable_segments:False");
    CUstream s = new_stream(), other = new_stream();
    void *warm = tu_malloc(5 * MiB, s); /* leaves a cached block on s */
    tu_free(warm);
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    void *p = NULL;
    /* A cache miss asks the driver and remembers the capture... */
    expect_error(xseg_malloc(&p, 100 * MiB, 0, s), XSEG_ERROR_ILLEGAL_STATE, "private pool");
    assert_null(p);
    /* ...so a request the cache could serve is refused as well. */
    expect_error(xseg_malloc(&p, 5 * MiB, 0, s), XSEG_ERROR_ILLEGAL_STATE, "private pool");
    /* A pool routed for another stream does not cover s. */
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, only_stream, other), XSEG_SUCCESS);
    expect_error(xseg_malloc(&p, 5 * MiB, 0, s), XSEG_ERROR_ILLEGAL_STATE, "private pool");
    void *q = tu_malloc(5 * MiB, other);
    assert_true(in_pool(q, pool));
    tu_free(q);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    CUgraph g = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &g)); /* still valid: nothing unsafe ran */
    tu_assert_cu(drv->cuGraphDestroy(g));
    void *after = tu_malloc(5 * MiB, s);
    tu_free(after);
    check_all_returned();
    tu_assert_cu(drv->cuStreamDestroy(s));
    tu_assert_cu(drv->cuStreamDestroy(other));
}

/* During a capture the OOM path releases nothing (the global pool's cached block stays), and the
 * message counts what the private pools hold cached. */
static void test_oom_during_capture(void **state)
{
    (void)state;
    use_mode("expandable_segments:False");
    CUstream s = new_stream();
    void *g4 = tu_malloc(4 * GiB, NULL);
    tu_free(g4); /* 4 GiB cached in the global pool */
    tu_set_memory_cap(6 * GiB); /* whatever the device's size */
    xseg_pool_id pool = NO_POOL;
    capture_begin(s, &pool);
    void *a = tu_malloc(1 * GiB, s);
    tu_free(a); /* 1 GiB cached in the pool */
    void *p = NULL;
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    expect_error(xseg_malloc(&p, 2 * GiB, 0, s), XSEG_ERROR_OUT_OF_MEMORY,
                 "with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and 4.00 GiB is reserved");
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved);
    CUgraph g = capture_end(s);
    /* Outside the capture, a request the cache cannot serve succeeds by releasing the global
     * cache (the pool's block stays: its graph is alive). */
    void *b = tu_malloc(4 * GiB + GiB / 2, NULL);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(5 * GiB + GiB / 2));
    tu_free(b);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    graph_destroy(g, pool);
    check_all_returned();
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* ---- statistics oracle with pools in the mix ---------------------------------------------- */

struct live {
    void *p;
    size_t size;
    int pool; /* -1: default, else index into pools[] */
};

/* The stats must equal what the snapshot shows, per small/large pool. */
static void oracle_check(const char *when, size_t step)
{
    xseg_device_stats st;
    assert_int_equal(xseg_get_stats(0, &st), XSEG_SUCCESS);
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    int64_t reserved[3] = {0}, allocated[3] = {0}, active[3] = {0}, count[3] = {0};
    for (size_t i = 0; i < snap->nsegments; i++) {
        const xseg_segment_info *s = &snap->segments[i];
        int k = s->is_large ? XSEG_STAT_LARGE_POOL : XSEG_STAT_SMALL_POOL;
        reserved[k] += (int64_t)s->total_size;
        allocated[k] += (int64_t)s->allocated_size;
        active[k] += (int64_t)s->active_size;
        for (size_t j = 0; j < s->nblocks; j++)
            count[k] += s->blocks[j].state == XSEG_BLOCK_ACTIVE_ALLOCATED;
    }
    xseg_snapshot_free(snap);
    for (int k = 1; k < 3; k++) {
        if (st.reserved_bytes[k].current != reserved[k] || st.allocated_bytes[k].current != allocated[k] ||
            st.active_bytes[k].current != active[k] || st.allocation[k].current != count[k])
            fail_msg("step %zu (%s), %s pool: stats reserved/allocated/active/count %lld/%lld/%lld/%lld, "
                     "snapshot %lld/%lld/%lld/%lld", step, when, k == 1 ? "small" : "large",
                     (long long)st.reserved_bytes[k].current, (long long)st.allocated_bytes[k].current,
                     (long long)st.active_bytes[k].current, (long long)st.allocation[k].current,
                     (long long)reserved[k], (long long)allocated[k], (long long)active[k], (long long)count[k]);
    }
    assert_int_equal(st.reserved_bytes[0].current, reserved[1] + reserved[2]);
    assert_int_equal(st.allocated_bytes[0].current, allocated[1] + allocated[2]);
}

#define ORACLE_POOLS 3
#define ORACLE_STREAMS 2

static void oracle(const char *config, unsigned seed)
{
    use_mode(config);
    srand(seed);
    CUstream streams[ORACLE_STREAMS] = {new_stream(), new_stream()};
    xseg_pool_id pools[ORACLE_POOLS];
    int uses[ORACLE_POOLS] = {0};
    /* Model of the routes, oldest first: pool index and the stream it matches (-1: every). */
    int route_pool[ORACLE_POOLS], route_stream[ORACLE_POOLS], nroutes = 0;
    for (int i = 0; i < ORACLE_POOLS; i++)
        assert_int_equal(xseg_pool_create(&pools[i]), XSEG_SUCCESS);
    size_t nlive = 0, cap = 512;
    struct live *live = calloc(cap, sizeof *live);
    assert_non_null(live);
    size_t steps = tu_scaled(600, 80);
    for (size_t step = 0; step < steps; step++) {
        int op = rand() % 100;
        int pi = rand() % ORACLE_POOLS, si = rand() % (ORACLE_STREAMS + 1) - 1; /* -1: legacy */
        CUstream stream = si < 0 ? NULL : streams[si];
        int ri = -1;
        for (int r = 0; r < nroutes; r++)
            if (route_pool[r] == pi)
                ri = r;
        const char *what;
        if (op < 45 && nlive < cap) {
            what = "malloc";
            size_t size = rand() % 3 ? (size_t)(rand() % (2 * (int)MiB)) + 1 : (size_t)(rand() % (60 * (int)MiB)) + 1;
            int expect = -1;
            for (int r = nroutes; r-- > 0;) {
                if (route_stream[r] < 0 || (si >= 0 && route_stream[r] == si)) {
                    expect = route_pool[r];
                    break;
                }
            }
            void *p = tu_malloc(size, stream);
            assert_true(in_pool(p, expect < 0 ? NO_POOL : pools[expect]));
            live[nlive++] = (struct live){p, size, expect};
        } else if (op < 80 && nlive) {
            what = "free";
            size_t k = (size_t)rand() % nlive;
            tu_free(live[k].p);
            live[k] = live[--nlive];
        } else if (op < 88) {
            what = "begin";
            int filt = rand() % (ORACLE_STREAMS + 1) - 1;
            xseg_status st = xseg_begin_allocate_to_pool(0, pools[pi], filt < 0 ? NULL : only_stream,
                                                         filt < 0 ? NULL : streams[filt]);
            if (ri >= 0) {
                assert_int_equal(st, XSEG_ERROR_ILLEGAL_STATE);
            } else {
                assert_int_equal(st, XSEG_SUCCESS);
                route_pool[nroutes] = pi;
                route_stream[nroutes++] = filt;
                uses[pi]++;
            }
        } else if (op < 94) {
            what = "end";
            xseg_status st = xseg_end_allocate_to_pool(0, pools[pi]);
            if (ri < 0) {
                assert_int_equal(st, XSEG_ERROR_ILLEGAL_STATE);
            } else {
                assert_int_equal(st, XSEG_SUCCESS);
                for (int r = ri; r + 1 < nroutes; r++) {
                    route_pool[r] = route_pool[r + 1];
                    route_stream[r] = route_stream[r + 1];
                }
                nroutes--;
            }
        } else if (op < 98) {
            what = "release";
            xseg_status st = xseg_release_pool(0, pools[pi]);
            if (uses[pi] == 0)
                assert_int_equal(st, XSEG_ERROR_INVALID_VALUE);
            else if (uses[pi] == 1 && ri >= 0)
                assert_int_equal(st, XSEG_ERROR_ILLEGAL_STATE);
            else {
                assert_int_equal(st, XSEG_SUCCESS);
                uses[pi]--;
            }
        } else {
            what = "empty_cache";
            int64_t before = tu_stat("reserved_bytes.all.current");
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            if (nroutes)
                assert_int_equal(tu_stat("reserved_bytes.all.current"), before); /* capture underway */
        }
        for (int i = 0; i < ORACLE_POOLS; i++) {
            int u = -1;
            assert_int_equal(xseg_pool_use_count(0, pools[i], &u), XSEG_SUCCESS);
            if (u != uses[i])
                fail_msg("step %zu (%s): pool %d has %d uses, the model %d", step, what, i, u, uses[i]);
        }
        oracle_check(what, step);
    }
    while (nroutes)
        assert_int_equal(xseg_end_allocate_to_pool(0, pools[route_pool[--nroutes]]), XSEG_SUCCESS);
    for (int i = 0; i < ORACLE_POOLS; i++)
        while (uses[i]--)
            assert_int_equal(xseg_release_pool(0, pools[i]), XSEG_SUCCESS);
    while (nlive)
        tu_free(live[--nlive].p);
    free(live);
    oracle_check("end", steps);
    check_all_returned();
    for (int i = 0; i < ORACLE_POOLS; i++)
        assert_int_equal(xseg_release_pool(0, pools[i]), XSEG_ERROR_INVALID_VALUE); /* all forgotten */
    for (int i = 0; i < ORACLE_STREAMS; i++)
        tu_assert_cu(drv->cuStreamDestroy(streams[i]));
}

static void test_oracle_expandable(void **state)
{
    (void)state;
    oracle("expandable_segments:True", 1234);
}

static void test_oracle_classic(void **state)
{
    (void)state;
    oracle("expandable_segments:False", 5678);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tables[] = {
        cmocka_unit_test(test_separate_pools),
        cmocka_unit_test(test_shared_pool),
        cmocka_unit_test(test_after_capture_graph),
        cmocka_unit_test(test_after_capture_no_graph),
        cmocka_unit_test(test_fragmentation_classic),
        cmocka_unit_test(test_fragmentation_max_split),
        cmocka_unit_test(test_fragmentation_expandable),
        cmocka_unit_test(test_capture_expandable),
        cmocka_unit_test(test_deferred_graph),
        cmocka_unit_test(test_deferred_no_graph),
        cmocka_unit_test(test_free_during_capture),
        cmocka_unit_test(test_free_no_capture),
    };
    const struct CMUnitTest functional[] = {
        cmocka_unit_test(test_released_while_live_expandable),
        cmocka_unit_test(test_released_while_live_classic),
        cmocka_unit_test(test_stream_filters),
        cmocka_unit_test(test_bad_use),
        cmocka_unit_test(test_capturing_stream_without_pool),
        cmocka_unit_test(test_oom_during_capture),
        cmocka_unit_test(test_oracle_expandable),
        cmocka_unit_test(test_oracle_classic),
    };
    const char *only = argc > 1 ? argv[1] : "functional";
    if (!strcmp(only, "functional"))
        return cmocka_run_group_tests(functional, group_setup, NULL);
    /* One test per process (the suite): a table starts from an empty allocator, and a functional
     * check that stops half-way (a capture left open, a cap left set) leaves nothing behind. */
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        if (strcmp(tables[i].name, only) != 0)
            continue;
        const struct CMUnitTest one[] = {tables[i]};
        return _cmocka_run_group_tests(tables[i].name, one, 1, NULL, NULL);
    }
    for (size_t i = 0; i < sizeof functional / sizeof functional[0]; i++) {
        if (strcmp(functional[i].name, only) != 0)
            continue;
        const struct CMUnitTest one[] = {functional[i]};
        return _cmocka_run_group_tests(functional[i].name, one, 1, group_setup, NULL);
    }
    fprintf(stderr, "test_pools: no test named '%s'\n", only);
    return 1;
}
