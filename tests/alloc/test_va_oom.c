/*
 * An OOM caused by the address space, not device memory (issue 31, finding 16a): when
 * cuMemAddressReserve fails (virtual address space exhausted, injected with cudaemu), the OOM
 * message says the virtual address reservation failed instead of blaming device memory; an OOM
 * from device memory itself still says "CUDA out of memory" without it; the allocator is usable
 * after both.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define MiB ((size_t)1 << 20)
#define FAILS 256

static void test_va_reservation_oom(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    tu_require_emulator_or_skip();
    void *warm = tu_malloc(MiB, NULL);
    /* Every cuMemAddressReserve from now on fails: the address space is exhausted. Not all
     * FAILS fire, by design: each reservation the malloc tries must, and it must try one. */
    unsigned long fired = tu_fail_fired(), tries = tu_call_count("cuMemAddressReserve");
    for (unsigned long i = 1; i <= FAILS; i++)
        assert_true(tu_fail("cuMemAddressReserve", i, CUDA_ERROR_OUT_OF_MEMORY));
    void *p = NULL;
    xseg_status st = xseg_malloc(&p, 512 * MiB, 0, NULL);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", xseg_last_error());
    tries = tu_call_count("cuMemAddressReserve") - tries;
    tu_fail_clear();
    assert_true(tries >= 1 && tries < FAILS);
    tu_assert_fired_n(fired, tries, "the %lu reservations the malloc tried", tries);
    assert_int_equal(st, XSEG_ERROR_OUT_OF_MEMORY);
    assert_null(p);
    if (!strstr(msg, "virtual address") || !strstr(msg, "cuMemAddressReserve"))
        fail_msg("the OOM message does not name the address-space reservation: %s", msg);
    if (strstr(msg, "CUDA out of memory"))
        fail_msg("the OOM message blames device memory: %s", msg);
    /* Usable after: the same request now fits. */
    void *q = tu_malloc(512 * MiB, NULL);
    tu_free(q);
    /* A real device OOM still reads as one, without the address-space wording. */
    size_t fr = 0, total = 0;
    tu_assert_cu(drv->cuMemGetInfo(&fr, &total));
    assert_int_equal(xseg_malloc(&p, total * 2, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(xseg_last_error(), "CUDA out of memory"));
    assert_null(strstr(xseg_last_error(), "virtual address"));
    tu_free(warm);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
}

int main(void)
{
    if (!getenv("CUDAEMU_TOTAL_MEM"))
        setenv("CUDAEMU_TOTAL_MEM", "1G", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_va_reservation_oom)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
