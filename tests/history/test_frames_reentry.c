/*
 * A frames callback that allocates through xseg (issue 31, finding 16b). Every xseg_malloc with
 * XSEG_STACKS_CALLBACK asks the callback for frames; one that calls xseg_malloc itself used to
 * recurse until the stack overflowed. The nested allocation is served without callback frames
 * (the callback is not entered again on that thread), the outer one gets the callback's frames,
 * and the library stays usable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define NESTED_MAX 64

static int cb_calls, cb_depth, cb_max_depth;
static void *nested[NESTED_MAX];
static xseg_status nested_st[NESTED_MAX];
static int nnested;

/* Allocates on every call, as a binding that builds its frame objects with the allocator might. */
static int alloc_cb(xseg_frame *frames, int max, void *user)
{
    (void)user;
    cb_calls++;
    if (++cb_depth > cb_max_depth)
        cb_max_depth = cb_depth;
    if (nnested < NESTED_MAX) {
        int i = nnested++;
        nested_st[i] = xseg_malloc(&nested[i], 4096, 0, NULL);
    }
    cb_depth--;
    if (max < 1)
        return 0;
    frames[0] = (xseg_frame){"binding.py", "walk_frames", 12};
    return 1;
}

static void test_callback_allocates(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:False");
    xseg_history_options o = {0};
    o.enabled = 1;
    o.record = XSEG_HISTORY_ALL;
    o.stacks = XSEG_STACKS_CALLBACK;
    o.callback = alloc_cb;
    o.clear = 1;
    assert_int_equal(xseg_record_memory_history(&o), XSEG_SUCCESS);
    void *outer[3];
    for (int i = 0; i < 3; i++) {
        if (xseg_malloc(&outer[i], MiB + (size_t)i, 0, NULL) != XSEG_SUCCESS)
            fail_msg("outer xseg_malloc: %s", xseg_last_error());
    }
    /* One callback call per outer allocation; the nested ones did not call it again. */
    assert_int_equal(cb_calls, 3);
    assert_int_equal(cb_max_depth, 1);
    assert_int_equal(nnested, 3);
    for (int i = 0; i < nnested; i++) {
        if (nested_st[i] != XSEG_SUCCESS)
            fail_msg("nested xseg_malloc %d: %s", i, xseg_last_error());
        assert_non_null(nested[i]);
    }
    /* The snapshot holds the outer allocations' frames. */
    char path[] = "/tmp/xseg-reentry-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(xseg_dump_snapshot_json(-1, path), XSEG_SUCCESS);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    unlink(path);
    assert_non_null(strstr(buf, "walk_frames"));
    for (int i = 0; i < 3; i++)
        tu_free(outer[i]);
    for (int i = 0; i < nnested; i++)
        tu_free(nested[i]);
    /* Usable after: recording stops, an allocation works. */
    assert_int_equal(xseg_record_memory_history(NULL), XSEG_SUCCESS);
    void *p = tu_malloc(MiB, NULL);
    tu_free(p);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

int main(void)
{
    if (!getenv("CUDAEMU_TOTAL_MEM"))
        setenv("CUDAEMU_TOTAL_MEM", "1G", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_callback_allocates)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
