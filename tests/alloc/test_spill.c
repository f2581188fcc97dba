/*
 * spill_to_host: out of memory, pages of live blocks move to host memory at the same addresses
 * and come back (xseg_promote, empty_cache). Through the public API on a small emulated device
 * (CUDAEMU_TOTAL_MEM 50M): the request that failed is served, live bytes survive the spill and
 * the promotion, the books match the driver's mappings (a host page is mapped but not reserved),
 * a stream still writing a block is waited for, a captured graph replays over spilled and
 * promoted input, every driver call of spill and of promotion can fail and is rolled back, and
 * sleep and IPC refuse spilled pages until they are promoted. The contract (core/services/spill.h):
 * only blocks declared cold move, a move never races the program's use (the parked promotion, the
 * oracle), pins end with what made them, a destroyed stream is never named, host pages go to
 * the device's NUMA node, and a spill moves what the growth after it maps, which then fits.
 *
 * The scenario: A (24 MiB, declared cold, tag 1) and B (16 MiB, tag 2) are live; C (20 MiB) does
 * not fit beside them. argv[1] names one test (one process each); without it every test runs.
 * Single-threaded tests with no idle thread read a declared block where it helps (check_data):
 * nothing can move it during a read that completes before the next xseg call; a program keeps the
 * promise instead (the oracle does).
 */
#define _GNU_SOURCE /* RTLD_DEFAULT, RTLD_NOLOAD */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tests/alloc/fixture.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#define A_SIZE (24 * MiB)
#define B_SIZE (16 * MiB)
#define C_SIZE (20 * MiB)
#define SPILL "expandable_segments:True,spill_to_host:True"

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A and B live and filled; A declared cold. */
static void scenario(void **a, void **b)
{
    *a = must_malloc(A_SIZE, NULL);
    *b = must_malloc(B_SIZE, NULL);
    tu_assert_cu(tu_fill(DPTR(*a), A_SIZE, 1));
    tu_assert_cu(tu_fill(DPTR(*b), B_SIZE, 2));
    assert_int_equal(xseg_spill_hint(*a, XSEG_SPILL_COLD), XSEG_SUCCESS);
}

/* start_emu(SPILL), the scenario, and C (still live, returned) served by spilling A's pages. */
static void *spilled_scenario(void **a, void **b)
{
    start_emu(SPILL);
    void *c = NULL;
    scenario(a, b);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    return c;
}

/* Do [x, x + n) and [y, y + n) hold the same bytes (every 64 KiB of the first 4 KiB read)? */
static bool same_bytes(void *x, void *y, size_t n)
{
    static unsigned char bx[4096], by[4096];
    for (size_t off = 0; off < n; off += 64 * 1024) {
        tu_assert_cu(drv->cuMemcpyDtoH(bx, DPTR(x) + off, sizeof bx));
        tu_assert_cu(drv->cuMemcpyDtoH(by, DPTR(y) + off, sizeof by));
        if (memcmp(bx, by, sizeof bx))
            return false;
    }
    return true;
}

static int location(void *p, size_t *host)
{
    int loc = -1;
    assert_int_equal(xseg_block_location(p, &loc, host, NULL), XSEG_SUCCESS);
    return loc;
}

/* The books: the snapshot's segments tile their blocks; reserved is what they span less the
 * spilled bytes; the driver maps exactly both (when @p driver: no leftover waits). */
static void check_books(bool driver)
{
    xseg_snapshot *s = NULL;
    assert_int_equal(xseg_take_snapshot(0, &s), XSEG_SUCCESS);
    int64_t span = 0, allocated = 0;
    for (size_t i = 0; i < s->nsegments; i++) {
        const xseg_segment_info *g = &s->segments[i];
        span += (int64_t)g->total_size;
        for (size_t j = 0; j < g->nblocks; j++)
            if (g->blocks[j].state == XSEG_BLOCK_ACTIVE_ALLOCATED)
                allocated += (int64_t)g->blocks[j].size;
    }
    xseg_snapshot_free(s);
    int64_t spilled = tu_stat("spilled_bytes.all.current");
    assert_true(spilled >= 0 && spilled <= allocated);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), span - spilled);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), allocated);
    struct cudaemu_live live;
    if (driver && tu_live(&live) && (int64_t)live.mapped_bytes != span)
        fail_msg("the snapshot spans %lld bytes, but the driver maps %zu", (long long)span, live.mapped_bytes);
}

/* The snapshot's host_bytes of the block at @p p (SIZE_MAX: no such block). */
static size_t snapshot_host_bytes(void *p)
{
    xseg_snapshot *s = NULL;
    assert_int_equal(xseg_take_snapshot(0, &s), XSEG_SUCCESS);
    size_t host = SIZE_MAX;
    for (size_t i = 0; i < s->nsegments; i++)
        for (size_t j = 0; j < s->segments[i].nblocks; j++)
            if (s->segments[i].blocks[j].address == (uint64_t)(uintptr_t)p)
                host = s->segments[i].blocks[j].host_bytes;
    xseg_snapshot_free(s);
    return host;
}

static void check_data(void *a, void *b)
{
    if (!tu_check(DPTR(a), A_SIZE, 1))
        fail_msg("A lost its bytes");
    if (!tu_check(DPTR(b), B_SIZE, 2))
        fail_msg("B lost its bytes");
}

static void finish(void *a, void *b)
{
    tu_free(a);
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    check_no_leaks();
}

/* The request is served by spilling A's pages; A and B keep their bytes; C works; xseg_promote
 * brings A back whole once C went. */
static void test_spill_serves(void **state)
{
    (void)state;
    start_emu(SPILL);
    void *a, *b, *c = NULL;
    scenario(&a, &b);
    int64_t ooms = tu_stat("num_ooms");
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(tu_stat("num_ooms"), ooms);
    size_t host = 0;
    assert_int_not_equal(location(a, &host), XSEG_LOCATION_DEVICE);
    assert_true(host >= 10 * MiB && host <= A_SIZE);
    assert_int_equal(location(b, NULL), XSEG_LOCATION_DEVICE); /* the hint chose A */
    assert_int_equal(tu_stat("spilled_bytes.all.current"), (int64_t)host);
    assert_int_equal(tu_stat("spilled_bytes.all.peak"), (int64_t)host);
    assert_true(tu_stat("num_spills") >= 1);
    assert_int_equal(tu_stat("spill_copied_bytes"), (int64_t)host);
    assert_int_equal(snapshot_host_bytes(a), host); /* the snapshot says where A is */
    assert_int_equal(snapshot_host_bytes(b), 0);
    char summary[8192];
    assert_int_equal(xseg_memory_summary(0, summary, sizeof summary, NULL), XSEG_SUCCESS);
    assert_non_null(strstr(summary, "Spilled to host"));
    check_books(true);
    check_data(a, b);
    /* Everything stays writable at its address: the new block and the spilled one. */
    tu_assert_cu(tu_fill(DPTR(c), C_SIZE, 3));
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 4));
    assert_true(tu_check(DPTR(c), C_SIZE, 3));
    assert_true(tu_check(DPTR(a), A_SIZE, 4));
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 1));
    /* No room yet: promotion says what stays. */
    assert_int_equal(xseg_promote(0), XSEG_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(xseg_last_error(), "stay on host memory"));
    check_books(true);
    check_data(a, b);
    tu_free(c);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* gives C's pages back, then promotes */
    assert_int_equal(location(a, &host), XSEG_LOCATION_DEVICE);
    assert_int_equal(host, 0);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    assert_int_equal(tu_stat("num_promotions"), tu_stat("num_spills"));
    assert_int_equal(tu_stat("spill_copied_bytes"), 2 * tu_stat("spilled_bytes.all.allocated"));
    assert_int_equal(xseg_promote(0), XSEG_SUCCESS); /* nothing left */
    check_books(true);
    check_data(a, b);
    finish(a, b);
}

/* Off (the default) the same request fails as before, nothing copied; classic segments cannot
 * spill, and the OOM message says why. */
static void test_spill_off(void **state)
{
    (void)state;
    start_emu("expandable_segments:True");
    void *a, *b, *c = NULL;
    scenario(&a, &b);
    tu_counts_reset();
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_null(strstr(xseg_last_error(), "pill"));
    assert_int_equal(tu_call_count("cuMemcpyDtoDAsync"), 0);
    assert_int_equal(tu_stat("num_spills"), 0);
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    check_books(true);
    check_data(a, b);
    finish(a, b);

    char buf[2048];
    assert_int_equal(xseg_get_config(buf, sizeof buf, NULL), XSEG_SUCCESS);
    assert_null(strstr(buf, "spill")); /* left out of the canonical string at its default */

    /* The host limit: what fits under it moves, then the OOM says the limit stopped it. */
    assert_int_equal(xseg_init(SPILL ",spill_host_limit_mb:4"), XSEG_SUCCESS);
    scenario(&a, &b);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(xseg_last_error(), "spill_host_limit_mb (4 MiB) is reached"));
    assert_true(tu_stat("spilled_bytes.all.current") > 0 && tu_stat("spilled_bytes.all.current") <= (int64_t)(4 * MiB));
    check_books(true);
    check_data(a, b);
    assert_int_equal(xseg_promote(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    check_data(a, b);
    finish(a, b);

    assert_int_equal(xseg_init("expandable_segments:False,spill_to_host:True"), XSEG_SUCCESS);
    scenario(&a, &b);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(xseg_last_error(), "Spill to host memory was not possible: its memory is in classic "
                                               "segments"));
    check_data(a, b);
    finish(a, b);
}

/* A stream still writing A when the malloc runs out: work queued before A's declaration, on a
 * side stream xseg was never told about (no record_stream: PyTorch needs none after wait_stream).
 * The spill waits for the device's work first (a context synchronize: no copy of stale bytes, no
 * unmap under the write), and A holds what the stream wrote (cudaemu refuses to unmap memory a
 * held stream's work still touches). */
static void test_spill_stream_writing(void **state)
{
    (void)state;
    start_emu(SPILL);
    CUstream w;
    tu_assert_cu(drv->cuStreamCreate(&w, CU_STREAM_NON_BLOCKING));
    void *a = must_malloc(A_SIZE, NULL), *b = must_malloc(B_SIZE, NULL), *c = NULL;
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 1));
    tu_assert_cu(tu_fill(DPTR(b), B_SIZE, 2));
    /* The write: a memset of A's first 8 MiB (the first pages to move) queued on the held stream
     * (pending work), then the declaration. */
    assert_true(tu_stream_hold(w));
    tu_assert_cu(drv->cuMemsetD8Async(DPTR(a), 0x5a, 8 * MiB, w));
    /* A side stream's use is recorded (the contract, core/services/spill.h): the declaration's
     * events cover it, and the spill waits for them, never for the context. */
    assert_int_equal(xseg_record_stream(a, w), XSEG_SUCCESS);
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_COLD), XSEG_SUCCESS);
    tu_counts_reset();
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(tu_call_count("cuCtxSynchronize"), 0);
    assert_true(tu_call_count("cuEventSynchronize") >= 1);
    assert_true(tu_stream_release(w));
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    /* A second spill of the same declarations waits for nothing. */
    void *c2 = NULL;
    tu_counts_reset();
    assert_int_equal(xseg_malloc(&c2, 2 * MiB, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(tu_call_count("cuCtxSynchronize"), 0);
    unsigned char probe[4096];
    for (size_t off = 0; off < 8 * MiB; off += MiB) {
        tu_assert_cu(drv->cuMemcpyDtoH(probe, DPTR(a) + off, sizeof probe));
        for (size_t i = 0; i < sizeof probe; i++)
            if (probe[i] != 0x5a)
                fail_msg("byte %zu of A lost the stream's write", off + i);
    }
    assert_true(tu_check(DPTR(b), B_SIZE, 2));
    check_books(true);
    tu_free(c2);
    tu_free(c);
    tu_free(a); /* declared before the last synchronize: its host pages go without a wait */
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(w));
}

/* A graph captured over A (a copy of A's first 4 MiB into OUT) replays the same after A was
 * spilled and after it was promoted: its nodes hold A's address, which never changed. The launch
 * touches A, so A's declaration ends first: with no room (the fraction) its pages stay on host
 * memory, and the graph reads them there; later, with room, the next NONE brings them back. */
static void test_spill_graph_replay(void **state)
{
    (void)state;
    start_emu(SPILL);
    const struct tu_graph_api *gx = tu_graph();
    const size_t n = 4 * MiB;
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *a, *b, *c = NULL, *out = must_malloc(n, NULL);
    scenario(&a, &b);
    tu_assert_cu(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    tu_assert_cu(gx->memcpy_dtod_async(DPTR(out), DPTR(a), n, s));
    CUgraph g = NULL;
    tu_assert_cu(drv->cuStreamEndCapture(s, &g));
    CUgraphExec x = NULL;
    tu_assert_cu(gx->instantiate(&x, g, 0));

    assert_int_equal(xseg_malloc(&c, C_SIZE - 4 * MiB, 0, NULL), XSEG_SUCCESS);
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    cap_device((size_t)tu_stat("reserved_bytes.all.current"));
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_NONE), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    tu_assert_cu(drv->cuMemsetD8(DPTR(out), 0, n));
    tu_assert_cu(gx->launch(x, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_true(same_bytes(out, a, n)); /* A's first n bytes, read from host memory */
    assert_true(tu_check(DPTR(a), A_SIZE, 1));

    tu_free(c);
    tu_free(b); /* room for all of A again */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE); /* not declared: not moved */
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_NONE), XSEG_SUCCESS); /* the program asks */
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    tu_assert_cu(drv->cuMemsetD8(DPTR(out), 0, n));
    tu_assert_cu(gx->launch(x, s));
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_true(same_bytes(out, a, n));
    assert_true(tu_check(DPTR(a), A_SIZE, 1));

    tu_assert_cu(gx->exec_destroy(x));
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_free(out);
    tu_free(a);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* A spilled block's free drops its host pages: spilled bytes go to 0, the driver maps no host
 * page, and the freed range serves a new block from device memory. */
static void test_spill_free_drops(void **state)
{
    (void)state;
    void *a, *b, *c = spilled_scenario(&a, &b);
    int64_t promotions = tu_stat("num_promotions");
    tu_free(a);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    assert_int_equal(tu_stat("num_promotions"), promotions); /* dropped, not copied back */
    check_books(true);
    void *d = must_malloc(A_SIZE / 2, NULL);
    assert_int_equal(location(d, NULL), XSEG_LOCATION_DEVICE);
    tu_assert_cu(tu_fill(DPTR(d), A_SIZE / 2, 5));
    assert_true(tu_check(DPTR(d), A_SIZE / 2, 5));
    assert_true(tu_check(DPTR(b), B_SIZE, 2));
    check_books(true);
    tu_free(d);
    tu_free(c);

    /* The drop's unmap fails: the free still succeeds, the page is counted unmapped (never handed
     * out as host memory), and the next reclaim gives it back. */
    a = must_malloc(A_SIZE, NULL);
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 1));
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_COLD), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN));
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    tu_fail_clear();
    tu_assert_fired(fired, "the drop's cuMemUnmap");
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    check_books(false);
    d = must_malloc(A_SIZE / 2, NULL); /* maps device memory where the stranded page was, if there */
    assert_int_equal(location(d, NULL), XSEG_LOCATION_DEVICE);
    tu_assert_cu(tu_fill(DPTR(d), A_SIZE / 2, 6));
    assert_true(tu_check(DPTR(d), A_SIZE / 2, 6));
    tu_free(d);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_books(true);
    tu_free(c);
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

/* A spilled block freed while a capture is underway: nothing is waited for or unmapped (either
 * would break the capture); its host pages are stranded, counted unmapped, and the first reclaim
 * after the capture gives them back. Spill itself refuses during the capture, saying so. A was
 * recorded on the capturing stream, so a wait for A's streams would synchronize that stream and
 * invalidate the capture (the driver's rule); the free makes no cuStreamSynchronize and no
 * cuMemUnmap at all until the capture ends. */
static void test_spill_capture_free(void **state)
{
    (void)state;
    void *a, *b;
    tu_free(spilled_scenario(&a, &b));
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    assert_int_equal(xseg_record_stream(a, s), XSEG_SUCCESS);
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *big = NULL; /* the capture's pool cannot grow past the device, and spill may not help */
    assert_int_equal(xseg_malloc(&big, 16 * MiB, 0, s), XSEG_ERROR_OUT_OF_MEMORY);
    if (!strstr(xseg_last_error(), "a stream capture is underway"))
        fail_msg("the OOM during the capture does not say why spill could not help: %s", xseg_last_error());
    tu_counts_reset();
    if (xseg_free(a) != XSEG_SUCCESS)
        fail_msg("the free of spilled A during the capture failed: %s", xseg_last_error());
    assert_int_equal(tu_call_count("cuStreamSynchronize"), 0);
    assert_int_equal(tu_call_count("cuMemUnmap"), 0);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    assert_true(tu_stream_work(s));
    CUgraph g = NULL;
    assert_int_equal(xseg_capture_end(0, s, &g), XSEG_SUCCESS); /* not invalidated */
    assert_non_null(g);
    tu_assert_cu(drv->cuGraphDestroy(g));
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_true(tu_check(DPTR(b), B_SIZE, 2));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_books(true);
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* A private pool's spilled block freed during a later capture into that pool, while a side
 * stream it was recorded on still copies from its host pages into a live buffer Y: the free sets
 * the host pages aside (no wait, no unmap: the capture forbids both), and the pool's growth in the
 * same capture must not unmap them either (xseg.h: while a pool records nothing is unmapped); it
 * goes elsewhere or fails as out of memory; the reclaim after the capture unmaps them only after
 * that work. Once the stream runs, Y holds the copied bytes. */
static void test_spill_capture_growth(void **state)
{
    (void)state;
    start_emu(SPILL);
    CUstream s, w;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&w, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool = {0, 0};
    CUgraph g = NULL;
    /* P: the pool's block, allocated during a first capture. */
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *p = must_malloc(A_SIZE, s);
    assert_int_equal(xseg_capture_end(0, s, &g), XSEG_SUCCESS);
    tu_assert_cu(drv->cuGraphDestroy(g));
    tu_assert_cu(tu_fill(DPTR(p), 4 * MiB, 7)); /* what the side stream copies */
    assert_int_equal(xseg_spill_hint(p, XSEG_SPILL_COLD), XSEG_SUCCESS);
    void *b = must_malloc(B_SIZE, NULL), *c = NULL, *x = NULL;
    tu_assert_cu(tu_fill(DPTR(b), B_SIZE, 2));
    /* P and B's first pages go (B declared for the time being: taken back right after, its
     * pages stay on host memory while C holds the device). */
    assert_int_equal(xseg_spill_hint(b, XSEG_SPILL_COLD), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_spill_hint(b, XSEG_SPILL_NONE), XSEG_SUCCESS);
    size_t host = 0;
    assert_int_not_equal(location(p, &host), XSEG_LOCATION_DEVICE);
    tu_free(c);
    void *y = must_malloc(4 * MiB, NULL);
    tu_assert_cu(tu_fill(DPTR(y), 4 * MiB, 9));
    /* P's declaration ends with no room to bring it back (the fraction): it stays on host memory,
     * the program's to use again. */
    cap_device((size_t)tu_stat("reserved_bytes.all.current") - C_SIZE + 4 * MiB);
    assert_int_equal(xseg_spill_hint(p, XSEG_SPILL_NONE), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_not_equal(location(p, NULL), XSEG_LOCATION_DEVICE);
    /* The side stream's copy from P's first 4 MiB (on host memory: the first pages to move). */
    assert_int_equal(xseg_record_stream(p, w), XSEG_SUCCESS);
    assert_true(tu_stream_hold(w));
    tu_assert_cu(drv->cuMemcpyDtoDAsync(DPTR(y), DPTR(p), 4 * MiB, w));

    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    tu_counts_reset();
    if (xseg_free(p) != XSEG_SUCCESS)
        fail_msg("the free of spilled P during the capture failed: %s", xseg_last_error());
    /* Larger than P's device pages: the pool must grow into P's range or elsewhere. */
    xseg_status st = xseg_malloc(&x, A_SIZE - 4 * MiB, 0, s);
    if (st != XSEG_SUCCESS && st != XSEG_ERROR_OUT_OF_MEMORY)
        fail_msg("the pool's growth during the capture failed: %s", xseg_last_error());
    if (x)
        tu_free(x);
    assert_int_equal(xseg_capture_end(0, s, &g), XSEG_SUCCESS);
    tu_assert_cu(drv->cuGraphDestroy(g));
    /* The reclaim after the capture gives the set-aside pages back, after the copy (it waits). */
    if (xseg_empty_cache(0) != XSEG_SUCCESS)
        fail_msg("empty_cache after the capture, the side stream's copy still queued: %s", xseg_last_error());
    tu_stream_release(w); /* done already where the wait ran the held work (cudaemu) */
    tu_assert_cu(drv->cuStreamSynchronize(w));
    if (!tu_check(DPTR(y), 4 * MiB, 7))
        fail_msg("Y lost the bytes the side stream copied from P");
    assert_true(tu_check(DPTR(b), B_SIZE, 2));
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_spill_hint(b, XSEG_SPILL_NONE), XSEG_SUCCESS); /* B's pages come home now */
    check_books(true);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    tu_free(y);
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(w));
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* A range registered with xseg_register_range never moves (spill_pinned asks the ledger): the
 * declared A stays on the device and B's pages (declared too) go instead; with B's declaration
 * ended, the OOM names the registration as the one pin. */
static void test_spill_registered(void **state)
{
    (void)state;
    start_emu(SPILL);
    void *a, *b, *c = NULL;
    scenario(&a, &b);
    static const xseg_range_callbacks cb = {NULL, NULL, 0};
    int ctx = 0;
    assert_int_equal(xseg_register_range(a, A_SIZE, &cb, &ctx), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    if (!strstr(xseg_last_error(), "is pinned (registered (xseg_register_range))"))
        fail_msg("the OOM does not name the registration: %s", xseg_last_error());
    assert_int_equal(xseg_spill_hint(b, XSEG_SPILL_COLD), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, C_SIZE - 6 * MiB, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    assert_int_not_equal(location(b, NULL), XSEG_LOCATION_DEVICE);
    check_books(true);
    check_data(a, b);
    tu_free(c);
    assert_int_equal(xseg_unregister_range(a, A_SIZE, &ctx), XSEG_SUCCESS);
    finish(a, b);
}

/* Sleep and IPC against spilled pages: both refused (the message says to promote), nothing
 * changed; after the promotion both work. */
static void test_spill_sleep_ipc(void **state)
{
    (void)state;
    void *a, *b, *c = spilled_scenario(&a, &b);
    xseg_ipc_handle *h = NULL;
    assert_int_equal(xseg_ipc_export(a, &h), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "xseg_promote"));
    xseg_phys_range r[64];
    size_t nr = 0;
    assert_int_equal(xseg_block_handles(a, r, 64, &nr), XSEG_ERROR_ILLEGAL_STATE);
    xseg_pool_id def = {0, 0};
    assert_int_equal(xseg_sleep(0, def, XSEG_SLEEP_OFFLOAD), XSEG_ERROR_ILLEGAL_STATE);
    assert_non_null(strstr(xseg_last_error(), "spilled to host memory"));
    check_books(true);
    check_data(a, b);
    /* B is not spilled: it exports, and its pages are pinned from then on (never spilled). */
    assert_int_equal(xseg_ipc_export(b, &h), XSEG_SUCCESS);
    xseg_ipc_handle_free(h);
    h = NULL;
    tu_free(c);
    tu_free(b); /* the export ends with the block */
    assert_int_equal(xseg_promote(0), XSEG_SUCCESS);
    assert_int_equal(xseg_sleep(0, def, XSEG_SLEEP_OFFLOAD), XSEG_SUCCESS);
    assert_int_equal(xseg_wake(0, def), XSEG_SUCCESS);
    assert_true(tu_check(DPTR(a), A_SIZE, 1));
    assert_int_equal(xseg_ipc_export(a, &h), XSEG_SUCCESS);
    xseg_ipc_handle_free(h);
    tu_free(a);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

/* xseg_trim gives the cache back and promotes. The idle thread never waits and never moves a page
 * a kernel may be using: a block whose declaration ended stays on host memory while its stream
 * works on it, whatever the idle thread, empty_cache, trim or xseg_promote do; declared again, the
 * idle thread leaves it (a synchronize would be needed: it makes none) and xseg_trim, which may
 * wait, brings it back; a block declared since before the last synchronize the idle thread
 * promotes by itself. */
static void test_spill_trim_idle(void **state)
{
    (void)state;
    void *a, *b, *c = NULL;
    tu_free(spilled_scenario(&a, &b));
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    check_data(a, b);

    /* A spilled again, then its declaration ends with no room (the fraction): it stays on host. */
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    tu_free(c);
    cap_device((size_t)tu_stat("reserved_bytes.all.current") - C_SIZE);
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_NONE), XSEG_SUCCESS);
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    /* The program's kernel on A, still queued on a side stream it recorded (xseg_record_stream). */
    CUstream w;
    tu_assert_cu(drv->cuStreamCreate(&w, CU_STREAM_NON_BLOCKING));
    assert_true(tu_stream_hold(w));
    tu_assert_cu(drv->cuMemsetD8Async(DPTR(a), 0x5a, 8 * MiB, w));
    assert_int_equal(xseg_record_stream(a, w), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config("idle_release_ms:20,idle_release_thread:True"), XSEG_SUCCESS);
    int64_t promotions = tu_stat("num_promotions");
    tu_counts_reset();
    for (int i = 0; i < 20; i++)
        nap_ms(10); /* several idle passes */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(xseg_promote(0), XSEG_SUCCESS); /* no declared block on host */
    assert_int_equal(tu_stat("num_promotions"), promotions); /* not declared: never moved */
    assert_int_equal(tu_call_count("cuCtxSynchronize"), 0);
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    /* Declared again, the kernel still queued: the idle thread does not wait for it. */
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_COLD), XSEG_SUCCESS);
    for (int i = 0; i < 20; i++)
        nap_ms(10);
    assert_int_equal(tu_stat("num_promotions"), promotions);
    assert_int_equal(tu_call_count("cuCtxSynchronize"), 0);
    assert_int_equal(xseg_set_config("idle_release_ms:0,idle_release_thread:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS); /* may wait: A's declaration's events, then A */
    assert_int_equal(tu_call_count("cuCtxSynchronize"), 0);
    assert_true(tu_call_count("cuEventSynchronize") >= 1);
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    assert_true(tu_stream_release(w));
    unsigned char probe[4096];
    tu_assert_cu(drv->cuMemcpyDtoH(probe, DPTR(a), sizeof probe));
    for (size_t i = 0; i < sizeof probe; i++)
        if (probe[i] != 0x5a)
            fail_msg("byte %zu of A lost the kernel's write", i);
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 1));

    /* Declared since before the last synchronize: the idle thread promotes it by itself. */
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    tu_free(c);
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    assert_int_equal(xseg_set_config("idle_release_ms:20,idle_release_thread:True"), XSEG_SUCCESS);
    /* A hang guard only: the thread's next passes promote A (generous bound). */
    for (int i = 0; i < 1000 && tu_stat("spilled_bytes.all.current"); i++)
        nap_ms(10);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    assert_int_equal(xseg_set_config("idle_release_ms:0,idle_release_thread:False"), XSEG_SUCCESS);
    check_books(true);
    check_data(a, b);
    finish(a, b);
    tu_assert_cu(drv->cuStreamDestroy(w));
}

/* Every call of a spill and of a promotion, failed in turn: the call rolls back (the data where
 * it was, the books matching the driver), the allocator stays usable, nothing is left behind. */
static const struct {
    const char *entry;
    CUresult res;
} faults[] = {
    {"cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY},  {"cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY},
    {"cuMemMap", CUDA_ERROR_UNKNOWN},           {"cuMemSetAccess", CUDA_ERROR_UNKNOWN},
    {"cuMemcpyDtoDAsync", CUDA_ERROR_UNKNOWN},  {"cuStreamSynchronize", CUDA_ERROR_UNKNOWN},
    {"cuMemUnmap", CUDA_ERROR_UNKNOWN},         {"cuMemRelease", CUDA_ERROR_UNKNOWN},
    {"cuMemAddressFree", CUDA_ERROR_UNKNOWN},     {"cuCtxSynchronize", CUDA_ERROR_UNKNOWN},
};
#define NFAULTS (sizeof faults / sizeof faults[0])

static void sweep(bool promote)
{
    start_emu(SPILL);
    unsigned long calls[NFAULTS];
    {
        void *a, *b, *c = NULL;
        scenario(&a, &b);
        if (!promote)
            tu_counts_reset();
        assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
        tu_free(c);
        if (promote)
            tu_counts_reset();
        assert_int_equal(xseg_promote(0), XSEG_SUCCESS);
        for (size_t f = 0; f < NFAULTS; f++)
            calls[f] = tu_call_count(faults[f].entry);
        /* A 2 MiB chunk a call: a page of each is enough to reach every step. */
        for (size_t f = 0; f < NFAULTS; f++)
            if (calls[f] > 3)
                calls[f] = 3;
        finish(a, b);
    }
    size_t served = 0, refused = 0;
    for (size_t f = 0; f < NFAULTS; f++)
        for (unsigned long nth = 1; nth <= calls[f]; nth++) {
            void *a, *b, *c = NULL;
            assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
            scenario(&a, &b);
            xseg_status st;
            unsigned long fired = tu_fail_fired();
            if (!promote) {
                assert_true(tu_fail(faults[f].entry, nth, faults[f].res));
                st = xseg_malloc(&c, C_SIZE, 0, NULL);
                tu_fail_clear();
                if (st != XSEG_SUCCESS && st != XSEG_ERROR_OUT_OF_MEMORY && st != XSEG_ERROR_DRIVER)
                    fail_msg("%s #%lu: xseg_malloc returned %d: %s", faults[f].entry, nth, (int)st, xseg_last_error());
                served += st == XSEG_SUCCESS;
                refused += st != XSEG_SUCCESS;
                if (st == XSEG_SUCCESS) {
                    tu_assert_cu(tu_fill(DPTR(c), C_SIZE, 3));
                    assert_true(tu_check(DPTR(c), C_SIZE, 3));
                    tu_free(c);
                }
            } else {
                assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
                tu_free(c);
                assert_true(tu_fail(faults[f].entry, nth, faults[f].res));
                st = xseg_promote(0);
                tu_fail_clear();
                served += st == XSEG_SUCCESS;
                refused += st != XSEG_SUCCESS;
            }
            tu_assert_fired(fired, "%s #%lu: the fault did not strike", faults[f].entry, nth);
            check_data(a, b);
            check_books(false);
            /* A reclaim retries the leftovers and promotes: the driver maps what the books say. */
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            check_books(true);
            check_data(a, b);
            assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
            /* Still usable: the request is served now that the fault is gone. */
            assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
            check_data(a, b);
            tu_free(c);
            finish(a, b);
        }
    print_message("spill %s faults: %zu served despite the fault, %zu refused\n", promote ? "promotion" : "demotion",
                  served, refused);
}

static void test_spill_faults(void **state)
{
    (void)state;
    sweep(false);
}

static void test_spill_promote_faults(void **state)
{
    (void)state;
    sweep(true);
}

/* cudaemu's count of bytes copied to or from host-located VMM memory (cudaemu_link_bytes). */
static uint64_t link_bytes(void)
{
    uint64_t (*f)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "cudaemu_link_bytes");
    void *lib = f ? NULL : dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
    if (lib)
        *(void **)&f = dlsym(lib, "cudaemu_link_bytes");
    if (!f)
        fail_msg("cudaemu_link_bytes: not exported by the emulator");
    return f();
}

/* The location of the host chunk under the first whole chunk of @p p, as the driver says
 * (cuMemRetainAllocationHandle + cuMemGetAllocationPropertiesFromHandle). */
static CUmemLocation chunk_location(void *p)
{
    CUresult (*props)(CUmemAllocationProp *, CUmemGenericAllocationHandle) = NULL;
    void *lib = dlopen(getenv("XSEG_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
    if (lib)
        *(void **)&props = dlsym(lib, "cuMemGetAllocationPropertiesFromHandle");
    if (!props)
        fail_msg("cuMemGetAllocationPropertiesFromHandle: not exported by the driver");
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr chunk = (DPTR(p) + 2 * MiB - 1) & ~(CUdeviceptr)(2 * MiB - 1);
    tu_assert_cu(drv->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)chunk));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    tu_assert_cu(props(&prop, h));
    tu_assert_cu(drv->cuMemRelease(h));
    return prop.location;
}

/* Where spill puts pages: HOST_NUMA at the device's own node (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
 * CUDAEMU_HOST_NUMA_ID), else location HOST (the device names no node), else HOST_NUMA node 0,
 * else nowhere (=none: the OOM says why). The stats, xseg_block_location, the snapshot and the
 * driver's own properties of the host chunk agree. A copy that fails names the location tried;
 * a spill and a promotion cross the host link with exactly the bytes they copied (cudaemu's link
 * bytes). */
static void location_case(const char *host_vmm, const char *numa_id, const char *named, int node, int fallback)
{
    setenv("CUDAEMU_HOST_VMM", host_vmm, 1); /* read at the first driver call */
    setenv("CUDAEMU_HOST_NUMA_ID", numa_id, 1);
    start_emu(SPILL);
    void *a, *b, *c = NULL;
    scenario(&a, &b);
    assert_int_equal(tu_stat("spill_numa_node"), -1); /* nothing spilled yet */
    assert_int_equal(tu_stat("spill_numa_fallback"), -1);
    if (!named) {
        assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
        if (!strstr(xseg_last_error(), "the driver cannot map host memory into device address ranges"))
            fail_msg("the OOM does not say why spill could not help: %s", xseg_last_error());
        check_data(a, b);
        finish(a, b);
        return;
    }
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemcpyDtoDAsync", 1, CUDA_ERROR_UNKNOWN));
    xseg_status st = xseg_malloc(&c, C_SIZE, 0, NULL);
    tu_fail_clear();
    tu_assert_fired(fired, "the copy's fault did not strike");
    assert_int_not_equal(st, XSEG_SUCCESS);
    if (!strstr(xseg_last_error(), named))
        fail_msg("the OOM does not name %s: %s", named, xseg_last_error());
    check_data(a, b);
    uint64_t l0 = link_bytes();
    int64_t copied0 = tu_stat("spill_copied_bytes");
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    int64_t copied = tu_stat("spill_copied_bytes") - copied0;
    assert_true(copied > 0);
    assert_int_equal(link_bytes() - l0, (uint64_t)copied);
    /* Where it went, said four ways. */
    assert_int_equal(tu_stat("spill_numa_node"), node);
    assert_int_equal(tu_stat("spill_numa_fallback"), fallback);
    int loc = -1, at = -2;
    size_t host = 0;
    assert_int_equal(xseg_block_location(a, &loc, &host, &at), XSEG_SUCCESS);
    assert_true(host > 0);
    assert_int_equal(at, node);
    assert_int_equal(xseg_block_location(b, &loc, &host, &at), XSEG_SUCCESS);
    assert_int_equal(at, -1); /* nothing of B on host memory */
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    int snap_node = -2;
    for (size_t i = 0; i < snap->nsegments; i++)
        for (size_t j = 0; j < snap->segments[i].nblocks; j++)
            if (snap->segments[i].blocks[j].address == (uint64_t)(uintptr_t)a)
                snap_node = snap->segments[i].blocks[j].host_numa_node;
    xseg_snapshot_free(snap);
    assert_int_equal(snap_node, node);
    CUmemLocation where = chunk_location(a);
    assert_int_equal(where.type, node >= 0 ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_HOST);
    if (node >= 0)
        assert_int_equal(where.id, node);
    char summary[8192];
    assert_int_equal(xseg_memory_summary(0, summary, sizeof summary, NULL), XSEG_SUCCESS);
    static const char *const rule[] = {"the device's own node", "location HOST", "node 0: the device names no node"};
    if (!strstr(summary, rule[fallback]))
        fail_msg("memory_summary does not say where spilled pages are (%s):\n%s", rule[fallback], summary);
    tu_free(c);
    l0 = link_bytes();
    copied0 = tu_stat("spill_copied_bytes");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* promotes */
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    assert_int_equal(link_bytes() - l0, (uint64_t)(tu_stat("spill_copied_bytes") - copied0));
    check_data(a, b);
    finish(a, b);
}

static void test_spill_location(void **state)
{
    (void)state;
    location_case("all", "1", "to host memory (location HOST_NUMA node 1)", 1, 0);
}

static void test_spill_location_host(void **state)
{
    (void)state;
    location_case("all", "-1", "to host memory (location HOST)", -1, 1);
}

static void test_spill_location_numa(void **state)
{
    (void)state;
    location_case("numa", "-1", "to host memory (location HOST_NUMA node 0)", 0, 2);
}

static void test_spill_location_none(void **state)
{
    (void)state;
    location_case("none", "0", NULL, -1, -1);
}

/* ---- the contract: what moves, and when (docs/services.md "Spill to host memory") ---- */

struct caller {
    pthread_t t;
    void *a;
    CUcontext ctx; /* made current on the thread before it touches memory */
    xseg_status st;
};

static void *promote_main(void *arg)
{
    struct caller *c = arg;
    c->st = xseg_promote(0);
    return NULL;
}

/* Take A's declaration back, then write it (the program's side of the contract). */
static void *undeclare_write_main(void *arg)
{
    struct caller *c = arg;
    c->st = xseg_spill_hint(c->a, XSEG_SPILL_NONE);
    if (c->st == XSEG_SUCCESS && drv->cuCtxSetCurrent(c->ctx) != CUDA_SUCCESS)
        c->st = XSEG_ERROR_DRIVER;
    if (c->st == XSEG_SUCCESS && tu_fill(DPTR(c->a), A_SIZE, 7) != CUDA_SUCCESS)
        c->st = XSEG_ERROR_DRIVER;
    return NULL;
}

/* After a spill of A and C's free: the cache goes back with promotion refused (a memory fraction
 * of exactly what stays reserved), so that the next promotion's first cuMemUnmap is its own
 * (between its copy and its remap: the gate parks it there). */
static void spilled_and_cache_released(void *c)
{
    tu_free(c);
    cap_device((size_t)tu_stat("reserved_bytes.all.current") - C_SIZE);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
}

/* The reproduction of the lost write: a promotion on another thread parked between its copy and
 * its remap (the gate on its first cuMemUnmap) while this thread writes A, which it never declared
 * cold. The remap would put back the bytes copied before the write. Under the contract A never
 * moves (only declared blocks do: the OOM says so), so the write stays whatever the promotion
 * does. Then the declared case: the promotion parked with A on host memory, another thread takes
 * the declaration back (xseg_spill_hint NONE: it waits for the move in flight) and writes: kept. */
static void test_spill_parked_promotion(void **state)
{
    (void)state;
    start_emu(SPILL);
    void *a = must_malloc(A_SIZE, NULL), *b = must_malloc(B_SIZE, NULL), *c = NULL;
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 1));
    tu_assert_cu(tu_fill(DPTR(b), B_SIZE, 2));
    xseg_status st = xseg_malloc(&c, C_SIZE, 0, NULL);
    bool parked = false;
    if (st == XSEG_SUCCESS)
        spilled_and_cache_released(c); /* a build that moves undeclared blocks */
    else if (st != XSEG_ERROR_OUT_OF_MEMORY || !strstr(xseg_last_error(), "declared cold"))
        fail_msg("the OOM does not say that only blocks declared cold move: %s", xseg_last_error());
    assert_true(tu_gate("cuMemUnmap", 1));
    struct caller p = {0};
    assert_int_equal(pthread_create(&p.t, NULL, promote_main, &p), 0);
    if (st == XSEG_SUCCESS)
        parked = tu_gate_wait(60000);
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 7)); /* the program's write, A never declared */
    tu_gate_open();
    assert_int_equal(pthread_join(p.t, NULL), 0);
    if (!tu_check(DPTR(a), A_SIZE, 7))
        fail_msg("A lost the write made while a promotion was %s", parked ? "parked between its copy and its remap"
                                                                        : "running");
    assert_true(tu_check(DPTR(b), B_SIZE, 2));
    tu_free(a);
    tu_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();

    /* Declared: spilled; the promotion parks with A half moved; the owner takes A back. */
    scenario(&a, &b);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS);
    spilled_and_cache_released(c);
    assert_true(tu_gate("cuMemUnmap", 1));
    p = (struct caller){0};
    assert_int_equal(pthread_create(&p.t, NULL, promote_main, &p), 0);
    assert_true(tu_gate_wait(60000));
    struct caller u = {.a = a};
    tu_assert_cu(drv->cuCtxGetCurrent(&u.ctx));
    assert_int_equal(pthread_create(&u.t, NULL, undeclare_write_main, &u), 0);
    nap_ms(50); /* the owner is blocked on the device lock the parked promotion holds */
    tu_gate_open();
    assert_int_equal(pthread_join(p.t, NULL), 0);
    assert_int_equal(pthread_join(u.t, NULL), 0);
    assert_int_equal(p.st, XSEG_SUCCESS);
    if (u.st != XSEG_SUCCESS)
        fail_msg("the owner's NONE or write failed (%d): %s", (int)u.st, xseg_last_error());
    if (!tu_check(DPTR(a), A_SIZE, 7))
        fail_msg("A lost the write its owner made after taking the declaration back");
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    check_books(true);
    finish(a, b);
}

/* Pins follow the exports that exist: B exported, its handle freed and B freed; D takes B's place.
 * A (declared cold, same segment) must spill for C: the segment's old export pins nothing now.
 * A live export pins its block, handles handed out until their last release, and the OOM names
 * only that pin. */
static void test_spill_freed_export(void **state)
{
    (void)state;
    start_emu(SPILL);
    void *a, *b, *c = NULL;
    scenario(&a, &b);
    xseg_ipc_handle *h = NULL;
    assert_int_equal(xseg_ipc_export(b, &h), XSEG_SUCCESS);
    xseg_ipc_handle_free(h);
    tu_free(b);
    b = must_malloc(B_SIZE, NULL); /* B's place again */
    tu_assert_cu(tu_fill(DPTR(b), B_SIZE, 2));
    if (xseg_malloc(&c, C_SIZE, 0, NULL) != XSEG_SUCCESS)
        fail_msg("a freed export still pins its segment: %s", xseg_last_error());
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    check_data(a, b);
    tu_free(c);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);

    /* A exported now: pinned, and the OOM says so (and nothing else). */
    assert_int_equal(xseg_ipc_export(a, &h), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    const char *msg = xseg_last_error();
    if (!strstr(msg, "exported over IPC") || strstr(msg, "observer") || strstr(msg, "handed out") ||
        strstr(msg, "registered"))
        fail_msg("the OOM does not name the one real pin (A exported): %s", msg);
    xseg_ipc_handle_free(h);
    check_data(a, b);
    finish(a, b);

    /* Handles handed out pin their block until the last release, and no longer. */
    scenario(&a, &b);
    xseg_phys_range r[64];
    size_t nr = 0;
    assert_int_equal(xseg_block_handles(a, r, 64, &nr), XSEG_SUCCESS);
    assert_int_equal(xseg_block_handles(a, r, 64, &nr), XSEG_SUCCESS);
    assert_int_equal(xseg_block_handles_release(a), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    msg = xseg_last_error();
    if (!strstr(msg, "handed out") || strstr(msg, "exported") || strstr(msg, "observer"))
        fail_msg("the OOM does not name the one real pin (A's handles): %s", msg);
    assert_int_equal(xseg_block_handles_release(a), XSEG_SUCCESS);
    if (xseg_malloc(&c, C_SIZE, 0, NULL) != XSEG_SUCCESS)
        fail_msg("released handles still pin A: %s", xseg_last_error());
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    tu_free(c);
    check_data(a, b);
    finish(a, b);
}

/* A's stream is destroyed by the user before the spill: the move must not queue on it or wait
 * for it (a dangling handle on a GPU; cudaemu counts every call naming it). The spill, the
 * promotion, a second spill and A's free (its host pages dropped) go through without one. */
static void test_spill_destroyed_stream(void **state)
{
    (void)state;
    start_emu(SPILL);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *a = must_malloc(A_SIZE, s), *b = must_malloc(B_SIZE, NULL), *c = NULL;
    tu_assert_cu(tu_fill(DPTR(a), A_SIZE, 1));
    tu_assert_cu(tu_fill(DPTR(b), B_SIZE, 2));
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_COLD), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(s));
    unsigned long dead = tu_dead_stream_calls();
    if (xseg_malloc(&c, C_SIZE, 0, NULL) != XSEG_SUCCESS)
        fail_msg("the spill of a block whose stream was destroyed failed: %s", xseg_last_error());
    assert_int_not_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    check_data(a, b);
    tu_free(c);
    assert_int_equal(xseg_promote(0), XSEG_SUCCESS);
    assert_int_equal(location(a, NULL), XSEG_LOCATION_DEVICE);
    check_data(a, b);
    assert_int_equal(xseg_malloc(&c, C_SIZE, 0, NULL), XSEG_SUCCESS); /* spilled again */
    tu_free(c);
    tu_free(a); /* its host pages dropped: no wait on its stream */
    assert_int_equal(tu_dead_stream_calls(), dead);
    tu_free(b);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

/* The spill oracle: threads, each with its own blocks and streams, follow the contract (a block is
 * touched only while not declared cold), while the idle thread (idle_release_thread) promotes and
 * other calls (empty_cache, trim, promote) run on a device spill must keep rescuing. Every block
 * holds the bytes its owner last wrote (tags on each 64 KiB, queued on the owner's streams). 10^5
 * operations in all (tu_steps: XSEG_TEST_SCALE of it under the sanitizers; the `long` setup's
 * 10^6, also under ThreadSanitizer). The build before the contract lost a write within a few
 * thousand operations. */
#define ORACLE_THREADS 4
#define ORACLE_SLOTS 4

struct oracle_thread {
    pthread_t t;
    unsigned id;
    uint64_t rng;
    long ops;
    CUstream streams[2];
    void *p[ORACLE_SLOTS];
    size_t size[ORACLE_SLOTS];
    uint32_t tag[ORACLE_SLOTS];
    bool cold[ORACLE_SLOTS];
    char err[512];
    long spilled_seen, ooms;
};

/* The oracle's pattern, cheap to write and to check at scale: @p tag at the start of each 64 KiB
 * (a page that kept an older write, or lost the page, shows), queued on @p s. */
static CUresult oracle_fill(void *p, size_t size, uint32_t tag, CUstream s)
{
    CUresult r = CUDA_SUCCESS;
    for (size_t off = 0; r == CUDA_SUCCESS && off + sizeof tag <= size; off += 64 * 1024)
        r = drv->cuMemcpyHtoDAsync(DPTR(p) + off, &tag, sizeof tag, s); /* pageable: staged at the call */
    return r;
}

static bool oracle_check(void *p, size_t size, uint32_t tag)
{
    for (size_t off = 0; off + sizeof tag <= size; off += 64 * 1024) {
        uint32_t got = 0;
        if (drv->cuMemcpyDtoH(&got, DPTR(p) + off, sizeof got) != CUDA_SUCCESS || got != tag)
            return false;
    }
    return true;
}

static uint64_t oracle_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static bool oracle_step(struct oracle_thread *o)
{
    unsigned k = (unsigned)(oracle_next(&o->rng) % ORACLE_SLOTS), r = (unsigned)(oracle_next(&o->rng) % 100);
    uint32_t tag = (uint32_t)(o->id << 24 | (uint32_t)(o->ops & 0xffffff)) | 1;
    if (!o->p[k]) {
        size_t size = (1 + oracle_next(&o->rng) % 4) * MiB + (oracle_next(&o->rng) % 3) * 64 * 1024;
        CUstream s = r < 30 ? NULL : o->streams[r % 2];
        xseg_status st = xseg_malloc(&o->p[k], size, 0, s);
        if (st == XSEG_ERROR_OUT_OF_MEMORY) {
            o->p[k] = NULL;
            o->ooms++;
            return true;
        }
        if (st != XSEG_SUCCESS) {
            snprintf(o->err, sizeof o->err, "malloc(%zu): %s", size, xseg_last_error());
            return false;
        }
        o->size[k] = size;
        o->cold[k] = false;
        /* Written on its stream, not waited for: the declaration below may follow at once. */
        if (oracle_fill(o->p[k], size, tag, s) != CUDA_SUCCESS) {
            snprintf(o->err, sizeof o->err, "fill of a new block failed");
            return false;
        }
        o->tag[k] = tag;
        return true;
    }
    void *p = o->p[k];
    if (o->cold[k]) {
        if (r < 15) { /* the owner needs it again */
            if (xseg_spill_hint(p, XSEG_SPILL_NONE) != XSEG_SUCCESS) {
                snprintf(o->err, sizeof o->err, "hint NONE: %s", xseg_last_error());
                return false;
            }
            o->cold[k] = false;
        } else if (r < 25) {
            size_t host = 0;
            int loc = -1;
            if (xseg_block_location(p, &loc, &host, NULL) != XSEG_SUCCESS) {
                snprintf(o->err, sizeof o->err, "block_location: %s", xseg_last_error());
                return false;
            }
            o->spilled_seen += host != 0;
        } else if (r < 30) {
            if (xseg_free(p) != XSEG_SUCCESS) {
                snprintf(o->err, sizeof o->err, "free of a cold block: %s", xseg_last_error());
                return false;
            }
            o->p[k] = NULL;
        }
        return true;
    }
    /* Not declared: the owner's to read and write. */
    if (!oracle_check(p, o->size[k], o->tag[k])) {
        snprintf(o->err, sizeof o->err, "block %p (%zu bytes) lost its bytes (tag %#x)", p, o->size[k], o->tag[k]);
        return false;
    }
    if (r < 45) {
        if (xseg_spill_hint(p, XSEG_SPILL_COLD) != XSEG_SUCCESS) {
            snprintf(o->err, sizeof o->err, "hint COLD: %s", xseg_last_error());
            return false;
        }
        o->cold[k] = true;
    } else if (r < 60) {
        if (oracle_fill(p, o->size[k], tag, o->streams[r % 2]) != CUDA_SUCCESS) {
            snprintf(o->err, sizeof o->err, "refill failed");
            return false;
        }
        o->tag[k] = tag;
    } else if (r < 75) {
        if (xseg_free(p) != XSEG_SUCCESS) {
            snprintf(o->err, sizeof o->err, "free: %s", xseg_last_error());
            return false;
        }
        o->p[k] = NULL;
    } else if (r < 78) {
        xseg_status st = r == 75 ? xseg_empty_cache(0) : r == 76 ? xseg_trim(0, 0) : xseg_promote(0);
        if (st != XSEG_SUCCESS && st != XSEG_ERROR_OUT_OF_MEMORY) {
            snprintf(o->err, sizeof o->err, "reclaim call %u: %s", r, xseg_last_error());
            return false;
        }
    }
    return true;
}

static _Atomic long oracle_budget;
static CUcontext oracle_ctx;

static void *oracle_main(void *arg)
{
    struct oracle_thread *o = arg;
    if (drv->cuCtxSetCurrent(oracle_ctx) != CUDA_SUCCESS)
        snprintf(o->err, sizeof o->err, "cuCtxSetCurrent failed");
    while (!o->err[0] && oracle_budget-- > 0) {
        o->ops++;
        if (!oracle_step(o))
            break;
    }
    for (unsigned k = 0; k < ORACLE_SLOTS && !o->err[0]; k++)
        if (o->p[k] && xseg_free(o->p[k]) != XSEG_SUCCESS)
            snprintf(o->err, sizeof o->err, "final free: %s", xseg_last_error());
    return NULL;
}

static void test_spill_oracle(void **state)
{
    (void)state;
    setenv("CUDAEMU_TOTAL_MEM", "32M", 1);
    start_emu(SPILL ",idle_release_ms:20,idle_release_thread:True");
    long total = (long)tu_steps(100000, 2000);
    oracle_budget = total;
    tu_assert_cu(drv->cuCtxGetCurrent(&oracle_ctx));
    struct oracle_thread th[ORACLE_THREADS];
    memset(th, 0, sizeof th);
    for (unsigned i = 0; i < ORACLE_THREADS; i++) {
        th[i].id = i + 1;
        th[i].rng = 0x9e3779b97f4a7c15ull * (i + 1);
        for (unsigned s = 0; s < 2; s++)
            tu_assert_cu(drv->cuStreamCreate(&th[i].streams[s], CU_STREAM_NON_BLOCKING));
        assert_int_equal(pthread_create(&th[i].t, NULL, oracle_main, &th[i]), 0);
    }
    long spilled = 0, ooms = 0;
    for (unsigned i = 0; i < ORACLE_THREADS; i++) {
        assert_int_equal(pthread_join(th[i].t, NULL), 0);
        if (th[i].err[0])
            fail_msg("thread %u after %ld operations: %s", th[i].id, th[i].ops, th[i].err);
        spilled += th[i].spilled_seen;
        ooms += th[i].ooms;
    }
    print_message("spill oracle: %ld operations, %ld spills, %ld promotions, %ld looks at spilled blocks, %ld OOMs\n",
                  total, (long)tu_stat("num_spills"), (long)tu_stat("num_promotions"), spilled, ooms);
    assert_true(tu_stat("num_spills") > 0); /* spill was exercised */
    assert_int_equal(xseg_set_config("idle_release_ms:0,idle_release_thread:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    check_no_leaks();
    for (unsigned i = 0; i < ORACLE_THREADS; i++)
        for (unsigned s = 0; s < 2; s++)
            tu_assert_cu(drv->cuStreamDestroy(th[i].streams[s]));
}

/* Device bytes free now (the driver's count). */
static size_t device_free(void)
{
    size_t free_b = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&free_b, &total));
    return free_b;
}

/* Which blocks a spill takes, through declarations, their ends and frees in any order: the
 * declared live ones, largest first, then lowest address, until the need is covered; a block whose
 * declaration ended, or that was freed, never. */
static void test_spill_order(void **state)
{
    (void)state;
    setenv("CUDAEMU_TOTAL_MEM", "64M", 1);
    start_emu(SPILL);
    static const size_t mib[] = {4, 2, 6, 2, 4, 8, 2}; /* whole 2 MiB pages: each moves whole */
    enum { N = sizeof mib / sizeof mib[0] };
    void *p[N], *ballast[64], *c = NULL;
    for (int i = 0; i < N; i++) {
        p[i] = must_malloc(mib[i] * MiB, NULL);
        tu_assert_cu(tu_fill(DPTR(p[i]), mib[i] * MiB, (unsigned char)(10 + i)));
    }
    size_t nb = 0;
    while (nb < 64 && xseg_malloc(&ballast[nb], 2 * MiB, 0, NULL) == XSEG_SUCCESS)
        nb++;
    assert_true(nb > 0 && nb < 64);
    static const int declare[] = {6, 0, 5, 3, 2, 4, 1}; /* not in spill order */
    for (int i = 0; i < N; i++)
        assert_int_equal(xseg_spill_hint(p[declare[i]], XSEG_SPILL_COLD), XSEG_SUCCESS);
    /* The 8 MiB block's declaration ends, the 6 MiB block is freed: both would come first. */
    assert_int_equal(xseg_spill_hint(p[5], XSEG_SPILL_NONE), XSEG_SUCCESS);
    tu_free(p[2]);
    p[2] = NULL;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    /* The room the free gave, filled while the driver has it: a ballast malloc past it would be
     * served by spilling (moving every declared block before the request below). */
    while (nb < 64 && device_free() >= 2 * MiB && xseg_malloc(&ballast[nb], 2 * MiB, 0, NULL) == XSEG_SUCCESS)
        nb++;
    assert_true(device_free() < 2 * MiB);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    /* 12 MiB (the allocation may ask again: a spill gives at least what it was asked, and each
     * takes from the front): what moved is a prefix of the spill order, whole but for its last. */
    assert_int_equal(xseg_malloc(&c, 12 * MiB, 0, NULL), XSEG_SUCCESS);
    static const int order[] = {0, 4, 1, 3, 6}; /* 4 MiB by address, then 2 MiB by address */
    size_t host[N] = {0}, moved = 0;
    bool short_seen = false;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
        int i = order[k];
        (void)location(p[i], &host[i]);
        if (host[i] && short_seen)
            fail_msg("block %d (%zu MiB) moved before a block ahead of it in spill order did whole", i, mib[i]);
        short_seen |= host[i] < mib[i] * MiB;
        moved += host[i];
    }
    assert_true(host[0] == 4 * MiB && host[4] == 4 * MiB && moved >= 12 * MiB);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), (int64_t)moved);
    assert_int_equal(location(p[5], NULL), XSEG_LOCATION_DEVICE); /* its declaration ended */
    check_books(true);
    for (int i = 0; i < N; i++)
        if (p[i] && !tu_check(DPTR(p[i]), mib[i] * MiB, (unsigned char)(10 + i)))
            fail_msg("block %d lost its bytes", i);
    /* The rest goes next: only the last 2 MiB block is left to give. */
    tu_free(c);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* gives c back and promotes all */
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    for (size_t i = 0; i < nb; i++)
        tu_free(ballast[i]);
    for (int i = 0; i < N; i++)
        if (p[i])
            tu_free(p[i]);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

/* A spill looks at no more than 64 declared blocks it must leave (pinned here) before giving up,
 * and says so: with 64 pinned ones first in spill order the block behind them stays; with one
 * fewer it moves. */
static void test_spill_skip_bound(void **state)
{
    (void)state;
    enum { NPIN = 64 };
    setenv("CUDAEMU_TOTAL_MEM", "1750M", 1);
    start_emu(SPILL);
    static const xseg_range_callbacks cb = {NULL, NULL, 0};
    int ctx = 0;
    void *pin[NPIN], *q, *ballast[64], *c = NULL;
    for (int i = 0; i < NPIN; i++)
        pin[i] = must_malloc(26 * MiB, NULL); /* larger than Q: ahead of it in spill order */
    q = must_malloc(24 * MiB, NULL);
    tu_assert_cu(tu_fill(DPTR(q), 24 * MiB, 7));
    size_t nb = 0;
    while (nb < 64 && xseg_malloc(&ballast[nb], 2 * MiB, 0, NULL) == XSEG_SUCCESS)
        nb++;
    for (int i = 0; i < NPIN; i++) {
        assert_int_equal(xseg_register_range(pin[i], 26 * MiB, &cb, &ctx), XSEG_SUCCESS);
        assert_int_equal(xseg_spill_hint(pin[i], XSEG_SPILL_COLD), XSEG_SUCCESS);
    }
    assert_int_equal(xseg_spill_hint(q, XSEG_SPILL_COLD), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, 20 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    if (!strstr(xseg_last_error(), "the 64 blocks declared cold that come first in spill order") ||
        !strstr(xseg_last_error(), "are pinned (registered (xseg_register_range))"))
        fail_msg("the OOM does not say where spill stopped: %s", xseg_last_error());
    assert_int_equal(location(q, NULL), XSEG_LOCATION_DEVICE);
    /* One pinned block less (its declaration ends): Q is the 64th looked at, and moves. */
    assert_int_equal(xseg_spill_hint(pin[0], XSEG_SPILL_NONE), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, 20 * MiB, 0, NULL), XSEG_SUCCESS);
    assert_int_not_equal(location(q, NULL), XSEG_LOCATION_DEVICE);
    assert_true(tu_check(DPTR(q), 24 * MiB, 7));
    check_books(true);
    tu_free(c);
    for (int i = 0; i < NPIN; i++) {
        assert_int_equal(xseg_unregister_range(pin[i], 26 * MiB, &ctx), XSEG_SUCCESS);
        tu_free(pin[i]);
    }
    tu_free(q);
    for (size_t i = 0; i < nb; i++)
        tu_free(ballast[i]);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    check_no_leaks();
}

/* A declared cold block X of @p x_mib MiB and 2 MiB ballast fill the device (or the memory
 * fraction); a request of @p req_mib MiB needs spill. It is served, having moved at most
 * @p most_mib MiB: what the growth maps, not a classic segment's size or a second round. */
static void room_case(size_t x_mib, size_t req_mib, size_t most_mib)
{
    void *x = must_malloc(x_mib * MiB, NULL), *ballast[64], *c = NULL;
    tu_assert_cu(tu_fill(DPTR(x), x_mib * MiB, 5));
    size_t nb = 0;
    while (nb < 64 && xseg_malloc(&ballast[nb], 2 * MiB, 0, NULL) == XSEG_SUCCESS)
        nb++;
    assert_true(nb > 0 && nb < 64);
    assert_int_equal(xseg_spill_hint(x, XSEG_SPILL_COLD), XSEG_SUCCESS);
    xseg_status st = xseg_malloc(&c, req_mib * MiB, 0, NULL);
    size_t host = 0;
    (void)location(x, &host);
    if (st != XSEG_SUCCESS)
        fail_msg("a %zu MiB request failed after spill moved %zu MiB of %zu (device free: %zu MiB): %s", req_mib,
                 host / MiB, x_mib, device_free() / MiB, xseg_last_error());
    if (host > most_mib * MiB)
        fail_msg("a %zu MiB request made spill move %zu MiB (at most %zu needed)", req_mib, host / MiB, most_mib);
    assert_true(host > 0);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), (int64_t)host);
    check_books(true);
    tu_assert_cu(tu_fill(DPTR(c), req_mib * MiB, 6));
    if (!tu_check(DPTR(x), x_mib * MiB, 5) || !tu_check(DPTR(c), req_mib * MiB, 6))
        fail_msg("X or the new block lost its bytes");
    tu_free(c);
    for (size_t i = 0; i < nb; i++)
        tu_free(ballast[i]);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* gives the rest back, then promotes X */
    assert_int_equal(location(x, NULL), XSEG_LOCATION_DEVICE);
    if (!tu_check(DPTR(x), x_mib * MiB, 5))
        fail_msg("X lost its bytes in the promotion");
    tu_free(x);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    check_no_leaks();
}

/* A request that needs spill gets the room spill made: the retry after a spill maps the
 * request's 2 MiB granules as every retry under pressure does, not a whole 20 MiB page that the
 * room spill made cannot hold (a 10 MiB request failed with 14 MiB moved and free); and spill is
 * asked for the request, not a classic segment's 20 MiB (an 8 MiB request moved 12 MiB). On a
 * 64 MiB device. */
static void test_spill_room(void **state)
{
    (void)state;
    setenv("CUDAEMU_TOTAL_MEM", "64M", 1);
    start_emu(SPILL);
    room_case(14, 10, 10);
    room_case(12, 8, 8);
    room_case(14, 12, 12);
    room_case(14, 9, 10); /* whole 2 MiB chunks */
    /* Short of room with every declared page moved: the OOM says so. */
    void *x = must_malloc(6 * MiB, NULL), *ballast[64], *c = NULL;
    tu_assert_cu(tu_fill(DPTR(x), 6 * MiB, 5));
    size_t nb = 0;
    while (nb < 64 && xseg_malloc(&ballast[nb], 2 * MiB, 0, NULL) == XSEG_SUCCESS)
        nb++;
    assert_int_equal(xseg_spill_hint(x, XSEG_SPILL_COLD), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, 10 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    if (!strstr(xseg_last_error(), "every block declared cold is on host memory already"))
        fail_msg("the OOM does not say that everything declared has moved: %s", xseg_last_error());
    assert_int_equal(location(x, NULL), XSEG_LOCATION_HOST);
    assert_true(tu_check(DPTR(x), 6 * MiB, 5));
    for (size_t i = 0; i < nb; i++)
        tu_free(ballast[i]);
    tu_free(x);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

/* The same under a memory fraction (64 MiB of a 256 MiB device): the limit, not the driver,
 * refuses the page. */
static void test_spill_room_fraction(void **state)
{
    (void)state;
    setenv("CUDAEMU_TOTAL_MEM", "256M", 1);
    start_emu(SPILL);
    assert_int_equal(xseg_set_memory_fraction(0.25, 0), XSEG_SUCCESS);
    room_case(14, 10, 10);
    room_case(12, 8, 8);
    room_case(14, 12, 12);
}

/* PyTorch's path (expandable_segments_recycle:False): growth maps whole 20 MiB pages, so spill
 * is asked for the page in one round, not the request twice (a 12 MiB request moved 24 MiB). */
static void test_spill_room_pages(void **state)
{
    (void)state;
    setenv("CUDAEMU_TOTAL_MEM", "64M", 1);
    start_emu(SPILL ",expandable_segments_recycle:False,expandable_chunk_mb:2");
    room_case(24, 12, 20);
    room_case(24, 10, 20);
}

/* ---- a capture on another thread (issue 75, item 2) --------------------------------------- */

/* Thread T captures on a stream of its own and allocates nothing through xseg, while the main
 * thread makes the call under test; T's graph must be made (cuStreamEndCapture CUDA_SUCCESS). */
struct capthread {
    CUstreamCaptureMode mode;
    atomic_int phase; /* 1: T captures; 2: the main thread is done */
    CUresult begin, end;
    pthread_t t;
};

static void *cap_main(void *arg)
{
    struct capthread *c = arg;
    CUstream s = NULL;
    c->begin = drv->cuCtxSetCurrent(tu_ctx());
    if (c->begin == CUDA_SUCCESS)
        c->begin = drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (c->begin == CUDA_SUCCESS)
        c->begin = drv->cuStreamBeginCapture(s, c->mode);
    if (c->begin == CUDA_SUCCESS)
        (void)tu_stream_work(s); /* one captured node */
    atomic_store(&c->phase, 1);
    while (atomic_load(&c->phase) != 2)
        nap_ms(1);
    if (c->begin == CUDA_SUCCESS) {
        CUgraph g = NULL;
        c->end = drv->cuStreamEndCapture(s, &g);
        if (g)
            drv->cuGraphDestroy(g);
    }
    if (s)
        drv->cuStreamDestroy(s);
    return NULL;
}

static void cap_start(struct capthread *c, CUstreamCaptureMode mode)
{
    *c = (struct capthread){.mode = mode};
    atomic_init(&c->phase, 0);
    assert_int_equal(pthread_create(&c->t, NULL, cap_main, c), 0);
    while (atomic_load(&c->phase) != 1)
        nap_ms(1);
    tu_assert_cu(c->begin);
}

/* T's capture ends with its graph. */
static void cap_finish(struct capthread *c)
{
    atomic_store(&c->phase, 2);
    assert_int_equal(pthread_join(c->t, NULL), 0);
    if (c->end != CUDA_SUCCESS)
        fail_msg("T's cuStreamEndCapture: %s (its capture was invalidated)", drv_error_name(c->end));
}

/* The request only a spill serves, during T's capture (GLOBAL, then RELAXED): served (the
 * declaration's events are waited for, never the context), and T's capture unbroken. */
static void spill_during_capture(CUstreamCaptureMode mode)
{
    start_emu(SPILL);
    void *a, *b, *c = NULL;
    scenario(&a, &b);
    struct capthread t;
    cap_start(&t, mode);
    xseg_status st = xseg_malloc(&c, C_SIZE, 0, NULL);
    cap_finish(&t);
    if (st != XSEG_SUCCESS)
        fail_msg("the spill during T's capture: %s", xseg_last_error());
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    check_books(true);
    check_data(a, b);
    if (c)
        tu_free(c);
    finish(a, b);
}
static void test_spill_capture_other_global(void **state) { (void)state; spill_during_capture(CU_STREAM_CAPTURE_MODE_GLOBAL); }
static void test_spill_capture_other_relaxed(void **state) { (void)state; spill_during_capture(CU_STREAM_CAPTURE_MODE_RELAXED); }

/* xseg_promote (@p how 0) or empty_cache with spilled pages (1) during T's GLOBAL capture. */
static void promote_during_capture(int how)
{
    void *a, *b, *c = spilled_scenario(&a, &b);
    tu_free(c);
    struct capthread t;
    cap_start(&t, CU_STREAM_CAPTURE_MODE_GLOBAL);
    xseg_status st = how == 0 ? xseg_promote(0) : xseg_empty_cache(0);
    cap_finish(&t);
    if (st != XSEG_SUCCESS)
        fail_msg("%s during T's capture: %s", how == 0 ? "xseg_promote" : "xseg_empty_cache", xseg_last_error());
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0); /* A came back */
    check_books(true);
    check_data(a, b);
    finish(a, b);
}
static void test_spill_capture_other_promote(void **state) { (void)state; promote_during_capture(0); }
static void test_spill_capture_other_empty_cache(void **state) { (void)state; promote_during_capture(1); }

static const struct tu_named_test all_tests[] = {
    TU_NAMED(test_spill_serves),
    TU_NAMED(test_spill_off),
    TU_NAMED(test_spill_stream_writing),
    TU_NAMED(test_spill_graph_replay),
    TU_NAMED(test_spill_free_drops),
    TU_NAMED(test_spill_sleep_ipc),
    TU_NAMED(test_spill_trim_idle),
    TU_NAMED(test_spill_capture_free),
    TU_NAMED(test_spill_capture_growth),
    TU_NAMED(test_spill_registered),
    TU_NAMED(test_spill_faults),
    TU_NAMED(test_spill_promote_faults),
    TU_NAMED(test_spill_location),
    TU_NAMED(test_spill_location_host),
    TU_NAMED(test_spill_location_numa),
    TU_NAMED(test_spill_location_none),
    TU_NAMED(test_spill_parked_promotion),
    TU_NAMED(test_spill_freed_export),
    TU_NAMED(test_spill_destroyed_stream),
    TU_NAMED(test_spill_oracle),
    TU_NAMED(test_spill_order),
    TU_NAMED(test_spill_skip_bound),
    TU_NAMED(test_spill_room),
    TU_NAMED(test_spill_room_fraction),
    TU_NAMED(test_spill_room_pages),
    TU_NAMED(test_spill_capture_other_global),
    TU_NAMED(test_spill_capture_other_relaxed),
    TU_NAMED(test_spill_capture_other_promote),
    TU_NAMED(test_spill_capture_other_empty_cache),
};

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "50M", 0);
    return tu_run_named("spill", all_tests, sizeof all_tests / sizeof all_tests[0], argc, argv);
}
