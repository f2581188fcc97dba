/*
 * Fitting a device under pressure without moving live bytes (issue 33), through the public API on
 * cudaemu, its call counters and live counts:
 *  - kept_handles: chunks the reclaim unmaps under pressure are mapped again by the growth that
 *    needed them (no cuMemRelease, no cuMemCreate), across streams and pools; none is held after
 *    the malloc;
 *  - kept_handles_faults: a failed cuMemMap / cuMemUnmap / cuMemCreate in that growth leaves the
 *    allocator consistent and leaks nothing (a kept handle is given back);
 *  - granules: the retry under pressure maps only the granules a request needs, so a request that
 *    a whole page would not fit is served, with the live bytes untouched and no copy;
 *  - fragmented, fragmented_after_refusal: once the device has refused a growth, or within its
 *    last eighth, memory is mapped in chunks smaller than a page, so the free chunks between live
 *    blocks serve a larger request at 1.01 x peak allocated;
 *  - small_device, small_device_pages, large_device_pages: on a device under 10 GiB, memory
 *    mapped before any pressure comes in chunks of at most 1/512 of the device, so pages split
 *    early between long-lived and freed blocks give the freed part back; PyTorch's layout, an
 *    explicit expandable_chunk_mb and larger devices keep one chunk a page;
 *  - training_step, top_placement: gradients and optimizer states predicted long-lived are carved
 *    from the top of the free range, so a training step's shape fits 1.01 x peak allocated; the
 *    placement by addresses.
 *  - class_segments(_large): on a device under 10 GiB, requests whose last blocks of their byte
 *    count are live take segments of their own, the others the rest (placement's S1); on a
 *    larger device best fit;
 *  - class_short: a byte count one of whose blocks was freed as the newest of its count never
 *    takes the class's segments.
 * Each test runs in its own process (meson passes its name).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/alloc/fixture.h"
#include "tests/common/testutil.h"
#include "xseg.h"

/* reserved_bytes is what the driver maps for xseg, and every handle alive is mapped. */
static void check_driver_agrees(void)
{
    struct cudaemu_live lv;
    assert_true(tu_live(&lv));
    assert_int_equal((int64_t)lv.mapped_bytes, tu_stat("reserved_bytes.all.current"));
}

/* 200 MiB cached by a private pool nobody uses any more, 100 MiB cached by stream s1 in the
 * default pool; on a device capped at 320 MiB, stream s2 asks for 300 MiB. The reclaim unmaps the
 * 15 cached 20 MiB chunks and the growth maps the same handles on s2. @p fail_entry (optional):
 * its @p nth call fails during that malloc, which may then fail too. @return the calls of
 * @p fail_entry the malloc made. */
static unsigned long kept_scenario(const char *fail_entry, unsigned long nth)
{
    start_emu("expandable_segments:True");
    CUstream s1, s2;
    tu_assert_cu(drv->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *x = must_malloc(200 * MiB, s1);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_free(x), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    void *y = must_malloc(100 * MiB, s1);
    assert_int_equal(xseg_free(y), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(300 * MiB));

    cap_device(320 * MiB);
    tu_counts_reset();
    if (fail_entry)
        assert_true(tu_fail(fail_entry, nth, CUDA_ERROR_UNKNOWN));
    void *z = NULL;
    xseg_status st = xseg_malloc(&z, 300 * MiB, 0, s2);
    unsigned long calls = fail_entry ? tu_call_count(fail_entry) : 0;
    tu_fail_clear();
    if (!fail_entry) {
        assert_int_equal(st, XSEG_SUCCESS);
        /* Unmapped and mapped again: no handle released, none created. */
        assert_int_equal(tu_call_count("cuMemCreate"), 0);
        assert_int_equal(tu_call_count("cuMemRelease"), 0);
        assert_int_equal(tu_call_count("cuMemMap"), 15);
        assert_true(tu_call_count("cuMemUnmap") >= 1);
        assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(300 * MiB));
        struct cudaemu_live lv;
        assert_true(tu_live(&lv));
        assert_int_equal(lv.handles, 15); /* nothing held back after the malloc */
    } else {
        assert_true(st == XSEG_SUCCESS || st == XSEG_ERROR_DRIVER || st == XSEG_ERROR_OUT_OF_MEMORY);
    }
    check_driver_agrees();
    if (st == XSEG_SUCCESS) {
        tu_assert_cu(tu_fill(DPTR(z), 300 * MiB, 5));
        assert_true(tu_check(DPTR(z), 300 * MiB, 5));
        assert_int_equal(xseg_free(z), XSEG_SUCCESS);
    }
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    /* The allocator stays usable, and empty_cache gives everything back to the driver. */
    void *w = must_malloc(300 * MiB, s2);
    tu_assert_cu(tu_fill(DPTR(w), 300 * MiB, 6));
    assert_int_equal(xseg_free(w), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    assert_int_equal(xseg_trim(0, 0), XSEG_SUCCESS); /* retries what a failed release left */
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(s1));
    tu_assert_cu(drv->cuStreamDestroy(s2));
    return calls;
}

static void test_kept_handles(void **state)
{
    (void)state;
    kept_scenario(NULL, 0);
}

static void test_kept_handles_faults(void **state)
{
    (void)state;
    /* No cuMemCreate: the growth maps the kept handles and creates none, faults or not. */
    const char *entries[] = {"cuMemMap", "cuMemUnmap", "cuMemSetAccess"};
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        unsigned long fired = tu_fail_fired(); /* the last run goes past the last call */
        for (unsigned long n = 1; n <= 16 && kept_scenario(entries[e], n) >= n; n++)
            ;
        tu_assert_fired(fired, "kept handles faults: %s", entries[e]);
    }
}

/* A 60 MiB block fills three 20 MiB pages of a device capped at 70 MiB; an 8 MiB request needs
 * growth, and a whole page would take the device to 80 MiB. The retry under pressure maps only
 * 8 MiB (four granules): the request is served, nothing of the live block is copied or remapped,
 * its bytes are intact. */
static void test_granules(void **state)
{
    (void)state;
    start_emu("expandable_segments:True");
    void *a = must_malloc(60 * MiB, NULL);
    tu_assert_cu(tu_fill(DPTR(a), 60 * MiB, 1));
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(60 * MiB));
    cap_device(70 * MiB);
    tu_counts_reset();
    void *b = NULL;
    if (xseg_malloc(&b, 7 * MiB + 512 * 1024, 0, NULL) != XSEG_SUCCESS)
        fail_msg("xseg_malloc(7.5 MiB) on a 70 MiB device holding 60 MiB: %s", xseg_last_error());
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(68 * MiB));
    check_driver_agrees();
    /* No live byte moved: no copy, and a's chunks were neither unmapped nor mapped again. */
    const char *copies[] = {"cuMemcpyDtoDAsync", "cuMemcpyDtoD", "cuMemcpyDtoH", "cuMemcpyHtoD",
                            "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync", "cuMemUnmap"};
    for (size_t k = 0; k < sizeof copies / sizeof copies[0]; k++)
        assert_int_equal(tu_call_count(copies[k]), 0);
    assert_true(tu_check(DPTR(a), 60 * MiB, 1));
    tu_assert_cu(tu_fill(DPTR(b), 7 * MiB + 512 * 1024, 2));
    assert_true(tu_check(DPTR(b), 7 * MiB + 512 * 1024, 2));
    assert_true(tu_check(DPTR(a), 60 * MiB, 1));
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    /* With room again, growth maps whole pages (PyTorch's reserved figures). */
    void *c = must_malloc(90 * MiB, NULL);
    assert_int_equal(xseg_free(c), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current") % (int64_t)(20 * MiB), 8 * (int64_t)MiB);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

/* Workload for test_fragmented: 60 blocks of 3 MiB, every other one freed, then 60 MiB asked for
 * on a device of peak allocated (180 MiB) x 1.01 rounded up to 2 MiB. */
#define FRAG_N 60
#define FRAG_BLOCK (3 * MiB)

/*
 * A fragmented workload served without moving a live byte because large-pool memory mapped after
 * the device first refused a growth, or within its last eighth, comes in chunks smaller than a
 * page (core/policy/expandable.c chunk_limit). Phase A, on a device capped at @p cap_ab MiB, meets
 * pressure once: @p a_mb cached by s1, then s2's @p b_mb growth is refused and served by the
 * reclaim. Phase B, same cap, maps 180 MiB as 3 MiB blocks and frees every other one: 90 MiB free
 * in 3 MiB holes beside live blocks. Phase C, on a device of 182 MiB (peak allocated of B x 1.01
 * rounded up to 2 MiB), asks for 60 MiB with 2 MiB left. Each hole holds a whole 2 MiB chunk,
 * which the reclaim gives to the growth; with 20 MiB page chunks (every page holds live blocks)
 * nothing can be given back and the malloc fails (it does on the code before). The live blocks'
 * bytes are intact and no copy was made.
 */
static void frag_scenario(size_t cap_ab, size_t a_mb, size_t b_mb)
{
    start_emu("expandable_segments:True");
    CUstream s1, s2;
    tu_assert_cu(drv->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    cap_device(cap_ab * MiB);

    void *a = must_malloc(a_mb * MiB, s1);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    tu_counts_reset();
    void *b = must_malloc(b_mb * MiB, s2);
    assert_true(tu_call_count("cuMemUnmap") >= 1); /* the growth was refused, then served */
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);

    void *blk[FRAG_N];
    for (int i = 0; i < FRAG_N; i++) {
        blk[i] = must_malloc(FRAG_BLOCK, NULL);
        tu_assert_cu(tu_fill(DPTR(blk[i]), FRAG_BLOCK, (unsigned char)(i + 1)));
    }
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(180 * MiB));
    for (int i = 1; i < FRAG_N; i += 2)
        assert_int_equal(xseg_free(blk[i]), XSEG_SUCCESS);

    cap_device(182 * MiB);
    tu_counts_reset();
    void *c = NULL;
    if (xseg_malloc(&c, 60 * MiB, 0, NULL) != XSEG_SUCCESS)
        fail_msg("xseg_malloc(60 MiB) on a 182 MiB device with 90 MiB free in 3 MiB holes: %s", xseg_last_error());
    check_driver_agrees();
    const char *copies[] = {"cuMemcpyDtoDAsync", "cuMemcpyDtoD", "cuMemcpyDtoH", "cuMemcpyHtoD",
                            "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync"};
    for (size_t k = 0; k < sizeof copies / sizeof copies[0]; k++)
        assert_int_equal(tu_call_count(copies[k]), 0);
    assert_true(tu_call_count("cuMemUnmap") >= 1); /* free chunks inside the holes went to the growth */
    for (int i = 0; i < FRAG_N; i += 2)
        if (!tu_check(DPTR(blk[i]), FRAG_BLOCK, (unsigned char)(i + 1)))
            fail_msg("live block %d lost its bytes", i);
    tu_assert_cu(tu_fill(DPTR(c), 60 * MiB, 0xC5));
    assert_true(tu_check(DPTR(c), 60 * MiB, 0xC5));
    for (int i = 0; i < FRAG_N; i += 2)
        assert_true(tu_check(DPTR(blk[i]), FRAG_BLOCK, (unsigned char)(i + 1)));

    for (int i = 0; i < FRAG_N; i += 2)
        assert_int_equal(xseg_free(blk[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_free(c), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
    tu_assert_cu(drv->cuStreamDestroy(s1));
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* At 1.01 x peak allocated throughout: phase B maps within the device's last eighth. */
static void test_fragmented(void **state)
{
    (void)state;
    frag_scenario(182, 120, 100);
}

/* Phases A and B on a 400 MiB device (B's 180 MiB stays below its last eighth): only the refusal
 * of phase A makes B's chunks small. */
static void test_fragmented_after_refusal(void **state)
{
    (void)state;
    frag_scenario(400, 300, 200);
}

/* Workload for test_small_device: SMALL_N blocks of 4 MiB, a 100 MiB block, every other small
 * block freed, then 40 MiB; peak allocated 180 MiB, its 1.01 x rounded up to 2 MiB is 182 MiB,
 * the emulated device of the small_device tests (CUDAEMU_TOTAL_MEM, set in main). */
#define SMALL_N 20
#define SMALL_BLOCK (4 * MiB)

/* The 20 blocks of 4 MiB, each filled with its own pattern: four 20 MiB pages, or @p pages when
 * placement's S1 gives the 18 with live twins a segment of their own. @return the cuMemCreate
 * calls (chunks) they took. */
static unsigned long small_blocks(void **blk, int64_t pages)
{
    tu_counts_reset();
    for (int i = 0; i < SMALL_N; i++) {
        blk[i] = must_malloc(SMALL_BLOCK, NULL);
        tu_assert_cu(tu_fill(DPTR(blk[i]), SMALL_BLOCK, (unsigned char)(i + 1)));
    }
    assert_int_equal(tu_stat("reserved_bytes.all.current"), pages * (int64_t)(20 * MiB));
    return tu_call_count("cuMemCreate");
}

/* The emulated device's memory. */
static size_t device_total(void)
{
    size_t total = 0;
    tu_assert_cu(drv->cuDeviceTotalMem(&total, 0));
    return total;
}

/*
 * bcrafton's pattern (docs/benchmarks-replay.md) on a device of 1.01 x peak allocated: the 4 MiB
 * blocks are mapped at 0-55 % of the device (below its last eighth, before any refusal), the
 * 100 MiB block fills it, every other 4 MiB block is freed (40 MiB in holes, every page still
 * holding live blocks) and 40 MiB is asked for with 2 MiB of the device left. The pages came in
 * 2 MiB chunks (182 MiB / 512 rounds down to a granule), so the reclaim gives the holes to the
 * growth; with one chunk a page nothing can go back and the malloc fails (it does on the code
 * before). No byte of a live block is copied or moved.
 */
static void test_small_device(void **state)
{
    (void)state;
    start_emu("expandable_segments:True");
    assert_int_equal(device_total(), 182 * MiB);
    void *blk[SMALL_N];
    /* S1 (core/device/placement.h): the first two blocks in one segment's page, the 18 with live
     * twins in four of a segment of their own; 100 MiB in 2 MiB chunks */
    assert_int_equal(small_blocks(blk, 5), 50);
    void *big = must_malloc(100 * MiB, NULL);
    tu_assert_cu(tu_fill(DPTR(big), 100 * MiB, 0xB1));
    for (int i = 1; i < SMALL_N; i += 2)
        assert_int_equal(xseg_free(blk[i]), XSEG_SUCCESS);

    tu_counts_reset();
    void *c = NULL;
    if (xseg_malloc(&c, 40 * MiB, 0, NULL) != XSEG_SUCCESS)
        fail_msg("xseg_malloc(40 MiB) on a 182 MiB device with 40 MiB free in 4 MiB holes: %s", xseg_last_error());
    check_driver_agrees();
    const char *copies[] = {"cuMemcpyDtoDAsync", "cuMemcpyDtoD", "cuMemcpyDtoH", "cuMemcpyHtoD",
                            "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync"};
    for (size_t k = 0; k < sizeof copies / sizeof copies[0]; k++)
        assert_int_equal(tu_call_count(copies[k]), 0);
    assert_true(tu_call_count("cuMemUnmap") >= 1); /* the holes' chunks went to the growth */
    tu_assert_cu(tu_fill(DPTR(c), 40 * MiB, 0xC5));
    for (int i = 0; i < SMALL_N; i += 2)
        if (!tu_check(DPTR(blk[i]), SMALL_BLOCK, (unsigned char)(i + 1)))
            fail_msg("live block %d lost its bytes", i);
    assert_true(tu_check(DPTR(big), 100 * MiB, 0xB1));
    assert_true(tu_check(DPTR(c), 40 * MiB, 0xC5));

    for (int i = 0; i < SMALL_N; i += 2)
        assert_int_equal(xseg_free(blk[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_free(big), XSEG_SUCCESS);
    assert_int_equal(xseg_free(c), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* The blocks of test_small_device take one chunk a page with @p config, on a device of
 * @p device_mib (0: the emulator's, capped at 182 MiB by the memory fraction). */
static void pages_run(const char *config, size_t device_mib)
{
    start_emu(config);
    if (!device_mib)
        cap_device(182 * MiB);
    void *blk[SMALL_N];
    if (small_blocks(blk, 4) != 4)
        fail_msg("%s: 20 blocks of 4 MiB took %lu chunks, not one a page", config, tu_call_count("cuMemCreate"));
    for (int i = 0; i < SMALL_N; i++)
        assert_true(tu_check(DPTR(blk[i]), SMALL_BLOCK, (unsigned char)(i + 1)));
    for (int i = 0; i < SMALL_N; i++)
        assert_int_equal(xseg_free(blk[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_no_leaks();
}

/* On the 182 MiB device, PyTorch's layout (expandable_segments_recycle:False) and
 * expandable_chunk_mb set to the page keep one chunk a page. */
static void test_small_device_pages(void **state)
{
    (void)state;
    pages_run("expandable_segments:True,expandable_segments_recycle:False", 182);
    pages_run("expandable_segments:True,expandable_chunk_mb:20", 182);
}

/* A device of 10 GiB or more (the emulator's 80 GiB) keeps one chunk a page, a small memory
 * fraction too: the rule reads the device's size. */
static void test_large_device_pages(void **state)
{
    (void)state;
    start_emu("expandable_segments:True");
    if (device_total() < ((size_t)10 << 30))
        skip(); /* CUDAEMU_TOTAL_MEM made the emulated device small */
    pages_run("expandable_segments:True", 0);
}

/*
 * A training step's shape, TS_STEPS times: TS_LAYERS layers of weights (25 and 100 MiB, kept), a
 * forward pass allocating six activations a layer, a backward pass freeing them in reverse and,
 * in the first step, allocating each weight's gradient (kept) beside a 33 MiB temporary, then an
 * optimizer step with two states per weight (the first step; kept) and a temporary of the
 * weight's size. Sizes in MiB. The workload of test_training_step.
 */
#define TS_LAYERS 4
#define TS_STEPS 3
#define TS_NW 4
#define TS_NA 6
#define TS_TMP 33
#define TS_EDGE (2 * MiB) /* the bytes filled and checked at each end of a kept block */
static const size_t ts_wts[TS_NW] = {25, 100, 25, 25};
static const size_t ts_acts[TS_NA] = {35, 45, 120, 30, 50, 20};

struct ts_run {
    bool dry; /* only count: the peak of allocated bytes */
    size_t cur, peak, dev;
    void *keep[4][TS_LAYERS][TS_NW]; /* weights, gradients, the two optimizer states */
    int step;
};

/* A block of @p mib MiB; a kept one (@p kind >= 0) is filled at both ends with its own tag. */
static void *ts_alloc(struct ts_run *r, size_t mib, int kind, int layer, int j)
{
    void *p = (void *)(uintptr_t)1;
    r->cur += mib * MiB;
    r->peak = XSEG_MAX(r->peak, r->cur);
    if (!r->dry && xseg_malloc(&p, mib * MiB, 0, NULL) != XSEG_SUCCESS)
        fail_msg("training step %d: xseg_malloc(%zu MiB) on a device of 1.01 x peak allocated (%zu MiB): %s", r->step,
                 mib, r->dev / MiB, xseg_last_error());
    if (kind >= 0) {
        r->keep[kind][layer][j] = p;
        if (!r->dry) {
            uint32_t tag = (uint32_t)(kind * 64 + layer * TS_NW + j + 1);
            tu_assert_cu(tu_fill(DPTR(p), TS_EDGE, tag));
            tu_assert_cu(tu_fill(DPTR(p) + mib * MiB - TS_EDGE, TS_EDGE, tag));
        }
    }
    return p;
}

static void ts_free(struct ts_run *r, void *p, size_t mib)
{
    r->cur -= mib * MiB;
    if (!r->dry)
        assert_int_equal(xseg_free(p), XSEG_SUCCESS);
}

static void ts_workload(struct ts_run *r)
{
    void *act[TS_LAYERS][TS_NA];
    for (int i = 0; i < TS_LAYERS; i++)
        for (int j = 0; j < TS_NW; j++)
            ts_alloc(r, ts_wts[j], 0, i, j);
    for (r->step = 0; r->step < TS_STEPS; r->step++) {
        for (int i = 0; i < TS_LAYERS; i++)
            for (int k = 0; k < TS_NA; k++)
                act[i][k] = ts_alloc(r, ts_acts[k], -1, 0, 0);
        for (int i = TS_LAYERS - 1; i >= 0; i--) {
            for (int k = TS_NA - 1; k >= 0; k--) {
                ts_free(r, act[i][k], ts_acts[k]);
                if (k >= TS_NW)
                    continue;
                if (r->step == 0)
                    ts_alloc(r, ts_wts[k], 1, i, k);
                ts_free(r, ts_alloc(r, TS_TMP, -1, 0, 0), TS_TMP);
            }
        }
        for (int i = 0; i < TS_LAYERS; i++) {
            for (int j = 0; j < TS_NW; j++) {
                if (r->step == 0) {
                    ts_alloc(r, ts_wts[j], 2, i, j);
                    ts_alloc(r, ts_wts[j], 3, i, j);
                }
                ts_free(r, ts_alloc(r, ts_wts[j], -1, 0, 0), ts_wts[j]);
            }
        }
    }
}

/*
 * Issue 33's lever, lifetime placement: on a device of 1.01 x peak allocated (capped by the
 * memory fraction, so one chunk a page), a training step whose gradients and optimizer states,
 * allocated while the backward pass frees activations, would sit in the activations' holes with
 * best fit and pin pages between them (the fullstep traces' pattern, docs/benchmarks-replay.md).
 * Predicted long-lived (core/device/placement.h, L1), they are carved from the top of the free range instead,
 * and the three steps fit (the code before fails a 20 MiB activation of the second step). No live
 * byte is copied: no copy call, and every kept block's ends keep their pattern.
 */
static void test_training_step(void **state)
{
    (void)state;
    struct ts_run r = {.dry = true};
    ts_workload(&r);
    size_t gran = 2 * MiB, dev = (r.peak + r.peak / 100 + gran - 1) / gran * gran;
    start_emu("expandable_segments:True");
    cap_device(dev);
    r = (struct ts_run){.dry = false, .dev = dev};
    tu_counts_reset();
    ts_workload(&r);
    /* No device-to-device copy (the fills write from the host). */
    assert_int_equal(tu_call_count("cuMemcpyDtoDAsync") + tu_call_count("cuMemcpyDtoD"), 0);
    check_driver_agrees();
    for (int kind = 0; kind < 4; kind++)
        for (int i = 0; i < TS_LAYERS; i++)
            for (int j = 0; j < TS_NW; j++) {
                void *p = r.keep[kind][i][j];
                uint32_t tag = (uint32_t)(kind * 64 + i * TS_NW + j + 1);
                if (!tu_check(DPTR(p), TS_EDGE, tag) || !tu_check(DPTR(p) + ts_wts[j] * MiB - TS_EDGE, TS_EDGE, tag))
                    fail_msg("kept block %d/%d/%d at %p lost its bytes", kind, i, j, p);
                assert_int_equal(xseg_free(p), XSEG_SUCCESS);
            }
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/*
 * The placement itself, by addresses: 16 pages (a new segment's reserve) hold an 80 MiB block, four
 * live 25 MiB twins, then
 * A (60 MiB), B, C (60 MiB), D; A and C freed, then 40 small blocks, so that frees lead the last
 * 64 mallocs and frees. A fifth 25 MiB request is predicted long-lived (core/device/placement.h, L1): it takes
 * the top of the highest fitting free block, C's hole (best fit would take A's front). A request
 * of another byte count has no live twins: best fit, the front of what is left of C's hole.
 */
struct top_layout {
    void *f, *k[4], *a, *b, *c, *e; /* A and C freed */
};

/* The layout above, up to the run of frees that leads the window. */
static void top_layout(const char *config, struct top_layout *t)
{
    start_emu(config);
    void *small[40];
    for (int i = 0; i < 40; i++)
        small[i] = must_malloc(512 << 10, NULL);
    t->f = must_malloc(80 * MiB, NULL);
    for (int i = 0; i < 4; i++)
        t->k[i] = must_malloc(25 * MiB, NULL);
    t->a = must_malloc(60 * MiB, NULL), t->b = must_malloc(10 * MiB, NULL);
    t->c = must_malloc(60 * MiB, NULL), t->e = must_malloc(10 * MiB, NULL);
    assert_ptr_equal(t->e, (char *)t->f + 310 * MiB); /* one segment, in address order, no free tail */
    assert_int_equal(tu_stat("reserved_bytes.large_pool.current"), (int64_t)(320 * MiB));
    assert_int_equal(xseg_free(t->a), XSEG_SUCCESS);
    assert_int_equal(xseg_free(t->c), XSEG_SUCCESS);
    for (int i = 0; i < 40; i++)
        assert_int_equal(xseg_free(small[i]), XSEG_SUCCESS);
}

static void top_placement(const char *config, bool top)
{
    struct top_layout t;
    top_layout(config, &t);
    void *f = t.f, **k = t.k, *a = t.a, *b = t.b, *c = t.c, *e = t.e;

    void *q = must_malloc(25 * MiB, NULL);
    void *want = top ? (char *)c + 35 * MiB : a; /* without the placement, best fit: A's front */
    if (q != want)
        fail_msg("%s: a request with four live twins after a run of frees went to %p, not %p (A %p, C %p)", config, q,
                 want, a, c);
    void *r = must_malloc(25 * MiB - 512, NULL);
    /* best fit: the 35 MiB left of C's hole (of A's without the placement), from its front */
    assert_ptr_equal(r, top ? c : (char *)a + 25 * MiB);
    assert_int_equal(tu_stat("reserved_bytes.large_pool.current"), (int64_t)(320 * MiB)); /* no growth */

    void *all[] = {f, k[0], k[1], k[2], k[3], b, e, q, r};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        assert_int_equal(xseg_free(all[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

static void test_top_placement(void **state)
{
    (void)state;
    top_placement("expandable_segments:True", true);
}

/*
 * empty_cache starts L1's window over (core/device/placement.h, place_phase_reset): the same run of
 * frees as top_placement's, then empty_cache, then a request with four live twins. Before the reset
 * the window still said frees lead and the request took the top of the highest fitting free
 * range; now it is best fit, as on a new device, until frees lead again.
 */
static void test_top_placement_empty_cache(void **state)
{
    (void)state;
    struct top_layout t;
    top_layout("expandable_segments:True", &t);
    void *f = t.f, **k = t.k, *a = t.a, *b = t.b, *c = t.c, *e = t.e;
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    void *q = must_malloc(25 * MiB, NULL);
    if (q != a) /* best fit: A's front (before the reset: 15 MiB above it) */
        fail_msg("after empty_cache a request with four live twins went to %p, not A's front %p (C %p)", q, a, c);
    void *all[] = {f, k[0], k[1], k[2], k[3], b, e, q};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        assert_int_equal(xseg_free(all[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* expandable_segments_recycle:False keeps PyTorch's layout: best fit for every request. */
static void test_top_placement_off(void **state)
{
    (void)state;
    top_placement("expandable_segments:True,expandable_segments_recycle:False", false);
}

/*
 * S1 (core/device/placement.h), by addresses: four requests of one byte count X kept live, a
 * request of another count (an "activation") after the second. The first two have no live
 * twins yet and, like the activation, take the first segment from its front. On a device under
 * 10 GiB (@p small) the third and fourth, whose last blocks are live, go to a segment of their own,
 * one after the other; the activation's hole is then reused by another request of its count,
 * and a freed block of the class is left to the class (a request of a new count goes to the first
 * segment). On a larger device best fit keeps all of them in the first segment in order.
 */
static void class_segments(bool small)
{
    start_emu("expandable_segments:True");
    const size_t X = 1152 * 1024, Y = 1536 * 1024; /* 1.125 MiB weight casts, 1.5 MiB activations */
    char *c0 = must_malloc(X, NULL), *c1 = must_malloc(X, NULL), *act = must_malloc(Y, NULL);
    assert_ptr_equal(c1, c0 + X);
    assert_ptr_equal(act, c1 + X);
    char *c2 = must_malloc(X, NULL), *c3 = must_malloc(X, NULL);
    if (!small) {
        assert_ptr_equal(c2, act + Y); /* best fit: the first segment's free rest, in order */
        assert_ptr_equal(c3, c2 + X);
    } else {
        /* not in the first segment's page (it starts at c0), but together in one of their own */
        if (c2 >= c0 && c2 < c0 + 20 * MiB)
            fail_msg("a request with two live twins went to %p, in the first segment's page at %p", (void *)c2,
                     (void *)c0);
        assert_ptr_equal(c3, c2 + X);
        assert_int_equal(tu_stat("reserved_bytes.large_pool.current"), (int64_t)(40 * MiB));
    }
    assert_int_equal(xseg_free(act), XSEG_SUCCESS);
    char *a2 = must_malloc(Y, NULL);
    assert_ptr_equal(a2, act); /* the activation's hole, for an activation */
    assert_int_equal(xseg_free(c3), XSEG_SUCCESS);
    char *n = must_malloc(X - 512, NULL); /* a new byte count: no twins */
    assert_ptr_equal(n, small ? a2 + Y : c3); /* small: not the class's free space */

    char *all[] = {c0, c1, c2, a2, n};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        assert_int_equal(xseg_free(all[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* On a 64 MiB device (CUDAEMU_TOTAL_MEM, set in main): segments by class. */
static void test_class_segments(void **state)
{
    (void)state;
    class_segments(true);
}

/*
 * S1's exception, by addresses on a 64 MiB device: a byte count one of whose blocks was freed while it
 * was the newest of its count (a temporary, as activations of a shared size are) never takes the
 * class's segments, though six of its blocks are live together after: best fit keeps them in one
 * segment, in order, and nothing more is mapped. (Before the exception the fifth and sixth,
 * whose last four blocks were live, went to a segment of their own.)
 */
static void test_class_short(void **state)
{
    (void)state;
    start_emu("expandable_segments:True");
    const size_t X = 1152 * 1024;
    char *t = must_malloc(X, NULL);
    assert_int_equal(xseg_free(t), XSEG_SUCCESS); /* the newest of its count: X is short from now on */
    /* the free as the device lock sees it (a malloc of the same count would take the block back from
     * the thread's slot, unseen by the placement) */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    char *c[6];
    for (int i = 0; i < 6; i++) {
        c[i] = must_malloc(X, NULL);
        if (c[i] != c[0] + (size_t)i * X) /* one segment's front, in order */
            fail_msg("block %d at %p, the first at %p", i, (void *)c[i], (void *)c[0]);
    }
    assert_int_equal(tu_stat("reserved_bytes.large_pool.current"), (int64_t)(20 * MiB));
    for (int i = 0; i < 6; i++)
        assert_int_equal(xseg_free(c[i]), XSEG_SUCCESS);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

/* On the emulator's default device (80 GiB): no classes, best fit (L1 predicts nothing here). */
static void test_class_segments_large(void **state)
{
    (void)state;
    class_segments(false);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kept_handles),
        cmocka_unit_test(test_kept_handles_faults),
        cmocka_unit_test(test_granules),
        cmocka_unit_test(test_fragmented),
        cmocka_unit_test(test_fragmented_after_refusal),
        cmocka_unit_test(test_small_device),
        cmocka_unit_test(test_small_device_pages),
        cmocka_unit_test(test_large_device_pages),
        cmocka_unit_test(test_training_step),
        cmocka_unit_test(test_top_placement),
        cmocka_unit_test(test_top_placement_off),
        cmocka_unit_test(test_top_placement_empty_cache),
        cmocka_unit_test(test_class_segments),
        cmocka_unit_test(test_class_segments_large),
        cmocka_unit_test(test_class_short),
    };
    /* Before the emulator starts: the small_device tests' device is 182 MiB. */
    if (argc > 1 && strncmp(argv[1], "test_small_device", 17) == 0)
        setenv("CUDAEMU_TOTAL_MEM", "182M", 1);
    if (argc > 1 && (strcmp(argv[1], "test_class_segments") == 0 || strcmp(argv[1], "test_class_short") == 0))
        setenv("CUDAEMU_TOTAL_MEM", "64M", 1);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
