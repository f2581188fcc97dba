/*
 * debug_stale_access's canary gives its pages back (issue 50: "their handles back to the
 * cache"). Through the public API in expandable segments of 2 MiB chunks: a quarantined block's
 * whole chunks are given back at its free (reserved bytes and, on cudaemu, the device's memory in
 * use drop by them; the segment observer hears them unmapped) and one canary page is mapped over
 * them; a stale write there is still found; leaving, the block returns over an unmapped range
 * that maps nothing back, and the next malloc of its size maps fresh pages there, with books
 * that match a snapshot and the driver. A block spilled to host memory (spill_to_host) before the
 * mode was switched on gives its host chunks back the same way.
 *
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

#define G (2 * MiB)

static size_t nreports, first_offset;
static void stale_observer(const xseg_stale_report *r, void *user)
{
    (void)user;
    nreports++;
    first_offset = r->first_offset;
}

static int64_t unmapped_heard;
static void segment_observer(const xseg_segment_event *e, void *user)
{
    (void)user;
    if (e->kind == XSEG_SEGMENT_UNMAP)
        unmapped_heard += (int64_t)e->size;
}

/* Device memory the driver holds for device 0 (cudaemu; -1 on a GPU). */
static int64_t used_bytes(void)
{
    struct cudaemu_live l;
    return tu_live(&l) ? (int64_t)l.used_bytes[0] : -1;
}

/* Reserved bytes are what the driver maps (nothing quarantined: no canary mapped). */
static void check_books_match_driver(void)
{
    struct cudaemu_live l;
    if (tu_live(&l) && (int64_t)l.mapped_bytes != tu_stat("reserved_bytes.all.current"))
        fail_msg("reserved_bytes %lld, but the driver maps %zu bytes",
                 (long long)tu_stat("reserved_bytes.all.current"), l.mapped_bytes);
}

static void start_stale(const char *config)
{
    start(config);
    assert_int_equal(xseg_attach_stale_observer(stale_observer, NULL), XSEG_SUCCESS);
    nreports = 0;
}

/* The free gives the block's whole chunks back; its range is unmapped when it leaves and mapped
 * anew by the next malloc there. */
static void test_handles_back(void **state)
{
    (void)state;
    /* 128 MiB: a (24 MiB) within a quarter of the bound, so the growth for `other` below does not
     * empty the quarantine first (quarantine.c quar_before_growth). */
    start_stale("expandable_segments:True,expandable_chunk_mb:2,debug_stale_access:True,debug_quarantine_mb:128");
    const size_t n = 24 * MiB;
    void *live = must_malloc(1 * MiB, NULL), *a = must_malloc(n, NULL);
    tu_assert_cu(tu_fill(DPTR(live), 1 * MiB, 77));
    tu_assert_cu(tu_fill(DPTR(a), n, 1));
    int64_t reserved0 = tu_stat("reserved_bytes.all.current"), used0 = used_bytes();
    int64_t frees0 = tu_stat("num_device_free");
    unmapped_heard = 0;
    assert_int_equal(xseg_attach_segment_observer(segment_observer, NULL), XSEG_SUCCESS);

    /* The free: the whole chunks inside a go back (all but at most a partial granule at each
     * end), heard unmapped; the driver keeps one canary granule for them. */
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    int64_t back = reserved0 - tu_stat("reserved_bytes.all.current");
    assert_true(back >= (int64_t)(n - 2 * G) && back % (int64_t)G == 0);
    assert_int_equal(unmapped_heard, back);
    assert_true(tu_stat("num_device_free") - frees0 >= back / (int64_t)G); /* one per 2 MiB chunk */
    if (used0 >= 0)
        assert_int_equal(used0 - used_bytes(), back - (int64_t)G);
    void *other = must_malloc(n, NULL); /* quarantined: not handed out again */
    assert_ptr_not_equal(other, a);
    xseg_free(other);

    /* A stale write into the canary is still found (within a granule of its offset), once the
     * fills waiting for their batch (debug_stale_fill_batch) went out. */
    /* Before its batch's fill, the canary already reads as the pattern: new memory holds any bytes
     * (cudaemu's CUDAEMU_FRESH pattern here), a dead block's among them on a GPU. */
    unsigned char seen[4096];
    tu_assert_cu(drv->cuMemcpyDtoH(seen, DPTR(a) + 10 * MiB, sizeof seen));
    for (size_t i = 0; i < sizeof seen; i++)
        assert_int_equal(seen[i], 0xFF);
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS);
    tu_assert_cu(drv->cuMemsetD8Async(DPTR(a) + 10 * MiB + 3, 0x3c, 1, NULL));
    tu_assert_cu(drv->cuStreamSynchronize(NULL));
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(first_offset % G, (10 * MiB + 3) % G);

    /* Leaving (drained with the mode off): the canary goes and nothing is mapped back. */
    assert_int_equal(xseg_set_config("debug_stale_access:False"), XSEG_SUCCESS);
    int64_t reserved1 = tu_stat("reserved_bytes.all.current"), allocs1 = tu_stat("num_device_alloc");
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved1);
    assert_int_equal(tu_stat("num_device_alloc"), allocs1);
    check_consistent(); /* the range is an unmapped hole, as after empty_cache */
    check_books_match_driver();

    /* The next malloc of that size takes the hole back, on fresh pages (whole pages of the hole,
     * as any growth maps). */
    void *b = must_malloc(n, NULL);
    assert_ptr_equal(b, a);
    assert_true(tu_stat("num_device_alloc") - allocs1 >= back / (int64_t)G);
    assert_true(tu_stat("reserved_bytes.all.current") - reserved1 >= back);
    tu_assert_cu(tu_fill(DPTR(b), n, 5));
    assert_true(tu_check(DPTR(b), n, 5)); /* distinct pages: no granule shares the canary any more */
    assert_true(tu_check(DPTR(live), 1 * MiB, 77));
    check_consistent();
    check_books_match_driver();
    assert_int_equal(xseg_detach_segment_observer(segment_observer, NULL), XSEG_SUCCESS);
    xseg_free(b);
    xseg_free(live);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(nreports, 1);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    check_no_leaks();
}

/* Blocks leaving over unmapped ranges next to each other and to free pages merge into one
 * hole; a larger malloc spans them; empty_cache gives the rest back. */
static void test_leave_merges(void **state)
{
    (void)state;
    start_stale("expandable_segments:True,expandable_chunk_mb:2,debug_stale_access:True,debug_quarantine_mb:64");
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = must_malloc(6 * MiB, NULL);
    int64_t reserved0 = tu_stat("reserved_bytes.all.current");
    for (int i = 0; i < 4; i++)
        assert_int_equal(xseg_free(p[i]), XSEG_SUCCESS);
    assert_true(tu_stat("reserved_bytes.all.current") < reserved0);
    size_t found = 9;
    assert_int_equal(xseg_set_config("debug_stale_access:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 0);
    check_consistent();
    void *big = must_malloc(24 * MiB, NULL);
    assert_ptr_equal(big, p[0]); /* the oldest hole, merged with its neighbours */
    tu_assert_cu(tu_fill(DPTR(big), 24 * MiB, 9));
    assert_true(tu_check(DPTR(big), 24 * MiB, 9));
    check_consistent();
    check_books_match_driver();
    xseg_free(big);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(nreports, 0);
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    check_no_leaks();
}

/* A block spilled to host memory before the mode was switched on: its free gives its host chunks
 * back with the canary swap (spilled bytes drop to 0 at once, no free byte stays on host), a
 * stale write is found, and it leaves cleanly. */
static void test_spilled_then_stale(void **state)
{
    (void)state;
    start_stale("expandable_segments:True,spill_to_host:True");
    tu_require_emulator_or_skip(); /* the small device (CUDAEMU_TOTAL_MEM) and host VMM are the emulator's */
    size_t total = 0;
    tu_assert_cu(drv->cuDeviceTotalMem(&total, 0));
    if (total > 64 * MiB) {
        print_message("skipped: needs a 50 MiB device (run alone: test_stale_canary spilled_then_stale)\n");
        skip();
    }
    void *a = must_malloc(24 * MiB, NULL), *b = must_malloc(16 * MiB, NULL), *c = NULL;
    tu_assert_cu(tu_fill(DPTR(a), 24 * MiB, 1));
    tu_assert_cu(tu_fill(DPTR(b), 16 * MiB, 2));
    assert_int_equal(xseg_spill_hint(a, XSEG_SPILL_COLD), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&c, 20 * MiB, 0, NULL), XSEG_SUCCESS); /* spills a */
    assert_true(tu_stat("spilled_bytes.all.current") > 0);
    assert_int_equal(xseg_set_config("debug_stale_access:True"), XSEG_SUCCESS);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(tu_stat("spilled_bytes.all.current"), 0);
    void *p = NULL;
    int loc = -1;
    assert_int_equal(xseg_block_location(b, &loc, NULL, NULL), XSEG_SUCCESS);
    assert_int_equal(loc, XSEG_LOCATION_DEVICE);
    assert_int_equal(xseg_stale_flush(0), XSEG_SUCCESS); /* the batch's fills out before the stale write */
    tu_assert_cu(drv->cuMemsetD8Async(DPTR(a) + 8 * MiB, 0x11, 4096, NULL));
    tu_assert_cu(drv->cuStreamSynchronize(NULL));
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(xseg_set_config("debug_stale_access:False"), XSEG_SUCCESS);
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    check_consistent();
    p = must_malloc(12 * MiB, NULL); /* device memory where a's host chunks were */
    assert_int_equal(xseg_block_location(p, &loc, NULL, NULL), XSEG_SUCCESS);
    assert_int_equal(loc, XSEG_LOCATION_DEVICE);
    tu_assert_cu(tu_fill(DPTR(p), 12 * MiB, 6));
    assert_true(tu_check(DPTR(p), 12 * MiB, 6));
    assert_true(tu_check(DPTR(b), 16 * MiB, 2));
    check_consistent();
    xseg_free(p);
    xseg_free(c);
    xseg_free(b);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_books_match_driver();
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    check_no_leaks();
}

static const struct {
    const char *name;
    struct CMUnitTest test;
} all_tests[] = {
    {"handles_back", cmocka_unit_test(test_handles_back)},
    {"leave_merges", cmocka_unit_test(test_leave_merges)},
    {"spilled_then_stale", cmocka_unit_test(test_spilled_then_stale)},
};

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "spilled_then_stale") == 0)
        setenv("CUDAEMU_TOTAL_MEM", "50M", 0); /* c out of memory beside a and b */
    size_t n = sizeof all_tests / sizeof all_tests[0];
    struct CMUnitTest run[sizeof all_tests / sizeof all_tests[0]];
    size_t nrun = 0;
    for (size_t i = 0; i < n; i++)
        if (argc < 2 || strcmp(argv[1], all_tests[i].name) == 0)
            run[nrun++] = all_tests[i].test;
    if (nrun == 0) {
        fprintf(stderr, "test_stale_canary: no test named %s\n", argv[1]);
        return 2;
    }
    return _cmocka_run_group_tests("stale_canary", run, nrun, NULL, NULL);
}
