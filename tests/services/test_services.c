/*
 * Long-running services (issue 14) through the public API: xseg_trim, release_threshold_mb.
 * One process per test (meson passes the test name): each starts from an empty allocator.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)

static int64_t cached(void)
{
    return tu_stat("reserved_bytes.all.current") - tu_stat("allocated_bytes.all.current");
}

/* Is [addr, addr + size) inside a mapped range the snapshot shows? */
static bool snap_mapped(uintptr_t addr, size_t size)
{
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    bool in = false;
    for (size_t i = 0; i < snap->nsegments && !in; i++) {
        const xseg_segment_info *s = &snap->segments[i];
        in = addr >= s->address && addr + size <= s->address + s->total_size;
    }
    xseg_snapshot_free(snap);
    return in;
}

/* Every byte of cache that can go goes; live data survives; the address space stays. */
static void test_trim_expandable(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True,expandable_segments_recycle:False");
    /* One segment (320 MiB of VA): A 60 | L1 20 | B 200 | L2 20, pages of 20 MiB. */
    void *a = tu_malloc(60 * MiB, NULL), *l1 = tu_malloc(20 * MiB, NULL);
    void *b = tu_malloc(200 * MiB, NULL), *l2 = tu_malloc(20 * MiB, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)l1, 20 * MiB, 1));
    tu_assert_cu(tu_fill((CUdeviceptr)l2, 20 * MiB, 2));
    tu_free(a);
    tu_free(b);
    assert_int_equal(cached(), 260 * MiB);

    /* Largest run first: 40 MiB comes out of B (its highest pages), A stays mapped. */
    int64_t frees = tu_stat("num_device_free");
    assert_int_equal(xseg_trim(0, 220 * MiB), XSEG_SUCCESS);
    assert_int_equal(cached(), 220 * MiB);
    assert_int_equal(tu_stat("num_device_free"), frees + 2);
    assert_true(snap_mapped((uintptr_t)a, 60 * MiB));
    assert_true(snap_mapped((uintptr_t)b, 160 * MiB));
    assert_false(snap_mapped((uintptr_t)b + 160 * MiB, 20 * MiB));

    /* A keep that is not a page multiple: at most keep bytes remain, within one page of it. */
    assert_int_equal(xseg_trim(0, 150 * MiB), XSEG_SUCCESS);
    assert_true(cached() <= (int64_t)(150 * MiB) && cached() > (int64_t)(130 * MiB));
    /* Keeping more than is cached changes nothing. */
    int64_t before = cached();
    assert_int_equal(xseg_trim(0, 1000 * MiB), XSEG_SUCCESS);
    assert_int_equal(cached(), before);

    /* Everything: reserved is exactly the live pages, the data is intact, the freed range can be
     * mapped again at the same addresses. */
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(cached(), 0);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 40 * MiB);
    assert_true(tu_check((CUdeviceptr)l1, 20 * MiB, 1));
    assert_true(tu_check((CUdeviceptr)l2, 20 * MiB, 2));
    void *b2 = tu_malloc(200 * MiB, NULL);
    assert_ptr_equal(b2, b);
    tu_assert_cu(tu_fill((CUdeviceptr)b2, 200 * MiB, 3));
    assert_true(tu_check((CUdeviceptr)b2, 200 * MiB, 3));
    tu_free(b2);
    tu_free(l1);
    tu_free(l2);
    assert_int_equal(xseg_trim(-1, 0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
}

/* Classic segments go whole, largest first; split ones stay. */
static void test_trim_classic(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    void *a = tu_malloc(30 * MiB, NULL), *b = tu_malloc(50 * MiB, NULL);
    void *s1 = tu_malloc(4 * MiB, NULL), *s2 = tu_malloc(4 * MiB, NULL); /* one 20 MiB segment */
    tu_free(a);
    tu_free(b);
    tu_free(s1);
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    assert_int_equal(reserved, 100 * MiB);
    /* 96 MiB cached: keeping 50 needs 46, which b alone gives (largest first); a stays. */
    assert_int_equal(xseg_trim(0, 50 * MiB), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 50 * MiB);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    /* The split 20 MiB segment holds s2: its free 16 MiB cannot go. */
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 20 * MiB);
    tu_free(s2);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
}

static void test_trim_errors(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(NULL);
    int n = 0;
    assert_int_equal(xseg_device_count(&n), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(n, 0), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(xseg_trim(-2, 0), XSEG_ERROR_INVALID_DEVICE);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS); /* nothing cached: nothing to do */

    /* While a pool records (a capture is taken to be underway) nothing is released. */
    void *a = tu_malloc(100 * MiB, NULL);
    tu_free(a);
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(cached(), 100 * MiB);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
    assert_int_equal(cached(), 0);
}

/* Every driver call a trim makes fails once, in turn: the error comes back, the bookkeeping
 * matches the driver (reserved = what cudaemu has mapped), live data survives, and a retry gives
 * everything back. */
static void test_trim_faults(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments_recycle:False");
    tu_require_emulator_or_skip();
    const char *entries[] = {"cuMemUnmap", "cuMemRelease", "cuStreamSynchronize", "cuMemAddressFree"};
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        for (unsigned long nth = 1; nth <= 3; nth++) {
            void *a = tu_malloc(100 * MiB, NULL), *live = tu_malloc(20 * MiB, NULL);
            void *c = tu_malloc(60 * MiB, NULL);
            tu_assert_cu(tu_fill((CUdeviceptr)live, 20 * MiB, 7));
            tu_free(a);
            tu_free(c);
            assert_true(tu_fail(entries[e], nth, CUDA_ERROR_UNKNOWN));
            xseg_status st = xseg_trim(0, 0);
            tu_fail_clear();
            assert_true(st == XSEG_SUCCESS || st == XSEG_ERROR_DRIVER);
            struct cudaemu_live lv;
            assert_true(tu_live(&lv));
            assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)lv.mapped_bytes);
            assert_true(tu_check((CUdeviceptr)live, 20 * MiB, 7));
            assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS);
            assert_int_equal(tu_stat("reserved_bytes.all.current"), 20 * MiB);
            tu_free(live);
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            assert_true(tu_live(&lv));
            assert_int_equal(lv.mapped_bytes, 0);
        }
    }
}

/* release_threshold_mb: a cache miss that went to the driver anyway trims the cache down to the
 * threshold, but only runs of streams whose work is known complete, and never waits. */
static void test_threshold_miss(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments_recycle:False,release_threshold_mb:40");
    tu_require_emulator_or_skip();
    CUstream s1, s2;
    tu_assert_cu(drv->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUevent ev;
    tu_assert_cu(drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

    /* s1 still has work queued (held) when its 200 MiB block is freed. */
    void *x = tu_malloc(200 * MiB, s1);
    assert_true(tu_stream_hold(s1));
    tu_assert_cu(drv->cuEventRecord(ev, s1));
    tu_free(x);
    tu_counts_reset();
    void *y = tu_malloc(100 * MiB, s2); /* a miss: new pages on s2 */
    assert_int_equal(tu_call_count("cuStreamSynchronize") + tu_call_count("cuCtxSynchronize") +
                         tu_call_count("cuEventSynchronize"), 0);
    assert_int_equal(cached(), 200 * MiB); /* s1 busy: nothing given back */

    /* s1 drains; the next miss gives back all but 40 MiB of x's run, still without waiting. */
    assert_true(tu_stream_release(s1));
    void *z = tu_malloc(100 * MiB, s2);
    assert_int_equal(tu_call_count("cuStreamSynchronize") + tu_call_count("cuCtxSynchronize") +
                         tu_call_count("cuEventSynchronize"), 0);
    assert_true(cached() <= (int64_t)(40 * MiB));
    assert_int_equal(cached(), 40 * MiB);
    tu_free(y);
    tu_free(z);
    /* Plain frees and cached mallocs never trim (no driver call on that path). */
    tu_counts_reset();
    void *w = tu_malloc(100 * MiB, s2);
    tu_free(w);
    assert_int_equal(tu_call_count("cuMemUnmap"), 0);
    assert_int_equal(cached(), 240 * MiB);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    tu_assert_cu(drv->cuEventDestroy(ev));
    tu_assert_cu(drv->cuStreamDestroy(s1));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* release_threshold_mb at event processing: a record_stream free completes, the next malloc
 * learns it and trims, with no cache miss and no wait. */
static void test_threshold_events(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("release_threshold_mb:0");
    tu_require_emulator_or_skip();
    CUstream side;
    tu_assert_cu(drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    void *keep = tu_malloc(20 * MiB, NULL);
    void *x = tu_malloc(200 * MiB, NULL);
    assert_true(tu_stream_hold(side));
    assert_int_equal(xseg_record_stream(x, side), XSEG_SUCCESS);
    tu_free(x);
    void *s = tu_malloc(4096, NULL); /* events pending: nothing completes, nothing trimmed */
    tu_free(s);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 220 * MiB + 2 * MiB);
    assert_true(tu_stream_release(side));
    tu_counts_reset();
    s = tu_malloc(4096, NULL); /* cached small block; the event completes: trim to 0 */
    assert_int_equal(tu_call_count("cuStreamSynchronize") + tu_call_count("cuCtxSynchronize") +
                         tu_call_count("cuEventSynchronize"), 0);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 20 * MiB + 2 * MiB);
    tu_free(s);
    tu_free(keep);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(side));
}

static void test_threshold_config(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("release_threshold_mb:512");
    char buf[1024];
    assert_int_equal(xseg_get_config(buf, sizeof buf, NULL), XSEG_SUCCESS);
    assert_non_null(strstr(buf, "release_threshold_mb:512"));
    assert_int_equal(xseg_set_config("release_threshold_mb:-1"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "release_threshold_mb"));
    assert_int_equal(xseg_set_config("release_threshold_mb:abc"), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(xseg_set_config("max_split_size_mb:200"), XSEG_SUCCESS);
    assert_int_equal(xseg_get_config(buf, sizeof buf, NULL), XSEG_SUCCESS);
    assert_non_null(strstr(buf, "release_threshold_mb:512")); /* kept when not named */
}

/* idle_release_ms: a run nobody used for that long is given back by a later malloc (which goes
 * through the general path while the key is set); a run in use is not. Never waits. */
static void test_idle(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments_recycle:False,idle_release_ms:40");
    tu_require_emulator_or_skip();
    CUstream s2;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    void *keep = tu_malloc(20 * MiB, NULL);
    void *x = tu_malloc(200 * MiB, s2);
    tu_free(x);
    int64_t reserved0 = tu_stat("reserved_bytes.all.current");
    assert_int_equal(reserved0, 220 * MiB);
    tu_counts_reset();
    /* Cached mallocs on the NULL stream tick the clock; x's run on s2 idles. Bounded by tries,
     * not by time: under load a tick may come late, never early. */
    struct timespec nap = {0, 5 * 1000 * 1000};
    int tries = 0;
    while (tu_stat("reserved_bytes.all.current") > (int64_t)(20 * MiB + 2 * MiB) && tries++ < 2000) {
        void *s = tu_malloc(4096, NULL);
        tu_free(s);
        nanosleep(&nap, NULL);
    }
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 20 * MiB + 2 * MiB);
    assert_int_equal(tu_call_count("cuStreamSynchronize") + tu_call_count("cuCtxSynchronize") +
                         tu_call_count("cuEventSynchronize"), 0);
    tu_free(keep);
    /* A busy stream keeps its idle runs until its work completes. */
    void *y = tu_malloc(100 * MiB, s2);
    CUevent ev;
    tu_assert_cu(drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    assert_true(tu_stream_hold(s2));
    tu_assert_cu(drv->cuEventRecord(ev, s2));
    tu_free(y);
    for (int i = 0; i < 30; i++) {
        void *s = tu_malloc(4096, NULL);
        tu_free(s);
        nanosleep(&nap, NULL);
    }
    assert_true(tu_stat("reserved_bytes.all.current") >= (int64_t)(100 * MiB));
    assert_true(tu_stream_release(s2));
    tries = 0;
    while (tu_stat("reserved_bytes.all.current") > (int64_t)(2 * MiB) && tries++ < 2000) {
        void *s = tu_malloc(4096, NULL);
        tu_free(s);
        nanosleep(&nap, NULL);
    }
    /* The small page of the 4 KiB churn stays (it is used every few ms); everything else went. */
    assert_true(tu_stat("reserved_bytes.all.current") <= (int64_t)(2 * MiB));
    tu_assert_cu(drv->cuEventDestroy(ev));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(s2));
    assert_int_equal(xseg_set_config("idle_release_ms:70000000000"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "idle_release_ms"));
}

int main(int argc, char **argv)
{
    setenv("CUDAEMU_TOTAL_MEM", "8G", 0);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trim_expandable),  cmocka_unit_test(test_trim_classic),
        cmocka_unit_test(test_trim_errors),      cmocka_unit_test(test_trim_faults),
        cmocka_unit_test(test_threshold_miss),   cmocka_unit_test(test_threshold_events),
        cmocka_unit_test(test_threshold_config), cmocka_unit_test(test_idle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
