/*
 * The fast path's deferred free (dev_alloc.fast.free_pending, core/state.h): a free leaves its merge
 * and index insert to the next holder of the device lock. A malloc that follows searches first
 * and lets the free wait until it is done only when the pending block cannot change its answer
 * or a counter's peak (alloc.c, free_pending_keeps_fit); every other lock taker settles it
 * first. Each test builds a layout, makes a free pend, and checks that what follows sees exactly
 * what it would had the free been made at once: the block best fit would take, the statistics
 * and their peaks, the cache released. `test_free_pending classic|expandable`.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/runtime.h"
#include "tests/common/testutil.h"
#include "xseg.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static const char *kind_config = "expandable_segments:True";
static bool classic;

/* Device 0 with nothing cached: every test starts from an empty device. */
static void fresh(void)
{
    tu_xseg_init_or_skip(kind_config);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    rt_device_peek(0)->fast.free_defer_min = 0; /* defer at any count (release builds wait for 2^16) */
}

/* The block whose free waits, or NULL (no lock taken since the free). */
static uintptr_t pending_addr(void)
{
    const struct dev_alloc *d = rt_device_peek(0);
    assert_non_null(d);
    return d->fast.free_pending ? d->fast.free_pending->addr : 0;
}

/* free(@p p) through the device path, which must leave its merge pending (a macro: a failure
 * names the caller's line). */
#define free_pends(p)                                                                              \
    do {                                                                                           \
        void *fp_ = (p);                                                                           \
        tu_free(fp_);                                                                              \
        assert_int_equal(pending_addr(), (uintptr_t)fp_);                                          \
    } while (0)

/* a | x | c in a fresh segment, x's free pending (the last malloc elsewhere, so that x's free is
 * not the slot's), then malloc(@p req): it must return x, the best fit once x's free is made. */
static void pending_is_the_fit(size_t x_size, size_t req)
{
    fresh();
    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(x_size, NULL), *c = tu_malloc(4 * KIB, NULL);
    void *other = tu_malloc(4 * MIB, NULL);
    free_pends(x);
    void *y = tu_malloc(req, NULL);
    assert_ptr_equal(y, x);
    assert_int_equal(pending_addr(), 0);
    tu_free(y);
    tu_free(a);
    tu_free(c);
    tu_free(other);
}

/* A pending block with no free neighbour, and a malloc of its size: the block is the best fit
 * once the free is made (the segment's free tail is larger), so the malloc must settle first. */
static void test_malloc_takes_it(void **state)
{
    (void)state;
    pending_is_the_fit(8 * KIB, 8 * KIB);
}

/* A pending block larger than the request but smaller than the search's fit (the segment's free
 * tail) is the best fit once made: the malloc must settle and search again. */
static void test_fits_between(void **state)
{
    (void)state;
    pending_is_the_fit(16 * KIB, 8 * KIB);
}

/* The pending block merges with a free predecessor into the exact fit of the next malloc. */
static void test_merged_takes_it(void **state)
{
    (void)state;
    fresh();
    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(8 * KIB, NULL), *c = tu_malloc(4 * KIB, NULL);
    void *other = tu_malloc(4 * MIB, NULL);
    free_pends(a);
    free_pends(x); /* a's free is made first */
    void *y = tu_malloc(12 * KIB, NULL);
    assert_ptr_equal(y, a); /* [a, x) merged: 12 KiB */
    tu_free(y);
    tu_free(c);
    tu_free(other);
}

/* The best fit without the pending block is its free successor, which the block's merge would
 * absorb: the malloc must take the merged block's front, not the successor. */
static void test_neighbour_fit(void **state)
{
    (void)state;
    fresh();
    /* One 2 MiB small segment (or page): a | f1 | f2 | x | r (8 KiB free). */
    void *a = tu_malloc(4 * KIB, NULL), *f1 = tu_malloc(1 * MIB, NULL);
    void *f2 = tu_malloc(2 * MIB - 4 * KIB - 1 * MIB - 64 * KIB - 8 * KIB, NULL);
    void *x = tu_malloc(64 * KIB, NULL);
    assert_ptr_equal((char *)x, (char *)a + 2 * MIB - 64 * KIB - 8 * KIB);
    void *other = tu_malloc(4 * MIB, NULL);
    free_pends(x);
    void *y = tu_malloc(8 * KIB, NULL);
    assert_ptr_equal(y, x); /* x + r merged (72 KiB) is the only fit; its front is handed out */
    tu_free(y);
    tu_free(a);
    tu_free(f1);
    tu_free(f2);
    tu_free(other);
}

/* A pending block larger than the malloc's fit: the malloc need not wait. Its answer and the
 * statistics must be those of the free made first. */
static void test_larger_block_waits(void **state)
{
    (void)state;
    fresh();
    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(64 * KIB, NULL), *c = tu_malloc(4 * KIB, NULL);
    void *s = tu_malloc(8 * KIB, NULL), *t = tu_malloc(4 * KIB, NULL);
    free_pends(s);
    free_pends(x); /* s's free is made first: an 8 KiB free block between c and t */
    int64_t split_bytes = tu_stat("inactive_split_bytes.all.current"); /* x's free made */
    void *y = tu_malloc(8 * KIB, NULL);
    assert_ptr_equal(y, s);
    assert_int_equal(pending_addr(), 0); /* made before the malloc returned */
    if (classic)
        assert_int_equal(tu_stat("inactive_split_bytes.all.current"), split_bytes - (int64_t)(8 * KIB));
    free_pends(y);
    void *z = tu_malloc(64 * KIB, NULL);
    assert_ptr_equal(z, x);
    tu_free(z);
    tu_free(a);
    tu_free(c);
    tu_free(t);
}

/* The counters' peaks see the calls in their order: the pending free raises inactive_split
 * (classic), the malloc after it lowers it, so the peak is the value between the two even when
 * the malloc ran first. */
static void test_peak_between(void **state)
{
    (void)state;
    fresh();
    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(64 * KIB, NULL), *c = tu_malloc(4 * KIB, NULL);
    void *s = tu_malloc(8 * KIB, NULL), *t = tu_malloc(4 * KIB, NULL);
    tu_free(s);
    int64_t n0 = tu_stat("inactive_split.all.current"), b0 = tu_stat("inactive_split_bytes.all.current");
    assert_int_equal(xseg_reset_peak_stats(0), XSEG_SUCCESS);
    free_pends(x);
    void *y = tu_malloc(8 * KIB, NULL); /* takes s whole */
    assert_ptr_equal(y, s);
    if (classic) {
        /* x's free: one more split block, 64 KiB more; the malloc: s leaves (one fewer, 8 KiB less). */
        assert_int_equal(tu_stat("inactive_split.all.peak"), n0 + 1);
        assert_int_equal(tu_stat("inactive_split_bytes.all.peak"), b0 + (int64_t)(64 * KIB));
        assert_int_equal(tu_stat("inactive_split.small_pool.peak"), n0 + 1);
        assert_int_equal(tu_stat("inactive_split.all.current"), n0);
        assert_int_equal(tu_stat("inactive_split_bytes.all.current"), b0 + (int64_t)(56 * KIB));
    } else {
        assert_int_equal(tu_stat("inactive_split.all.peak"), 0); /* expandable blocks are not counted */
    }
    tu_free(y);
    tu_free(a);
    tu_free(c);
    tu_free(t);
}

/* Classic: a malloc whose fit is a whole segment splits it, raising inactive_split, while the
 * pending free merges two split neighbours away. Made in their order the count goes 2, 0, 1: the
 * peak stays 2. The malloc must not run first (3, then 1). */
static void test_peak_unsplit_fit(void **state)
{
    (void)state;
    if (!classic)
        skip(); /* expandable blocks are not counted in inactive_split */
    fresh();
    void *s0 = tu_malloc(12 * MIB, NULL); /* a 12 MiB segment, then cached whole */
    tu_free(s0);
    void *s1 = tu_malloc(64 * MIB, NULL);
    tu_free(s1);
    void *p = tu_malloc(14 * MIB, NULL);  /* s1: p | 50 MiB free */
    void *x = tu_malloc(30 * MIB, NULL);  /* s1: p | x | 20 MiB free */
    assert_ptr_equal(p, s1);
    assert_ptr_equal((char *)x, (char *)s1 + 14 * MIB);
    tu_free(p);
    assert_int_equal(tu_stat("inactive_split.large_pool.current"), 2);
    assert_int_equal(xseg_reset_peak_stats(0), XSEG_SUCCESS);
    free_pends(x);
    void *y = tu_malloc(10 * MIB, NULL); /* best fit: s0, split: 2 MiB stay free */
    assert_ptr_equal(y, s0);
    assert_int_equal(tu_stat("inactive_split.large_pool.current"), 1);
    assert_int_equal(tu_stat("inactive_split_bytes.large_pool.current"), (int64_t)(2 * MIB));
    assert_int_equal(tu_stat("inactive_split.large_pool.peak"), 2);
    assert_int_equal(tu_stat("inactive_split_bytes.large_pool.peak"), (int64_t)(34 * MIB));
    assert_int_equal(tu_stat("inactive_split.all.peak"), 2);
    tu_free(y);
}

/* Expandable: best fit counts a block with the unmapped space after it, so a small free block at
 * the end of the mapped pages loses to a larger pending block with none: the malloc must settle
 * first and take the pending block. */
static void test_expandable_tail(void **state)
{
    (void)state;
    if (classic)
        skip(); /* classic blocks have no unmapped tail */
    fresh();
    /* The first 2 MiB page: a | x | c | f1 | f2 | 4 KiB free, then unmapped space. */
    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(64 * KIB, NULL), *c = tu_malloc(4 * KIB, NULL);
    void *f1 = tu_malloc(1 * MIB, NULL), *f2 = tu_malloc(1 * MIB - 76 * KIB, NULL);
    free_pends(x);
    void *y = tu_malloc(4 * KIB, NULL);
    assert_ptr_equal(y, x);
    tu_free(y);
    tu_free(a);
    tu_free(c);
    tu_free(f1);
    tu_free(f2);
}

/* With garbage collection on, each search ticks the GC clock: a malloc that searched again after
 * making a pending free would tick it twice, so frees make their merge at once. */
static void test_gc_frees_at_once(void **state)
{
    (void)state;
    fresh();
    char config[256];
    snprintf(config, sizeof config, "%s,garbage_collection_threshold:0.6", kind_config);
    tu_xseg_init_or_skip(config);
    assert_int_equal(xseg_set_memory_fraction(0.9, 0), XSEG_SUCCESS);
    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(64 * KIB, NULL), *c = tu_malloc(4 * KIB, NULL);
    void *other = tu_malloc(4 * MIB, NULL);
    tu_free(x);
    assert_int_equal(pending_addr(), 0);
    assert_ptr_equal(tu_malloc(64 * KIB, NULL), x);
    tu_free(x);
    tu_free(a);
    tu_free(c);
    tu_free(other);
    assert_int_equal(xseg_set_memory_fraction(1.0, 0), XSEG_SUCCESS);
    tu_xseg_init_or_skip(kind_config);
}

/* The requested bytes go down at the free itself (the next malloc raises them). */
static void test_requested_at_free(void **state)
{
    (void)state;
    fresh();
    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(60 * KIB, NULL), *c = tu_malloc(4 * KIB, NULL);
    void *s = tu_malloc(512, NULL), *t = tu_malloc(4 * KIB, NULL);
    tu_free(s);
    assert_int_equal(xseg_reset_peak_stats(0), XSEG_SUCCESS);
    int64_t r0 = tu_stat("requested_bytes.all.current");
    free_pends(x);
    void *y = tu_malloc(100, NULL); /* s: smaller than x, so the malloc need not wait for it */
    assert_ptr_equal(y, s);
    assert_int_equal(tu_stat("requested_bytes.all.current"), r0 - (int64_t)(60 * KIB) + 100);
    assert_int_equal(tu_stat("requested_bytes.all.peak"), r0);
    tu_free(y);
    tu_free(a);
    tu_free(c);
    tu_free(t);
}

/* Every other entry point settles the pending free before it looks: the statistics, a second
 * free of the same pointer, another thread's free, empty_cache. */
static void *free_on_thread(void *arg)
{
    return (void *)(intptr_t)xseg_free(arg);
}

static void test_entry_points_settle(void **state)
{
    (void)state;
    fresh();
    void *big = tu_malloc(4 * MIB, NULL); /* alone in its segment */
    void *o = tu_malloc(4 * KIB, NULL);   /* the last malloc elsewhere: big's free is not the slot's */
    free_pends(big);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS); /* big's whole segment is free: released */
    assert_int_equal(pending_addr(), 0);
    assert_int_equal(tu_stat("reserved_bytes.large_pool.current"), 0);
    tu_free(o);

    void *a = tu_malloc(4 * KIB, NULL), *x = tu_malloc(8 * KIB, NULL), *c = tu_malloc(4 * KIB, NULL);
    free_pends(x);
    assert_int_equal(xseg_free(x), XSEG_ERROR_INVALID_VALUE); /* freed once: refused */
    assert_int_equal(pending_addr(), 0);

    free_pends(a);
    assert_int_equal(tu_stat("allocation.all.current"), 1); /* the statistics settle it */
    assert_int_equal(pending_addr(), 0);

    void *b = tu_malloc(4 * KIB, NULL), *e = tu_malloc(4 * KIB, NULL);
    free_pends(b);
    pthread_t th;
    void *ret = NULL;
    assert_int_equal(pthread_create(&th, NULL, free_on_thread, c), 0);
    assert_int_equal(pthread_join(th, &ret), 0);
    assert_int_equal((intptr_t)ret, XSEG_SUCCESS);
    assert_int_equal(pending_addr(), (uintptr_t)c); /* b's free was made first; c's pends */
    tu_free(e);
    assert_int_equal(tu_stat("allocation.all.current"), 0);
    assert_int_equal(xseg_empty_cache(0), XSEG_SUCCESS);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0); /* every block merged back */
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "classic") == 0) {
        kind_config = "expandable_segments:False";
        classic = true;
    } else if (argc > 1 && strcmp(argv[1], "expandable") != 0) {
        fprintf(stderr, "test_free_pending: the kind is classic or expandable, not %s\n", argv[1]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malloc_takes_it),    cmocka_unit_test(test_fits_between),
        cmocka_unit_test(test_merged_takes_it),
        cmocka_unit_test(test_neighbour_fit),      cmocka_unit_test(test_larger_block_waits),
        cmocka_unit_test(test_peak_between),       cmocka_unit_test(test_peak_unsplit_fit),
        cmocka_unit_test(test_expandable_tail),    cmocka_unit_test(test_gc_frees_at_once),
        cmocka_unit_test(test_requested_at_free),
        cmocka_unit_test(test_entry_points_settle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
