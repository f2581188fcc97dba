/* core/device/placement.h, L1 (the lifetime predictor): random malloc and free sequences against a
 * reference written from the rule's sentence, so that the hot path's encodings (the window without
 * an event count, a new key entry's flags, the tag a block carries) keep the rule's meaning:
 *
 *   predicted long  <=>  frees outnumber mallocs among the last min(events, 64) mallocs and frees,
 *                        and the key's last min(recorded, 4) blocks, at least 2, are all allocated.
 *
 * Both prediction paths (the fast path's place_predict_home with its record, and life_predict_long
 * with life_record) are compared at every malloc. Blocks the predictor never recorded (a placed
 * block, xseg_pool_malloc_at) free through life_forget too, with any prio.
 *
 * On a device under 10 GiB (S1's regime) the class is compared instead, through both paths
 * (place_predict_home then place_class_home, and place_class_of), against:
 *
 *   of the class  <=>  the key's last min(recorded, 4) blocks, at least 2, are all allocated, and no
 *                      block of the key was ever freed while it was the key's newest record. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/device/placement.h"

#define T_KEYS 16   /* few enough that no key entry is ever replaced (8 probes a key) */
#define T_ADDRS 72   /* addresses blocks take: a freed one is soon another block's */
#define T_LIVE 60    /* live blocks at most */
#define T_RECS 4096  /* recorded blocks a key remembers in the reference (only its last 4 count) */

struct t_key {
    size_t req;
    CUstream stream;
    const void *pool;
    bool short_; /* a block of the key freed while it was the key's newest record */
    int nrec;
    int rec[T_RECS]; /* block ids, in record order */
};

struct t_block {
    struct block b;
    int key; /* -1: never recorded */
    bool live;
};

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static unsigned t_rand(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

static struct t_key keys[T_KEYS];
static struct t_block *blocks; /* by id */
static int nblocks;
static unsigned char window[1 << 20]; /* the events in order: 1 a free */
static size_t nevents;

static bool ref_frees_lead(void)
{
    size_t n = nevents < PLACE_LIFE_WINDOW ? nevents : PLACE_LIFE_WINDOW, frees = 0;
    for (size_t i = nevents - n; i < nevents; i++)
        frees += window[i];
    return 2 * frees > n;
}

static bool ref_key_live(const struct t_key *k)
{
    if (k->nrec < PLACE_LIFE_TWINS)
        return false;
    for (int i = k->nrec - 1; i >= 0 && i >= k->nrec - LIFE_DEPTH; i--)
        if (!blocks[k->rec[i]].live)
            return false;
    return true;
}

/* S1's regime: block @p id is the newest record of a cast key (0 to 3), which is never freed. */
static bool cast_newest(int id)
{
    int k = blocks[id].key;
    return k >= 0 && k < 4 && keys[k].rec[keys[k].nrec - 1] == id;
}

static bool addr_taken(const int *live_ids, int nlive, uintptr_t a)
{
    for (int i = 0; i < nlive; i++)
        if (blocks[live_ids[i]].b.addr == a)
            return true;
    return false;
}

static void run(unsigned steps, bool fast, bool small)
{
    struct dev_alloc *d = calloc(1, sizeof *d);
    assert_non_null(d);
    lock_init(&d->lock);
    lock_acquire(&d->lock); /* place_class_of's contract */
    d->use_expandable = true;
    d->cfg.expandable_segments_recycle = true;
    d->info.total_mem = small ? (size_t)1 << 30 : (size_t)80 << 30;
    place_refresh_cfg(d);
    assert_int_equal(place_class_regime(d), small);
    life_init(&d->life);
    blocks = calloc(steps + 1, sizeof *blocks);
    assert_non_null(blocks);
    nblocks = 0;
    nevents = 0;
    static int pool_a, pool_b;
    for (int i = 0; i < T_KEYS; i++)
        keys[i] = (struct t_key){.req = (size_t)(2 + i % 5) << 20, /* sizes shared across streams and pools */
                                 .stream = (CUstream)(uintptr_t)(i % 3 == 0 ? 0 : 0x1000 * (i % 3)),
                                 .pool = i % 4 == 3 ? (const void *)&pool_b : (const void *)&pool_a};
    int live_ids[T_LIVE], nlive = 0;
    unsigned predicted = 0, classed = 0, shorts = 0;
    for (unsigned s = 0; s < steps; s++) {
        /* Phases of mostly mallocs and mostly frees, so that the window swings both ways. */
        bool malloc_phase = (s / 151) % 2 == 0;
        bool do_malloc = nlive == 0 || (nlive < T_LIVE && t_rand(10) < (malloc_phase ? 7u : 3u));
        if (do_malloc) {
            uintptr_t a;
            do
                a = (uintptr_t)(1 + t_rand(T_ADDRS)) << 21;
            while (addr_taken(live_ids, nlive, a));
            int id = nblocks++;
            struct t_block *tb = &blocks[id];
            tb->b.addr = a;
            tb->b.prio = (uint32_t)rng; /* a treap's, until a record sets the tag */
            tb->live = true;
            if (t_rand(16) == 0) { /* placed, never seen by the predictor */
                tb->key = -1;
            } else {
                /* keys arrive over the run: a new key's first records also meet a window of frees */
                unsigned avail = 2 + s / 1200;
                int ki = (int)t_rand(avail < T_KEYS ? avail : T_KEYS);
                struct t_key *k = &keys[ki];
                bool want = ref_key_live(k) && ref_frees_lead();
                predicted += want;
                assert_int_equal(life_predict_long(&d->life, k->req, k->stream, k->pool), want);
                if (small) {
                    unsigned cls = ref_key_live(k) && !k->short_ ? PLACE_SEG_CLASS : PLACE_SEG_PLAIN;
                    classed += cls == PLACE_SEG_CLASS;
                    if (fast) {
                        assert_true(place_predict_home(d, BLOCK_SMALL_SIZE + 1, k->req, k->stream, k->pool));
                        assert_int_equal(place_class_home(d, k->req, k->stream, k->pool), cls);
                    } else {
                        assert_int_equal(place_class_of(d, k->req, k->stream, k->pool), cls);
                    }
                } else if (fast) {
                    assert_int_equal(place_predict_home(d, BLOCK_SMALL_SIZE + 1, k->req, k->stream, k->pool), want);
                }
                life_note(&d->life, 0);
                window[nevents++] = 0;
                if (fast)
                    place_record_home(d, k->req, k->stream, k->pool, &tb->b);
                else
                    life_record(&d->life, k->req, k->stream, k->pool, &tb->b);
                tb->key = ki;
                assert_true(k->nrec < T_RECS);
                k->rec[k->nrec++] = id;
            }
            live_ids[nlive++] = id;
        } else {
            /* mostly the oldest (a layer's activations), else any */
            unsigned j = t_rand(4) ? 0 : t_rand((unsigned)nlive);
            /* in S1's regime keys 0 to 3 are casts: their newest block is never freed, so they keep
             * the class while their last blocks are live (a cast key's newest is skipped) */
            for (unsigned tries = 0; small && tries < (unsigned)nlive && cast_newest(live_ids[j]); tries++)
                j = (j + 1) % (unsigned)nlive;
            if (small && cast_newest(live_ids[j]))
                continue; /* only casts' newest blocks are live: no free this step */
            int id = live_ids[j];
            struct t_block *tb = &blocks[id];
            memmove(&live_ids[j], &live_ids[j + 1], (size_t)(--nlive - (int)j) * sizeof *live_ids);
            tb->live = false;
            if (tb->key >= 0 && keys[tb->key].rec[keys[tb->key].nrec - 1] == id) {
                shorts += !keys[tb->key].short_;
                keys[tb->key].short_ = true;
            }
            life_note(&d->life, 1);
            window[nevents++] = 1;
            life_forget(&d->life, &tb->b);
        }
        assert_true(nevents < sizeof window);
    }
    /* The sequences reach both answers, often; in S1's regime, keys are classed and some marked short
     * (not all: the class must still be reached). */
    assert_true(predicted > steps / 50);
    if (small) {
        assert_true(classed > steps / 200);
        assert_true(shorts > 0 && shorts < T_KEYS);
    }
    lock_release(&d->lock);
    free(blocks);
    free(d);
}

/* The slow path's record (life_record, a hash a record) against the reference. */
static void test_record(void **state)
{
    (void)state;
    run(20000, false, false);
}

/* The fast path's (place_predict_home, then place_record_home into the entry it found). */
static void test_record_home(void **state)
{
    (void)state;
    run(20000, true, false);
}

/* S1's class through place_class_of (a probe) against the reference, on a 1 GiB device. */
static void test_class(void **state)
{
    (void)state;
    run(20000, false, true);
}

/* ... and through the fast path's place_predict_home and place_class_home (its home entry). */
static void test_class_home(void **state)
{
    (void)state;
    run(20000, true, true);
}

/* A device's first events: fewer than 64 seen, frees lead only when frees outnumber mallocs among
 * them (LIFE_RING_INIT stands for the missing count). Frees can lead from the start: a placed
 * block's malloc is not seen. */
static void test_window_start(void **state)
{
    (void)state;
    for (unsigned pattern = 0; pattern < 4096; pattern++) {
        struct life_state *l = calloc(1, sizeof *l);
        assert_non_null(l);
        life_init(l);
        for (unsigned e = 1; e <= 70; e++) {
            unsigned is_free = e <= 12 ? (pattern >> (e - 1)) & 1 : (unsigned)t_rand(2);
            life_note(l, is_free);
            window[e - 1] = (unsigned char)is_free;
            nevents = e;
            assert_int_equal(life_frees_lead(l), ref_frees_lead());
        }
        free(l);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record),
        cmocka_unit_test(test_record_home),
        cmocka_unit_test(test_window_start),
        cmocka_unit_test(test_class),
        cmocka_unit_test(test_class_home),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
