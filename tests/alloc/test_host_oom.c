/*
 * Host OOM for a block's side struct (core/index/block.h: record_stream's streams, events, the history
 * stack live there, allocated on demand) and whatever else the call allocates: each host
 * allocation of the call fails in turn (base/hostmem.h, the seam: the nth from now), and the call
 * returns XSEG_ERROR_OUT_OF_MEMORY with a message, with everything rolled back: the statistics as
 * before, the block freed as an unrecorded one, nothing leaked (debug_level=2 builds run
 * dev_check after every operation). n goes up until the call makes fewer than n allocations.
 * Also xseg_block_handles' hold and a block placed by xseg_pool_malloc_at with history on.
 * tests/alloc/test_host_oom_sweep.c does the same for every call of a mixed workload.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/hostmem.h"
#include "tests/alloc/fixture.h"
#include "tests/common/testutil.h"
#include "xseg.h"

static int setup(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    return 0;
}

/* record_stream on a live block, its nth host allocation failing: OUT_OF_MEMORY and no stream
 * recorded (the free is immediate even with s2 busy); past the last, the call succeeds and the
 * free waits for the stream. */
static void test_record_stream(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    CUstream s2;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    int ooms = 0;
    for (unsigned long n = 1;; n++) {
        void *a = NULL;
        assert_int_equal(xseg_malloc(&a, 4096, 0, NULL), XSEG_SUCCESS);
        int64_t active = tu_stat("active_bytes.all.current"), req = tu_stat("requested_bytes.all.current");
        xseg_status st;
        bool hit;
        HOST_OOM_CALL(n, st, hit, xseg_record_stream(a, s2));
        if (st == XSEG_ERROR_OUT_OF_MEMORY) {
            ooms++;
            assert_int_equal(tu_stat("active_bytes.all.current"), active);
            assert_int_equal(tu_stat("requested_bytes.all.current"), req);
            /* Not recorded: the free returns the block at once, even with s2 busy. */
            assert_true(tu_stream_hold(s2));
            assert_int_equal(xseg_free(a), XSEG_SUCCESS);
            assert_int_equal(tu_stat("active_bytes.all.current"), active - 4096);
            assert_int_equal(tu_stat("requested_bytes.all.current"), req - 4096);
            assert_true(tu_stream_release(s2));
            continue;
        }
        assert_int_equal(st, XSEG_SUCCESS);
        /* With memory: recorded, and the free waits for s2. */
        assert_true(tu_stream_hold(s2));
        assert_int_equal(xseg_free(a), XSEG_SUCCESS);
        assert_int_equal(tu_stat("active_bytes.all.current"), active); /* pending */
        assert_true(tu_stream_release(s2));
        void *b = NULL;
        assert_int_equal(xseg_malloc(&b, 4096, 0, NULL), XSEG_SUCCESS); /* polls the event */
        assert_int_equal(xseg_free(b), XSEG_SUCCESS);
        assert_int_equal(tu_stat("active_bytes.all.current"), active - 4096);
        if (!hit)
            break; /* the call made fewer than n allocations */
    }
    assert_true(ooms >= 1); /* at least the side struct */
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* History keeping block state with stacks: a malloc whose nth host allocation (the stack, the
 * side struct that holds it) fails returns OUT_OF_MEMORY, leaving no block allocated; past the
 * last, the malloc succeeds and its free is recorded. */
static void test_history(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    xseg_history_options o = {0};
    o.enabled = 1;
    o.record = XSEG_HISTORY_ALL;
    o.stacks = XSEG_STACKS_C;
    o.clear = 1;
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    int ooms = 0;
    /* n = 0 fails nothing: this call site's stack is stored then, once for all (stacks are
     * interned), so the later mallocs allocate only what the block itself needs. */
    for (unsigned long n = 0;; n++) {
        int64_t allocs = tu_stat("allocation.all.current"), bytes = tu_stat("allocated_bytes.all.current");
        int64_t req = tu_stat("requested_bytes.all.current");
        void *a = NULL;
        xseg_status st;
        bool hit;
        HOST_OOM_CALL(n, st, hit, xseg_malloc(&a, 8192, 0, NULL));
        if (st == XSEG_ERROR_OUT_OF_MEMORY) {
            ooms++;
            assert_int_equal(tu_stat("allocation.all.current"), allocs);
            assert_int_equal(tu_stat("allocated_bytes.all.current"), bytes);
            assert_int_equal(tu_stat("requested_bytes.all.current"), req);
            continue;
        }
        assert_int_equal(st, XSEG_SUCCESS);
        assert_int_equal(tu_stat("allocation.all.current"), allocs + 1);
        assert_int_equal(xseg_free(a), XSEG_SUCCESS);
        assert_int_equal(tu_stat("allocation.all.current"), allocs);
        assert_int_equal(tu_stat("requested_bytes.all.current"), req);
        if (n && !hit)
            break;
    }
    assert_true(ooms >= 1);
    xseg_history_options off = {0};
    off.clear = 1;
    assert_int_equal(xseg_record_memory_history(&off), XSEG_SUCCESS);
}

/* xseg_block_handles' hold (recorded in the block's side struct): its nth host allocation
 * failing, OUT_OF_MEMORY with nothing handed out and no hold to release; past the last, one hold,
 * released once. */
static void test_block_handles(void **state)
{
    (void)state;
    void *a = NULL;
    assert_int_equal(xseg_malloc(&a, 4096, 0, NULL), XSEG_SUCCESS);
    int ooms = 0;
    for (unsigned long n = 1;; n++) {
        xseg_phys_range r;
        size_t cnt = 7;
        hostmem_fail_nth(n);
        xseg_status st = xseg_block_handles(a, &r, 1, &cnt);
        bool hit = hostmem_failed();
        hostmem_disarm();
        if (st == XSEG_ERROR_OUT_OF_MEMORY) {
            ooms++;
            assert_true(hit);
            assert_non_null(strstr(xseg_last_error(), "out of host memory"));
            assert_int_equal(cnt, 0);
            assert_int_equal(xseg_block_handles_release(a), XSEG_ERROR_ILLEGAL_STATE);
            continue;
        }
        assert_int_equal(st, XSEG_SUCCESS);
        assert_int_equal(cnt, 1);
        assert_int_equal(xseg_block_handles_release(a), XSEG_SUCCESS);
        assert_int_equal(xseg_block_handles_release(a), XSEG_ERROR_ILLEGAL_STATE);
        if (!hit)
            break;
    }
    assert_true(ooms >= 1); /* the side struct */
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
}

/* A block placed by xseg_pool_malloc_at while history keeps block state: the nth host allocation
 * (its side struct for the stack) failing, OUT_OF_MEMORY with the free block as it was (classic
 * segment: inactive_split too); past the last, placed and recorded. */
static void test_malloc_at_history(void **state)
{
    (void)state;
    xseg_pool_id pool;
    assert_int_equal(xseg_pool_create(&pool), XSEG_SUCCESS);
    assert_int_equal(xseg_pool_retain(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), XSEG_SUCCESS);
    void *a = NULL, *b = NULL;
    assert_int_equal(xseg_malloc(&a, 2 << 20, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_malloc(&b, 3 << 20, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_end_allocate_to_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    xseg_history_options o = {0};
    o.enabled = 1;
    o.record = XSEG_HISTORY_ALL;
    o.stacks = XSEG_STACKS_C;
    o.clear = 1;
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    const char *keys[] = {"allocation.all.current", "allocated_bytes.all.current", "requested_bytes.all.current",
                          "inactive_split.all.current", "inactive_split_bytes.all.current"};
    int ooms = 0;
    for (unsigned long n = 0;; n++) { /* n = 0: the call site's stack is interned once */
        int64_t before[5];
        for (int k = 0; k < 5; k++)
            before[k] = tu_stat(keys[k]);
        void *at = (char *)b + (1 << 20); /* head 1 MiB, tail 1 MiB */
        hostmem_fail_nth(n);
        xseg_status st = xseg_pool_malloc_at(0, pool, at, 1 << 20);
        bool hit = hostmem_failed();
        hostmem_disarm();
        if (st == XSEG_ERROR_OUT_OF_MEMORY) {
            ooms++;
            assert_true(hit);
            assert_non_null(strstr(xseg_last_error(), "out of host memory"));
            for (int k = 0; k < 5; k++)
                assert_int_equal(tu_stat(keys[k]), before[k]);
            assert_int_equal(xseg_free(at), XSEG_ERROR_INVALID_VALUE); /* not placed */
            continue;
        }
        assert_int_equal(st, XSEG_SUCCESS);
        assert_int_equal(tu_stat("allocation.all.current"), before[0] + 1);
        assert_int_equal(tu_stat("inactive_split.all.current"), before[3] + 1); /* 3 MiB became 1 | 1 */
        assert_int_equal(xseg_free(at), XSEG_SUCCESS);
        for (int k = 0; k < 5; k++)
            assert_int_equal(tu_stat(keys[k]), before[k]);
        if (n && !hit)
            break;
    }
    assert_true(ooms >= 1);
    xseg_history_options off = {0};
    off.clear = 1;
    assert_int_equal(xseg_record_memory_history(&off), XSEG_SUCCESS);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(xseg_release_pool(0, pool), XSEG_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_record_stream, setup),
        cmocka_unit_test_setup(test_history, setup),
        cmocka_unit_test_setup(test_block_handles, setup),
        cmocka_unit_test_setup(test_malloc_at_history, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
