/*
 * The fast path's deferred map insert (dev_alloc.fast.live_pending, core/state.h): a malloc served
 * from the cache leaves its pointer's insert into the live map to the next holder of the device
 * lock, which must make it before anything looks a pointer up. Each test makes a fast-path
 * malloc, checks that its insert is pending, and then reaches the pointer through one public
 * entry point: each must find it (a missed settle would answer "was not returned by
 * xseg_malloc"), and the insert is made by then. `test_live_pending classic|expandable`.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/runtime.h"
#include "tests/common/testutil.h"
#include "vmm/driver.h"
#include "xseg.h"

static const char *kind_config = "expandable_segments:True";

/* A malloc the fast path serves: the first one of the size makes the segment (slow path, the map
 * written at once), the second splits the cached remainder. Returns the second; its insert pends. */
static void *fast_malloc(void **first)
{
    tu_xseg_init_or_skip(kind_config);
    *first = tu_malloc(4096, NULL);
    void *p = tu_malloc(8192, NULL);
    struct dev_alloc *d = rt_device_peek(0);
    assert_non_null(d);
    assert_non_null(d->fast.live_pending); /* no lock taken since: the insert waits */
    assert_int_equal(d->fast.live_pending->addr, (uintptr_t)p);
    return p;
}

static void test_record_stream_sees_it(void **state)
{
    (void)state;
    void *first, *p = fast_malloc(&first);
    CUstream s = NULL;
    tu_assert_cu(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    assert_int_equal(xseg_record_stream(p, (struct CUstream_st *)s), XSEG_SUCCESS);
    assert_null(rt_device_peek(0)->fast.live_pending);
    tu_free(p);
    tu_free(first);
    tu_assert_cu(drv->cuStreamSynchronize(s));
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* the recorded stream's event settles */
    tu_assert_cu(drv->cuStreamDestroy(s));
    int64_t live = -1;
    assert_int_equal(xseg_stat(0, "allocation.all.current", &live), XSEG_SUCCESS);
    assert_int_equal(live, 0);
}

static void test_free_sees_it(void **state)
{
    (void)state;
    void *first, *p = fast_malloc(&first);
    assert_int_equal(xseg_free(p), XSEG_SUCCESS);
    assert_null(rt_device_peek(0)->fast.live_pending);
    /* Freed once: a second free is refused, naming the pointer. */
    assert_int_equal(xseg_free(p), XSEG_ERROR_INVALID_VALUE);
    tu_free(first);
}

static void test_foreign_free_settles_it(void **state)
{
    (void)state;
    void *first, *p = fast_malloc(&first);
    int local;
    assert_int_equal(xseg_free(&local), XSEG_ERROR_INVALID_VALUE); /* a host pointer: refused */
    assert_null(rt_device_peek(0)->fast.live_pending);                /* that lookup made the insert */
    tu_free(p);
    tu_free(first);
}

static void *free_on_thread(void *arg)
{
    return (void *)(intptr_t)xseg_free(arg);
}

static void test_other_thread_sees_it(void **state)
{
    (void)state;
    void *first, *p = fast_malloc(&first);
    pthread_t t;
    void *ret = NULL;
    assert_int_equal(pthread_create(&t, NULL, free_on_thread, p), 0);
    assert_int_equal(pthread_join(t, &ret), 0);
    assert_int_equal((intptr_t)ret, XSEG_SUCCESS);
    assert_null(rt_device_peek(0)->fast.live_pending);
    tu_free(first);
}

/* Many fast-path mallocs in a row: each one's pending insert is made by the next, the map grows
 * past its first tables meanwhile (room is reserved before an insert pends), and every pointer
 * frees once. */
static void test_many_in_a_row(void **state)
{
    (void)state;
    tu_xseg_init_or_skip(kind_config);
    enum { N = 3000 };
    static void *ptrs[N];
    for (size_t i = 0; i < N; i++)
        ptrs[i] = tu_malloc(512 * (1 + i % 7), NULL);
    int64_t live = -1;
    assert_int_equal(xseg_stat(0, "allocation.all.current", &live), XSEG_SUCCESS);
    assert_int_equal(live, N);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(xseg_free(ptrs[(i * 7) % N]), XSEG_SUCCESS); /* 7 and N coprime */
    assert_int_equal(xseg_stat(0, "allocation.all.current", &live), XSEG_SUCCESS);
    assert_int_equal(live, 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "classic") == 0)
        kind_config = "expandable_segments:False";
    else if (argc > 1 && strcmp(argv[1], "expandable") != 0) {
        fprintf(stderr, "test_live_pending: the kind is classic or expandable, not %s\n", argv[1]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_stream_sees_it),  cmocka_unit_test(test_free_sees_it),
        cmocka_unit_test(test_foreign_free_settles_it), cmocka_unit_test(test_other_thread_sees_it),
        cmocka_unit_test(test_many_in_a_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
