/*
 * Placement (issue 48 item 4): where a large request in expandable mode goes, and how large the
 * chunks are that back it. Every rule and the constant it turns on is in the table below, with what
 * the constant trades, the record that measured it (docs/benchmarks-replay.md, the row named) and
 * the test that guards it (tests/alloc/test_fit.c). A rule changes by its row, re-measured on the
 * row's benchmark and test, never for one trace.
 *
 *  rule  constant (value)            trades                           record row; test
 *  ----  --------------------------  -------------------------------  --------------------------------
 *  L1    PLACE_LIFE_WINDOW (64)      a longer window reacts later to  #lifetime-placement,
 *        PLACE_LIFE_TWINS (2)        a new phase; fewer twins put     "size-live+frees";
 *        LIFE_DEPTH (4, state.h)     more short blocks on top         fit_training_step,
 *        LIFE_KEYS (1024, state.h),  host memory (in the device's     fit_top_placement(_off)
 *        PLACE_LIFE_PROBES (8)       state) against forgotten keys
 *  L2    PLACE_TOP_WALK_MAX (256)    host time under the lock against #lifetime-placement, "highest
 *                                    a lower block taken (at most 86  fitting block, its top end";
 *                                    fitting free blocks at a top     #walks (bench_walks);
 *                                    placement in the 25 traces)      fit_top_placement
 *  C1    PLACE_DEVICE_CHUNK_DIV      smaller chunks give more back    "The 1 % bar", Small devices
 *        (512)                       around live blocks; at most      (bcrafton); fit_small_device,
 *                                    1,024 chunks a device            fit_small_device_pages,
 *                                                                     fit_large_device_pages
 *  C2    PLACE_NEAR_FULL_DIV (8)     driver calls near a full device  "The 1 % bar" (codeloc_qwen3_
 *                                    against what a refusal can give  gnn_3gpu-dev2); fit_fragmented
 *  C3    PLACE_FINE_CHUNK_DIV (16)   granule chunks fit as well but   #chunk-size (sqattn_qwen2_calib:
 *                                    cost 5x the calls                33,093 calls against 176,842);
 *                                                                     fit_fragmented_after_refusal,
 *                                                                     fit_kept_handles
 *  S1    PLACE_CLASS_DEVICE_MAX      segments of their own strand     "Beyond lifetime" (silmont_fwd_
 *        (10 GiB: C1's regime),      no cast beside a freed           bf16); #the-fit-harness (the
 *        LIFE_SHORT (a key's mark)   activation, but a growth cannot  split: accepted on both halves);
 *                                    use the other kind's free VA;    fit_class_segments,
 *                                    the mark keeps shared sizes out  fit_class_short, unit-life
 *
 *  L1  A large request is predicted long-lived when frees outnumbered mallocs among the last
 *      PLACE_LIFE_WINDOW the device lock saw and the last 2 to LIFE_DEPTH blocks of its (requested
 *      size, stream, pool) are all still allocated (a training step's gradients and optimizer
 *      states match, a forward pass's activations do not). empty_cache starts the window over
 *      (#fit-after-a-warm-run, benchmarks/fit_warm.py; fit_top_placement_empty_cache).
 *  L2  A predicted-long request takes the top end of the highest fitting free block (newer
 *      segment, then higher address), everything else best fit: long-lived blocks collect above
 *      the holes best fit reuses.
 *  C1  On a device under 10 GiB a chunk is at most 1/PLACE_DEVICE_CHUNK_DIV of the device (in
 *      granules): a page shared with a long-lived block can still give back its freed part.
 *  C2  Within the device's (or fraction's) last 1/PLACE_NEAR_FULL_DIV, memory is mapped as under
 *      pressure (C3): a later refusal has to give back what is mapped there first.
 *  C3  After a refused growth a chunk is 1/PLACE_FINE_CHUNK_DIV of its request (granules to a
 *      page), or the largest kept handle's size while handles wait to be mapped again.
 *  S1  On a device under PLACE_CLASS_DEVICE_MAX, a large request whose key's last 2 to LIFE_DEPTH
 *      blocks are all live (L1's second half) and whose key is not short takes free blocks and
 *      growth only in segments of that class (segrec.cls), every other large request only in the
 *      others, best fit; under pressure (the reclaim's retries) either kind. A key is short from
 *      the first of its blocks freed while it was the key's newest record: a size that temporaries
 *      or activations also take (niu_fwdbwd200*), whose few long-lived blocks would strand
 *      granules in class segments nothing refills. L1 and L2 step aside there: long-lived blocks
 *      of one size (a forward pass's weight casts) fill granules among themselves.
 *
 * All with expandable_segments_recycle only (off: PyTorch's layout, one chunk a page, best fit);
 * an explicit expandable_chunk_mb replaces C1. A run that never meets pressure on a device of
 * 10 GiB or more (the six pytorch/ traces on 80 GiB) makes the same driver calls without C1-C3,
 * and S1 leaves such a device alone. S1 costs the key's hash and home-entry test every large malloc
 * on devices under 10 GiB (its class, its short mark and its record from that entry), and a walk of
 * the stream's free blocks (at most PLACE_TOP_WALK_MAX) where the index's best fit is of the other
 * class; no driver call. The rules are judged by benchmarks/fit_harness.py: on every recorded trace
 * no more than one 2 MiB step above the rule before, a lower mean, on a tuning half and on the
 * held-out half.
 * L1 is O(1) a malloc or free, allocates nothing, calls no driver; a slot's block
 * (core/device/fast.h) is seen at its malloc and at the free that settles it. Locking: the device
 * lock, for all of it. Host cost (callgrind, the device-lock round robin against the same tree with
 * XSEG_PLACEMENT_OFF; docs/benchmarks-host.md's host-pairs table): the large pool's pair 841
 * instructions against 792 (+6.2 %) on 80 GiB, 859 (+8.5 %) on 8 GiB (S1); the small pool's +0.9 %
 * (the finders' request passed by address took 9 off the tree without the placement, 1 with it). What a large pair must do here is
 * about 32 of them: the key's hash and home-entry test (14), its record (9, in the home entry the
 * prediction found: life_state.home_tag), the window (3) and the free's forget (6); S1 adds its
 * class test and its own malloc (malloc_class in core/alloc.c: a call, no second hash). Dropping S1
 * instead was measured and refused: benchmarks-replay.md#s1-on-and-off.
 */
#ifndef XSEG_CORE_PLACEMENT_H
#define XSEG_CORE_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>

#include "base/common.h"
#include "core/device/device.h"

#define PLACE_LIFE_WINDOW 64     /* L1: mallocs and frees in the window (the bits of life_state.ring) */
#define PLACE_LIFE_TWINS 2       /* L1: live blocks of the key needed, at least */
#define PLACE_LIFE_PROBES 8      /* L1: key entries probed from a key's home before one is replaced */
#define PLACE_TOP_WALK_MAX 256   /* L2: fitting free blocks a top-fit or class search looks at, at most */
#define PLACE_DEVICE_CHUNK_DIV 512 /* C1 */
#define PLACE_NEAR_FULL_DIV 8    /* C2 */
#define PLACE_FINE_CHUNK_DIV 16  /* C3 */
#define PLACE_CLASS_DEVICE_MAX ((size_t)10 << 30) /* S1: devices under 10 GiB, C1's regime */
#define PLACE_REGIME_OFF 0 /* life_state.l1: neither L1 nor S1 (classic, or without recycle) */
#define PLACE_REGIME_L1 1  /* L1 (and L2) */
#define PLACE_REGIME_S1 2  /* S1 instead */
#define PLACE_SEG_ANY 0   /* S1: a growth may use any segment (life_state.want) */
#define PLACE_SEG_PLAIN 1 /* S1: only segments of other requests */
#define PLACE_SEG_CLASS 2 /* S1: only segments of requests whose last blocks are live */

/* XSEG_PLACEMENT_OFF (a -D of a benchmark build only): L1 and L2 compiled out, to measure their
 * cost against the same tree (benchmarks/callgrind_round_robin.sh). XSEG_PLACEMENT_NO_S1 (the same):
 * S1 off, L1 and L2 on every device size, for the fit harness's S1 on/off comparison. */
#ifdef XSEG_PLACEMENT_OFF
#define life_init(l) ((void)(l))
#define life_note(l, is_free) ((void)(l), (void)(is_free))
#define life_note_free(l) ((void)(l))
#define life_predict_long(l, req, stream, pool) ((void)(l), false)
#define life_record(l, req, stream, pool, b) ((void)(l))
#define place_record_home(d, req, stream, pool, b) ((void)(d))
#define life_forget(l, b) ((void)(l))
#else
/* L1's window before any event: alternate bits, 32 of 64 set. After e < 64 events, f of them frees,
 * it holds f + ceil((64 - e) / 2) set bits, so "more than 32 set" is exactly "2 f > e": frees
 * outnumbered mallocs among the events seen, without a count of them (tests/unit/test_life.c,
 * test_window_start; frees can lead early: a placed block's malloc is not seen). */
#define LIFE_RING_INIT 0x5555555555555555ull

/* L1's state of a new device (its struct zeroed). */
static inline void life_init(struct life_state *l)
{
    l->ring = LIFE_RING_INIT;
}

/* L1: a malloc (@p is_free 0) or a free (1) enters the window. */
static inline __attribute__((always_inline)) void life_note(struct life_state *l, unsigned is_free)
{
    l->ring = l->ring << 1 | is_free;
}

/* life_note(l, 1) as two read-modify-writes of the word (a shift, an or) where the compiler would
 * load, compute and store: one instruction less on every free. */
static inline __attribute__((always_inline)) void life_note_free(struct life_state *l)
{
    l->ring <<= 1;
    __asm__("" : "+m"(l->ring)); /* keeps the two apart */
    l->ring |= 1;
}

/* The key table counts in words (struct life_key: eight, the n-th of entry j the table's word
 * 8 j + n). An entry's tag is its first word's index; a block's slot, the index of the word that
 * holds its address, which also indexes its live flag (life_state.live): one index reaches both,
 * scaled by the addressing. A recorded block's `prio` holds its slot while it is allocated (no
 * index holds it then; an index insert sets prio anew). */
_Static_assert(LIFE_DEPTH == 4 && sizeof(struct life_key) == 64 && sizeof(uintptr_t) == 8 &&
                   offsetof(struct life_key, stream) == 8 && offsetof(struct life_key, pool) == 2 * 8 &&
                   offsetof(struct life_key, addr) == 3 * 8 &&
                   LIFE_KEYS * 8 <= (1u << 26),
               "an entry is eight words, its addresses words 3 to 6");
#define LIFE_WORDS (LIFE_KEYS * 8u)
#define LIFE_TAG(j) ((uint32_t)(j) * 8u) /* entry j's first word */
#define LIFE_ADDR0 3u                     /* addr[0]'s word in an entry */
#define LIFE_RECS 7u /* life_state.live[tag + LIFE_RECS]: the entry's blocks recorded, mod 256 (the next
                      * goes to addr[recs % LIFE_DEPTH], the oldest's) */
#define LIFE_SHORT 0u /* life_state.live[tag + LIFE_SHORT]: S1's mark, a block of the key was freed while
                       * it was the key's newest (placement.c, place_class_at) */
#define LIFE_HOME_NONE SIZE_MAX /* life_state.home_tag: the key is not in its home entry */

/* The key's home entry: one multiply over its words mixed by xor, the top bits. */
static inline __attribute__((always_inline)) size_t life_hash(size_t req, CUstream stream, const void *pool)
{
    _Static_assert(LIFE_KEYS == 1024, "the hash's top 10 bits index the key table");
    uint64_t h = ((uint64_t)req ^ (uint64_t)(uintptr_t)stream ^ (uint64_t)(uintptr_t)pool) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 54);
}

/* LIFE_TAG(life_hash(...)), in two instructions (a shift and a mask) after the multiply. */
static inline __attribute__((always_inline)) size_t life_home_tag(size_t req, CUstream stream, const void *pool)
{
    uint64_t h = ((uint64_t)req ^ (uint64_t)(uintptr_t)stream ^ (uint64_t)(uintptr_t)pool) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 51) & ~(size_t)7;
}

static inline __attribute__((always_inline)) bool life_is(const struct life_key *k, size_t req, CUstream stream,
                                                          const void *pool)
{
    return k->req == req && k->stream == stream && k->pool == pool;
}

/* life_is for the entry of tag @p tag, word by word (the entry's address folds into each load). */
static inline __attribute__((always_inline)) bool life_is_at(const struct life_state *l, size_t tag, size_t req,
                                                             CUstream stream, const void *pool)
{
    return l->words[tag] == req && l->words[tag + 1] == (uintptr_t)stream && l->words[tag + 2] == (uintptr_t)pool;
}

/* The set bits of @p x, inline (libgcc's __popcountdi2 is a call where the target has no popcnt). */
static inline __attribute__((always_inline)) unsigned life_popcount(uint64_t x)
{
#ifdef __POPCNT__
    return (unsigned)__builtin_popcountll(x);
#else
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (unsigned)((x * 0x0101010101010101ull) >> 56);
#endif
}

/* L1's first half: frees outnumbered mallocs in the window (of min(events, 64) events: LIFE_RING_INIT). */
static inline __attribute__((always_inline)) bool life_frees_lead(const struct life_state *l)
{
    return life_popcount(l->ring) > PLACE_LIFE_WINDOW / 2;
}

/* A new entry's live flags: the first PLACE_LIFE_TWINS slots (the first records' places) not
 * live, the rest live, so that "all four flags set" is "at least PLACE_LIFE_TWINS recorded and all
 * recorded ones live" in one compare, without a test of the record count. */
#define LIFE_LIVE_NEW "\0\0\1\1" /* live[tag + LIFE_ADDR0 ...], for memcpy */
_Static_assert(PLACE_LIFE_TWINS == 2 && LIFE_DEPTH == 4, "LIFE_LIVE_NEW: twins not live, the rest live");

/* L1's second half for the entry of tag @p tag: its last blocks (2 to LIFE_DEPTH) are all live. */
static inline __attribute__((always_inline)) bool life_key_live(const struct life_state *l, size_t tag)
{
    uint32_t v;
    memcpy(&v, &l->live[tag + LIFE_ADDR0], sizeof v);
    return v == 0x01010101u;
}

/* L1's second half past the key's home entry (probing). */
bool life_twins_live(const struct life_state *l, size_t req, CUstream stream, const void *pool);

/* life_twins_live and life_record_slow (below) for device @p d's table, called from the fast path
 * by the device: GCC kept &d->life for such calls in a stack slot, 2 instructions of every large
 * malloc through the device lock, where these rare calls now compute it themselves. */
bool place_twins_live(const struct dev_alloc *d, size_t req, CUstream stream, const void *pool);
void place_record_slow(struct dev_alloc *d, size_t req, CUstream stream, const void *pool, struct block *b);

/* The tag of the key's home entry when the key sits there, else LIFE_HOME_NONE (the key is
 * elsewhere or not recorded). Valid while the device lock stays held: only a record changes which
 * key an entry holds. */
static inline __attribute__((always_inline)) size_t life_home(const struct life_state *l, size_t req,
                                                              CUstream stream, const void *pool)
{
    size_t tag = life_home_tag(req, stream, pool);
    return XSEG_LIKELY(life_is_at(l, tag, req, stream, pool)) ? tag : LIFE_HOME_NONE;
}

/* L1: predicted long, given the key's home entry's tag @p tag (life_home). Both halves are pure;
 * the key's entry first (the cheaper test, and false on a steady malloc-free cycle), then the window. */
static inline __attribute__((always_inline)) bool life_predict_at(const struct life_state *l, size_t tag,
                                                                  size_t req, CUstream stream, const void *pool)
{
    if (XSEG_LIKELY(tag != LIFE_HOME_NONE))
        return life_key_live(l, tag) && life_frees_lead(l);
    return life_frees_lead(l) && life_twins_live(l, req, stream, pool);
}

/* L1: predicted long. */
static inline bool life_predict_long(struct life_state *l, size_t req, CUstream stream, const void *pool)
{
    return life_predict_at(l, life_home(l, req, stream, pool), req, stream, pool);
}

/* Block @p b goes into the entry of tag @p tag (its key's) in place of the key's oldest; b->prio
 * gets its slot. */
static inline __attribute__((always_inline)) void life_put_key(struct life_state *l, size_t tag, struct block *b)
{
    uint8_t *recs = &l->live[tag + LIFE_RECS]; /* the entry's count, by the tag alone */
    unsigned i = *recs & (LIFE_DEPTH - 1u);
    (*recs)++;
    size_t w = tag + LIFE_ADDR0 + i; /* the slot */
    b->prio = (uint32_t)w;
    l->words[w] = b->addr;
    l->live[w] = 1;
}

static inline __attribute__((always_inline)) void life_put(struct life_state *l, size_t j, struct block *b)
{
    life_put_key(l, LIFE_TAG(j), b);
}

/* life_record past the key's home entry (probing, a new or replaced entry). */
void life_record_slow(struct life_state *l, size_t req, CUstream stream, const void *pool, struct block *b);

/* Block @p b was handed out for the key (req, stream, pool): it replaces the key's oldest (a full
 * table replaces an entry; never fails), and b->prio gets its slot. Inline when the key sits in its
 * home entry. */
static inline __attribute__((always_inline)) void life_record(struct life_state *l, size_t req, CUstream stream,
                                                              const void *pool, struct block *b)
{
    size_t tag = life_home(l, req, stream, pool);
    if (XSEG_LIKELY(tag != LIFE_HOME_NONE))
        life_put_key(l, tag, b);
    else
        life_record_slow(l, req, stream, pool, b);
}

/* The fast path's record of a large malloc right after place_predict_home for the same key under
 * the same lock hold: into the home entry it found (life_state.home_tag), without a second hash;
 * elsewhere (LIFE_HOME_NONE) as life_record, in expandable mode only. */
static inline __attribute__((always_inline)) void place_record_home(struct dev_alloc *d, size_t req, CUstream stream,
                                                                    const void *pool, struct block *b)
{
    size_t tag = d->life.home_tag;
    if (XSEG_LIKELY(tag != LIFE_HOME_NONE))
        life_put_key(&d->life, tag, b);
    else if (d->use_expandable)
        place_record_slow(d, req, stream, pool, b);
}

/* Large expandable block @p b is freed: no longer live. Through its tag, no lookup: a slot that has
 * since recorded another block (or an entry another key took) holds another address and is left
 * alone (two live blocks never share an address); a block never recorded (its prio a treap's) can
 * only clear a stale flag of an earlier block at its address. */
static inline __attribute__((always_inline)) void life_forget(struct life_state *l, const struct block *b)
{
    /* A block recorded at its malloc: its slot; else any word of the table, whose flag is unused
     * unless the word is a slot (words 3 to 6 of an entry): the address decides. */
    size_t w = b->prio & (LIFE_WORDS - 1);
    if (XSEG_LIKELY(l->words[w] == b->addr)) /* a recorded block's: its own slot */
        l->live[w] = 0;
}

#endif

/* S1: large requests in expandable mode (with expandable_segments_recycle) on a device under
 * PLACE_CLASS_DEVICE_MAX are placed by class (L1's key table, so not without it). */
static inline bool place_class_regime(const struct dev_alloc *d)
{
#ifdef XSEG_PLACEMENT_OFF
    (void)d;
    return false;
#else
    return d->life.cls; /* place_refresh_cfg */
#endif
}

/* S1: the segments a large request of @p requested bytes may use (PLACE_SEG_CLASS or _PLAIN); may
 * mark the key short (place_class_at). */
unsigned place_class_of(struct dev_alloc *d, size_t requested, CUstream stream, const void *pool);

#ifndef XSEG_PLACEMENT_OFF
/* S1's class for the key of the entry of tag @p tag: its last blocks (2 to LIFE_DEPTH) all live and
 * the key not short. A key is short from the first of its blocks freed while it was the key's newest
 * record (a malloc-free cycle: a temporary, an activation), which the key's next malloc finds here
 * (the newest slot's flag down) and marks for good: its blocks never take the class's segments,
 * though some of them are live together later. */
static inline __attribute__((always_inline)) unsigned place_class_at(struct life_state *l, size_t tag)
{
    if (XSEG_UNLIKELY(l->live[tag + LIFE_SHORT]))
        return PLACE_SEG_PLAIN;
    if (life_key_live(l, tag))
        return PLACE_SEG_CLASS;
    /* the newest record's slot: the oldest's before it (a new entry's slot 3 is live: no record yet) */
    if (!l->live[tag + LIFE_ADDR0 + ((l->live[tag + LIFE_RECS] - 1u) & (LIFE_DEPTH - 1u))])
        l->live[tag + LIFE_SHORT] = 1;
    return PLACE_SEG_PLAIN;
}
#endif

/* place_class_of for the malloc whose place_predict_home (S1's regime) left home_tag: the key's home
 * entry when it sits there (the same entry place_class_of's probe finds first), without a hash. */
static inline unsigned place_class_home(struct dev_alloc *d, size_t requested, CUstream stream, const void *pool)
{
#ifndef XSEG_PLACEMENT_OFF
    size_t tag = d->life.home_tag;
    if (XSEG_LIKELY(tag != LIFE_HOME_NONE))
        return place_class_at(&d->life, tag);
#endif
    return place_class_of(d, requested, stream, pool);
}

/* S1: may free block @p b serve a request restricted to @p want (PLACE_SEG_*)? A classic block
 * (cached from before expandable segments) belongs to no class. */
static inline bool place_block_ok(const struct block *b, unsigned want)
{
    return want == PLACE_SEG_ANY || !b->expandable || b->seg->cls == (want == PLACE_SEG_CLASS);
}

/* S1: is free block @p a a better fit than @p best (NULL: yes)? Smaller, then the lower address:
 * the free index's order (bpool_fit's best fit). */
static inline bool place_class_better(const struct block *a, const struct block *best)
{
    return !best || a->size < best->size || (a->size == best->size && a->addr < best->addr);
}

/* S1: the growth that follows may use the segments @p want says (PLACE_SEG_*), until it is set
 * back to PLACE_SEG_ANY. Device lock held. */
static inline void place_want(struct dev_alloc *d, unsigned want) { d->life.want = (uint8_t)want; }

/* S1: may the growth in progress use segment @p s? */
static inline bool place_seg_ok(const struct dev_alloc *d, const struct segrec *s)
{
    return d->life.want == PLACE_SEG_ANY || s->cls == (d->life.want == PLACE_SEG_CLASS);
}

/* S1: is a segment created by the growth in progress one of the class? */
static inline bool place_seg_class(const struct dev_alloc *d) { return d->life.want == PLACE_SEG_CLASS; }

/* L1 for a malloc of @p size rounded bytes (@p requested asked): large requests in expandable
 * mode with expandable_segments_recycle only; without it, PyTorch's layout. */
static inline bool place_predict_long(struct dev_alloc *d, size_t size, size_t requested, CUstream stream,
                                      const void *pool)
{
    return size > BLOCK_SMALL_SIZE && d->use_expandable && d->cfg.expandable_segments_recycle &&
           life_predict_long(&d->life, requested, stream, pool);
}

/* The device's config moved (dev_refresh_cfg_slow): L1 predicts for large requests in expandable
 * mode with expandable_segments_recycle, one flag for the fast path's test (life_state.on). */
static inline void place_refresh_cfg(struct dev_alloc *d)
{
    bool on = d->use_expandable && d->cfg.expandable_segments_recycle;
#ifndef XSEG_PLACEMENT_OFF
#ifdef XSEG_PLACEMENT_NO_S1
    d->life.cls = false;
#else
    d->life.cls = on && d->info.total_mem - 1 < PLACE_CLASS_DEVICE_MAX - 1; /* 0: the size is unknown */
#endif
#endif
    d->life.l1 = !on ? PLACE_REGIME_OFF : d->life.cls ? PLACE_REGIME_S1 : PLACE_REGIME_L1;
}

/* A new device's placement state: called by its creator (core/runtime.c) after dev_create, before
 * the device is published (device.c sits below this module in the wing's order). */
static inline void place_device_init(struct dev_alloc *d)
{
    life_init(&d->life);
    place_refresh_cfg(d);
}

/* empty_cache: L1's window starts over as on a new device (the keys stay). The frees before it, a
 * teardown as often as not, say nothing of what the program does next; a window left leading
 * with them sends the next phase's first requests with live twins (a model's weights loaded
 * again) to the tops of segments the empty_cache just unmapped, and under a memory fraction at
 * the cold run's peak such a warm run no longer fits (public2-charan_forward, the H200's frag
 * check of 2026-11-26). */
static inline void place_phase_reset(struct dev_alloc *d) { life_init(&d->life); }

#ifndef XSEG_PLACEMENT_OFF
/* place_predict_home where L1 does not predict: S1's regime (true: malloc_class hands over; home_tag
 * the key's home entry's, for its class and its record), or neither (false). */
static inline __attribute__((always_inline)) bool place_predict_other(struct dev_alloc *d, size_t size,
                                                                      size_t requested, CUstream stream,
                                                                      const void *pool)
{
    struct life_state *l = &d->life;
    if (XSEG_LIKELY(l->l1 < PLACE_REGIME_S1 || size <= BLOCK_SMALL_SIZE)) { /* the flags of l1's test */
        l->home_tag = LIFE_HOME_NONE;
        return false;
    }
    l->home_tag = life_home(l, requested, stream, pool);
    return true;
}
#endif

/* place_predict_long for a large request that leaves in life_state.home_tag the tag of the key's
 * home entry when the key sits there (else LIFE_HOME_NONE), for the malloc's record under the same
 * lock hold (place_record_home): one hash a malloc. In the device's state, not a register: the fast
 * path has none to spare. */
static inline __attribute__((always_inline)) bool place_predict_home(struct dev_alloc *d, size_t size, size_t requested,
                                                                     CUstream stream, const void *pool)
{
#ifdef XSEG_PLACEMENT_OFF
    (void)d, (void)size, (void)requested, (void)stream, (void)pool;
    return false;
#else
    struct life_state *l = &d->life;
    if (XSEG_UNLIKELY(!(size > BLOCK_SMALL_SIZE && l->l1 == PLACE_REGIME_L1))) /* one test: L1 on, not S1 */
        return place_predict_other(d, size, requested, stream, pool);
    size_t tag = life_home_tag(requested, stream, pool);
    if (XSEG_LIKELY(life_is_at(l, tag, requested, stream, pool))) {
        l->home_tag = tag;
        return life_key_live(l, tag) && life_frees_lead(l); /* the entry first: the cheaper test */
    }
    l->home_tag = LIFE_HOME_NONE;
    return life_frees_lead(l) && place_twins_live(d, requested, stream, pool);
#endif
}

/* L2: is free block @p a higher than @p best (NULL: yes)? A newer segment (expandable.c's
 * seg_order_less), else a higher address in the same one. (The oldest segment's top instead
 * changed nothing that counts: docs/benchmarks-replay.md#lifetime-placement.) */
static inline bool place_top_higher(const struct block *a, const struct block *best)
{
    if (!best)
        return true;
    if (a->seg != best->seg && a->seg->seq != best->seg->seq)
        return a->seg->seq > best->seg->seq;
    return a->addr > best->addr;
}

/* C1-C3: the largest chunk (one physical allocation, vmm/segment.h) of a growth of @p size bytes in
 * @p pool whose segment has pages of @p page and granules of @p gran: the page (PyTorch's layout,
 * one handle a page) unless expandable_chunk_mb asks for smaller chunks, the device is small (C1),
 * near full (C2) or has refused a growth (C3). A chunk is given back only whole, so smaller chunks
 * let the OOM path give back more of what freed blocks leave between live ones. Mappings still
 * cover whole pages (reserved memory is PyTorch's). The small pool's chunks are its 2 MiB pages.
 * Device lock held. */
size_t place_chunk_limit(const struct dev_alloc *d, const struct bpool *pool, size_t page, size_t gran, size_t size);

#endif
