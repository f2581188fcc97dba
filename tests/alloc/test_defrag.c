/*
 * expandable_segments_defrag: the OOM path re-backs partly used pages with granule chunks and
 * gives their free granules back, so an allocation the free memory inside live pages can hold
 * succeeds instead of failing. Through the public API on a small emulated device: live pointers
 * and bytes survive, statistics match a snapshot and the driver's mappings, and every driver
 * failure during the re-backing (one injected fault at each call the path makes) leaves the live
 * data intact, the allocator consistent and usable, and nothing with the driver at the end.
 *
 * The scenario: ten 10 MiB blocks fill five 20 MiB pages; every second one is freed, so each page
 * is half used and 50 MiB of free memory sits in 10 MiB gaps. The device has 110 MiB: a 40 MiB
 * request (two new pages) cannot be mapped, and no page is wholly free to give back. The "full"
 * tests run on 100 MiB: no room at all beside the pages, so the first page is re-backed through
 * host memory (seg_refine's host staging), the others on the device.
 * argv[1] names one test (one process each); without it every test runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/alloc/fixture.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#define NBLK 10
#define BLK (10 * MiB)
#define WANT (40 * MiB)
/* One chunk a page, the layout defrag re-backs: on this small device the default maps 2 MiB
 * chunks (core/policy/expandable.c device_chunk), whose free ones go back without a copy. */
#define PAGES "expandable_segments:True,expandable_chunk_mb:20"

/* Stats that a snapshot determines must match it (as tests/alloc/test_faults.c), and with
 * @p driver the driver's mappings too (not while an earlier failure's leftover, e.g. a scratch
 * range whose unmap failed, waits for the next reclaim). */
static void check_books(bool driver)
{
    xseg_snapshot *s = NULL;
    assert_int_equal(xseg_take_snapshot(0, &s), XSEG_SUCCESS);
    int64_t reserved = 0, allocated = 0, nalloc = 0;
    for (size_t i = 0; i < s->nsegments; i++) {
        const xseg_segment_info *g = &s->segments[i];
        reserved += (int64_t)g->total_size;
        uint64_t at = g->address;
        for (size_t j = 0; j < g->nblocks; j++) {
            const xseg_block_info *b = &g->blocks[j];
            assert_int_equal(b->address, at);
            at += b->size;
            if (b->state == XSEG_BLOCK_ACTIVE_ALLOCATED) {
                allocated += (int64_t)b->size;
                nalloc++;
            }
        }
    }
    xseg_snapshot_free(s);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), allocated);
    assert_int_equal(tu_stat("allocation.all.current"), nalloc);
    struct cudaemu_live live;
    if (driver && tu_live(&live) && (int64_t)live.mapped_bytes != reserved)
        fail_msg("reserved_bytes %lld, but the driver maps %zu bytes", (long long)reserved, live.mapped_bytes);
}



/* Five half-used pages: live[j] is the first half of page j, filled with tag 100 + j. Each block
 * asks for a different byte count (all round to BLK), so that none of a sweep's later runs looks
 * long-lived to the lifetime predictor (core/device/placement.h: same-size twins still live after a run
 * of frees), which would place it at the top of the free range. */
static void fragment(void *live[NBLK / 2])
{
    void *p[NBLK];
    for (int i = 0; i < NBLK; i++) {
        p[i] = tu_malloc(BLK - (size_t)i, NULL);
        assert_ptr_equal(p[i], (char *)p[0] + (size_t)i * BLK);
    }
    for (int i = 0; i < NBLK; i++) {
        if (i % 2) {
            tu_free(p[i]);
        } else {
            live[i / 2] = p[i];
            tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p[i], BLK, 100 + (uint32_t)i / 2));
        }
    }
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(NBLK * BLK));
}

static void check_live(void *live[NBLK / 2])
{
    for (int j = 0; j < NBLK / 2; j++)
        if (!tu_check((CUdeviceptr)(uintptr_t)live[j], BLK, 100 + (uint32_t)j))
            fail_msg("live block %d at %p lost its bytes", j, live[j]);
}

static void teardown(void *live[NBLK / 2])
{
    for (int j = 0; j < NBLK / 2; j++)
        tu_free(live[j]);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* The default: the free halves go back, the request is served, nothing live moves. */
static void serves(void)
{
    start_emu(PAGES ",expandable_segments_defrag:True");
    void *live[NBLK / 2], *q = NULL;
    fragment(live);
    int64_t ooms = tu_stat("num_ooms"), frees = tu_stat("num_device_free");
    assert_int_equal(xseg_malloc(&q, WANT, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(tu_stat("num_ooms"), ooms);
    /* Four pages gave their free halves back (one handle each went, five granule chunks came). */
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(NBLK * BLK - 4 * BLK + WANT));
    assert_true(tu_stat("num_device_free") >= frees + 4);
    check_books(true);
    check_live(live);
    /* Everything stays writable: the new block and the re-backed live blocks. */
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)q, WANT, 7));
    for (int j = 0; j < NBLK / 2; j++)
        tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)live[j], BLK, 200 + (uint32_t)j));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)q, WANT, 7));
    for (int j = 0; j < NBLK / 2; j++)
        assert_true(tu_check((CUdeviceptr)(uintptr_t)live[j], BLK, 200 + (uint32_t)j));
    tu_free(q);
    /* The gaps are holes now: a 10 MiB request refills one without a new page. */
    void *r = NULL;
    assert_int_equal(xseg_malloc(&r, BLK, 0, NULL), XSEG_SUCCESS);
    check_books(true);
    tu_free(r);
    teardown(live);
}

static void test_defrag_serves(void **state)
{
    (void)state;
    serves();
}

/* No room beside the pages: the first is staged through the host. */
static void test_defrag_full_serves(void **state)
{
    (void)state;
    tu_counts_reset();
    serves();
    assert_true(tu_call_count("cuMemcpyDtoH") >= 1);
}

/* PyTorch's behaviour: the same request runs out of memory, and no live byte is copied or
 * remapped. @p config is the default with page chunks (the step is off unless asked for, since it
 * copies live bytes another thread may be writing) or the key set to False. */
static void defrag_off(const char *config)
{
    start_emu(config);
    void *live[NBLK / 2], *q = NULL;
    fragment(live);
    tu_counts_reset();
    assert_int_equal(xseg_malloc(&q, WANT, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_int_equal(tu_call_count("cuMemcpyDtoDAsync"), 0);
    assert_int_equal(tu_call_count("cuMemcpyDtoH"), 0);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(NBLK * BLK));
    check_books(true);
    check_live(live);
    teardown(live);
}

static void test_defrag_off(void **state)
{
    (void)state;
    defrag_off(PAGES ",expandable_segments_defrag:False");
}

static void test_defrag_off_by_default(void **state)
{
    (void)state;
    defrag_off("expandable_chunk_mb:20");
    char buf[1024];
    size_t n = 0;
    assert_int_equal(xseg_get_config(buf, sizeof buf, &n), XSEG_SUCCESS);
    assert_non_null(strstr(buf, "expandable_segments_defrag:False"));
}

/* With room to spare nothing is re-backed and no copy is made. */
static void test_defrag_idle_with_room(void **state)
{
    (void)state;
    start_emu(PAGES ",expandable_segments_defrag:True");
    void *live[NBLK / 2], *q = NULL;
    fragment(live);
    tu_counts_reset();
    assert_int_equal(xseg_malloc(&q, 5 * MiB, 0, NULL), XSEG_SUCCESS); /* fits a gap */
    assert_int_equal(tu_call_count("cuMemcpyDtoDAsync"), 0);
    assert_int_equal(tu_call_count("cuMemCreate"), 0);
    tu_free(q);
    teardown(live);
}

/* One injected failure at every call the re-backing makes (and the retry after it): the live
 * bytes survive, the books match the driver, and everything goes back at the end. */
static void faults_sweep(void)
{
    start_emu(PAGES ",expandable_segments_defrag:True");
    static const struct {
        const char *entry;
        CUresult res;
    } faults[] = {
        {"cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY}, {"cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY},
        {"cuMemMap", CUDA_ERROR_UNKNOWN},                  {"cuMemSetAccess", CUDA_ERROR_UNKNOWN},
        {"cuCtxSynchronize", CUDA_ERROR_UNKNOWN},          {"cuMemcpyDtoDAsync", CUDA_ERROR_UNKNOWN},
        {"cuMemUnmap", CUDA_ERROR_UNKNOWN},                {"cuMemRelease", CUDA_ERROR_UNKNOWN},
        {"cuMemAddressFree", CUDA_ERROR_UNKNOWN},          {"cuMemcpyDtoH", CUDA_ERROR_UNKNOWN},
        {"cuMemcpyHtoD", CUDA_ERROR_UNKNOWN},
    };
    size_t nf = sizeof faults / sizeof faults[0];
    /* The calls of a fault-free run bound each sweep. */
    unsigned long calls[sizeof faults / sizeof faults[0]];
    {
        void *live[NBLK / 2], *q = NULL;
        fragment(live);
        tu_counts_reset();
        assert_int_equal(xseg_malloc(&q, WANT, 0, NULL), XSEG_SUCCESS);
        for (size_t f = 0; f < nf; f++)
            calls[f] = tu_call_count(faults[f].entry);
        assert_true(calls[5] >= 1); /* a copy on the device ran */
        tu_free(q);
        teardown(live);
    }
    size_t served = 0, refused = 0;
    /* Each run re-backs pages for real (183 runs in defrag_faults): under TSan (XSEG_TEST_SCALE
     * 0.1) every third call of each entry, the rest of the time every call. */
    unsigned long step = tu_scale() < 0.25 ? 3 : 1;
    for (size_t f = 0; f < nf; f++) {
        for (unsigned long nth = 1; nth <= calls[f]; nth += step) {
            void *live[NBLK / 2], *q = NULL;
            /* The last run's refused growth left the device mapping fine chunks (for its life,
             * issue 33), which leave no page to re-back: a new memory fraction ends that. */
            assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
            fragment(live);
            tu_counts_reset();
            unsigned long fired = tu_fail_fired();
            assert_true(tu_fail(faults[f].entry, nth, faults[f].res));
            xseg_status st = xseg_malloc(&q, WANT, 0, NULL);
            tu_fail_clear();
            /* The run went the fault-free run's way up to the fault: the fault struck. */
            tu_assert_fired(fired, "%s #%lu (%lu calls): the malloc took another path than the fault-free run",
                            faults[f].entry, nth, tu_call_count(faults[f].entry));
            if (getenv("DEFRAG_VERBOSE"))
                print_message("%s #%lu: %d %s\n", faults[f].entry, nth, (int)st, st ? xseg_last_error() : "");
            if (st != XSEG_SUCCESS && st != XSEG_ERROR_OUT_OF_MEMORY && st != XSEG_ERROR_DRIVER)
                fail_msg("%s #%lu: xseg_malloc returned %d: %s", faults[f].entry, nth, (int)st, xseg_last_error());
            check_live(live);
            check_books(false);
            /* A reclaim retries the leftovers: then the driver maps exactly what is reserved. */
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            check_books(true);
            check_live(live);
            if (st == XSEG_SUCCESS) {
                served++;
                tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)q, WANT, 9));
                assert_true(tu_check((CUdeviceptr)(uintptr_t)q, WANT, 9));
                tu_free(q);
            } else {
                refused++;
            }
            /* Still usable: the allocator serves the request now (the fault is gone). */
            assert_int_equal(xseg_malloc(&q, WANT, 0, NULL), XSEG_SUCCESS);
            check_live(live);
            tu_free(q);
            check_books(true);
            teardown(live);
        }
    }
    print_message("defrag faults: %zu served despite the fault, %zu refused\n", served, refused);
}

static void test_defrag_faults(void **state)
{
    (void)state;
    faults_sweep();
}

static void test_defrag_full_faults(void **state)
{
    (void)state;
    faults_sweep();
}

static const struct tu_named_test all_tests[] = {
    TU_NAMED(test_defrag_serves),
    TU_NAMED(test_defrag_off),
    TU_NAMED(test_defrag_off_by_default),
    TU_NAMED(test_defrag_idle_with_room),
    TU_NAMED(test_defrag_faults),
    TU_NAMED(test_defrag_full_serves),
    TU_NAMED(test_defrag_full_faults),
};

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", argc > 1 && strstr(argv[1], "_full_") ? "100M" : "110M", 0);
    return tu_run_named("defrag", all_tests, sizeof all_tests / sizeof all_tests[0], argc, argv);
}
