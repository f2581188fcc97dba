/*
 * debug_stale_access's canary pages under driver failures (issue 50): one injected failure at
 * every driver call of the swap (a block's whole chunks given back and a canary page mapped over
 * them at its free) and of the release (the canary's mappings unmapped when it leaves, the range
 * left unmapped), then two at once: a failed canary map or access grant followed by a failed
 * unmap at each later unmap (the double fault that used to leave a chunk mapped without access).
 * A swap that fails before giving a chunk back changes nothing (the block is filled whole); one
 * that fails after keeps what it gave back, and a canary it could not map whole is neither
 * filled nor checked; a failed release keeps the block quarantined (its range never handed out),
 * says so through xseg_last_error, and is tried again at the next check or empty_cache. Never an
 * abort; the stale write is found wherever the canary took it; reserved memory never rises at
 * the free; a live block keeps its bytes; the books match the driver once the block left (no
 * granule left mapped, with access or without); nothing leaks.
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
enum { UNMAP = 3, MAP = 4, ACCESS = 5 }; /* indexes in faults[] */

/* Reserved bytes are what the driver maps (no canary page left mapped, no chunk lost). */
static void check_books_match_driver(void)
{
    struct cudaemu_live l;
    if (tu_live(&l) && (int64_t)l.mapped_bytes != tu_stat("reserved_bytes.all.current"))
        fail_msg("reserved_bytes %lld, but the driver maps %zu bytes",
                 (long long)tu_stat("reserved_bytes.all.current"), l.mapped_bytes);
}

/* May the owner read and write @p p (mapped, access granted)? */
static bool accessible(const void *p)
{
    unsigned long long flags = 0;
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    return drv->cuMemGetAccess(&flags, &loc, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS &&
           flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* One run: @p fault (SIZE_MAX: none) armed at its @p nth call during @p ph, and with @p nth2 an
 * unmap failing at its nth2 call in the same phase (a double fault). With @p calls (fault-free
 * run): the calls each entry made during each phase. */
static void run2(enum phase ph, size_t fault, unsigned long nth, unsigned long nth2, unsigned long calls[2][NF]);
static void run(enum phase ph, size_t fault, unsigned long nth, unsigned long calls[2][NF])
{
    run2(ph, fault, nth, 0, calls);
}

static void run2(enum phase ph, size_t fault, unsigned long nth, unsigned long nth2, unsigned long calls[2][NF])
{
    /* debug_stale_fill_batch:1: the fill at the free, inside the swap's phase, as the runs count
     * it; every byte checked: a span cut short by a fault moves the sampled probes (fallback). */
    tu_xseg_init_or_skip("expandable_segments:True,expandable_chunk_mb:2,debug_stale_access:True,"
                         "debug_quarantine_mb:64,debug_stale_fill_batch:1,debug_stale_full_check:True");
    tu_require_emulator_or_skip(); /* the faults are the emulator's */
    assert_int_equal(xseg_attach_stale_observer(observer, NULL), XSEG_SUCCESS);
    nreports = 0;
    CUstream s = NULL;
    void *live = tu_malloc(1 * MiB, s), *a = tu_malloc(BIG, s);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)live, 1 * MiB, 77));
    unsigned long fired = tu_fail_fired();

    /* The free gives a's whole chunks back for a canary: reserved drops (or, failed before a
     * chunk went, stays: the block is filled whole), never rises. */
    int64_t reserved0 = tu_stat("reserved_bytes.all.current");
    tu_counts_reset();
    if (calls == NULL && ph == SWAP) {
        assert_true(tu_fail(faults[fault].entry, nth, faults[fault].res));
        if (nth2)
            assert_true(tu_fail(faults[UNMAP].entry, nth2, faults[UNMAP].res));
    }
    tu_free(a);
    tu_fail_clear();
    for (size_t f = 0; calls && f < NF; f++)
        calls[SWAP][f] = tu_call_count(faults[f].entry);
    if (calls == NULL && ph == SWAP && !nth2)
        tu_assert_fired(fired, "%s #%lu at the swap: the free took another path than the fault-free run",
                        faults[fault].entry, nth);
    int64_t reserved1 = tu_stat("reserved_bytes.all.current");
    assert_true(reserved1 <= reserved0);
    if (calls) /* fault-free: the three or four whole chunks inside a went back */
        assert_true(reserved0 - reserved1 >= (int64_t)(BIG - 2 * 2 * MiB));

    /* A stale write over 2 MiB from 4 MiB: at a sampled probe, and over a whole canary page if
     * swapped. Where the canary could not be mapped (or granted access) the range faults
     * instead, and its block is never checked: nothing written, nothing found. */
    bool canary = accessible((char *)a + 4 * MiB);
    if (canary)
        tu_assert_cu(drv->cuMemsetD8Async((CUdeviceptr)(uintptr_t)a + 4 * MiB, 0x5a, 2 * MiB, s));
    else
        assert_true(calls == NULL && ph == SWAP && (fault == MAP || fault == ACCESS));
    size_t found = 0;
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    if (nth2 && canary) /* a double fault left canary mappings: the block is not checked */
        canary = found == 1;
    assert_int_equal(found, canary ? 1 : 0);
    assert_int_equal(nreports, canary ? 1 : 0);

    /* The mode off: the next check drains the quarantine, unmapping a's canary. */
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
    /* empty_cache tries again (the fault is gone): the block leaves, its range serves again
     * (pages mapped anew where its canary was). */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(xseg_check_stale(0, &found), XSEG_SUCCESS);
    check_books_match_driver();
    void *b = tu_malloc(BIG, s);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)b, BIG, 5));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)b, BIG, 5)); /* its own pages: distinct bytes again */
    assert_true(tu_check((CUdeviceptr)(uintptr_t)live, 1 * MiB, 77));
    check_books_match_driver();
    tu_free(b);
    tu_free(live);
    assert_int_equal(nreports, canary ? 1 : 0); /* found once, never again */
    assert_int_equal(xseg_shutdown(), XSEG_SUCCESS);
    check_no_leaks();
}

static void test_canary_faults(void **state)
{
    (void)state;
    unsigned long calls[2][NF];
    run(SWAP, SIZE_MAX, 0, calls);
    /* A canary was made and mapped; leaving, it was unmapped and nothing was mapped back. */
    assert_true(calls[SWAP][2] >= 1 && calls[SWAP][MAP] >= 1 && calls[RESTORE][UNMAP] >= 1);
    assert_int_equal(calls[RESTORE][2] + calls[RESTORE][MAP] + calls[RESTORE][ACCESS], 0);
    size_t runs = 0;
    for (int ph = SWAP; ph <= RESTORE; ph++)
        for (size_t f = 0; f < NF; f++)
            for (unsigned long nth = 1; nth <= calls[ph][f]; nth++, runs++)
                run((enum phase)ph, f, nth, NULL);
    assert_true(nkept >= 1); /* the release's unmap failure kept the block */
    /* Double faults: a canary map or access grant fails, then an unmap (its rollback's, or a
     * later chunk's) fails too. */
    size_t doubles = 0;
    for (size_t f = MAP; f <= ACCESS; f++)
        for (unsigned long nth = 1; nth <= calls[SWAP][f]; nth++)
            for (unsigned long nth2 = 1; nth2 <= calls[SWAP][UNMAP] + 1; nth2++, doubles++)
                run2(SWAP, f, nth, nth2, NULL);
    print_message("canary faults: %zu runs and %zu double faults, each survived; %zu releases failed and were "
                  "tried again\n", runs, doubles, nkept);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_canary_faults)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
