/* base/log: the warnings go through one function, to a sink when one is set, else to stderr in
 * one line; driven by a public call that warns (xseg_check_config with keys xseg ignores). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/log.h"
#include "xseg.h"

static char got[2048];
static int ngot;

static void sink(const char *line)
{
    snprintf(got, sizeof got, "%s", line);
    ngot++;
}

static void test_sink_receives_the_warning(void **state)
{
    (void)state;
    assert_null(log_set_sink(sink));
    assert_int_equal(xseg_check_config("backend:cudaMallocAsync", NULL, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(ngot, 1);
    assert_string_equal(got, "xseg: warning: allocator config keys accepted for PyTorch and ignored: "
                             "backend:cudaMallocAsync (xseg is itself the caching allocator)");
    /* One note per key per process: the same key again says nothing. */
    assert_int_equal(xseg_check_config("backend:cudaMallocAsync", NULL, 0, NULL), XSEG_SUCCESS);
    assert_int_equal(ngot, 1);
    assert_ptr_equal(log_set_sink(NULL), sink);
}

static void test_default_is_one_stderr_line(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(f), 2) >= 0);
    log_warn("device %d says %s", 3, "hello");
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    char buf[256] = "";
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    assert_string_equal(buf, "xseg: device 3 says hello\n");
    assert_int_equal(ngot, 1); /* the sink was given back */
}

static void test_long_line_is_truncated(void **state)
{
    (void)state;
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    log_set_sink(sink);
    log_warn("%s", big);
    log_set_sink(NULL);
    assert_int_equal(strlen(got), 1023);
    assert_memory_equal(got, "xseg: aaa", 9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sink_receives_the_warning),
        cmocka_unit_test(test_default_is_one_stderr_line),
        cmocka_unit_test(test_long_line_is_truncated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
