/* base/hugemem: 2 MiB-aligned, zeroed, writable mappings advised to huge pages, given back whole. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/hugemem.h"
#include "tests/unit/smaps.h"

/* The VmFlags line of the mapping that holds @p p (empty when absent). */
static void vm_flags_of(const void *p, char *out, size_t size)
{
    unsigned long huge_kb;
    smaps_of(p, out, size, &huge_kb);
}

/* Is [p, p + n) mapped? mincore fails with ENOMEM on a range with an unmapped page. */
static bool mapped(void *p, size_t n)
{
    static unsigned char vec[2 * 512];
    return mincore(p, n, vec) == 0 || errno != ENOMEM;
}

static void test_alloc_write_free(void **state)
{
    (void)state;
    size_t n = 2 * HUGEMEM_PAGE;
    unsigned char *p = hugemem_alloc(n);
    if (!p)
        skip(); /* no transparent huge pages in this kernel: callers use calloc, as they must */
    assert_int_equal((uintptr_t)p % HUGEMEM_PAGE, 0);
    for (size_t i = 0; i < n; i += 4096)
        assert_int_equal(p[i] | p[i + 4095], 0);
    memset(p, 0xA5, n);
    assert_int_equal(p[n - 1], 0xA5);
    char flags[512];
    vm_flags_of(p, flags, sizeof flags);
    if (flags[0]) /* /proc mounted: the advice is on the mapping, and nothing around it is */
        assert_non_null(strstr(flags, " hg"));
    assert_true(mapped(p, n));
    hugemem_free(p, n);
    assert_false(mapped(p, HUGEMEM_PAGE));
    assert_false(mapped(p + n - HUGEMEM_PAGE, HUGEMEM_PAGE));
    hugemem_free(NULL, n); /* a no-op */
}

/* The over-mapping that aligns is cut off: nothing stays mapped on either side of a region that
 * was not mapped before. */
static void test_ends_cut(void **state)
{
    (void)state;
    void *a = hugemem_alloc(HUGEMEM_PAGE), *b = hugemem_alloc(HUGEMEM_PAGE);
    if (!a || !b)
        skip();
    char flags[512];
    char *pa = a;
    /* The 4 KiB page before a and after it are a's neighbours in the address space: either
     * unmapped or some other mapping, never one advised to huge pages by this allocation unless
     * it is b. */
    char *around[2] = {pa - 4096, pa + HUGEMEM_PAGE};
    for (int i = 0; i < 2; i++) {
        if ((around[i] >= (char *)b && around[i] < (char *)b + HUGEMEM_PAGE) || !mapped(around[i], 4096))
            continue;
        vm_flags_of(around[i], flags, sizeof flags);
        assert_null(strstr(flags, " hg"));
    }
    hugemem_free(a, HUGEMEM_PAGE);
    hugemem_free(b, HUGEMEM_PAGE);
}

static void test_floor(void **state)
{
    (void)state;
    assert_int_equal(hugemem_floor(1), HUGEMEM_PAGE); /* at least one page */
    assert_int_equal(hugemem_floor(HUGEMEM_PAGE), HUGEMEM_PAGE);
    assert_int_equal(hugemem_floor(2 * HUGEMEM_PAGE - 1), HUGEMEM_PAGE);
    assert_int_equal(hugemem_floor(5 * HUGEMEM_PAGE + 7), 5 * HUGEMEM_PAGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_write_free),
        cmocka_unit_test(test_ends_cut),
        cmocka_unit_test(test_floor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
