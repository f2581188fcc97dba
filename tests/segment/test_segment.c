/* vmm/segment: page maps and unmaps, data integrity across them, faults on unmapped pages, VA
 * growth and its policy, rollback under injected driver failures, many segments, peers.
 * Runs on cudaemu and, unchanged, on a real GPU (emulator-only checks skip themselves). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "base/error.h"
#include "tests/common/testutil.h"
#include "vmm/driver.h"
#include "vmm/segment.h"

static size_t G;      /* device 0's VMM granularity: the page size of most tests */
/* seg_map's chunking in these tests: one chunk per page, no cut (the page-per-handle layout). */
#define TU_PAGE_CHUNK G, SIZE_MAX
static CUdevice dev0;
static bool emu;

/* ---- helpers ---- */

static struct seg *mkseg_on(int device, size_t page, size_t min_size, const int *peers, int npeers)
{
    struct seg_params p = {0};
    p.device = device;
    tu_assert_cu(drv->cuDeviceGet(&p.cudev, device));
    p.stream = NULL;
    p.page_size = page;
    p.peers = peers;
    p.npeers = npeers;
    struct seg *s = NULL;
    xseg_status st = seg_create(&p, min_size, &s);
    if (st != XSEG_SUCCESS)
        fail_msg("seg_create(page %zu, min %zu) failed: %s", page, min_size, xseg_last_error());
    assert_non_null(s);
    return s;
}

static struct seg *mkseg(size_t min_size) { return mkseg_on(0, G, min_size, NULL, 0); }

static void live(struct cudaemu_live *l)
{
    memset(l, 0, sizeof(*l));
    if (emu)
        assert_true(tu_live(l));
}

/* The emulator's live handles, mapped bytes and reservations are what they were. */
static void assert_live_eq(const struct cudaemu_live *a, const struct cudaemu_live *b)
{
    if (!emu)
        return;
    assert_int_equal(a->handles, b->handles);
    assert_int_equal(a->mapped_bytes, b->mapped_bytes);
    assert_int_equal(a->reservations, b->reservations);
}

static void assert_live_delta(const struct cudaemu_live *before, size_t handles, size_t mapped,
                              size_t reservations)
{
    if (!emu)
        return;
    struct cudaemu_live now;
    live(&now);
    assert_int_equal(now.handles - before->handles, handles);
    assert_int_equal(now.mapped_bytes - before->mapped_bytes, mapped);
    assert_int_equal(now.reservations - before->reservations, reservations);
}

static void map_ok(struct seg *s, size_t first, size_t n, size_t expect_new)
{
    size_t m = 12345;
    xseg_status st = seg_map(s, first * seg_page_size(s), n * seg_page_size(s), TU_PAGE_CHUNK, &m, NULL);
    if (st != XSEG_SUCCESS)
        fail_msg("seg_map(pages %zu+%zu) failed: %s", first, n, xseg_last_error());
    assert_int_equal(m, expect_new * seg_page_size(s));
}

static void unmap_ok(struct seg *s, size_t first, size_t n, size_t expect_gone)
{
    size_t u = 12345;
    xseg_status st = seg_unmap(s, first * seg_page_size(s), n * seg_page_size(s), &u, NULL);
    if (st != XSEG_SUCCESS)
        fail_msg("seg_unmap(pages %zu+%zu) failed: %s", first, n, xseg_last_error());
    assert_int_equal(u, expect_gone * seg_page_size(s));
}

static CUdeviceptr page_addr(struct seg *s, size_t i) { return seg_base(s) + i * seg_page_size(s); }

/* Page @p i (of the segment's page size) mapped: its first granule is (chunks never straddle
 * pages in these tests: every map uses chunks of one page, TU_PAGE_CHUNK). */
static int page_mapped(const struct seg *s, size_t i)
{
    return seg_gran_is_mapped(s, i * (seg_page_size(s) / seg_gran(s)));
}

static CUmemGenericAllocationHandle page_handle(const struct seg *s, size_t i)
{
    CUmemGenericAllocationHandle h = 0;
    size_t first = 0;
    if (!seg_chunk(s, i * (seg_page_size(s) / seg_gran(s)), &h, &first, NULL))
        return 0;
    return h;
}

static void destroy_ok(struct seg *s)
{
    xseg_status st = seg_destroy(s);
    if (st != XSEG_SUCCESS)
        fail_msg("seg_destroy failed: %s", xseg_last_error());
}

static void assert_msg_has(const char *needle)
{
    const char *msg = xseg_last_error();
    if (!strstr(msg, needle))
        fail_msg("error message \"%s\" lacks \"%s\"", msg, needle);
}

/* ---- creation ---- */

static void test_create_invalid(void **state)
{
    (void)state;
    struct cudaemu_live before;
    live(&before);
    struct seg_params p = {0};
    tu_assert_cu(drv->cuDeviceGet(&p.cudev, 0));
    struct seg *s = (struct seg *)&p;

    assert_int_equal(seg_create(NULL, G, &s), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_create(&p, G, NULL), XSEG_ERROR_INVALID_VALUE);
    p.page_size = 0;
    assert_int_equal(seg_create(&p, G, &s), XSEG_ERROR_INVALID_VALUE);
    assert_null(s);
    p.page_size = G + G / 2; /* not a multiple of the granularity */
    assert_int_equal(seg_create(&p, G, &s), XSEG_ERROR_INVALID_VALUE);
    assert_msg_has("granularity");
    p.page_size = G;
    p.npeers = 1; /* with peers == NULL */
    assert_int_equal(seg_create(&p, G, &s), XSEG_ERROR_INVALID_VALUE);
    p.npeers = 0;
    assert_int_equal(seg_create(&p, SIZE_MAX - 1, &s), XSEG_ERROR_OUT_OF_MEMORY);
    assert_null(s);
    struct cudaemu_live after;
    live(&after);
    assert_live_eq(&after, &before);
    assert_int_equal(seg_destroy(NULL), XSEG_SUCCESS);
}

static void test_create_policy(void **state)
{
    (void)state;
    struct cudaemu_live before;
    live(&before);
    struct seg *a = mkseg(0);
    assert_int_equal(seg_va_size(a), SEG_INITIAL_PAGES * G);
    assert_int_equal(seg_page_size(a), G);
    assert_int_equal(seg_mapped_bytes(a), 0);
    assert_int_equal(seg_base(a) % G, 0);
    struct seg *b = mkseg(SEG_INITIAL_PAGES * G + G / 2); /* rounds up to the 32 MiB unit */
    assert_int_equal(seg_va_size(b), xseg_align_up(SEG_INITIAL_PAGES * G + G / 2, SEG_VA_ALIGN));
    assert_int_equal(seg_va_size(b) % SEG_VA_ALIGN, 0);
    struct seg *c = mkseg_on(0, 10 * G, 1, NULL, 0); /* a 20 MiB-style page */
    assert_int_equal(seg_va_size(c), SEG_INITIAL_PAGES * 10 * G);
    assert_live_delta(&before, 0, 0, 3);
    for (size_t i = 0; i < SEG_INITIAL_PAGES; i++)
        assert_false(page_mapped(a, i));
    assert_false(page_mapped(a, SEG_INITIAL_PAGES + 100));
    destroy_ok(a);
    destroy_ok(b);
    destroy_ok(c);
    struct cudaemu_live after;
    live(&after);
    assert_live_eq(&after, &before);
}

/* ---- map / unmap ---- */

static void test_map_unmap_ranges(void **state)
{
    (void)state;
    struct cudaemu_live before;
    live(&before);
    struct seg *s = mkseg(16 * G);
    assert_int_equal(seg_va_size(s), 16 * G);

    map_ok(s, 2, 3, 3);
    assert_int_equal(seg_mapped_bytes(s), 3 * G);
    assert_live_delta(&before, 3, 3 * G, 1);
    map_ok(s, 0, 8, 5); /* pages 2..4 already mapped: left alone */
    assert_int_equal(seg_mapped_bytes(s), 8 * G);
    map_ok(s, 0, 0, 0);
    unmap_ok(s, 3, 1, 1);
    assert_false(page_mapped(s, 3));
    assert_true(page_mapped(s, 4));
    unmap_ok(s, 10, 4, 0); /* nothing mapped there */
    unmap_ok(s, 0, 16, 7);
    assert_int_equal(seg_mapped_bytes(s), 0);
    assert_live_delta(&before, 0, 0, 1);

    /* Bad ranges are rejected and change nothing. */
    size_t m = 99;
    assert_int_equal(seg_map(s, G / 2, G, TU_PAGE_CHUNK, &m, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(m, 0);
    assert_int_equal(seg_map(s, 0, G + 1, TU_PAGE_CHUNK, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_map(s, 15 * G, 2 * G, TU_PAGE_CHUNK, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_msg_has("outside");
    assert_int_equal(seg_map(s, 17 * G, 0, TU_PAGE_CHUNK, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_map(s, SIZE_MAX - G + 1, 2 * G, TU_PAGE_CHUNK, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_unmap(s, G, G / 2, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_unmap(s, 16 * G, G, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_map(NULL, 0, G, TU_PAGE_CHUNK, NULL, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_mapped_bytes(s), 0);

    /* Random ranges against a shadow copy. */
    enum { NP = 16 };
    bool shadow[NP] = {0};
    unsigned seed = 12345;
    size_t iters = tu_scaled(400, 40);
    for (size_t it = 0; it < iters; it++) {
        seed = seed * 1103515245u + 12345u;
        size_t a = (seed >> 8) % NP;
        size_t n = 1 + (seed >> 16) % (NP - a);
        bool do_map = (seed >> 28) & 1;
        size_t expect = 0;
        for (size_t i = a; i < a + n; i++) {
            expect += shadow[i] != do_map;
            shadow[i] = do_map;
        }
        if (do_map)
            map_ok(s, a, n, expect);
        else
            unmap_ok(s, a, n, expect);
        size_t total = 0;
        for (size_t i = 0; i < NP; i++) {
            assert_int_equal(page_mapped(s, i), shadow[i]);
            total += shadow[i];
        }
        assert_int_equal(seg_mapped_bytes(s), total * G);
        assert_live_delta(&before, total, total * G, 1);
    }
    destroy_ok(s); /* with pages still mapped */
    struct cudaemu_live after;
    live(&after);
    assert_live_eq(&after, &before);
}

static void test_data_survives(void **state)
{
    (void)state;
    struct seg *s = mkseg(8 * G);
    map_ok(s, 0, 6, 6);
    for (uint32_t i = 0; i < 6; i++)
        tu_assert_cu(tu_fill(page_addr(s, i), G, 100 + i));
    unmap_ok(s, 1, 2, 2);
    map_ok(s, 2, 1, 1);
    tu_assert_cu(tu_fill(page_addr(s, 2), G, 200));
    map_ok(s, 6, 2, 2);
    unmap_ok(s, 3, 2, 2);
    map_ok(s, 0, 8, 3);
    assert_true(tu_check(page_addr(s, 0), G, 100));
    assert_true(tu_check(page_addr(s, 2), G, 200));
    assert_true(tu_check(page_addr(s, 5), G, 105));
    /* The pages mapped again (1, 3, 4) are usable across their whole range. */
    tu_assert_cu(tu_fill(page_addr(s, 1), G, 301));
    tu_assert_cu(tu_fill(page_addr(s, 3), 2 * G, 303));
    assert_true(tu_check(page_addr(s, 1), G, 301));
    assert_true(tu_check(page_addr(s, 3), 2 * G, 303));
    assert_true(tu_check(page_addr(s, 0), G, 100));
    assert_true(tu_check(page_addr(s, 2), G, 200));
    assert_true(tu_check(page_addr(s, 5), G, 105));
    destroy_ok(s);
}

static void test_unmapped_page_faults(void **state)
{
    (void)state;
    tu_require_emulator_or_skip(); /* a copy to unmapped VA: ILLEGAL_ADDRESS on cudaemu; a GPU may lose its context */
    struct seg *s = mkseg(4 * G);
    map_ok(s, 0, 1, 1);
    map_ok(s, 2, 1, 1);
    assert_true(tu_device_accessible(page_addr(s, 0)));
    assert_true(tu_device_accessible(page_addr(s, 2) + G - 64));
    assert_false(tu_device_accessible(page_addr(s, 1)));
    assert_false(tu_device_accessible(page_addr(s, 3)));
    unmap_ok(s, 2, 1, 1);
    assert_false(tu_device_accessible(page_addr(s, 2)));
    assert_true(tu_device_accessible(page_addr(s, 0)));
    destroy_ok(s);
}

/* ---- growth ---- */

static void test_grow_contiguous(void **state)
{
    (void)state;
    struct cudaemu_live before;
    live(&before);
    struct seg *s = mkseg(G);
    CUdeviceptr base = seg_base(s);
    size_t P = SEG_INITIAL_PAGES; /* pages */
    map_ok(s, 0, 2, 2);
    tu_assert_cu(tu_fill(page_addr(s, 0), 2 * G, 7));

    assert_int_equal(seg_grow(s, P * G), XSEG_SUCCESS); /* covered already */
    assert_int_equal(seg_va_size(s), P * G);
    assert_int_equal(seg_grow(s, P * G + 1), XSEG_SUCCESS); /* doubles */
    assert_int_equal(seg_va_size(s), 2 * P * G);
    assert_int_equal(seg_base(s), base);
    assert_int_equal(seg_grow(s, 5 * P * G), XSEG_SUCCESS); /* more than double: exactly the need */
    assert_int_equal(seg_va_size(s), 5 * P * G);
    assert_int_equal(seg_base(s), base);
    assert_live_delta(&before, 2, 2 * G, 3);
    assert_int_equal(seg_grow(NULL, G), XSEG_ERROR_INVALID_VALUE);
    assert_int_equal(seg_grow(s, SIZE_MAX), XSEG_ERROR_OUT_OF_MEMORY);
    assert_int_equal(seg_va_size(s), 5 * P * G);

    /* One map across both piece boundaries: one cuMemSetAccess per piece, data reachable. */
    tu_counts_reset();
    map_ok(s, P - 2, P + 4, P + 4);
    if (emu) {
        assert_int_equal(tu_call_count("cuMemSetAccess"), 3);
        assert_int_equal(tu_call_count("cuMemCreate"), P + 4);
        assert_int_equal(tu_call_count("cuMemMap"), P + 4);
    }
    for (size_t i = P - 2; i < 2 * P + 2; i++)
        tu_assert_cu(tu_fill(page_addr(s, i), G, (uint32_t)i));
    for (size_t i = P - 2; i < 2 * P + 2; i++)
        assert_true(tu_check(page_addr(s, i), G, (uint32_t)i));
    assert_true(tu_check(page_addr(s, 0), 2 * G, 7));
    map_ok(s, 0, 5 * P, 5 * P - (P + 6));
    assert_int_equal(seg_mapped_bytes(s), 5 * P * G);
    assert_false(page_mapped(s, 5 * P));
    unmap_ok(s, 0, 5 * P, 5 * P);
    destroy_ok(s);
    struct cudaemu_live after;
    live(&after);
    assert_live_eq(&after, &before);
}

/* Reserve @p size bytes at exactly @p at, or return 0 (the driver placed it elsewhere). */
static CUdeviceptr reserve_exactly(CUdeviceptr at, size_t size)
{
    CUdeviceptr got = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&got, size, 0, at, 0));
    if (got != at) {
        tu_assert_cu(drv->cuMemAddressFree(got, size));
        return 0;
    }
    return got;
}

static void test_grow_blocked(void **state)
{
    (void)state;
    struct seg *s = mkseg(G);
    size_t P = SEG_INITIAL_PAGES;
    CUdeviceptr base = seg_base(s);
    CUdeviceptr blocker = reserve_exactly(base + P * G, SEG_VA_ALIGN);
    if (!blocker) {
        destroy_ok(s);
        print_message("[  SKIPPED ] the driver did not honour the address hint for the blocker\n");
        skip();
    }
    struct cudaemu_live before;
    live(&before);
    assert_int_equal(seg_grow(s, P * G + 1), XSEG_ERROR_OUT_OF_MEMORY);
    assert_msg_has("not free");
    assert_int_equal(seg_va_size(s), P * G);
    assert_int_equal(seg_base(s), base);
    struct cudaemu_live after;
    live(&after);
    assert_live_eq(&after, &before);
    map_ok(s, 0, P, P); /* still usable */
    tu_assert_cu(drv->cuMemAddressFree(blocker, SEG_VA_ALIGN));

    /* A hole big enough for the need (one 32 MiB unit) but not for the geometric step: the need
     * is taken. Pages are 2 MiB here, so the unit is P pages. */
    assert_int_equal(P * G, SEG_VA_ALIGN);
    assert_int_equal(seg_grow(s, 2 * P * G), XSEG_SUCCESS);
    assert_int_equal(seg_va_size(s), 2 * P * G);
    blocker = reserve_exactly(base + 3 * P * G, SEG_VA_ALIGN);
    if (blocker) {
        assert_int_equal(seg_grow(s, 2 * P * G + 1), XSEG_SUCCESS);
        assert_int_equal(seg_va_size(s), 3 * P * G);
        map_ok(s, 2 * P, 1, 1);
        assert_int_equal(seg_grow(s, 3 * P * G + 1), XSEG_ERROR_OUT_OF_MEMORY);
        assert_int_equal(seg_va_size(s), 3 * P * G);
        tu_assert_cu(drv->cuMemAddressFree(blocker, SEG_VA_ALIGN));
        assert_int_equal(seg_grow(s, 3 * P * G + 1), XSEG_SUCCESS);
        assert_int_equal(seg_va_size(s), 6 * P * G);
    }
    destroy_ok(s);
}

/* ---- fault injection ---- */

struct sweep_case {
    const char *entry;
    CUresult res;
    xseg_status expect;
};

static const struct sweep_case sweep_cases[] = {
    {"cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
    {"cuMemCreate", CUDA_ERROR_INVALID_VALUE, XSEG_ERROR_DRIVER},
    {"cuMemMap", CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
    {"cuMemMap", CUDA_ERROR_INVALID_VALUE, XSEG_ERROR_DRIVER},
    {"cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, XSEG_ERROR_DRIVER},
    {"cuMemSetAccess", CUDA_ERROR_OUT_OF_MEMORY, XSEG_ERROR_OUT_OF_MEMORY},
};

static void snapshot_pages(struct seg *s, bool *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = page_mapped(s, i);
}

/* Restore exactly the pages in @p want (others unmapped). */
static void restore_pages(struct seg *s, const bool *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!want[i] && page_mapped(s, i))
            unmap_ok(s, i, 1, 1);
}

static void test_fault_sweep_map(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    int ndev = 0;
    tu_assert_cu(drv->cuDeviceGetCount(&ndev));
    int peer = 1;
    /* Two pieces of P pages; pages 3 and P + P/2 mapped beforehand, so the new pages form the
     * runs [0,3) [4,P) | [P,P+P/2) [P+P/2+1,2P): split by mapped pages and by a piece edge. */
    struct seg *s = mkseg_on(0, G, G, &peer, ndev > 1 ? 1 : 0);
    enum { NP = 2 * SEG_INITIAL_PAGES };
    assert_int_equal(seg_grow(s, NP * G), XSEG_SUCCESS);
    assert_int_equal(seg_va_size(s), NP * G);
    map_ok(s, 3, 1, 1);
    map_ok(s, SEG_INITIAL_PAGES + SEG_INITIAL_PAGES / 2, 1, 1);
    tu_assert_cu(tu_fill(page_addr(s, 3), G, 33));
    bool initial[NP];
    snapshot_pages(s, initial, NP);

    /* Count the calls of a clean map first. */
    tu_counts_reset();
    map_ok(s, 0, NP, NP - 2);
    unsigned long calls[3] = {tu_call_count("cuMemCreate"), tu_call_count("cuMemMap"),
                              tu_call_count("cuMemSetAccess")};
    assert_int_equal(calls[0], NP - 2);
    assert_int_equal(calls[1], NP - 2);
    assert_int_equal(calls[2], 4); /* one per run, owner and peer in one call */
    restore_pages(s, initial, NP);

    for (size_t c = 0; c < sizeof(sweep_cases) / sizeof(sweep_cases[0]); c++) {
        const struct sweep_case *sc = &sweep_cases[c];
        unsigned long expect_fail = strcmp(sc->entry, "cuMemCreate") == 0 ? calls[0]
                                    : strcmp(sc->entry, "cuMemMap") == 0  ? calls[1]
                                                                          : calls[2];
        unsigned long failures = 0;
        for (unsigned long n = 1;; n++) {
            struct cudaemu_live before, after;
            live(&before);
            assert_true(tu_fail(sc->entry, n, sc->res));
            size_t m = 777;
            xseg_status st = seg_map(s, 0, NP * G, TU_PAGE_CHUNK, &m, NULL);
            tu_fail_clear();
            if (st == XSEG_SUCCESS) {
                assert_int_equal(n, expect_fail + 1);
                restore_pages(s, initial, NP);
                break;
            }
            failures++;
            if (st != sc->expect)
                fail_msg("%s #%lu -> %s: seg_map returned %d (%s)", sc->entry, n, drv_error_name(sc->res),
                         (int)st, xseg_last_error());
            assert_msg_has(sc->entry);
            assert_msg_has(drv_error_name(sc->res));
            assert_int_equal(m, 0);
            live(&after);
            assert_live_eq(&after, &before);
            bool now[NP];
            snapshot_pages(s, now, NP);
            assert_memory_equal(now, initial, sizeof(now));
            assert_int_equal(seg_mapped_bytes(s), 2 * G);
            /* Still usable: the same map succeeds, and the old data is intact. */
            map_ok(s, 0, NP, NP - 2);
            assert_true(tu_check(page_addr(s, 3), G, 33));
            restore_pages(s, initial, NP);
        }
        assert_int_equal(failures, expect_fail);
    }
    destroy_ok(s);
}

static void test_fault_sweep_reserve(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    struct cudaemu_live before, after;
    size_t P = SEG_INITIAL_PAGES;

    /* Which placement path runs depends on where the driver put earlier segments
     * (vmm/README.md): at the cursor a create makes one reservation call; with the probe two
     * (the probe, then the segment at its start). cudaemu honours a free hint, so the cursor is
     * on here; test_fault_probe (last) turns it off and fails the probe's calls. */
    tu_counts_reset();
    struct seg *s = mkseg(G);
    assert_int_equal(tu_call_count("cuMemAddressReserve"), 1);
    destroy_ok(s);

    /* seg_create: every driver call it makes, failing, leaves nothing behind. */
    const char *create_entries[] = {"cuDevicePrimaryCtxRetain", "cuMemGetAllocationGranularity",
                                    "cuMemAddressReserve"};
    for (size_t i = 0; i < 3; i++) {
        live(&before);
        struct seg_params p = {0};
        tu_assert_cu(drv->cuDeviceGet(&p.cudev, 0));
        p.page_size = G;
        s = (struct seg *)&p;
        unsigned long fired = tu_fail_fired();
        assert_true(tu_fail(create_entries[i], 1, CUDA_ERROR_OUT_OF_MEMORY));
        assert_int_equal(seg_create(&p, G, &s), XSEG_ERROR_OUT_OF_MEMORY);
        tu_fail_clear();
        tu_assert_fired_n(fired, 1, "seg_create: %s", create_entries[i]);
        assert_null(s);
        assert_msg_has(create_entries[i]);
        live(&after);
        assert_live_eq(&after, &before);
    }

    s = mkseg(G);
    map_ok(s, 0, 2, 2);
    assert_int_equal(P * G, SEG_VA_ALIGN); /* 2 MiB pages: the unit is P pages */
    assert_int_equal(seg_grow(s, 2 * P * G), XSEG_SUCCESS);
    /* The geometric step fails: the need (one unit) is reserved instead. */
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemAddressReserve", 1, CUDA_ERROR_OUT_OF_MEMORY));
    assert_int_equal(seg_grow(s, 2 * P * G + 1), XSEG_SUCCESS);
    tu_fail_clear();
    tu_assert_fired_n(fired, 1, "the geometric step");
    assert_int_equal(seg_va_size(s), 3 * P * G);
    /* The step and the exact need both fail: nothing changes, the segment stays usable, and a
     * retry grows it. */
    for (int code = 0; code < 2; code++) {
        CUresult res = code ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
        live(&before);
        tu_counts_reset();
        fired = tu_fail_fired();
        assert_true(tu_fail("cuMemAddressReserve", 1, res));
        assert_true(tu_fail("cuMemAddressReserve", 2, res));
        xseg_status st = seg_grow(s, 3 * P * G + 1);
        assert_int_equal(tu_call_count("cuMemAddressReserve"), 2);
        tu_fail_clear();
        tu_assert_fired_n(fired, 2, "the step and the need");
        assert_int_equal(st, code ? XSEG_ERROR_DRIVER : XSEG_ERROR_OUT_OF_MEMORY);
        assert_msg_has("cuMemAddressReserve");
        assert_int_equal(seg_va_size(s), 3 * P * G);
        live(&after);
        assert_live_eq(&after, &before);
        map_ok(s, 0, 3 * P, 3 * P - 2);
        unmap_ok(s, 2, 3 * P - 2, 3 * P - 2);
    }
    assert_int_equal(seg_grow(s, 3 * P * G + 1), XSEG_SUCCESS);
    assert_int_equal(seg_va_size(s), 6 * P * G);
    map_ok(s, 0, 6 * P, 6 * P - 2);
    destroy_ok(s);
}

static void test_unmap_failure(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    struct seg *s = mkseg(8 * G);
    map_ok(s, 0, 6, 6);
    for (uint32_t i = 0; i < 6; i++)
        tu_assert_cu(tu_fill(page_addr(s, i), G, 40 + i));
    struct cudaemu_live before;
    live(&before);

    /* Nothing mapped in the range: no synchronize, no driver call. */
    tu_counts_reset();
    unmap_ok(s, 6, 2, 0);
    assert_int_equal(tu_call_count("cuStreamSynchronize"), 0);

    /* The synchronize fails, and so does the context synchronize it falls back to (vmm/stream.h):
     * nothing is unmapped. */
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuStreamSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED));
    assert_true(tu_fail("cuCtxSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED));
    size_t u = 1;
    assert_int_equal(seg_unmap(s, 0, 6 * G, &u, NULL), XSEG_ERROR_DRIVER);
    tu_fail_clear();
    tu_assert_fired_n(fired, 2, "both synchronizes");
    assert_int_equal(u, 0);
    assert_int_equal(seg_mapped_bytes(s), 6 * G);

    /* One cuMemUnmap per run of adjacent chunks: when it fails, the whole run stays mapped with
     * its data. */
    tu_counts_reset();
    fired = tu_fail_fired();
    assert_true(tu_fail("cuMemUnmap", 1, CUDA_ERROR_INVALID_VALUE));
    assert_int_equal(seg_unmap(s, 0, 6 * G, &u, NULL), XSEG_ERROR_DRIVER);
    tu_fail_clear();
    tu_assert_fired_n(fired, 1, "the one run's unmap");
    assert_msg_has("cuMemUnmap");
    assert_int_equal(u, 0);
    assert_int_equal(seg_mapped_bytes(s), 6 * G);
    for (size_t i = 0; i < 6; i++)
        assert_true(page_mapped(s, i) && tu_check(page_addr(s, i), G, 40 + (uint32_t)i));

    /* Two runs ([0, 2) and [3, 6) once page 2 is gone): the second run's unmap fails, so the
     * first run is unmapped and the second stays mapped with its data. */
    unmap_ok(s, 2, 1, 1);
    live(&before);
    tu_counts_reset();
    fired = tu_fail_fired();
    assert_true(tu_fail("cuMemUnmap", 2, CUDA_ERROR_INVALID_VALUE));
    assert_int_equal(seg_unmap(s, 0, 6 * G, &u, NULL), XSEG_ERROR_DRIVER);
    tu_fail_clear();
    tu_assert_fired_n(fired, 1, "the second run's unmap");
    assert_int_equal(u, 2 * G);
    assert_int_equal(tu_call_count("cuStreamSynchronize"), 1);
    assert_int_equal(seg_mapped_bytes(s), 3 * G);
    assert_false(page_mapped(s, 0));
    assert_false(page_mapped(s, 1));
    for (size_t i = 3; i < 6; i++) {
        assert_true(page_mapped(s, i));
        assert_true(tu_check(page_addr(s, i), G, 40 + (uint32_t)i));
    }
    struct cudaemu_live now;
    live(&now);
    assert_int_equal(before.handles - now.handles, 2);
    assert_int_equal(before.mapped_bytes - now.mapped_bytes, 2 * G);
    unmap_ok(s, 0, 8, 3);
    destroy_ok(s);
}

/* ---- scale ---- */

static void test_many_segments(void **state)
{
    (void)state;
    size_t n = tu_scaled(1000, 50);
    struct cudaemu_live before;
    live(&before);
    struct seg **segs = calloc(n, sizeof(*segs));
    assert_non_null(segs);
    size_t va = 0;
    for (size_t i = 0; i < n; i++) {
        segs[i] = mkseg(3 * G);
        map_ok(segs[i], i % 3, 2, 2);
        va += seg_va_size(segs[i]);
    }
    /* The policy's figure: a segment holding a little memory reserves SEG_INITIAL_PAGES pages,
     * not a multiple of device memory. */
    assert_int_equal(va, n * SEG_INITIAL_PAGES * G);
    assert_live_delta(&before, 2 * n, 2 * n * G, n);
    tu_assert_cu(tu_fill(page_addr(segs[n - 1], (n - 1) % 3), 2 * G, 9));
    assert_true(tu_check(page_addr(segs[n - 1], (n - 1) % 3), 2 * G, 9));
    for (size_t i = 0; i < n; i++)
        destroy_ok(segs[i]);
    free(segs);
    struct cudaemu_live after;
    live(&after);
    assert_live_eq(&after, &before);
}

/* ---- peers and context ---- */

static bool peer_access_rw(CUdeviceptr addr, int device)
{
    CUmemLocation loc = {0};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = device;
    unsigned long long flags = 0;
    tu_assert_cu(drv->cuMemGetAccess(&flags, &loc, addr));
    return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

static void test_peers(void **state)
{
    (void)state;
    int ndev = 0, can = 0;
    tu_assert_cu(drv->cuDeviceGetCount(&ndev));
    if (ndev >= 2) {
        CUdevice d1;
        tu_assert_cu(drv->cuDeviceGet(&d1, 1));
        tu_assert_cu(drv->cuDeviceCanAccessPeer(&can, d1, dev0));
    }
    if (!can) {
        print_message("[  SKIPPED ] needs two devices with peer access (CUDAEMU_DEVICES=2)\n");
        skip();
    }
    struct seg *s = mkseg(G);
    size_t P = SEG_INITIAL_PAGES;
    map_ok(s, 0, 2, 2);
    map_ok(s, 4, 1, 1);
    assert_false(peer_access_rw(page_addr(s, 0), 1));
    assert_true(peer_access_rw(page_addr(s, 0), 0));
    tu_counts_reset();
    assert_int_equal(seg_add_peer(s, 1), XSEG_SUCCESS);
    if (emu)
        assert_int_equal(tu_call_count("cuMemSetAccess"), 2); /* runs [0,2) and [4,5) */
    assert_true(peer_access_rw(page_addr(s, 0), 1));
    assert_true(peer_access_rw(page_addr(s, 1), 1));
    assert_true(peer_access_rw(page_addr(s, 4), 1));
    /* Remembered: pages mapped later, in a grown piece too, get it. */
    assert_int_equal(seg_grow(s, 2 * P * G), XSEG_SUCCESS);
    map_ok(s, P - 1, 3, 3);
    for (size_t i = P - 1; i < P + 2; i++) {
        assert_true(peer_access_rw(page_addr(s, i), 1));
        assert_true(peer_access_rw(page_addr(s, i), 0));
    }
    tu_counts_reset();
    assert_int_equal(seg_add_peer(s, 1), XSEG_SUCCESS); /* already a peer: no driver call */
    assert_int_equal(seg_add_peer(s, 0), XSEG_SUCCESS); /* the owner */
    if (emu)
        assert_int_equal(tu_call_count("cuMemSetAccess"), 0);
    assert_int_equal(seg_add_peer(s, -1), XSEG_ERROR_INVALID_DEVICE);
    destroy_ok(s);

    /* Peers given at creation (duplicates and the owner itself ignored). */
    int peers[] = {1, 0, 1};
    s = mkseg_on(0, G, G, peers, 3);
    map_ok(s, 1, 2, 2);
    assert_true(peer_access_rw(page_addr(s, 2), 1));
    if (emu) {
        /* A failing peer grant is reported and not remembered; a retry succeeds. */
        struct seg *t = mkseg(G);
        map_ok(t, 0, 1, 1);
        unsigned long fired = tu_fail_fired();
        assert_true(tu_fail("cuMemSetAccess", 1, CUDA_ERROR_INVALID_DEVICE));
        assert_int_equal(seg_add_peer(t, 1), XSEG_ERROR_DRIVER);
        tu_fail_clear();
        tu_assert_fired_n(fired, 1, "the peer grant");
        assert_int_equal(seg_add_peer(t, 1), XSEG_SUCCESS);
        assert_true(peer_access_rw(page_addr(t, 0), 1));
        destroy_ok(t);
    }
    destroy_ok(s);
}

static void test_context_made_current(void **state)
{
    (void)state;
    struct seg *s = mkseg(G);
    tu_assert_cu(drv->cuCtxSetCurrent(NULL));
    map_ok(s, 0, 1, 1);
    CUcontext cur = NULL;
    tu_assert_cu(drv->cuCtxGetCurrent(&cur));
    assert_ptr_equal(cur, tu_ctx());
    tu_assert_cu(drv->cuCtxSetCurrent(NULL));
    unmap_ok(s, 0, 1, 1);
    tu_assert_cu(drv->cuCtxSetCurrent(NULL));
    destroy_ok(s);
    tu_ctx_set();
}

/* ---- observer hook and page handles ---- */

struct obs_log {
    int n;
    size_t first[32], last[32];
    int mapped[32];
};

static void obs_rec(void *user, struct seg *s, size_t first, size_t last, int mapped)
{
    (void)s;
    struct obs_log *l = user;
    assert_true(l->n < 32);
    l->first[l->n] = first;
    l->last[l->n] = last;
    l->mapped[l->n++] = mapped;
}

static void obs_expect(struct obs_log *l, int i, size_t first, size_t last, int mapped)
{
    assert_true(i < l->n);
    if (l->first[i] != first || l->last[i] != last || l->mapped[i] != mapped)
        fail_msg("event %d: got [%zu,%zu) %s, expected [%zu,%zu) %s", i, l->first[i], l->last[i],
                 l->mapped[i] ? "map" : "unmap", first, last, mapped ? "map" : "unmap");
}

static void test_observer_hook(void **state)
{
    (void)state;
    struct obs_log log = {0};
    struct seg_params p = {0};
    p.device = 0;
    p.cudev = dev0;
    p.page_size = G;
    p.observe = obs_rec;
    p.observe_user = &log;
    struct seg *s = NULL;
    assert_int_equal(seg_create(&p, G, &s), XSEG_SUCCESS);
    assert_int_equal(seg_handle_types(s), CU_MEM_HANDLE_TYPE_NONE);
    map_ok(s, 0, 2, 2);
    map_ok(s, 4, 1, 1);
    map_ok(s, 0, 6, 3); /* new pages 2, 3 and 5: two runs */
    assert_int_equal(log.n, 4);
    obs_expect(&log, 0, 0, 2, 1);
    obs_expect(&log, 1, 4, 5, 1);
    obs_expect(&log, 2, 2, 4, 1);
    obs_expect(&log, 3, 5, 6, 1);
    for (size_t i = 0; i < 6; i++)
        assert_true(page_handle(s, i) != 0);
    assert_true(page_handle(s, 6) == 0);
    assert_true(page_handle(s, 1u << 30) == 0);

    struct obs_log replay = {0};
    seg_replay_mapped(s, obs_rec, &replay);
    assert_int_equal(replay.n, 1);
    obs_expect(&replay, 0, 0, 6, 1);

    log.n = 0;
    unmap_ok(s, 1, 2, 2);
    assert_int_equal(log.n, 1);
    obs_expect(&log, 0, 1, 3, 0);
    if (emu) {
        /* A failed unmap announced as an unmap is reported mapped again (the whole run). */
        log.n = 0;
        unsigned long fired = tu_fail_fired();
        assert_true(tu_fail("cuMemUnmap", 1, CUDA_ERROR_INVALID_VALUE));
        size_t gone = 0;
        assert_int_equal(seg_unmap(s, 3 * G, 3 * G, &gone, NULL), XSEG_ERROR_DRIVER);
        tu_fail_clear();
        tu_assert_fired_n(fired, 1, "the observed unmap");
        assert_int_equal(gone, 0);
        assert_int_equal(log.n, 2);
        obs_expect(&log, 0, 3, 6, 0);
        obs_expect(&log, 1, 3, 6, 1);
    }
    log.n = 0;
    destroy_ok(s);
    /* Every page still mapped is announced before the segment goes. */
    size_t total = 0;
    for (int i = 0; i < log.n; i++) {
        assert_int_equal(log.mapped[i], 0);
        total += log.last[i] - log.first[i];
    }
    assert_int_equal(total, 4);
}

/* The probe's path (vmm/README.md): a driver that does not place a reservation where the cursor
 * points turns the cursor off for the process; each create then probes for a hole with room to
 * grow and reserves at its start. Last in the list, since the cursor stays off afterwards. */
static void test_fault_probe(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    /* Take the range the cursor points at (past the newest segment's room): the next create's
     * hinted reservation lands elsewhere and is given back, and the create probes. */
    struct seg *s = mkseg(G);
    CUdeviceptr cursor = seg_base(s) + seg_va_size(s) + SEG_GROW_ROOM;
    cursor = (cursor + SEG_VA_ALIGN - 1) & ~(CUdeviceptr)(SEG_VA_ALIGN - 1);
    destroy_ok(s);
    CUdeviceptr block = 0;
    tu_assert_cu(drv->cuMemAddressReserve(&block, SEG_VA_ALIGN, 0, cursor, 0));
    assert_true(block == cursor);
    tu_counts_reset();
    s = mkseg(G);
    /* At the cursor (given back), the probe (given back), the segment: 3 and 2. Or 2 and 1 where an
     * earlier test's hinted range already landed elsewhere and turned the cursor off (under TSan
     * the emulator's mmap does not always honour the hint). */
    unsigned long nres = tu_call_count("cuMemAddressReserve"), nfree = tu_call_count("cuMemAddressFree");
    if (!(nres == 3 && nfree == 2) && !(nres == 2 && nfree == 1))
        fail_msg("a create past a taken cursor: %lu reservations, %lu frees", nres, nfree);
    destroy_ok(s);
    tu_counts_reset();
    s = mkseg(G);
    assert_int_equal(tu_call_count("cuMemAddressReserve"), 2); /* the probe, the segment */
    destroy_ok(s);

    /* Both reservations fail: the create fails, leaving nothing. */
    struct cudaemu_live before, after;
    live(&before);
    struct seg_params p = {0};
    tu_assert_cu(drv->cuDeviceGet(&p.cudev, 0));
    p.page_size = G;
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemAddressReserve", 1, CUDA_ERROR_OUT_OF_MEMORY));
    assert_true(tu_fail("cuMemAddressReserve", 2, CUDA_ERROR_OUT_OF_MEMORY));
    assert_int_equal(seg_create(&p, G, &s), XSEG_ERROR_OUT_OF_MEMORY);
    tu_fail_clear();
    tu_assert_fired_n(fired, 2, "the probe and the segment's reservation");
    assert_msg_has("cuMemAddressReserve");
    live(&after);
    assert_live_eq(&after, &before);

    /* A failed probe for growth room (or a failed free of it) is no error. */
    fired = tu_fail_fired();
    assert_true(tu_fail("cuMemAddressReserve", 1, CUDA_ERROR_OUT_OF_MEMORY));
    s = mkseg(G);
    tu_fail_clear();
    tu_assert_fired_n(fired, 1, "the probe's reservation");
    destroy_ok(s);
    fired = tu_fail_fired();
    assert_true(tu_fail("cuMemAddressFree", 1, CUDA_ERROR_INVALID_VALUE));
    s = mkseg(G);
    tu_fail_clear();
    tu_assert_fired_n(fired, 1, "the probe's address free");
    destroy_ok(s);
    live(&after);
    if (after.reservations != before.reservations + 1) /* the probe that could not be freed */
        fail_msg("reservations %zu -> %zu", before.reservations, after.reservations);
    tu_assert_cu(drv->cuMemAddressFree(block, SEG_VA_ALIGN));
}

int main(void)
{
    /* Two emulated devices for the peer test (the real driver ignores this); the caller's
     * environment wins. */
    setenv("CUDAEMU_DEVICES", "2", 0);
    /* Many segments hold many emulated handles (one descriptor each on cudaemu). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    tu_exit_skip_without_gpu();
    emu = tu_emulated();
    tu_assert_cu(drv->cuDeviceGet(&dev0, 0));
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    if (drv->cuMemGetAllocationGranularity(&G, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !G) {
        fprintf(stderr, "cannot read the VMM granularity\n");
        return 1;
    }

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_create_policy),
        cmocka_unit_test(test_map_unmap_ranges),
        cmocka_unit_test(test_data_survives),
        cmocka_unit_test(test_unmapped_page_faults),
        cmocka_unit_test(test_grow_contiguous),
        cmocka_unit_test(test_grow_blocked),
        cmocka_unit_test(test_fault_sweep_map),
        cmocka_unit_test(test_fault_sweep_reserve),
        cmocka_unit_test(test_unmap_failure),
        cmocka_unit_test(test_many_segments),
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_context_made_current),
        cmocka_unit_test(test_observer_hook),
        cmocka_unit_test(test_fault_probe), /* last: it turns the placement cursor off */
    };
    return cmocka_run_group_tests_name("segment", tests, NULL, NULL);
}
