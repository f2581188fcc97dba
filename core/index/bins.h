/*
 * The free index and the unmapped index of a block pool (struct bpool): size bins per (pool,
 * stream) with a treap per bin, and one treap of unmapped blocks, all threaded through the blocks
 * (core/index/block.h), so no update allocates. The inline half (best fit and the in-place key changes
 * of the fast path) is here; the out-of-line half is bins.c.
 *
 * Locking: everything here belongs to one device allocator and is used under its mutex.
 */
#ifndef XSEG_CORE_BINS_H
#define XSEG_CORE_BINS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "base/assert.h"
#include "base/common.h"
#include "core/index/block.h"

/* Size classes of the free index (bins_index): 512 exact ones of 512 B below 256 KiB, then 32 a
 * power of two up to 2^64 B (1,984 used). */
#define BINS_N 2048
#define BINS_WORDS (BINS_N / 64)
_Static_assert(BINS_WORDS < 64, "the summary word has a bit per map word, and one to spare");

/* The free blocks of one (pool, stream): a treap per size class, ordered by (size, addr), and a
 * two-level bitmap (map: bit k set iff bin[k] is non-empty; summary: bit w set iff map[w] != 0).
 * Created by the first segment of the pair, freed with its last (refs). */
struct sbins {
    CUstream stream;
    unsigned refs; /* segments of this (pool, stream) */
    /* What the passes that never wait (core/policy/release.h memo_idle) know of this stream's
     * free blocks without asking the stream, which may be destroyed by now. free_ev is xseg's
     * event (NULL until the first record), recorded on the stream by a program's free while the
     * stream is alive, at most once per window (release_note_due). Marks are the pool's GC clock
     * (block_gc_base, stamped as a block enters the index; a record advances the clock): a block
     * stamped below rec_mark entered the index before free_ev's last record; below done_mark, its
     * work is known done (that record seen complete, or a context wait). rec_ns: when a record
     * was last made or tried (0: never); rearm: the next program free records again. */
    CUevent free_ev;
    uint64_t rec_mark, done_mark, rec_ns;
    bool rearm;
    uint64_t summary;
    uint64_t map[BINS_WORDS];
    struct block *bin[BINS_N];
};

/* One block pool: small or large (private pools will add more). */
struct bpool {
    /* Free index: the bins of each stream with segments in this pool. `last` is the bins the last
     * lookup found (one compare for a single-stream workload); `hash` finds any other in O(1)
     * (open addressing, hmask + 1 slots, at most half used); `by_stream` holds them in ascending
     * stream order for the walks in (stream, size, addr) order. */
    struct sbins *last;
    struct sbins **hash;
    size_t hmask;
    struct sbins **by_stream;
    unsigned nstreams, capstreams;
    struct block *unmapped; /* treap root, key (stream, addr) */
    bool is_small;
    bool is_private;        /* a private pool's (struct priv_pool), not the device's own two */
    int stat_index;         /* XSEG_STAT_SMALL_POOL or XSEG_STAT_LARGE_POOL */
    uint64_t get_free_blocks_call_count; /* garbage-collection clock */
    size_t nfree;           /* blocks in the free index */
    /* Idle reclaim (core/services/trim.c): free blocks whose gc_count_base is below this have been idle
     * for idle_release_ms (the idle ticks advance get_free_blocks_call_count); 0: none known. */
    uint64_t idle_mark;
    /* The last ticks: at time tick_ns[i] the clock read tick_count[i] (then advanced by one). */
#define BPOOL_IDLE_TICKS 8
    uint64_t tick_ns[BPOOL_IDLE_TICKS], tick_count[BPOOL_IDLE_TICKS];
    unsigned tick_next;
};

/* @p b lives in segment @p s (its pool and vseg set): the segment and what it decides
 * (BLOCK_SEG_BITS: expandable and the pool bits) together. */
static inline void block_set_seg(struct block *b, struct segrec *s)
{
    b->seg = s;
    b->expandable = s->vseg != NULL;
    b->small_pool = s->pool->is_small;
    b->private_pool = s->pool->is_private;
}

/* Key order of the free index: (stream, size, addr). */
static inline bool bkey_less(uintptr_t s1, size_t z1, uintptr_t a1, uintptr_t s2, size_t z2, uintptr_t a2)
{
    if (s1 != s2)
        return s1 < s2;
    return ((unsigned __int128)z1 << 64 | a1) < ((unsigned __int128)z2 << 64 | a2);
}

/* Key order inside one stream's bins: (size, addr) as one 128-bit number. */
static inline bool zkey_less(size_t z1, uintptr_t a1, size_t z2, uintptr_t a2)
{
    return ((unsigned __int128)z1 << 64 | a1) < ((unsigned __int128)z2 << 64 | a2);
}

/* The size class of @p size: monotone in size (so the bins in index order hold ascending sizes),
 * exact in units of 512 B below 256 KiB, then 32 classes per power of two. */
static inline unsigned bins_index(size_t size)
{
    size_t u = size >> 9;
    if (u < 512)
        return (unsigned)u;
    unsigned e = 63u - (unsigned)__builtin_clzll((unsigned long long)u); /* 9..54 */
    return 512u + ((e - 9u) << 5) + (unsigned)((u >> (e - 5u)) & 31u);
}

/* The first non-empty bin of @p s at or above @p k (k <= BINS_N), or -1. */
static inline int bins_next(const struct sbins *s, unsigned k)
{
    if (k >= BINS_N)
        return -1;
    unsigned w = k >> 6;
    uint64_t m = s->map[w] & (~(uint64_t)0 << (k & 63));
    if (m)
        return (int)(w << 6 | (unsigned)__builtin_ctzll(m));
    uint64_t sm = s->summary & (~(uint64_t)0 << (w + 1)); /* w + 1 <= BINS_WORDS < 64 */
    if (!sm)
        return -1;
    w = (unsigned)__builtin_ctzll(sm);
    return (int)(w << 6 | (unsigned)__builtin_ctzll(s->map[w]));
}

/* The smallest block in the bins of @p s from bin @p k on, or NULL. */
static inline struct block *bins_first_from(const struct sbins *s, unsigned k)
{
    int j = bins_next(s, k);
    if (j < 0)
        return NULL;
    struct block *t = s->bin[j];
    while (t->left)
        t = t->left;
    return t;
}

/* The smallest size that bins_index puts in class @p k (k < BINS_N). */
static inline size_t bins_class_min(unsigned k)
{
    if (k < 512)
        return (size_t)k << 9;
    unsigned e = 9u + ((k - 512u) >> 5), m = (k - 512u) & 31u;
    return ((size_t)(32u + m) << (e - 5u)) << 9;
}

/* A walk of the free blocks of @p s whose size lies in [lo, hi), bounded by what it hands out:
 * size classes upward from lo's, each class's treap depth first, pruned to the range by the
 * treap's (size, addr) order (left of a block below lo and right of one at hi or above hold
 * nothing in range). @p visit sees at most @p max blocks, all in range; the walk looks at no
 * more than max + 2 classes and, beyond the blocks it hands out, two paths of a treap in each
 * (the range's ends). Inline: with a constant @p visit, the compiler inlines the visitor. */
#define BINS_WALK_STACK 128
static inline __attribute__((always_inline)) void bins_walk(const struct sbins *s, size_t lo, size_t hi, unsigned max,
                                                            void (*visit)(void *ctx, struct block *b), void *ctx)
{
    struct block *stack[BINS_WALK_STACK];
    unsigned seen = 0;
    for (int k = bins_next(s, bins_index(lo)); k >= 0 && seen < max; k = bins_next(s, (unsigned)k + 1)) {
        if (bins_class_min((unsigned)k) >= hi)
            break; /* every later class is larger still */
        unsigned n = 0;
        stack[n++] = s->bin[k];
        while (n && seen < max) {
            struct block *b = stack[--n];
            bool above_lo = b->size >= lo, below_hi = b->size < hi;
            if (b->right && below_hi && n < BINS_WALK_STACK)
                stack[n++] = b->right;
            if (b->left && above_lo && n < BINS_WALK_STACK)
                stack[n++] = b->left;
            if (above_lo && below_hi) {
                seen++;
                visit(ctx, b);
            }
        }
    }
}

/* The bins of (@p p, @p stream), or NULL when no segment of the pool has that stream. */
struct sbins *bpool_bins_lookup(const struct bpool *p, CUstream stream);
static inline struct sbins *bpool_bins(const struct bpool *p, CUstream stream)
{
    struct sbins *s = p->last;
    if (XSEG_LIKELY(s && s->stream == stream))
        return s;
    return bpool_bins_lookup(p, stream);
}

/* A new segment of (@p p, @p stream) takes a reference on its bins, creating them: false on
 * ENOMEM (nothing changed). Its end gives the reference back (the last one frees the bins, which
 * are empty by then: the segment's blocks left the index before). */
bool bpool_bins_acquire(struct bpool *p, CUstream stream);
void bpool_bins_release(struct bpool *p, CUstream stream);

/* Free index. Inserting needs the bins of the block's stream (a segment's reference). */
void bpool_insert_free(struct bpool *p, struct block *b);
void bpool_remove_free(struct bpool *p, struct block *b);
/* The first free block with key >= (stream, size, addr), or NULL. */
struct block *bpool_lower_bound(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr);
/* The next free block after @p b (in the free index) in index order, or NULL. */
struct block *bpool_next_free(const struct bpool *p, const struct block *b);
/* The last free block with key < (stream, size, addr), or NULL. */
struct block *bpool_prev_free(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr);

/*
 * Best fit for the fast path: the first free block with key >= (stream, size, 0) if it is on
 * @p stream (else NULL: bpool_lower_bound gives the general answer), with its neighbours inside
 * its bin: *pred the one before it (NULL: it is the first of its bin), *next the one after it
 * (NULL: it is the last of its bin; bpool_fit_next_bin gives the successor on the stream then,
 * bpool_next_free the index successor). One descent
 * of the request's bin: the last node where it turns right is the predecessor; the successor is
 * the leftmost block of the result's right subtree or else the last node where the descent turned
 * left before reaching the result. When the request's bin holds nothing large enough, the result
 * is the smallest block of the next non-empty bin (the bitmap finds it).
 */
static inline struct block *bpool_fit(const struct bpool *p, CUstream stream, size_t size, struct block **pred,
                                      struct block **next)
{
    struct sbins *s = bpool_bins(p, stream);
    *pred = *next = NULL;
    if (!s)
        return NULL;
    unsigned k = bins_index(size);
    struct block *t = s->bin[k], *res = NULL, *lo = NULL, *up = NULL;
    while (t) {
        /* key(t) < (size, 0): addresses are never below 0. */
        if (t->size < size) {
            lo = t;
            t = t->right;
        } else {
            up = res;
            res = t;
            t = t->left;
        }
    }
    if (!res) {
        int j = bins_next(s, k + 1);
        if (j < 0)
            return NULL;
        for (t = s->bin[j]; t->left; t = t->left)
            up = t;
        res = t;
        lo = NULL;
    }
    *pred = lo;
    if (res->right) {
        for (up = res->right; up->left;)
            up = up->left;
    }
    *next = up;
    return res;
}

/* The index successor of @p b when bpool_fit found it the last of its bin, if it is on b's stream
 * (else NULL): the smallest block of the stream's next non-empty bin. */
static inline struct block *bpool_fit_next_bin(const struct bpool *p, const struct block *b)
{
    return bins_first_from(bpool_bins(p, b->stream), bins_index(b->size) + 1);
}

/* Give free block @p b (in the free index) the key (stream, @p size, @p addr): removed and
 * re-inserted (the general case of the two functions below). */
void bpool_rekey_free(struct bpool *p, struct block *b, uintptr_t addr, size_t size);

/*
 * Free block @p b (in the free index; @p pred its predecessor in its bin or NULL, as bpool_fit
 * gives it) hands its first @p n bytes out (n < b->size): it becomes [addr + n, addr + size). Its
 * key only decreases (same stream, smaller size), so within its bin only the predecessor can be
 * crossed: while the new size keeps its bin and the new key stays above the predecessor's, the
 * block keeps its place and nothing is re-linked.
 */
static inline void bpool_free_take_front(struct bpool *p, struct block *b, size_t n, const struct block *pred)
{
    uintptr_t na = b->addr + n;
    size_t nz = b->size - n;
    /* Below 256 KiB a bin is 512 B wide and block sizes are 512 B multiples: a smaller size is
     * another bin (re-keying is right in any case). */
    if (b->size >= ((size_t)512 << 9) && bins_index(nz) == bins_index(b->size) &&
        (!pred || zkey_less(pred->size, pred->addr, nz, na))) {
        b->addr = na;
        b->size = nz;
    } else {
        bpool_rekey_free(p, b, na, nz);
    }
}

/* The successor of free block @p b in its bin's treap @p root, NULL when b is the bin's last:
 * the leftmost block of b's right subtree, else the last ancestor where the descent to b turns
 * left. Serves the free's merge (bpool_free_grow) and the index walk (bpool_next_free). */
static inline __attribute__((always_inline)) struct block *bins_succ_in_bin(struct block *root, const struct block *b)
{
    struct block *succ = NULL;
    if (b->right) {
        for (succ = b->right; succ->left;)
            succ = succ->left;
        return succ;
    }
    for (struct block *t = root; t != b;) {
        if (XSEG_UNLIKELY(!t))
            abort(); /* index corrupted: the block is not where its key says */
        if (zkey_less(b->size, b->addr, t->size, t->addr)) {
            succ = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return succ;
}

/*
 * Free block @p b (in the free index) grows to [addr, addr + size) with size > b->size (a merge
 * with a neighbour being freed). Its key only increases, so within its bin only the successor can
 * be crossed: in place while the new size keeps its bin and the new key stays below the
 * successor's, else re-inserted.
 */
static inline __attribute__((always_inline)) void bpool_free_grow(struct bpool *p, struct block *b, uintptr_t addr,
                                                                  size_t size)
{
    unsigned k = bins_index(b->size);
    if (size < ((size_t)512 << 9) || bins_index(size) != k) { /* as in bpool_free_take_front */
        bpool_rekey_free(p, b, addr, size);
        return;
    }
    struct block *succ = bins_succ_in_bin(bpool_bins(p, b->stream)->bin[k], b);
    if (!succ || zkey_less(size, addr, succ->size, succ->addr)) {
        b->addr = addr;
        b->size = size;
    } else {
        bpool_rekey_free(p, b, addr, size);
    }
}

/* Every free block, in index order, into a malloc'd array (*out, *n). Returns false on ENOMEM. */
bool bpool_collect_free(const struct bpool *p, struct block ***out, size_t *n);
/* The free blocks of at least @p min_size bytes, in index order (the subsequence of
 * bpool_collect_free's), into a malloc'd array (*out, *n; NULL and 0 when none). The walk starts
 * at each stream's first non-empty bin from min_size's class (the bitmap): the smaller blocks are
 * never looked at. Returns false on ENOMEM. */
bool bpool_collect_free_from(const struct bpool *p, size_t min_size, struct block ***out, size_t *n);
/* The largest free block of @p p, or NULL: each stream's highest non-empty bin (the bitmap), the
 * last block of its treap (the (size, addr) order), the largest of those. */
struct block *bpool_largest_free(const struct bpool *p);

/* Unmapped index. */
void bpool_insert_unmapped(struct bpool *p, struct block *b);
void bpool_remove_unmapped(struct bpool *p, struct block *b);
/* The first unmapped block with key >= (stream, addr), or NULL. */
struct block *bpool_unmapped_lower_bound(const struct bpool *p, CUstream stream, uintptr_t addr);

/* Remove @p b from whichever index holds it (no-op when none). */
void bpool_unindex(struct block *b);

#endif
