/*
 * The allocator's largest host tables on huge pages: the block structs' arena (base/arena.h,
 * dev_block_carve: advised to huge pages from ~420,000 structs in a release build, the structs
 * made before moved onto them in place) and the live map's table (base/hugemem.h, ptrmap_grow,
 * from 4 MiB). Here both thresholds are lowered so that 3,000 blocks cross them, and the
 * allocator must behave exactly as on 4 KiB pages: every pointer distinct and freeable, the
 * statistics exact, the cache empty at the end.
 * `test_host_tables classic|expandable`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/hugemem.h"
#include "core/runtime.h"
#include "tests/common/testutil.h"
#include "xseg.h"

static const char *kind_config = "expandable_segments:True";

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static size_t rand_size(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (size_t)(1 + rng % 16) * 512;
}

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

static void test_blocks_on_huge_pages(void **state)
{
    (void)state;
    void *probe = hugemem_alloc(HUGEMEM_PAGE);
    if (!probe)
        skip(); /* the kernel takes no MADV_HUGEPAGE advice: calloc'd tables only (the other tests) */
    hugemem_free(probe, HUGEMEM_PAGE);
    tu_xseg_init_or_skip(kind_config);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    struct dev_alloc *d = rt_device_peek(0);
    assert_non_null(d);
    /* Few enough for debug builds, whose dev_check walks every block after each call; the map
     * grows past its first tables on the way. */
    size_t n = 3000, bytes = 0;
    void **v = calloc(n, sizeof *v);
    size_t *sz = calloc(n, sizeof *sz);
    assert_non_null(v);
    assert_non_null(sz);
    for (size_t i = 0; i < n; i++) {
        if (i == n / 2) {
            /* Half the blocks live on 4 KiB pages: the arena's next take crosses the threshold,
             * and their structs move onto a huge page in place (where MADV_COLLAPSE exists). */
            d->structs.huge_div = 0;
            d->slab_left = 0;     /* the next struct from a new slab (the current one's rest unused) */
            d->live.huge_min = 1; /* the map's next table on huge pages */
        }
        sz[i] = rand_size();
        v[i] = tu_malloc(sz[i], NULL);
        bytes += sz[i];
    }
    if (d->structs.broken)
        skip(); /* no address space reserved: the structs are calloc'd (the other tests) */
    assert_true(d->structs.huge);
    assert_true(d->structs.used > 0); /* the structs came from the arena */
    assert_true(d->live.huge);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), (int64_t)bytes);
    assert_int_equal(tu_stat("allocation.all.current"), (int64_t)n);
    /* Churn: every other block freed and allocated again at another size. */
    for (size_t i = 0; i < n; i += 2) {
        tu_free(v[i]);
        bytes -= sz[i];
        sz[i] = rand_size();
        v[i] = tu_malloc(sz[i], NULL);
        bytes += sz[i];
    }
    assert_int_equal(tu_stat("allocated_bytes.all.current"), (int64_t)bytes);
    /* Every pointer distinct (sorted, no two equal); each free below finds its block in the map. */
    void **w = malloc(n * sizeof *w);
    assert_non_null(w);
    memcpy(w, v, n * sizeof *w);
    qsort(w, n, sizeof *w, ptr_cmp);
    for (size_t i = 1; i < n; i++)
        assert_true(w[i - 1] != w[i]);
    free(w);
    for (size_t i = 0; i < n; i++)
        tu_free(v[i]);
    assert_int_equal(tu_stat("allocated_bytes.all.current"), 0);
    assert_int_equal(tu_stat("allocation.all.current"), 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    free(v);
    free(sz);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "classic") == 0) {
        kind_config = "expandable_segments:False";
    } else if (argc > 1 && strcmp(argv[1], "expandable") != 0) {
        fprintf(stderr, "test_host_tables: the kind is classic or expandable, not %s\n", argv[1]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_on_huge_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
