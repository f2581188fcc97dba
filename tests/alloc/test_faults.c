/*
 * Faults and misuse: driver failures that used to lose memory or hand out memory that
 * faults, and hostile input. Each test drives xseg through its public API, injects driver
 * failures with cudaemu (tests needing that skip on a real GPU), and checks the effect: data,
 * statistics against a snapshot walk, and the driver's live handles.
 *
 * argv[1] names one test (meson runs one process per test, so a failure cannot leave blocks
 * behind for the next); without it every test runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include "tests/alloc/fixture.h"
#include "tests/common/testutil.h"
#include "xseg.h"

static void must_contain(const char *what)
{
    if (!strstr(xseg_last_error(), what))
        fail_msg("message \"%s\" lacks \"%s\"", xseg_last_error(), what);
}

/* Everything freed by the caller: empty_cache gives all of it back. */
static void check_all_returned(void)
{
    check_consistent();
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    check_no_leaks();
}

static long maxrss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

#define PAGE (20 * MiB) /* the large pool's expandable page */

/* Every page of [p, p + size) can be read and written by the device, its first and last byte. */
static void check_writable(void *p, size_t size)
{
    if (!tu_emulated())
        return;
    for (size_t off = 0; off < size; off += PAGE) {
        size_t len = size - off < PAGE ? size - off : PAGE;
        CUdeviceptr at = (CUdeviceptr)(uintptr_t)p + off;
        if (!tu_device_accessible(at) || !tu_device_accessible(at + len - 1))
            fail_msg("page %p + %zu MiB is not mapped with access", p, off / MiB);
    }
}

/* reserved_bytes is what the driver maps for xseg. */
static void check_reserved_is_mapped(void)
{
    struct cudaemu_live live;
    if (tu_live(&live) && (int64_t)live.mapped_bytes != tu_stat("reserved_bytes.all.current"))
        fail_msg("reserved_bytes %lld, but the driver maps %zu bytes",
                 (long long)tu_stat("reserved_bytes.all.current"), live.mapped_bytes);
}

/* ---- 1. pages left mapped by a failed rollback never fault -------------------------------- */

/* A live 10 MiB block holds page 0 of the segment, so the segment survives the OOM path. An
 * 80 MiB request then needs pages 1..4: cuMemCreate fails for page 4, and the rollback's
 * unmap of page 1 fails (also @p unmap_fails - 1 later unmaps: the retry in the OOM path). */
static void rollback_unmap_fails(int unmap_fails)
{
    start_emu("expandable_segments:True");
    void *live = tu_malloc(10 * MiB, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)live, 10 * MiB, 9));
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)PAGE);
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemCreate", 4, CUDA_ERROR_OUT_OF_MEMORY));
    for (int k = 0; k < unmap_fails; k++)
        assert_true(tu_fail("cuMemUnmap", 1 + 3 * (unsigned long)k, CUDA_ERROR_UNKNOWN));
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, 80 * MiB, 0, NULL);
    tu_assert_fired_n(fired, 1ul + (unsigned long)unmap_fails, "rollback with %d unmap failures", unmap_fails);
    tu_fail_clear();
    /* The OOM path's retry serves it (the injected OOM was one call). */
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_malloc(80 MiB): %s", xseg_last_error());
    assert_ptr_equal(p, (char *)live + 10 * MiB);
    /* The retry under pressure maps only the granules the request needs: [20, 90) MiB. */
    check_writable((char *)live + PAGE, 3 * PAGE + 10 * MiB);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p, 80 * MiB, 10));
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)(4 * PAGE + 10 * MiB));
    check_reserved_is_mapped();
    check_consistent();
    assert_true(tu_check((CUdeviceptr)(uintptr_t)live, 10 * MiB, 9));
    tu_free(p);
    tu_free(live);
    check_all_returned();
}

static void test_rollback_unmap_fails(void **state)
{
    (void)state;
    rollback_unmap_fails(1); /* the OOM path's reclaim unmaps the stranded page */
}

static void test_rollback_unmap_fails_twice(void **state)
{
    (void)state;
    rollback_unmap_fails(2); /* it stays stranded: the retry maps over it, granting access */
}

/* A failed map with a stranded page, then nothing else: the next empty_cache gives it back. */
static void test_rollback_stranded_reclaimed(void **state)
{
    (void)state;
    /* The defragmenting step would serve the request from the live page's free half
     * (tests/alloc/test_defrag.c); here the failure must reach the OOM report. */
    start_emu("expandable_segments:True,expandable_segments_defrag:False");
    void *live = tu_malloc(10 * MiB, NULL);
    /* Fail the create of page 4 in the first try and of the retry, so the malloc fails. */
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemCreate", 4, CUDA_ERROR_OUT_OF_MEMORY));
    assert_true(tu_fail("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN));
    assert_true(tu_fail("cuMemUnmap", 4, CUDA_ERROR_UNKNOWN)); /* the OOM path's reclaim */
    assert_true(tu_fail("cuMemCreate", 7, CUDA_ERROR_OUT_OF_MEMORY)); /* page 4 of the retry */
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, 80 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    tu_assert_fired_n(fired, 4, "stranded page");
    tu_fail_clear();
    assert_int_equal(tu_stat("reserved_bytes.all.current"), (int64_t)PAGE);
    check_consistent();
    /* The segment lives on (the live block): empty_cache unmaps the stranded page anyway. */
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_reserved_is_mapped();
    tu_free(live);
    check_all_returned();
}

/* ---- 2. a failed cuMemRelease / cuMemUnmap / cuMemAddressFree is retried, not forgotten ---- */

static void leftover_retried(const char *entry, unsigned long nth)
{
    start_emu("expandable_segments:True");
    void *p = tu_malloc(60 * MiB, NULL);
    tu_free(p);
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail(entry, nth, CUDA_ERROR_UNKNOWN));
    xseg_status st = xseg_empty_cache(0);
    unsigned long calls = tu_call_count(entry);
    (void)calls;
    tu_assert_fired_n(fired, 1, "%s #%lu at empty_cache", entry, nth);
    tu_fail_clear();
    (void)st; /* an unmap failure is reported; a release or address-free failure is kept quietly */
    struct cudaemu_live live;
    assert_true(tu_live(&live));
    if (live.handles + live.reservations + live.mapped_bytes == 0)
        fail_msg("the injected %s failure #%lu changed nothing", entry, nth);
    /* The next reclaim gives it back. */
    check_all_returned();
}

static void test_release_fails(void **state)
{
    (void)state;
    leftover_retried("cuMemRelease", 2);
}

static void test_address_free_fails(void **state)
{
    (void)state;
    leftover_retried("cuMemAddressFree", 1);
}

static void test_unmap_fails(void **state)
{
    (void)state;
    leftover_retried("cuMemUnmap", 1);
}

/* The rollback's own cuMemRelease fails: the handle is kept and released at the next reclaim. */
static void test_rollback_release_fails(void **state)
{
    (void)state;
    start_emu("expandable_segments:True,expandable_segments_defrag:False"); /* as above: the OOM report */
    void *live = tu_malloc(10 * MiB, NULL);
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuMemCreate", 4, CUDA_ERROR_OUT_OF_MEMORY));
    assert_true(tu_fail("cuMemCreate", 7, CUDA_ERROR_OUT_OF_MEMORY));
    assert_true(tu_fail("cuMemRelease", 1, CUDA_ERROR_UNKNOWN));
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, 80 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    tu_assert_fired_n(fired, 3, "rollback release");
    tu_fail_clear();
    check_reserved_is_mapped();
    check_consistent();
    tu_free(live);
    check_all_returned();
}

/* ---- 5. impossible sizes are refused before any work ---------------------------------------- */

static void impossible_sizes(const char *config)
{
    start(config);
    size_t dfree = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&dfree, &total));
    /* A cached block must survive: a request that can never fit is no reason to empty the
     * cache (the OOM path would release it and retry). */
    void *cached = tu_malloc(24 * MiB, NULL);
    tu_free(cached);
    int64_t reserved = tu_stat("reserved_bytes.all.current");
    int64_t retries = tu_stat("num_alloc_retries"), ooms = tu_stat("num_ooms");
    assert_true(reserved > 0);
    long rss = maxrss_kib();
    const size_t sizes[] = {total + 1, total + 64 * MiB, (size_t)1 << 50, (size_t)1 << 54, (size_t)1 << 62,
                            ((size_t)1 << 62) + 1, SIZE_MAX - 4096, SIZE_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = (void *)1;
        xseg_status st = xseg_malloc(&p, sizes[i], 0, NULL);
        if (st != XSEG_ERROR_OUT_OF_MEMORY)
            fail_msg("xseg_malloc(%zu) returned %s: %s", sizes[i], xseg_status_name(st), xseg_last_error());
        assert_null(p);
        must_contain("exceeds the device's total memory");
        if (tu_stat("reserved_bytes.all.current") != reserved)
            fail_msg("xseg_malloc(%zu) released cached memory: reserved %lld, was %lld", sizes[i],
                     (long long)tu_stat("reserved_bytes.all.current"), (long long)reserved);
        assert_int_equal(tu_stat("num_alloc_retries"), retries);
        assert_int_equal(tu_stat("num_ooms"), ooms + (int64_t)i + 1);
        /* No metadata sized for the request (2^54 bytes of 20 MiB pages: 7 GiB of page tables). */
        if (maxrss_kib() - rss > 64 * 1024)
            fail_msg("xseg_malloc(%zu) grew the peak RSS by %ld KiB", sizes[i], maxrss_kib() - rss);
    }
    /* The same through the memory fraction: what exceeds the allowed share never fits. */
    assert_int_equal(xseg_set_memory_fraction(0.5, 0), XSEG_SUCCESS);
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, total / 2 + 64 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    /* Still usable, and the cached block is the one handed out. */
    void *again = tu_malloc(24 * MiB, NULL);
    assert_ptr_equal(again, cached);
    tu_free(again);
    check_all_returned();
}

static void test_impossible_sizes_expandable(void **state)
{
    (void)state;
    impossible_sizes("expandable_segments:True");
}

static void test_impossible_sizes_classic(void **state)
{
    (void)state;
    impossible_sizes("expandable_segments:False");
}

/* ---- 4. memory cached for a destroyed stream can be released ------------------------------- */

static void destroyed_stream(const char *config)
{
    start(config);
    CUstream s;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *small = tu_malloc(4096, s), *large = tu_malloc(30 * MiB, s);
    void *keep = tu_malloc(5 * MiB, NULL); /* a live block on another stream stays put */
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)keep, 5 * MiB, 77));
    tu_free(small);
    tu_free(large);
    tu_assert_cu(drv->cuStreamDestroy(s));
    /* The segment's stream is gone: unmapping must wait some other way, not fail forever. */
    if (xseg_empty_cache(0) != XSEG_SUCCESS)
        fail_msg("empty_cache with a destroyed stream's cache: %s", xseg_last_error());
    check_consistent();
    assert_true(tu_check((CUdeviceptr)(uintptr_t)keep, 5 * MiB, 77));
    tu_free(keep);
    check_all_returned();
}

static void test_destroyed_stream_expandable(void **state)
{
    (void)state;
    destroyed_stream("expandable_segments:True");
}

static void test_destroyed_stream_classic(void **state)
{
    (void)state;
    destroyed_stream("expandable_segments:False");
}

/* ---- 3. a driver failure while freeing a record_stream'ed block never loses it -------------- */
/* ---- 6. record_stream refuses a destroyed or bogus stream ---------------------------------- */

/* @p p is pending (its free waits for recorded work): not handed out, shown as pending. */
static bool is_pending(void *p)
{
    xseg_snapshot *s = NULL;
    assert_int_equal(xseg_take_snapshot(0, &s), XSEG_SUCCESS);
    bool pending = false;
    for (size_t i = 0; i < s->nsegments; i++)
        for (size_t j = 0; j < s->segments[i].nblocks; j++)
            if (s->segments[i].blocks[j].address == (uint64_t)(uintptr_t)p)
                pending = s->segments[i].blocks[j].state == XSEG_BLOCK_ACTIVE_PENDING_FREE;
    xseg_snapshot_free(s);
    return pending;
}

static void must_free(void *p)
{
    xseg_status st = xseg_free(p);
    if (st != XSEG_SUCCESS)
        fail_msg("xseg_free of a record_stream'ed block: %s: %s", xseg_status_name(st), xseg_last_error());
    /* The free happened: a second one is a double free. */
    assert_int_equal(xseg_free(p), XSEG_ERROR_INVALID_VALUE);
    must_contain("freed already");
}

static void record_stream_faults(const char *config, size_t size)
{
    start_emu(config);
    CUstream s2, s3;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));

    /* The device's context cannot be made current at the free: nothing can be recorded now. */
    void *p = tu_malloc(size, NULL);
    assert_int_equal(xseg_record_stream(p, s2), XSEG_SUCCESS);
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuCtxGetCurrent", 1, CUDA_ERROR_UNKNOWN));
    must_free(p);
    tu_assert_fired_n(fired, 1, "context at the free");
    tu_fail_clear();
    assert_true(is_pending(p));
    check_consistent();
    check_all_returned();

    /* No event, no stream synchronize, no context synchronize: pending until the driver works
     * again, and not handed out meanwhile (s2 is held: its work is still running). */
    p = tu_malloc(size, NULL);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p, size, 5));
    assert_int_equal(xseg_record_stream(p, s2), XSEG_SUCCESS);
    assert_true(tu_stream_hold(s2));
    fired = tu_fail_fired();
    assert_true(tu_fail("cuEventRecord", 1, CUDA_ERROR_UNKNOWN));
    assert_true(tu_fail("cuStreamSynchronize", 1, CUDA_ERROR_UNKNOWN));
    assert_true(tu_fail("cuCtxSynchronize", 1, CUDA_ERROR_UNKNOWN));
    must_free(p);
    tu_assert_fired_n(fired, 3, "no event, no synchronize");
    tu_fail_clear();
    assert_true(is_pending(p));
    void *q = tu_malloc(size, NULL); /* retries the recording: an event on held s2 */
    assert_ptr_not_equal(q, p);
    assert_true(is_pending(p));
    assert_true(tu_check((CUdeviceptr)(uintptr_t)p, size, 5)); /* nobody wrote it */
    tu_free(q);
    check_consistent();
    assert_true(tu_stream_release(s2));
    check_all_returned();

    /* A recorded stream destroyed after the free: the events recorded at the free are xseg's
     * own, so nothing names the stream again (a call with a destroyed stream faults: cudaemu, as
     * the driver crashed on one). */
    tu_assert_cu(drv->cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING));
    p = tu_malloc(size, NULL);
    assert_int_equal(xseg_record_stream(p, s3), XSEG_SUCCESS);
    tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p, size, 6));
    must_free(p);
    tu_assert_cu(drv->cuStreamDestroy(s3));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    check_all_returned();

    /* record_stream itself refuses a handle the driver does not know (cudaemu's answer for one it
     * never made; a destroyed stream is the program's error, undefined on the driver), and
     * records nothing. */
    p = tu_malloc(size, NULL);
    assert_int_equal(xseg_record_stream(p, (CUstream)(uintptr_t)0x5eed0), XSEG_ERROR_INVALID_VALUE);
    must_contain("0x5eed0");
    must_contain("is not a stream");
    assert_int_equal(xseg_record_stream(p, NULL), XSEG_SUCCESS); /* its own stream: nothing to do */
    assert_int_equal(xseg_record_stream(p, s2), XSEG_SUCCESS);
    assert_int_equal(xseg_record_stream(p, s2), XSEG_SUCCESS);   /* twice: once */
    must_free(p);
    check_all_returned();
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

static void test_record_stream_faults_expandable(void **state)
{
    (void)state;
    record_stream_faults("expandable_segments:True", 12 * MiB);
}

static void test_record_stream_faults_classic(void **state)
{
    (void)state;
    record_stream_faults("expandable_segments:False", 4096);
}

/* ---- 6. the config in force keeps its rules; config errors show what was typed ----------- */

static void no_invisible_bytes(void)
{
    for (const unsigned char *c = (const unsigned char *)xseg_last_error(); *c; c++)
        if (*c < 0x20 || *c >= 0x7f)
            fail_msg("message \"%s\" holds the byte 0x%02X", xseg_last_error(), *c);
}

static void test_config_misuse(void **state)
{
    (void)state;
    start("expandable_segments:True");
    /* Two strings each valid alone must not combine into a config that breaks its own rules. */
    assert_int_equal(xseg_set_config("max_non_split_rounding_mb:64"), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config("large_segment_size_mb:80"), XSEG_ERROR_INVALID_VALUE);
    must_contain("max_non_split_rounding_mb");
    char buf[1024];
    size_t len = 0;
    assert_int_equal(xseg_get_config(buf, sizeof buf, &len), XSEG_SUCCESS);
    if (xseg_set_config(buf) != XSEG_SUCCESS)
        fail_msg("xseg_get_config's \"%s\" refused: %s", buf, xseg_last_error());
    assert_int_equal(xseg_set_config("large_segment_size_mb:80,max_non_split_rounding_mb:80"), XSEG_SUCCESS);
    assert_int_equal(xseg_get_config(buf, sizeof buf, &len), XSEG_SUCCESS);
    assert_int_equal(xseg_set_config(buf), XSEG_SUCCESS);

    /* Invisible characters are shown escaped. */
    assert_int_equal(xseg_set_config("\xEF\xBB\xBF" "expandable_segments:True"), XSEG_ERROR_INVALID_VALUE);
    must_contain("\\xEF\\xBB\\xBF");
    no_invisible_bytes();
    assert_int_equal(xseg_set_config("expandable_segments:True,\x01max_split_size_mb:64"), XSEG_ERROR_INVALID_VALUE);
    must_contain("\\x01");
    no_invisible_bytes();

    /* An unknown key near a known one suggests it; a far one does not. */
    assert_int_equal(xseg_set_config("max_split_size_mbb:64"), XSEG_ERROR_INVALID_VALUE);
    must_contain("did you mean 'max_split_size_mb'?");
    assert_int_equal(xseg_set_config("expandable_segment:True"), XSEG_ERROR_INVALID_VALUE);
    must_contain("did you mean 'expandable_segments'?");
    assert_int_equal(xseg_set_config("zzz:1"), XSEG_ERROR_INVALID_VALUE);
    if (strstr(xseg_last_error(), "did you mean"))
        fail_msg("a far key got a suggestion: %s", xseg_last_error());
    assert_int_equal(xseg_set_config("expandable_segments:True"), XSEG_SUCCESS);
}

/* ---- capture driver calls failing (found by the fault sweep) -------------------------------- */

/* The pool of the segment holding @p p. */
static xseg_pool_id pool_of(void *p)
{
    xseg_snapshot *s = NULL;
    assert_int_equal(xseg_take_snapshot(0, &s), XSEG_SUCCESS);
    xseg_pool_id id = {UINT64_MAX, UINT64_MAX};
    uint64_t a = (uint64_t)(uintptr_t)p;
    for (size_t i = 0; i < s->nsegments; i++)
        if (a >= s->segments[i].address && a < s->segments[i].address + s->segments[i].total_size)
            id = (xseg_pool_id){s->segments[i].pool_id[0], s->segments[i].pool_id[1]};
    xseg_snapshot_free(s);
    return id;
}

/* Fork @p side off @p s (it joins the capture), or join it back with the arguments swapped. */
static void stream_wait(CUstream dst, CUstream src)
{
    CUevent e;
    tu_assert_cu(drv->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    tu_assert_cu(drv->cuEventRecord(e, src));
    tu_assert_cu(drv->cuStreamWaitEvent(dst, e, 0));
    tu_assert_cu(drv->cuEventDestroy(e));
}

static void capture_done(CUstream s, CUstream side, xseg_pool_id pool, void *keep)
{
    CUgraph g = NULL;
    if (xseg_capture_end(0, s, &g) != XSEG_SUCCESS)
        fail_msg("xseg_capture_end: %s (the capture was invalidated)", xseg_last_error());
    assert_non_null(g);
    tu_assert_cu(drv->cuGraphDestroy(g));
    if (keep)
        tu_free(keep);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    tu_assert_cu(drv->cuStreamDestroy(side));
    tu_assert_cu(drv->cuStreamDestroy(s));
    check_all_returned();
}

/* The capture id cannot be read right after cuStreamBeginCapture: a stream that joins the capture
 * still allocates from the capture's pool (it used to be refused: no pool matched it). */
static void test_capture_id_unread(void **state)
{
    (void)state;
    start_emu("expandable_segments:True");
    CUstream s, side;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool = {0, 0};
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuStreamGetCaptureInfo", 1, CUDA_ERROR_UNKNOWN));
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    tu_assert_fired_n(fired, 1, "cuStreamGetCaptureInfo");
    tu_fail_clear();
    stream_wait(side, s);
    void *p = NULL;
    if (xseg_malloc(&p, 1 * MiB, 0, side) != XSEG_SUCCESS)
        fail_msg("allocation on a stream that joined the capture: %s", xseg_last_error());
    xseg_pool_id got = pool_of(p);
    assert_true(got.first == pool.first && got.second == pool.second);
    stream_wait(s, side);
    capture_done(s, side, pool, p);
}

/* Classic mode: the switch to relaxed capture mode around cuMemAlloc fails. The allocation fails
 * with a driver error naming the call, and the capture stays valid (cuMemAlloc in GLOBAL mode
 * used to invalidate it). */
static void test_capture_mode_switch_fails(void **state)
{
    (void)state;
    start_emu("expandable_segments:False");
    CUstream s, side;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuThreadExchangeStreamCaptureMode", 1, CUDA_ERROR_UNKNOWN));
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, 4 * MiB, 0, s), XSEG_ERROR_DRIVER);
    must_contain("cuThreadExchangeStreamCaptureMode");
    tu_assert_fired_n(fired, 1, "cuThreadExchangeStreamCaptureMode");
    tu_fail_clear();
    p = tu_malloc(4 * MiB, s);
    capture_done(s, side, pool, p);
}

/* cuStreamEndCapture fails and the capture stays open: xseg keeps routing it, says so, and a
 * second xseg_capture_end ends it with its graph (the route used to be dropped, leaving the
 * capture without a pool). */
static void test_capture_end_fails(void **state)
{
    (void)state;
    start_emu("expandable_segments:True");
    CUstream s, side;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    tu_assert_cu(drv->cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    xseg_pool_id pool = {0, 0};
    assert_int_equal(xseg_capture_begin(0, s, &pool, CU_STREAM_CAPTURE_MODE_GLOBAL), XSEG_SUCCESS);
    void *a = tu_malloc(1 * MiB, s);
    CUgraph g = NULL;
    unsigned long fired = tu_fail_fired();
    assert_true(tu_fail("cuStreamEndCapture", 1, CUDA_ERROR_UNKNOWN));
    assert_int_equal(xseg_capture_end(0, s, &g), XSEG_ERROR_DRIVER);
    tu_assert_fired_n(fired, 1, "cuStreamEndCapture");
    tu_fail_clear();
    assert_null(g);
    must_contain("still open");
    void *b = tu_malloc(1 * MiB, s); /* still routed to the capture's pool */
    xseg_pool_id got = pool_of(b);
    assert_true(got.first == pool.first && got.second == pool.second);
    tu_free(b);
    tu_free(a);
    capture_done(s, side, pool, NULL);
}

/* ---- main ---------------------------------------------------------------------------------- */

static const struct tu_named_test all_tests[] = {
    TU_NAMED(test_rollback_unmap_fails),
    TU_NAMED(test_rollback_unmap_fails_twice),
    TU_NAMED(test_rollback_stranded_reclaimed),
    TU_NAMED(test_release_fails),
    TU_NAMED(test_address_free_fails),
    TU_NAMED(test_unmap_fails),
    TU_NAMED(test_rollback_release_fails),
    TU_NAMED(test_impossible_sizes_expandable),
    TU_NAMED(test_impossible_sizes_classic),
    TU_NAMED(test_config_misuse),
    TU_NAMED(test_destroyed_stream_expandable),
    TU_NAMED(test_destroyed_stream_classic),
    TU_NAMED(test_record_stream_faults_expandable),
    TU_NAMED(test_record_stream_faults_classic),
    TU_NAMED(test_capture_id_unread),
    TU_NAMED(test_capture_mode_switch_fails),
    TU_NAMED(test_capture_end_fails),
};

int main(int argc, char **argv)
{
    return tu_run_named("faults", all_tests, sizeof all_tests / sizeof all_tests[0], argc, argv);
}
