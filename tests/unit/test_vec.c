/* base/vec: growth keeps contents and capacity, overflow and failure leave the array unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "base/vec.h"

static void test_grows_and_keeps(void **state)
{
    (void)state;
    int *a = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < 1000; i++) {
        assert_true(VEC_RESERVE(a, cap, i + 1));
        assert_true(cap >= i + 1);
        a[i] = (int)i * 3;
    }
    for (size_t i = 0; i < 1000; i++)
        assert_int_equal(a[i], (int)i * 3);
    /* Doubling from 8: 1000 elements fit in 1024. */
    assert_int_equal(cap, 1024);
    size_t before = cap;
    int *same = a;
    assert_true(VEC_RESERVE(a, cap, 10)); /* already room: nothing moves */
    assert_ptr_equal(a, same);
    assert_int_equal(cap, before);
    free(a);
}

static void test_overflow_unchanged(void **state)
{
    (void)state;
    struct big {
        char b[4096];
    } *a = NULL;
    size_t cap = 0;
    assert_true(VEC_RESERVE(a, cap, 3));
    struct big *old = a;
    a[0].b[0] = 7;
    assert_false(VEC_RESERVE(a, cap, SIZE_MAX / 1024)); /* need * elem overflows */
    assert_ptr_equal(a, old);
    assert_int_equal(cap, 8);
    assert_false(VEC_RESERVE(a, cap, SIZE_MAX));
    assert_ptr_equal(a, old);
    assert_int_equal(a[0].b[0], 7);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grows_and_keeps),
        cmocka_unit_test(test_overflow_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
