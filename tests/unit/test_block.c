/* core/index/block: the free index (size bins per stream) and its in-place key changes (bpool_fit
 * with its predecessor and successor in the bin, bpool_free_take_front, bpool_free_grow), its
 * walks (bpool_lower_bound, bpool_next_free, bpool_prev_free, bpool_collect_free) and the live
 * pointer map, against plain reference implementations over random operation sequences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/hugemem.h"
#include "core/index/bins.h"
#include "core/index/block.h"
#include "core/index/ptrmap.h"
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

/* The reference index: the indexed blocks in key order (returns the count). */
static size_t ref_sorted(struct block *blocks, struct block **ref)
{
    size_t n = 0;
    for (size_t i = 0; i < NB; i++)
        if (blocks[i].in_index)
            ref[n++] = &blocks[i];
    qsort(ref, n, sizeof ref[0], key_cmp_blocks);
    return n;
}

/* The walks at a random key (stream, size, addr) against the reference order. */
static void check_walks(const struct bpool *p, struct block *blocks, CUstream stream, size_t size, uintptr_t addr)
{
    struct block *ref[NB];
    size_t n = ref_sorted(blocks, ref), i = 0;
    while (i < n && bkey_less((uintptr_t)ref[i]->stream, ref[i]->size, ref[i]->addr, (uintptr_t)stream, size, addr))
        i++;
    assert_ptr_equal(bpool_lower_bound(p, stream, size, addr), i < n ? ref[i] : NULL);
    assert_ptr_equal(bpool_prev_free(p, stream, size, addr), i > 0 ? ref[i - 1] : NULL);
    for (size_t j = 0; j < n; j++)
        assert_ptr_equal(bpool_next_free(p, ref[j]), j + 1 < n ? ref[j + 1] : NULL);
}

struct walk_seen {
    struct block *v[NB];
    size_t n;
};

static void walk_note(void *ctx, struct block *b)
{
    struct walk_seen *w = ctx;
    assert_true(w->n < NB);
    w->v[w->n++] = b;
}

/* bins_walk over [lo, hi) of @p stream: unbounded, exactly the reference's blocks in range, each
 * once; bounded by @p max, min(max, that many) of them. */
static void check_bins_walk(const struct bpool *p, struct block *blocks, CUstream stream, size_t lo, size_t hi,
                            unsigned max)
{
    struct sbins *s = bpool_bins_lookup(p, stream);
    if (!s)
        return;
    size_t want = 0;
    for (size_t i = 0; i < NB; i++)
        want += blocks[i].in_index && blocks[i].stream == stream && blocks[i].size >= lo && blocks[i].size < hi;
    for (int bounded = 0; bounded < 2; bounded++) {
        struct walk_seen w = {.n = 0};
        bins_walk(s, lo, hi, bounded ? max : ~0u, walk_note, &w);
        assert_int_equal(w.n, bounded && max < want ? max : want);
        for (size_t i = 0; i < w.n; i++) {
            assert_true(w.v[i]->in_index && w.v[i]->stream == stream && w.v[i]->size >= lo && w.v[i]->size < hi);
            for (size_t j = 0; j < i; j++)
                assert_ptr_not_equal(w.v[i], w.v[j]);
        }
    }
}

/* Sizes that fall in exact bins (512 B steps) and in shared ones (16 sizes a bin near 300 KiB). */
static size_t rnd_size(void)
{
    return rnd() & 1 ? 512 * (1 + rnd() % 16) : 512 * (600 + rnd() % 64);
}

/* bins_class_min is the first size of each class: bins_index maps it, and not the size before it,
 * to the class. */
static void test_bins_class_min(void **state)
{
    (void)state;
    for (unsigned k = 1; k < 1984; k++) {
        assert_int_equal(bins_index(bins_class_min(k)), k);
        assert_int_equal(bins_index(bins_class_min(k) - 1), k - 1);
    }
    assert_int_equal(bins_class_min(0), 0);
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
    /* The streams' segments hold their bins (two references on stream 2). */
    for (uintptr_t st = 1; st <= 3; st++)
        assert_true(bpool_bins_acquire(&pool, (CUstream)st));
    assert_true(bpool_bins_acquire(&pool, (CUstream)(uintptr_t)2));
    assert_int_equal(pool.nstreams, 3);
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
                b->size = rnd_size();
                b->addr = next_addr;
                next_addr += (uintptr_t)1 << 32;
                bpool_insert_free(&pool, b);
                inserted++;
            }
            break;
        case 1: { /* best fit; split its front off */
            size_t want = rnd_size();
            struct block *pred, *nx, *rpred, *rnx;
            struct block *f = bpool_fit(&pool, stream, want, &pred, &nx);
            struct block *rf = ref_fit(blocks, stream, want, &rpred, &rnx);
            /* bpool_fit: the fit on the stream only, its neighbours inside its bin only. */
            assert_ptr_equal(f, rf && rf->stream == stream ? rf : NULL);
            if (!f)
                break;
            unsigned k = bins_index(f->size);
            assert_ptr_equal(pred, rpred && rpred->stream == stream && bins_index(rpred->size) == k ? rpred : NULL);
            assert_ptr_equal(nx, rnx && rnx->stream == stream && bins_index(rnx->size) == k ? rnx : NULL);
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
                bpool_rekey_free(&pool, b, b->addr + 512, rnd_size());
            break;
        }
        check_index(&pool, blocks);
        if (it % 8 == 1) {
            size_t lo = rnd_size(), hi = lo + 512 * (rnd() % 80);
            check_bins_walk(&pool, blocks, (CUstream)(uintptr_t)(1 + rnd() % 3), lo, hi, (unsigned)(1 + rnd() % 8));
        }
        if (it % 8 == 0)
            check_walks(&pool, blocks, (CUstream)(uintptr_t)(rnd() % 5), rnd_size() + (rnd() & 1) * 512,
                        next_addr / 2);
    }
    assert_true(inserted > 50 && in_place_ops > 500);
    for (size_t i = 0; i < NB; i++)
        if (blocks[i].in_index)
            bpool_remove_free(&pool, &blocks[i]);
    assert_int_equal(pool.nfree, 0);
    /* The last reference of each stream frees its bins; the last stream, the pool's arrays. */
    for (uintptr_t st = 1; st <= 3; st++)
        bpool_bins_release(&pool, (CUstream)st);
    assert_int_equal(pool.nstreams, 1);
    assert_non_null(bpool_bins_lookup(&pool, (CUstream)(uintptr_t)2));
    bpool_bins_release(&pool, (CUstream)(uintptr_t)2);
    assert_int_equal(pool.nstreams, 0);
    assert_null(pool.by_stream);
    assert_null(pool.hash);
    assert_null(pool.last);
}

/* The map against a reference (present[]), with the fingerprints turned off halfway when
 * @p fp_off_at is not 0 (ptrmap_fp_off: every entry must stay findable), or before the first
 * table when @p high_slab (ptrmap_admit of structs above 2^48: no table may keep them). Tables of
 * @p huge_min bytes or more go on huge pages (0: the default, which these few keys never reach). */
static void ptrmap_reference_run(size_t fp_off_at, bool high_slab, size_t huge_min)
{
    enum { NK = 3000 };
    static uintptr_t keys[NK];
    static bool present[NK];
    static struct block vals[NK];
    struct ptrmap m;
    memset(&m, 0, sizeof m);
    m.huge_min = huge_min;
    memset(present, 0, sizeof present); /* static: each run starts with an empty reference */
    if (high_slab) {
        uintptr_t hi = PTRMAP_FP_BITS ? (uintptr_t)1 << 50 : 0;
        ptrmap_admit(&m, (void *)hi, (void *)(hi + 4096));
        assert_true(m.keep == PTRMAP_KEEP_NO_FP || PTRMAP_FP_BITS == 0);
    }
    for (size_t i = 0; i < NK; i++) {
        keys[i] = (uintptr_t)(1 + (rnd() % 100000)) * 512 + ((i % 7) << 30) * 512;
        vals[i].addr = keys[i]; /* the map's key is its block's address */
    }
    size_t live = 0;
    size_t iters = tu_scaled(200000, 20000);
    for (size_t it = 0; it < iters; it++) {
        if (fp_off_at && it == iters / fp_off_at) {
            assert_true(ptrmap_fp_mask(&m) != 0 || PTRMAP_FP_BITS == 0);
            ptrmap_fp_off(&m);
            assert_true(ptrmap_fp_mask(&m) == 0);
        }
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
        if (m.huge) /* whole 2 MiB pages, aligned */
            assert_true(m.cap * sizeof *m.slots % HUGEMEM_PAGE == 0 && (uintptr_t)m.slots % HUGEMEM_PAGE == 0);
        if (high_slab)
            assert_true(ptrmap_fp_mask(&m) == 0); /* every table since, the grown ones too */
    }
    for (size_t i = 0; i < NK; i++)
        if (present[i])
            assert_ptr_equal(ptrmap_get(&m, keys[i]), &vals[i]);
    assert_null(ptrmap_get(&m, 0));
    ptrmap_destroy(&m);
}

static void test_ptrmap_against_reference(void **state)
{
    (void)state;
    ptrmap_reference_run(0, false, 0);
}

static void test_ptrmap_fingerprints_off(void **state)
{
    (void)state;
    ptrmap_reference_run(2, false, 0);
    ptrmap_reference_run(0, true, 0);
}

/* Tables on huge pages (base/hugemem.h) from the first: the first grow asks for 256 slots, whose
 * 2 KiB round down to one 2 MiB page (262,144 slots), so the map is huge from its first table;
 * every entry stays findable, as in the runs above, and with the fingerprints turned off. */
static void test_ptrmap_huge_tables(void **state)
{
    (void)state;
    struct ptrmap m;
    memset(&m, 0, sizeof m);
    m.huge_min = 1;
    assert_true(ptrmap_grow(&m));
    if (!m.huge) {
        ptrmap_destroy(&m);
        skip(); /* the kernel takes no MADV_HUGEPAGE advice: the map stays on calloc, as it must */
    }
    assert_int_equal(m.cap, HUGEMEM_PAGE / sizeof *m.slots);
    assert_int_equal((uintptr_t)m.slots % HUGEMEM_PAGE, 0);
    ptrmap_destroy(&m);
    assert_null(m.slots);
    ptrmap_reference_run(0, false, 1);
    ptrmap_reference_run(2, false, 1);
    /* Growth across the rounding: 262,144 slots (one page), then 393,216 on calloc (3 MiB rounds
     * down to the page it had), then 524,288 on two pages: every key found after each rehash. */
    enum { NHB = 300000 };
    struct block *bs = calloc(NHB, sizeof *bs);
    assert_non_null(bs);
    memset(&m, 0, sizeof m);
    m.huge_min = 1;
    size_t caps[3] = {0}, ncaps = 0;
    bool huge[3] = {false};
    for (size_t i = 0; i < NHB; i++) {
        bs[i].addr = (uintptr_t)(i + 1) * 512;
        assert_true(ptrmap_put(&m, bs[i].addr, &bs[i]));
        if (ncaps == 0 || caps[ncaps - 1] != m.cap) {
            assert_true(ncaps < 3);
            caps[ncaps] = m.cap;
            huge[ncaps++] = m.huge;
        }
    }
    assert_int_equal(ncaps, 3);
    assert_int_equal(caps[0], 262144);
    assert_int_equal(caps[1], 393216);
    assert_int_equal(caps[2], 524288);
    assert_true(huge[0] && !huge[1] && huge[2]);
    for (size_t i = 0; i < NHB; i++)
        assert_ptr_equal(ptrmap_take(&m, bs[i].addr), &bs[i]);
    assert_int_equal(m.count, 0);
    ptrmap_destroy(&m);
    free(bs);
}

/* A lookup reads through no entry but its own: 14 keys share one home slot (distances 0..13,
 * below the saturated tag, so a deletion's shift reads no block either), each block struct on a
 * page of its own, and every page but the looked-up block's is made unreadable. Without the
 * fingerprints the probe would read the blocks of the entries before it and fault. */
static void test_ptrmap_probe_reads_only_its_block(void **state)
{
    (void)state;
    if (PTRMAP_FP_BITS == 0)
        skip(); /* 32-bit host: no room for fingerprints */
    enum { NK = 14 };
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *pages = mmap(NULL, NK * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(pages != MAP_FAILED);
    struct ptrmap m;
    memset(&m, 0, sizeof m);
    assert_true(ptrmap_grow(&m)); /* the first table: 256 slots, room for all 14 without growing */
    size_t home = ptrmap_hash(512 * 1000, m.cap);
    uintptr_t keys[NK];
    size_t n = 0;
    for (uintptr_t k = 512; n < NK; k += 512) {
        if (ptrmap_hash(k, m.cap) != home)
            continue;
        bool fresh = true; /* distinct fingerprints: a shared one would be read through, rightly */
        for (size_t j = 0; j < n; j++)
            fresh &= ptrmap_fp_of(ptrmap_mix(keys[j])) != ptrmap_fp_of(ptrmap_mix(k));
        if (fresh)
            keys[n++] = k;
    }
    for (size_t i = 0; i < NK; i++) {
        struct block *b = (struct block *)(void *)(pages + i * page);
        b->addr = keys[i];
        assert_true(ptrmap_put(&m, keys[i], b));
    }
    assert_int_equal(m.cap, 256);
    /* The last key inserted sits at distance 13; then the first, whose take shifts all others. */
    size_t targets[2] = {NK - 1, 0};
    for (size_t t = 0; t < 2; t++) {
        size_t k = targets[t];
        for (size_t i = 0; i < NK; i++)
            assert_int_equal(mprotect(pages + i * page, page, i == k ? PROT_READ | PROT_WRITE : PROT_NONE), 0);
        struct block *want = (struct block *)(void *)(pages + k * page);
        assert_ptr_equal(ptrmap_get(&m, keys[k]), want);
        assert_ptr_equal(ptrmap_take(&m, keys[k]), want);
        assert_null(ptrmap_get(&m, keys[k]));
        assert_int_equal(mprotect(pages, NK * page, PROT_READ | PROT_WRITE), 0);
    }
    for (size_t i = 1; i < NK - 1; i++)
        assert_ptr_equal(ptrmap_get(&m, keys[i]), (struct block *)(void *)(pages + i * page));
    ptrmap_destroy(&m);
    munmap(pages, NK * page);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bins_class_min),
        cmocka_unit_test(test_free_index_in_place),
        cmocka_unit_test(test_ptrmap_against_reference),
        cmocka_unit_test(test_ptrmap_fingerprints_off),
        cmocka_unit_test(test_ptrmap_huge_tables),
        cmocka_unit_test(test_ptrmap_probe_reads_only_its_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
