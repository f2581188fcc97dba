/*
 * Expandable segments beneath the pools: page-level reclaim, stream isolation, mixed mode, the
 * fault-injection sweep, many streams, peer access. Stats are checked against a snapshot walk
 * (reserved = mapped ranges, allocated/active/requested = block sums) after every scenario.
 * argv[1] = "peer" runs the two-device test (CUDAEMU_DEVICES=2 set before the driver loads).
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

#define PAGE (20 * MiB)

/* A live block in the middle keeps exactly the pages it touches. */
static void test_page_reclaim(void **state)
{
    (void)state;
    start("expandable_segments:True");
    void *big = must_malloc(10 * PAGE, NULL);
    char *base = big;
    assert_int_equal(xseg_free(big), XSEG_SUCCESS);
    void *front = must_malloc(70 * MiB, NULL);  /* [0, 70) MiB */
    void *mid = must_malloc(30 * MiB, NULL);    /* [70, 100) MiB: pages 3 and 4 */
    assert_ptr_equal(front, base);
    assert_ptr_equal(mid, base + 70 * MiB);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)mid, 30 * MiB, 0xbeef));
    assert_int_equal(xseg_free(front), XSEG_SUCCESS);
    int64_t frees = tu_stat("num_device_free");
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(2 * PAGE));
    assert_int_equal(tu_stat("num_device_free"), frees + 8);
    assert_true(tu_check((CUdeviceptr)(uintptr_t)mid, 30 * MiB, 0xbeef));
    check_consistent();
    if (tu_emulated()) {
        assert_false(tu_device_accessible((CUdeviceptr)(uintptr_t)base));            /* page 0: gone */
        assert_false(tu_device_accessible((CUdeviceptr)(uintptr_t)(base + 9 * PAGE))); /* page 9 */
        assert_true(tu_device_accessible((CUdeviceptr)(uintptr_t)(base + 3 * PAGE)));  /* shared page */
    }
    /* The hole refills by mapping again, at the same addresses. */
    void *again = must_malloc(60 * MiB, NULL);
    assert_ptr_equal(again, base);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(5 * PAGE));
    check_consistent();
    assert_int_equal(xseg_free(again), XSEG_SUCCESS);
    assert_int_equal(xseg_free(mid), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* Another stream gets its own segment; growth extends the tail in place. */
static void test_stream_isolation_and_growth(void **state)
{
    (void)state;
    start("expandable_segments:True");
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    char *a = must_malloc(30 * MiB, NULL);
    char *b = must_malloc(30 * MiB, NULL);
    assert_ptr_equal(b, a + 30 * MiB); /* contiguous in one segment */
    char *c = must_malloc(30 * MiB, s);
    /* Not among the default stream's blocks; which segment it is in is checked below. Where it
     * lies is the driver's choice: the H100's driver places the next reservation right after. */
    assert_true(c + 30 * MiB <= a || c >= b + 30 * MiB);
    xseg_snapshot *snap = NULL;
    assert_int_equal(xseg_take_snapshot(0, &snap), XSEG_SUCCESS);
    int on_null = 0, on_s = 0;
    for (size_t i = 0; i < snap->nsegments; i++) {
        assert_true(snap->segments[i].is_expandable);
        if (snap->segments[i].stream == NULL)
            on_null++;
        else if (snap->segments[i].stream == s)
            on_s++;
    }
    xseg_snapshot_free(snap);
    assert_int_equal(on_null, 1);
    assert_int_equal(on_s, 1);
    /* Grow well past the first reservation: still contiguous after b. */
    char *d = must_malloc(400 * MiB, NULL);
    assert_ptr_equal(d, b + 30 * MiB);
    check_consistent();
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    assert_int_equal(xseg_free(c), XSEG_SUCCESS);
    assert_int_equal(xseg_free(d), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_consistent();
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* expandable_segments switched mid-run: both kinds side by side, never merged or confused. */
static void test_mixed_mode(void **state)
{
    (void)state;
    start("expandable_segments:True");
    void *e = must_malloc(30 * MiB, NULL);
    void *e2 = must_malloc(100 * 1024, NULL);
    assert_int_equal(xseg_set_config("expandable_segments:False"), XSEG_SUCCESS);
    void *c = must_malloc(30 * MiB, NULL);
    assert_int_equal(tu_stat("segment.all.current"), 1);
    assert_int_equal(xseg_free(e), XSEG_SUCCESS);
    void *c2 = must_malloc(12 * MiB, NULL); /* must not take the cached expandable block */
    assert_int_equal(tu_stat("segment.all.current"), 2);
    check_consistent();
    assert_int_equal(xseg_free(c), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* classic segment freed, pages unmapped */
    check_consistent();
    assert_int_equal(xseg_set_config("expandable_segments:True"), XSEG_SUCCESS);
    void *e3 = must_malloc(30 * MiB, NULL);
    check_consistent();
    assert_int_equal(xseg_free(e2), XSEG_SUCCESS);
    assert_int_equal(xseg_free(e3), XSEG_SUCCESS);
    assert_int_equal(xseg_free(c2), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* ---- fault-injection sweep ---- */

#define NLIVE 12

struct scen {
    void *p[NLIVE];
    size_t size[NLIVE];
};

static void scen_alloc(struct scen *sc, int i, size_t size, CUstream s)
{
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, size, 0, s);
    if (st == XSEG_SUCCESS) {
        sc->p[i] = p;
        sc->size[i] = size;
        tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p, size, 1000u + (unsigned)i));
    } else if (st != XSEG_ERROR_OUT_OF_MEMORY && st != XSEG_ERROR_DRIVER) {
        fail_msg("malloc failed with %s: %s", xseg_status_name(st), xseg_last_error());
    }
}

static void scen_free(struct scen *sc, int i)
{
    if (!sc->p[i])
        return;
    assert_true(tu_check((CUdeviceptr)(uintptr_t)sc->p[i], sc->size[i], 1000u + (unsigned)i));
    assert_int_equal(xseg_free(sc->p[i]), XSEG_SUCCESS);
    sc->p[i] = NULL;
}

static void scenario(struct scen *sc, CUstream s)
{
    scen_alloc(sc, 0, 50 * MiB, NULL);
    scen_alloc(sc, 1, 3 * MiB, NULL);
    scen_alloc(sc, 2, 700 * 1024, NULL);
    scen_alloc(sc, 3, 64 * MiB, s);
    scen_alloc(sc, 4, 5 * MiB, NULL);
    scen_free(sc, 1);
    scen_free(sc, 0);
    (void)xseg_empty_cache(0);
    scen_alloc(sc, 5, 90 * MiB, NULL);
    scen_alloc(sc, 6, 4 * 1024, NULL);
    scen_alloc(sc, 7, 30 * MiB, s);
    scen_free(sc, 3);
    (void)xseg_empty_cache(0);
    scen_alloc(sc, 8, 45 * MiB, s);
    scen_alloc(sc, 9, 2 * MiB + 512, NULL);
}

static void test_fault_sweep(void **state)
{
    (void)state;
    start("expandable_segments:True");
    tu_require_emulator_or_skip();
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const char *entries[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemAddressReserve"};
    unsigned runs = 0;
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        unsigned long fired = tu_fail_fired(); /* the last run goes past the last call */
        for (unsigned long n = 1;; n++) {
            struct scen sc;
            memset(&sc, 0, sizeof sc);
            tu_counts_reset();
            CUresult res = n % 2 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
            assert_true(tu_fail(entries[e], n, res));
            scenario(&sc, s);
            unsigned long calls = tu_call_count(entries[e]);
            tu_fail_clear();
            check_consistent();
            for (int i = 0; i < NLIVE; i++)
                scen_free(&sc, i);
            check_consistent();
            assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
            assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
            check_no_leaks();
            runs++;
            if (calls < n)
                break; /* the scenario never reached the Nth call: done with this entry */
        }
        tu_assert_fired(fired, "fault sweep: %s", entries[e]);
    }
    print_message("fault sweep: %u runs\n", runs);
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* 1,000 streams with a few MiB each: one segment (one reservation) per stream, all released. */
static void test_many_streams(void **state)
{
    (void)state;
    start("expandable_segments:True");
    size_t n = tu_scaled(1000, 50);
    CUstream *ss = calloc(n, sizeof *ss);
    void **ps = calloc(n, sizeof *ps);
    assert_non_null(ss);
    assert_non_null(ps);
    for (size_t i = 0; i < n; i++) {
        tu_assert_cu(drv->cuStreamCreate(&ss[i], CU_STREAM_NON_BLOCKING));
        ps[i] = must_malloc((2 + i % 3) * MiB, ss[i]);
    }
    struct cudaemu_live live;
    if (tu_live(&live))
        assert_true(live.reservations <= n);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(n * PAGE));
    check_consistent();
    for (size_t i = 0; i < n; i++)
        assert_int_equal(xseg_free(ps[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
    for (size_t i = 0; i < n; i++)
        tu_assert_cu(drv->cuStreamDestroy(ss[i]));
    free(ss);
    free(ps);
}

static void test_peer_access(void **state)
{
    (void)state;
    start("expandable_segments:True");
    int n = 0;
    assert_int_equal(xseg_device_count(&n), XSEG_SUCCESS);
    if (n < 2)
        skip();
    void *before = must_malloc(30 * MiB, NULL); /* segment exists before access is enabled */
    xseg_status st = xseg_enable_peer_access(0, 1);
    if (st == XSEG_ERROR_NOT_SUPPORTED)
        skip();
    assert_int_equal(st, XSEG_SUCCESS);
    void *after = must_malloc(30 * MiB, NULL);
    void *small = must_malloc(4096, NULL); /* a new (small-pool) segment inherits the peer */
    void *ptrs[3] = {before, after, small};
    for (int i = 0; i < 3; i++) {
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1};
        unsigned long long flags = 0;
        tu_assert_cu(drv->cuMemGetAccess(&flags, &loc, (CUdeviceptr)(uintptr_t)ptrs[i]));
        assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(xseg_free(ptrs[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(-1), XSEG_SUCCESS);
    check_no_leaks();
}

/* ---- expandable_page_size_mb ---- */

#define GiB ((size_t)1 << 30)
#define TEST_MIN(a, b) ((a) < (b) ? (a) : (b))

/* Reserved bytes and pages mapped by one @p size allocation on a fresh allocator with
 * @p config (everything freed and given back afterwards). */
static void reserve_one(const char *config, size_t size, int64_t *reserved, int64_t *pages)
{
    start(config);
    int64_t allocs = tu_stat("num_device_alloc");
    void *p = must_malloc(size, NULL);
    *reserved = tu_stat("reserved_bytes.all.current");
    *pages = tu_stat("num_device_alloc") - allocs;
    /* Usable at both ends. */
    size_t n = TEST_MIN(size, (size_t)4096);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p, n, 7));
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p + size - n, n, 8));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)p + size - n, n, 8));
    if (size >= 2 * n)
        assert_true(tu_check((CUdeviceptr)(uintptr_t)p, n, 7));
    check_consistent();
    assert_int_equal(xseg_free(p), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* The large pool's page follows expandable_page_size_mb; the default stays PyTorch's 20 MiB
 * (seed 003: 8 GiB reserves 8.008 GiB); small-pool pages and classic segments do not change. */
static void test_page_size(void **state)
{
    (void)state;
    int64_t reserved, pages;
    reserve_one("expandable_segments:True", 8 * GiB, &reserved, &pages);
    assert_int_equal(pages, 410);
    assert_int_equal(reserved, (int64_t)(410 * 20 * MiB)); /* 8.008 GiB */
    reserve_one("expandable_segments:True", 8 * GiB - MiB, &reserved, &pages);
    assert_int_equal(reserved, (int64_t)(410 * 20 * MiB));
    reserve_one("expandable_segments:True,expandable_page_size_mb:4", 8 * GiB - MiB, &reserved, &pages);
    assert_int_equal(pages, 2048);
    assert_int_equal(reserved, (int64_t)(8 * GiB));
    reserve_one("expandable_segments:True,expandable_page_size_mb:2", 8 * GiB - MiB, &reserved, &pages);
    assert_int_equal(reserved, (int64_t)(8 * GiB));
    reserve_one("expandable_segments:True,expandable_page_size_mb:10", 8 * GiB - MiB, &reserved, &pages);
    assert_int_equal(reserved, (int64_t)(820 * 10 * MiB));
    /* A 5 MiB request maps two 4 MiB pages, not a 20 MiB one. */
    reserve_one("expandable_segments:True,expandable_page_size_mb:4", 5 * MiB, &reserved, &pages);
    assert_int_equal(reserved, (int64_t)(8 * MiB));
    assert_int_equal(pages, 2);
    /* Small pool: 2 MiB pages whatever the key says. */
    reserve_one("expandable_segments:True,expandable_page_size_mb:4", 512, &reserved, &pages);
    assert_int_equal(reserved, (int64_t)(2 * MiB));
    /* Classic segments keep large_segment_size_mb. */
    reserve_one("expandable_segments:False,expandable_page_size_mb:4", 5 * MiB, &reserved, &pages);
    assert_int_equal(reserved, (int64_t)(20 * MiB));
    /* The page set in force shows in the configuration string. */
    start("expandable_segments:True,expandable_page_size_mb:6");
    char buf[512];
    size_t len = 0;
    assert_int_equal(xseg_get_config(buf, sizeof buf, &len), XSEG_SUCCESS);
    assert_non_null(strstr(buf, "expandable_page_size_mb:6,"));
    /* A bad value is refused with the key named, and the allocator keeps working. */
    assert_int_equal(xseg_set_config("expandable_page_size_mb:5"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "expandable_page_size_mb"));
    void *p = must_malloc(7 * MiB, NULL);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(12 * MiB));
    assert_int_equal(xseg_free(p), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
    /* Keys not named keep their value: give the next tests the default page back. */
    start("expandable_page_size_mb:20");
}

/* ---- reclaim under pressure (expandable_segments_recycle) ---- */

/* a | gap | c, 100 MiB each, page-aligned (the segment starts on a page), on a device capped at
 * 330 MiB: a 120 MiB request fits no free block and the growth is refused. With recycling the
 * pressure step gives back the gap's 5 pages (a stream known idle: no wait) and the growth goes
 * through without the OOM path; without it the OOM path releases every cached block and retries
 * (num_alloc_retries). Reserved ends at 320 MiB either way. Plenty of room: nothing is given back
 * (420 MiB, as PyTorch). When @p fail_entry is set, its Nth call fails during that growth: the
 * malloc still succeeds and everything stays consistent. Returns the calls of fail_entry made by
 * the growth (to end a sweep). */
static unsigned long recycle_scenario(bool recycle, bool capped, const char *fail_entry, unsigned long nth)
{
    start(recycle ? "expandable_segments:True,expandable_segments_recycle:True"
                  : "expandable_segments:True,expandable_segments_recycle:False");
    if (capped)
        cap_device(330 * MiB);
    struct cudaemu_live before = {0};
    (void)tu_live(&before);
    void *a = must_malloc(100 * MiB, NULL), *b = must_malloc(100 * MiB, NULL), *c = must_malloc(100 * MiB, NULL);
    tu_assert_cu(tu_fill(DPTR(a), 100 * MiB, 1));
    tu_assert_cu(tu_fill(DPTR(c), 100 * MiB, 3));
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(300 * MiB));
    int64_t frees = tu_stat("num_device_free"), retries = tu_stat("num_alloc_retries");
    unsigned long calls = 0;
    tu_counts_reset();
    if (fail_entry)
        assert_true(tu_fail(fail_entry, nth, CUDA_ERROR_UNKNOWN));
    void *d = must_malloc(120 * MiB, NULL);
    if (fail_entry) {
        calls = tu_call_count(fail_entry);
        tu_fail_clear();
    }
    check_consistent();
    if (!fail_entry) {
        assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)((capped ? 320 : 420) * MiB));
        assert_int_equal(tu_stat("num_device_free"), frees + (capped ? 5 : 0));
        /* The OOM path only without recycling; no host-blocking wait either way (the NULL
         * stream had no work queued: the pressure step asked, it did not wait). */
        assert_int_equal(tu_stat("num_alloc_retries"), retries + (capped && !recycle ? 1 : 0));
        if (recycle)
            assert_int_equal(tu_call_count("cuStreamSynchronize"), 0);
    }
    tu_assert_cu(tu_fill(DPTR(d), 120 * MiB, 4));
    assert_true(tu_check(DPTR(a), 100 * MiB, 1));
    assert_true(tu_check(DPTR(c), 100 * MiB, 3));
    if (capped)
        cap_device(500 * MiB);
    /* Given back VA is a hole now: a 100 MiB request maps it again, in place. */
    void *e = must_malloc(100 * MiB, NULL);
    tu_assert_cu(tu_fill(DPTR(e), 100 * MiB, 5));
    check_consistent();
    assert_true(tu_check(DPTR(a), 100 * MiB, 1) && tu_check(DPTR(c), 100 * MiB, 3) &&
                tu_check(DPTR(d), 120 * MiB, 4));
    void *all[] = {a, c, d, e};
    for (int i = 0; i < 4; i++)
        assert_int_equal(xseg_free(all[i]), XSEG_SUCCESS);
    check_consistent();
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    /* Leak-free, except a handle whose cuMemRelease failed: the driver's to keep (at most one
     * per run; earlier runs' such handles are in @p before). */
    struct cudaemu_live live;
    if (tu_live(&live)) {
        size_t kept = fail_entry && strcmp(fail_entry, "cuMemRelease") == 0 ? 1 : 0;
        if (live.handles > before.handles + kept || live.mapped_bytes || live.reservations || live.allocs)
            fail_msg("leak: %zu handles (%zu before), %zu bytes mapped, %zu reservations, %zu allocs",
                     live.handles, before.handles, live.mapped_bytes, live.reservations, live.allocs);
    }
    return calls;
}

static void test_recycle_gap(void **state)
{
    (void)state;
    recycle_scenario(true, true, NULL, 0);
    recycle_scenario(false, true, NULL, 0);
    /* With room to spare, nothing moves: what PyTorch reserves. */
    recycle_scenario(true, false, NULL, 0);
}

/* Under pressure, pages cached by one stream serve another stream's growth without the OOM path;
 * with room to spare each stream keeps its cache (PyTorch's stream isolation). */
static void test_recycle_across_streams(void **state)
{
    (void)state;
    start("expandable_segments:True,expandable_segments_recycle:True");
    cap_device(250 * MiB);
    CUstream s1, s2;
    tu_assert_cu(drv->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    size_t n = tu_scaled(20, 4);
    int64_t retries = tu_stat("num_alloc_retries");
    for (size_t i = 0; i < n; i++) {
        void *p = must_malloc(200 * MiB, i % 2 ? s2 : s1);
        tu_assert_cu(tu_fill(DPTR(p), 200 * MiB, (uint32_t)i));
        assert_true(tu_check(DPTR(p), 200 * MiB, (uint32_t)i));
        assert_int_equal(xseg_free(p), XSEG_SUCCESS);
        /* The other stream's 10 cached pages moved here: never more than one block's pages. */
        assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(200 * MiB));
        check_consistent();
    }
    assert_int_equal(tu_stat("num_alloc_retries"), retries);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    void *p = must_malloc(200 * MiB, n % 2 ? s2 : s1);
    assert_int_equal(xseg_free(p), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(400 * MiB));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(s1));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* Under pressure, a stream with work queued is waited for once, not once per run: its four
 * isolated free runs are given back after one wait (the context's: the program may have destroyed
 * the stream the runs were freed on, so it is never named again). */
static void test_recycle_waits_once(void **state)
{
    (void)state;
    start("expandable_segments:True,expandable_segments_recycle:True");
    tu_require_emulator_or_skip();
    cap_device(450 * MiB);
    CUstream busy;
    tu_assert_cu(drv->cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
    /* Four isolated free 20 MiB runs on the busy stream. */
    void *keep[5], *gap[4];
    for (int i = 0; i < 4; i++) {
        keep[i] = must_malloc(40 * MiB, busy);
        gap[i] = must_malloc(20 * MiB, busy);
    }
    keep[4] = must_malloc(40 * MiB, busy);
    for (int i = 0; i < 4; i++)
        assert_int_equal(xseg_free(gap[i]), XSEG_SUCCESS);
    assert_true(tu_stream_hold(busy));
    assert_true(tu_stream_work(busy)); /* a kernel still queued: the stream is not idle */
    tu_counts_reset();
    void *big = must_malloc(240 * MiB, NULL); /* 280 + 240 > 450: 80 MiB must go */
    assert_int_equal(tu_call_count("cuStreamSynchronize"), 0);
    assert_int_equal(tu_call_count("cuCtxSynchronize"), 1);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(440 * MiB));
    check_consistent();
    assert_int_equal(xseg_free(big), XSEG_SUCCESS);
    for (int i = 0; i < 5; i++)
        assert_int_equal(xseg_free(keep[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(busy));
}

/* empty_cache waits once per pass, not once per pool: the default pool's and an unused private
 * pool's cached pages on one stream go back after one wait (the context's: vmm/stream.h). */
static void test_empty_cache_waits_once(void **state)
{
    (void)state;
    start("expandable_segments:True");
    tu_require_emulator_or_skip();
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *in_pool = must_malloc(40 * MiB, s);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    void *plain = must_malloc(40 * MiB, s);
    assert_int_equal(xseg_free(in_pool), XSEG_SUCCESS);
    assert_int_equal(xseg_free(plain), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    tu_counts_reset();
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_call_count("cuStreamSynchronize"), 0);
    assert_int_equal(tu_call_count("cuCtxSynchronize"), 1);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(s));
}

/* expandable_chunk_mb: smaller chunks let the OOM path give back a free gap up to the live
 * blocks' edges (as expandable_segments_defrag does with page chunks, at the OOM itself). a, b, c are 30 MiB each on 20 MiB pages; b's gap [30, 60) MiB shares a page with
 * a, so with one chunk per page only [40, 60) can go. On a device capped 10 MiB above what is
 * mapped, a 40 MiB request needs 30 MiB back: it fails with page chunks and fits with 2 MiB chunks,
 * whose layout (and reserved bytes before the pressure) is PyTorch's page layout all the same. */
static void chunk_scenario(const char *config, bool fits)
{
    start(config);
    void *a = must_malloc(30 * MiB, NULL), *b = must_malloc(30 * MiB, NULL), *c = must_malloc(30 * MiB, NULL);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(100 * MiB)); /* five pages */
    tu_assert_cu(tu_fill(DPTR(a), 30 * MiB, 7));
    tu_assert_cu(tu_fill(DPTR(c), 30 * MiB, 9));
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    cap_device(110 * MiB);
    void *d = NULL;
    xseg_status st = xseg_malloc(&d, 40 * MiB, 0, NULL);
    if (fits) {
        assert_int_equal(st, XSEG_SUCCESS);
        tu_assert_cu(tu_fill(DPTR(d), 40 * MiB, 11));
        assert_true(tu_stat("reserved_bytes.all.current") <= (int64_t)(110 * MiB));
        assert_int_equal(xseg_free(d), XSEG_SUCCESS);
    } else {
        assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
        assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(80 * MiB));
    }
    assert_true(tu_check(DPTR(a), 30 * MiB, 7) && tu_check(DPTR(c), 30 * MiB, 9));
    check_consistent();
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(xseg_free(c), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

static void test_chunk_size(void **state)
{
    (void)state;
    /* Page chunks: the gap gives back only [40, 60); the retry under pressure maps only the
     * granules the request needs (30 MiB after c's free 10 MiB), which just fit. */
    chunk_scenario("expandable_segments:True,expandable_chunk_mb:0,expandable_segments_defrag:False", true);
    /* The default re-backs a's page on the OOM path: [40, 60) and the gap's part of a's page go. */
    chunk_scenario("expandable_segments:True,expandable_chunk_mb:0,expandable_segments_defrag:True", true);
    chunk_scenario("expandable_segments:True,expandable_chunk_mb:2", true);
    chunk_scenario("expandable_segments:True,expandable_chunk_mb:4,expandable_segments_recycle:False", true);
    /* The key's rules: even MiB, at most the page. */
    assert_int_equal(xseg_set_config("expandable_chunk_mb:3"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "expandable_chunk_mb"));
    assert_int_equal(xseg_set_config("expandable_chunk_mb:40"), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "expandable_page_size_mb"));
    start("expandable_chunk_mb:0");
}

/* With room to spare, a steady churn on many streams makes no driver call at all: no mapping,
 * no host-blocking synchronization, no capture query, whatever the number of streams; reclaim
 * (empty_cache) asks the driver about no stream's capture state either, and waits once per
 * stream. */
static void test_steady_state_quiet(void **state)
{
    (void)state;
    start("expandable_segments:True");
    tu_require_emulator_or_skip();
    enum { NS = 64, LIVE = 3 };
    static const size_t sizes[] = {2 * MiB, 5 * MiB, 3 * MiB, 8 * MiB, 6 * MiB, 4 * MiB};
    CUstream st[NS];
    void *live[NS][LIVE] = {{0}};
    for (int i = 0; i < NS; i++)
        tu_assert_cu(drv->cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING));
    const char *quiet[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                           "cuMemAddressReserve", "cuStreamSynchronize", "cuCtxSynchronize",
                           "cuEventSynchronize", "cuStreamIsCapturing", "cuStreamGetCaptureInfo",
                           "cuStreamQuery"};
    for (int round = 0; round < 60; round++) {
        if (round == 48)
            tu_counts_reset(); /* warmed up: every stream's cache holds its sizes */
        for (int i = 0; i < NS; i++) {
            void **slot = &live[i][round % LIVE];
            if (*slot)
                assert_int_equal(xseg_free(*slot), XSEG_SUCCESS);
            *slot = must_malloc(sizes[(i + round) % 6], st[i]);
        }
    }
    for (size_t k = 0; k < sizeof quiet / sizeof quiet[0]; k++)
        if (tu_call_count(quiet[k]))
            fail_msg("%lu calls of %s in the steady state", tu_call_count(quiet[k]), quiet[k]);
    for (int i = 0; i < NS; i++)
        for (int j = 0; j < LIVE; j++)
            assert_int_equal(xseg_free(live[i][j]), XSEG_SUCCESS);
    tu_counts_reset();
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_call_count("cuStreamIsCapturing") + tu_call_count("cuStreamGetCaptureInfo"), 0);
    assert_true(tu_call_count("cuStreamSynchronize") <= NS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
    for (int i = 0; i < NS; i++)
        tu_assert_cu(drv->cuStreamDestroy(st[i]));
}

/* Fail the Nth cuMemUnmap / cuStreamQuery while giving back under pressure. Not cuMemRelease (the
 * handles given back are mapped again, none released) nor cuStreamSynchronize (an idle stream is
 * asked, not waited for): the growth makes neither call. */
static void test_recycle_faults(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    const char *entries[] = {"cuMemUnmap", "cuStreamQuery"};
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        unsigned long fired = tu_fail_fired(); /* the last run goes past the last call */
        for (unsigned long n = 1; recycle_scenario(true, true, entries[e], n) >= n; n++)
            ;
        tu_assert_fired(fired, "recycle faults: %s", entries[e]);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "peer") == 0) {
        setenv("CUDAEMU_DEVICES", "2", 0);
        const struct CMUnitTest peer[] = {cmocka_unit_test(test_peer_access)};
        return cmocka_run_group_tests(peer, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_reclaim),
        cmocka_unit_test(test_stream_isolation_and_growth),
        cmocka_unit_test(test_mixed_mode),
        cmocka_unit_test(test_fault_sweep),
        cmocka_unit_test(test_many_streams),
        cmocka_unit_test(test_page_size),
        cmocka_unit_test(test_recycle_gap),
        cmocka_unit_test(test_recycle_across_streams),
        cmocka_unit_test(test_recycle_waits_once),
        cmocka_unit_test(test_empty_cache_waits_once),
        cmocka_unit_test(test_steady_state_quiet),
        cmocka_unit_test(test_chunk_size),
        cmocka_unit_test(test_recycle_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
