/* core/block: the free index's in-place key changes (bpool_fit with its predecessor and successor,
 * bpool_free_take_front, bpool_free_grow) and the live pointer map, against plain reference
 * implementations over random operation sequences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/block.h"
#include "tests/common/testutil.h"

#define NB 64

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int key_cmp_blocks(const void *x, const void *y)
{
    const struct block *a = *(const struct block *const *)x, *b = *(const struct block *const *)y;
    if (bkey_less((uintptr_t)a->stream, a->size, a->addr, (uintptr_t)b->stream, b->size, b->addr))
        return -1;
    return bkey_less((uintptr_t)b->stream, b->size, b->addr, (uintptr_t)a->stream, a->size, a->addr);
}

/* The index holds exactly the blocks marked in_index, in key order. */
static void check_index(const struct bpool *p, struct block *blocks)
{
    struct block *ref[NB];
    size_t n = 0;
    for (size_t i = 0; i < NB; i++)
        if (blocks[i].in_index)
            ref[n++] = &blocks[i];
    qsort(ref, n, sizeof ref[0], key_cmp_blocks);
    struct block **got;
    size_t ngot;
    assert_true(bpool_collect_free(p, &got, &ngot));
    assert_int_equal(ngot, n);
    assert_int_equal(p->nfree, n);
    for (size_t i = 0; i < n; i++)
        assert_ptr_equal(got[i], ref[i]);
    free(got);
}

/* Reference best fit: the first indexed block with key >= (stream, size, 0), its predecessor and
 * its successor in key order. */
static struct block *ref_fit(struct block *blocks, CUstream stream, size_t size, struct block **pred,
                             struct block **next)
{
    struct block *ref[NB];
    size_t n = 0;
    for (size_t i = 0; i < NB; i++)
        if (blocks[i].in_index)
            ref[n++] = &blocks[i];
    qsort(ref, n, sizeof ref[0], key_cmp_blocks);
    size_t i = 0;
    while (i < n && bkey_less((uintptr_t)ref[i]->stream, ref[i]->size, ref[i]->addr, (uintptr_t)stream, size, 0))
        i++;
    *pred = i > 0 ? ref[i - 1] : NULL;
    *next = i + 1 < n ? ref[i + 1] : NULL;
    return i < n ? ref[i] : NULL;
}

static void test_free_index_in_place(void **state)
{
    (void)state;
    static struct block blocks[NB];
    struct bpool pool;
    memset(&pool, 0, sizeof pool);
    memset(blocks, 0, sizeof blocks);
    /* Far apart, so that shifting addresses never makes two keys equal. */
    uintptr_t next_addr = (uintptr_t)1 << 32;
    size_t inserted = 0, in_place_ops = 0;
    size_t iters = tu_scaled(20000, 4000);
    for (size_t it = 0; it < iters; it++) {
        struct block *b = &blocks[rnd() % NB];
        /* Few streams and sizes, so keys collide in stream and size and order by address. */
        CUstream stream = (CUstream)(uintptr_t)(1 + rnd() % 3);
        switch (rnd() % 4) {
        case 0: /* insert or remove */
            if (b->in_index) {
                bpool_remove_free(&pool, b);
            } else {
                b->stream = stream;
                b->size = 512 * (1 + rnd() % 16);
                b->addr = next_addr;
                next_addr += (uintptr_t)1 << 32;
                bpool_insert_free(&pool, b);
                inserted++;
            }
            break;
        case 1: { /* best fit; split its front off */
            size_t want = 512 * (1 + rnd() % 16);
            struct block *pred, *nx, *rpred, *rnx;
            struct block *f = bpool_fit(&pool, stream, want, &pred, &nx);
            assert_ptr_equal(f, ref_fit(blocks, stream, want, &rpred, &rnx));
            if (!f)
                break;
            assert_ptr_equal(pred, rpred);
            assert_ptr_equal(nx, rnx);
            if (f->size > want) {
                bpool_free_take_front(&pool, f, want, pred);
                in_place_ops++;
            }
            break;
        }
        case 2: /* a neighbour merged into an indexed block: from the front or the back */
            if (b->in_index) {
                size_t add = 512 * (1 + rnd() % 8);
                if (rnd() & 1)
                    bpool_free_grow(&pool, b, b->addr - add, b->size + add);
                else
                    bpool_free_grow(&pool, b, b->addr, b->size + add);
                in_place_ops++;
            }
            break;
        default: /* general re-key */
            if (b->in_index)
                bpool_rekey_free(&pool, b, b->addr + 512, 512 * (1 + rnd() % 16));
            break;
        }
        check_index(&pool, blocks);
    }
    assert_true(inserted > 50 && in_place_ops > 500);
    for (size_t i = 0; i < NB; i++)
        if (blocks[i].in_index)
            bpool_remove_free(&pool, &blocks[i]);
    assert_null(pool.free);
    assert_int_equal(pool.nfree, 0);
}

static void test_ptrmap_against_reference(void **state)
{
    (void)state;
    enum { NK = 3000 };
    static uintptr_t keys[NK];
    static bool present[NK];
    static struct block vals[NK];
    struct ptrmap m;
    memset(&m, 0, sizeof m);
    for (size_t i = 0; i < NK; i++) {
        keys[i] = (uintptr_t)(1 + (rnd() % 100000)) * 512 + ((i % 7) << 30) * 512;
        vals[i].addr = keys[i]; /* the map's key is its block's address */
    }
    size_t live = 0;
    size_t iters = tu_scaled(200000, 20000);
    for (size_t it = 0; it < iters; it++) {
        size_t i = rnd() % NK;
        /* Duplicate keys in the table refer to one slot: only the first index owns it. */
        size_t owner = i;
        for (size_t j = 0; j < i; j++)
            if (keys[j] == keys[i]) {
                owner = j;
                break;
            }
        if (owner != i)
            continue;
        if (present[i]) {
            assert_ptr_equal(ptrmap_get(&m, keys[i]), &vals[i]);
            assert_ptr_equal(ptrmap_take(&m, keys[i]), &vals[i]);
            assert_null(ptrmap_get(&m, keys[i]));
            assert_null(ptrmap_take(&m, keys[i]));
            present[i] = false;
            live--;
        } else {
            assert_null(ptrmap_get(&m, keys[i]));
            assert_true(ptrmap_put(&m, keys[i], &vals[i]));
            present[i] = true;
            live++;
        }
        assert_int_equal(m.count, live);
    }
    for (size_t i = 0; i < NK; i++)
        if (present[i])
            assert_ptr_equal(ptrmap_get(&m, keys[i]), &vals[i]);
    assert_null(ptrmap_get(&m, 0));
    ptrmap_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_index_in_place),
        cmocka_unit_test(test_ptrmap_against_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
