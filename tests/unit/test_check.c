/* core/device/check: dev_check accepts a consistent device and aborts on each kind of broken
 * invariant (a miscounted statistic, a broken neighbour link, a block missing from its index).
 * Needs the expensive level (-Ddebug_level=2, as in tools/test.sh's ASan build); skips otherwise.
 * Each corruption is made in a forked child, which must die by SIGABRT. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/device/check.h"
#include "core/runtime.h"
#include "tests/common/testutil.h"

#if XSEG_CHECK_EXPENSIVE
static struct dev_alloc *dev;

static int corrupt_stat(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    dev->acct.stats.allocated_bytes[XSEG_STAT_SMALL_POOL].current += 512;
    dev_check(dev);
    return 0; /* not reached when the check works */
}

static int corrupt_link(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    struct block *b = dev->segs->first;
    b->next->prev = NULL;
    dev_check(dev);
    return 0;
}

static int corrupt_index(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    struct block *b = dev->segs->first;
    while (b && !b->in_index)
        b = b->next;
    bpool_remove_free(block_pool(b), b); /* a cached block no index knows */
    dev_check(dev);
    return 0;
}

/* The first block of the first segment that is in the free index. */
static struct block *first_free(void)
{
    struct block *b = dev->segs->first;
    while (b && !b->in_index)
        b = b->next;
    return b;
}

static int corrupt_bitmap(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    struct block *b = first_free();
    struct sbins *s = bpool_bins(block_pool(b), b->stream);
    unsigned k = bins_index(b->size);
    s->map[k >> 6] &= ~((uint64_t)1 << (k & 63)); /* a non-empty bin the bitmap does not show */
    dev_check(dev);
    return 0;
}

static int corrupt_bin(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    struct block *b = first_free();
    struct bpool *pool = block_pool(b);
    struct sbins *s = bpool_bins(pool, b->stream);
    bpool_remove_free(pool, b);
    /* Back in the index, in the bin above the one its size says (empty: it was alone there). */
    unsigned k = bins_index(b->size) + 1;
    s->bin[k] = b;
    s->map[k >> 6] |= (uint64_t)1 << (k & 63);
    s->summary |= (uint64_t)1 << (k >> 6);
    b->in_index = true;
    pool->nfree++;
    dev_check(dev);
    return 0;
}

static int corrupt_pool_bit(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    struct block *b = first_free();
    b->small_pool = !b->small_pool; /* dev_block_pool would find the other pool */
    dev_check(dev);
    return 0;
}

/* release_floor above a segment's size: empty_cache and trim would skip its whole free block. */
static int corrupt_floor(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    dev->release_floor = dev->segs->size + 1;
    dev_check(dev);
    return 0;
}

/* A busy slot (the parent filled it) whose debt the sum of core/device/fast.h's invariant leaves out. */
static int corrupt_owed(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    dev->fast.busy_slots = 0;
    dev_check(dev);
    return 0;
}

static int consistent(void *arg)
{
    (void)arg;
    lock_acquire(&dev->lock);
    dev_check(dev);
    lock_release(&dev->lock);
    return 0;
}
#endif

static void test_dev_check(void **state)
{
    (void)state;
#if !XSEG_CHECK_EXPENSIVE
    skip(); /* dev_check exists at debug_level=2 only */
#else
    tu_xseg_init_or_skip("expandable_segments:False");
    void *p = tu_malloc(4096, NULL); /* one small segment: the allocated front and a free rest */
    assert_int_equal(rt_device(0, &dev), XSEG_SUCCESS);
    int detail = 0;
    assert_int_equal(tu_run_child(consistent, NULL, &detail), TU_CHILD_OK);
    int (*corrupt[])(void *) = {corrupt_stat, corrupt_link,     corrupt_index,  corrupt_bitmap,
                                corrupt_bin,  corrupt_pool_bit, corrupt_floor};
    for (size_t i = 0; i < sizeof corrupt / sizeof corrupt[0]; i++) {
        assert_int_equal(tu_run_child(corrupt[i], NULL, &detail), TU_CHILD_SIGNAL);
        assert_int_equal(detail, SIGABRT);
    }
    tu_free(p); /* the last block allocated, first in its segment: its free fills its slot */
    assert_int_not_equal(dev->fast.busy_slots, 0);
    assert_int_equal(tu_run_child(consistent, NULL, &detail), TU_CHILD_OK);
    assert_int_equal(tu_run_child(corrupt_owed, NULL, &detail), TU_CHILD_SIGNAL);
    assert_int_equal(detail, SIGABRT);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_dev_check)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
