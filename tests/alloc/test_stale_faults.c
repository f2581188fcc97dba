/*
 * debug_stale_access's canary pages under driver failures (issue 50): one injected failure at
 * every driver call of the swap (a block's whole chunks swapped for a canary page at its free)
 * and of the restore (the chunks mapped back when it leaves the quarantine). A failed swap rolls
 * back (the block is filled and checked as a classic one); a failed restore keeps the block
 * quarantined (its pages never handed out), says so through xseg_last_error, and is tried again
 * at the next check or empty_cache. Never an abort; the stale write is found either way; a live
 * block keeps its bytes; the books match the driver; nothing leaks.
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

#define MiB ((size_t)1 << 20)
#define BIG (8 * MiB) /* four 2 MiB chunks: at least three lie wholly inside the block */

static size_t nreports, nkept; /* nkept: runs whose restore failed (the block kept) */
static void observer(const xseg_stale_report *r, void *user)
{
    (void)r;
    (void)user;
    nreports++;
}

static const struct {
    const char *entry;
    CUresult res;
} faults[] = {
    {"cuStreamSynchronize", CUDA_ERROR_UNKNOWN}, {"cuCtxSynchronize", CUDA_ERROR_UNKNOWN},
    {"cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY},   {"cuMemUnmap", CUDA_ERROR_UNKNOWN},
    {"cuMemMap", CUDA_ERROR_OUT_OF_MEMORY},      {"cuMemSetAccess", CUDA_ERROR_UNKNOWN},
    {"cuMemRelease", CUDA_ERROR_UNKNOWN},
};
#define NF (sizeof faults / sizeof faults[0])

enum phase { SWAP, RESTORE };

/* Reserved bytes are what the driver maps (no canary page left mapped, no chunk lost). */
static void check_books_match_driver(void)
{
    struct cudaemu_live l;
    if (tu_live(&l) && (int64_t)l.mapped_bytes != tu_stat("reserved_bytes.all.current"))
        fail_msg("reserved_bytes %lld, but the driver maps %zu bytes",
                 (long long)tu_stat("reserved_bytes.all.current"), l.mapped_bytes);
}

/* One run: @p fault (NULL: none) armed at its @p nth call during @p ph. With @p calls (fault-free
 * run): the calls each entry made during each phase. */
static void run(enum phase ph, size_t fault, unsigned long nth, unsigned long calls[2][NF])
{
    /* debug_stale_fill_batch:1: the fill at the free, inside the swap's phase, as the runs count it */
    tu_xseg_init_or_skip("expandable_segments:True,expandable_chunk_mb:2,debug_stale_access:True,"
                         "debug_quarantine_mb:64,debug_stale_fill_batch:1");
    tu_require_emulator_or_skip(); /* the faults are the emulator's */
    assert_int_equal(xseg_attach_stale_observer(observer, NULL), XSEG_SUCCESS);
    nreports = 0;
    CUstream s = NULL;
    void *live = tu_malloc(1 * MiB, s), *a = tu_malloc(BIG, s);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)live, 1 * MiB, 77));
    unsigned long fired = tu_fail_fired();

    /* The free swaps a's whole chunks for a canary (a failure there: rolled back, filled whole). */
    tu_counts_reset();
    if (calls == NULL && ph == SWAP)
        assert_true(tu_fail(faults[fault].entry, nth, faults[fault].res));
    tu_free(a);
    tu_fail_clear();
    for (size_t f = 0; calls && f < NF; f++)
        calls[SWAP][f] = tu_call_count(faults[f].entry);
    if (calls == NULL && ph == SWAP)
        tu_assert_fired(fired, "%s #%lu at the swap: the free took another path than the fault-free run",
                        faults[fault].entry, nth);

    /* A stale write over 2 MiB from 4 MiB: at a sampled probe, and over a whole canary page if swapped. */
    tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a + 4 * MiB, 0x5a, 2 * MiB, s));
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    assert_int_equal(found, 1);
    assert_int_equal(nreports, 1);

    /* The mode off: the next check drains the quarantine, restoring a's chunks. */
    assert_int_equal(xseg_set_config("debug_stale_access:False"), XSEG_SUCCESS);
    tu_counts_reset();
    if (calls == NULL && ph == RESTORE)
        assert_true(tu_fail(faults[fault].entry, nth, faults[fault].res));
    xseg_status st = xseg_check_stale(0, &found);
    tu_fail_clear();
    for (size_t f = 0; calls && f < NF; f++)
        calls[RESTORE][f] = tu_call_count(faults[f].entry);
    if (calls == NULL && ph == RESTORE)
        tu_assert_fired(fired, "%s #%lu at the restore: the check took another path than the fault-free run",
                        faults[fault].entry, nth);
    if (st != XSEG_SUCCESS) {
        /* Reported, and the block stays quarantined: its range is not handed out. */
        assert_true(st == XSEG_ERROR_DRIVER || st == XSEG_ERROR_OUT_OF_MEMORY);
        nkept++;
        assert_non_null(strstr(xseg_last_error(), "stays quarantined"));
        void *b = tu_malloc(BIG, s);
        assert_ptr_not_equal(b, a);
        tu_free(b);
        assert_true(tu_check((CUdeviceptr)(uintptr_t)live, 1 * MiB, 77));
    }
    /* empty_cache tries again (the fault is gone): the block leaves, its memory serves again. */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    void *b = tu_malloc(BIG, s);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)b, BIG, 5));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)b, BIG, 5)); /* its own pages: distinct bytes again */
    assert_true(tu_check((CUdeviceptr)(uintptr_t)live, 1 * MiB, 77));
    check_books_match_driver();
    tu_free(b);
    tu_free(live);
    assert_int_equal(nreports, 1); /* found once, never again */
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    check_no_leaks();
}

static void test_canary_faults(void **state)
{
    (void)state;
    unsigned long calls[2][NF];
    run(SWAP, 0, 0, calls);
    assert_true(calls[SWAP][2] >= 1 && calls[RESTORE][4] >= 1); /* a canary was made, and mapped back */
    size_t runs = 0;
    for (int ph = SWAP; ph <= RESTORE; ph++)
        for (size_t f = 0; f < NF; f++)
            for (unsigned long nth = 1; nth <= calls[ph][f]; nth++, runs++)
                run((enum phase)ph, f, nth, NULL);
    assert_true(nkept >= 3); /* the restore's unmap, map and access failures kept the block */
    print_message("canary faults: %zu runs, each survived; %zu restores failed and were tried again\n", runs, nkept);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_canary_faults)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
