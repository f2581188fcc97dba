/*
 * Host OOM for a block's side struct (core/block.h: record_stream's streams, events, the history
 * stack live there, allocated on demand): the allocation of the side fails, and the call that
 * needed it returns XSEG_ERROR_OUT_OF_MEMORY with a message, with everything rolled back: the
 * statistics as before, the block freed as an unrecorded one, nothing leaked (debug_level=2
 * builds run dev_check after every operation).
 *
 * The test replaces calloc and fails only the calls made by block_side_get (by return address),
 * so libc, the driver and cmocka allocate as usual. Skipped under the sanitizers: they own
 * malloc and calloc.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/block.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HOST_OOM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define HOST_OOM_SANITIZED 1
#endif
#endif

#ifndef HOST_OOM_SANITIZED
/* glibc's own entry points, which the replacement below forwards to. */
extern void *__libc_calloc(size_t n, size_t size);

static volatile int fail_side; /* calls of block_side_get still to fail */
static volatile int failed;    /* how many were failed */

/* Was calloc called from block_side_get? Its body is far smaller than 1 KiB. */
static bool from_side_get(const void *ra)
{
    uintptr_t f = (uintptr_t)&block_side_get;
    return (uintptr_t)ra >= f && (uintptr_t)ra - f < 1024;
}

void *calloc(size_t n, size_t size)
{
    if (fail_side > 0 && n == 1 && size == sizeof(struct block_side) && from_side_get(__builtin_return_address(0))) {
        fail_side--;
        failed++;
        return NULL;
    }
    return __libc_calloc(n, size);
}

static int setup(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    return 0;
}

/* record_stream on a live block: no side struct, so OUT_OF_MEMORY and no stream recorded (the
 * free is immediate); then the same call succeeds and the free waits for the stream. */
static void test_record_stream(void **state)
{
    (void)state;
    tu_require_emulator_or_skip();
    CUstream s2;
    tu_assert_cu(drv->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    void *a = NULL;
    assert_int_equal(xseg_malloc(&a, 4096, 0, NULL), XSEG_SUCCESS);
    int64_t active = tu_stat("active_bytes.all.current"), req = tu_stat("requested_bytes.all.current");
    fail_side = 1;
    failed = 0;
    assert_int_equal(xseg_record_stream(a, s2), XSEG_ERROR_OUT_OF_MEMORY);
    assert_int_equal(failed, 1);
    fail_side = 0;
    assert_non_null(strstr(xseg_last_error(), "out of host memory"));
    assert_int_equal(tu_stat("active_bytes.all.current"), active);
    assert_int_equal(tu_stat("requested_bytes.all.current"), req);
    /* Not recorded: the free returns the block at once, even with s2 busy. */
    assert_true(tu_stream_hold(s2));
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(tu_stat("active_bytes.all.current"), active - 4096);
    assert_int_equal(tu_stat("requested_bytes.all.current"), req - 4096);
    /* With memory: recorded, and the free waits for s2. */
    assert_int_equal(xseg_malloc(&a, 4096, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(xseg_record_stream(a, s2), XSEG_SUCCESS);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(tu_stat("active_bytes.all.current"), active); /* pending */
    assert_true(tu_stream_release(s2));
    void *b = NULL;
    assert_int_equal(xseg_malloc(&b, 4096, 0, NULL), XSEG_SUCCESS); /* polls the event */
    assert_int_equal(xseg_free(b), XSEG_SUCCESS);
    assert_int_equal(tu_stat("active_bytes.all.current"), active - 4096);
    tu_assert_cu(drv->cuStreamDestroy(s2));
}

/* History keeping block state with stacks: a malloc whose block cannot get a side struct for its
 * stack fails with OUT_OF_MEMORY, leaving no block allocated and recording no event; the next
 * malloc succeeds and its free is recorded. */
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
    int64_t allocs = tu_stat("allocation.all.current"), bytes = tu_stat("allocated_bytes.all.current");
    int64_t req = tu_stat("requested_bytes.all.current");
    void *a = NULL;
    fail_side = 1;
    failed = 0;
    assert_int_equal(xseg_malloc(&a, 8192, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    fail_side = 0;
    assert_int_equal(failed, 1);
    assert_non_null(strstr(xseg_last_error(), "out of host memory"));
    assert_int_equal(tu_stat("allocation.all.current"), allocs);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), bytes);
    assert_int_equal(tu_stat("requested_bytes.all.current"), req);
    assert_int_equal(xseg_malloc(&a, 8192, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(tu_stat("allocation.all.current"), allocs + 1);
    assert_int_equal(xseg_free(a), XSEG_SUCCESS);
    assert_int_equal(tu_stat("allocation.all.current"), allocs);
    assert_int_equal(tu_stat("requested_bytes.all.current"), req);
    xseg_history_options off = {0};
    off.clear = 1;
    assert_int_equal(xseg_record_memory_history(&off), XSEG_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_record_stream, setup),
        cmocka_unit_test_setup(test_history, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("host_oom: skipped: the sanitizers own malloc and calloc, which this test replaces\n");
    return 77; /* meson: skipped */
}
#endif
