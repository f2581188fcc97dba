/* base/error: the thread-local message, context added in front (err_prefix) and after
 * (err_suffix), a copy kept across later failures (err_keep), truncation at 1 KiB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"

static void test_prefix_and_suffix(void **state)
{
    (void)state;
    err_clear();
    assert_string_equal(err_message(), "");
    assert_int_equal(err_set(XSEG_ERROR_DRIVER, "cuMemMap failed: %s", "CUDA_ERROR_UNKNOWN"), XSEG_ERROR_DRIVER);
    assert_int_equal(err_prefix(XSEG_ERROR_DRIVER, "xseg_%s", "wake"), XSEG_ERROR_DRIVER);
    assert_string_equal(err_message(), "xseg_wake: cuMemMap failed: CUDA_ERROR_UNKNOWN");
    assert_int_equal(err_suffix(XSEG_ERROR_OUT_OF_MEMORY, "; the pool is still asleep (%d)", 3),
                     XSEG_ERROR_OUT_OF_MEMORY);
    assert_string_equal(err_message(), "xseg_wake: cuMemMap failed: CUDA_ERROR_UNKNOWN; the pool is still asleep (3)");
    /* With no message, the suffix alone (as err_prefix gives the context alone). */
    err_clear();
    err_suffix(XSEG_ERROR_DRIVER, " (after %s)", "a retry");
    assert_string_equal(err_message(), " (after a retry)");
    err_clear();
    err_prefix(XSEG_ERROR_DRIVER, "ctx");
    assert_string_equal(err_message(), "ctx");
}

static void test_suffix_truncates(void **state)
{
    (void)state;
    char big[1100];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    err_set(XSEG_ERROR_DRIVER, "%.1000s", big);
    err_suffix(XSEG_ERROR_DRIVER, "; %s", "0123456789012345678901234567890123456789");
    size_t n = strlen(err_message());
    assert_int_equal(n, 1023);
    assert_memory_equal(err_message() + 1000, "; 012345678901234567890", 23);
    /* A full message takes nothing more and stays terminated. */
    err_suffix(XSEG_ERROR_DRIVER, "more");
    assert_int_equal(strlen(err_message()), 1023);
}

static void test_keep(void **state)
{
    (void)state;
    err_set(XSEG_ERROR_DRIVER, "first failure");
    struct err_kept k = err_keep();
    err_set(XSEG_ERROR_DRIVER, "a rollback's own failure");
    assert_string_equal(k.msg, "first failure");
    err_set(XSEG_ERROR_DRIVER, "%s; rolled back", k.msg);
    assert_string_equal(err_message(), "first failure; rolled back");
    char big[1100];
    memset(big, 'b', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    err_set(XSEG_ERROR_DRIVER, "%s", big);
    k = err_keep();
    assert_int_equal(strlen(k.msg), sizeof k.msg - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_and_suffix),
        cmocka_unit_test(test_suffix_truncates),
        cmocka_unit_test(test_keep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
