/*
 * Blocks and block pools: the host-side metadata of the caching allocator.
 *
 * A block is a byte range [addr, addr + size) of one segment. The blocks of a segment form a
 * doubly linked list in address order (prev/next) that tiles the segment exactly. A block is
 * allocated (handed out), pending (freed but waiting for events on other streams), free and
 * mapped (cached, in its pool's free index), or — in an expandable segment only — unmapped (no
 * physical page behind it, in its pool's unmapped index).
 *
 * Indexes are threaded through the blocks themselves (treap links: left, right, prio), so
 * inserting or removing a block never allocates:
 *   - the free index: free mapped blocks in the order (stream, size, addr), PyTorch's
 *     BlockPool::blocks, kept as size bins per (pool, stream) (struct sbins): BINS_N size classes
 *     (exact below 256 KiB, then 32 a power of two), each a treap ordered by (size, addr), and a
 *     two-level bitmap of the non-empty bins. Best fit, PyTorch's lower_bound(stream, size, 0),
 *     is the lower bound in the request's bin or else the smallest block of the next non-empty
 *     bin: O(1) in streams and bins, a descent of one bin's treap;
 *   - bpool.unmapped: unmapped blocks ordered by (stream, addr) (PyTorch's BlockPool::unmapped),
 *     one treap.
 * A block is in at most one index at a time. A segment holds a reference on its (pool, stream)
 * bins from its creation to its end (bpool_bins_acquire / bpool_bins_release), so indexing one of
 * its blocks never allocates.
 *
 * The live map (ptrmap) finds the block of an allocated pointer for free and record_stream.
 *
 * Locking: everything here belongs to one device allocator and is used under its mutex.
 */
#ifndef XSEG_CORE_BLOCK_H
#define XSEG_CORE_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda.h>

#include "base/assert.h"
#include "base/common.h"
#include "base/hostmem.h"

#define BLOCK_MIN_SIZE ((size_t)512)               /* kMinBlockSize: rounding unit */
#define BLOCK_SMALL_SIZE XSEG_MiB                  /* kSmallSize: largest small-pool request */
#define BLOCK_SMALL_BUFFER (2 * XSEG_MiB)          /* kSmallBuffer: small-pool segment/page size */
#define BLOCK_MIN_LARGE_ALLOC (10 * XSEG_MiB)      /* kMinLargeAlloc */
#define BLOCK_ROUND_LARGE (2 * XSEG_MiB)           /* kRoundLarge */

struct segrec;
struct bpool;
struct hstack;

/* Streams a block was recorded on besides its own (record_stream). Two inline slots cover
 * almost every use; more spill to a heap array. */
struct stream_set {
    unsigned n, cap;
    CUstream inl[2];
    CUstream *heap; /* when cap > 2 */
};

/* What only some blocks need, allocated on demand (block_side_get) and released when the block
 * returns to its pool (block_side_drop) or is deleted: the streams and events of record_stream,
 * and the history stack. The requested size moves here while the side exists (the block's last
 * word points here then). */
struct block_side {
    size_t requested_size;
    int event_count;           /* events still pending before the block can be freed */
    struct stream_set uses;    /* streams recorded besides the block's own (record_stream) */
    struct hstack *hist_stack; /* the allocation's stack (history on; valid while `recorded`) */
};

struct block {
    /* The first 64 bytes hold all an index descent and a neighbour test read (key, links,
     * priority, state), so that a descent touches one cache line a node. */
    uintptr_t addr;
    size_t size;
    CUstream stream;       /* the stream it was allocated on; reused only there */
    /* index linkage (free or unmapped treap) */
    struct block *left, *right;
    uint32_t prio;
    bool allocated;
    bool mapped;     /* always true in classic segments */
    /* What a free must do besides the common work, tested as one byte (block_free_slow):
     * `oversize`, `recorded`, `sided` and `exported` (the BLOCK_FREE_SLOW bits; check.c verifies
     * the compiler's bit order). */
    union {
        struct {
            bool oversize : 1; /* counted in oversize_allocations (decided at allocation time) */
            bool recorded : 1; /* allocated or pending while history recorded (core/history.h):
                                * its free is recorded; the side's hist_stack holds a reference.
                                * Only ever set on allocated / pending blocks, so spare structs
                                * have it clear. */
            bool sided : 1;    /* `u.side` is valid (and so no other member of `u`) */
            bool expandable : 1; /* == (seg->vseg != NULL); cached for the hot path */
            /* Its segment's pool, as the free path needs it without reading the segment record
             * (one dependent cache miss at a million live blocks): is_small and is_private of
             * seg->pool, kept by block_set_seg / block_same_seg (dev_block_pool reads them). */
            bool small_pool : 1;
            bool private_pool : 1;
            /* Allocated and exported over IPC (xseg_ipc_export) since its malloc: its pool
             * refuses to sleep (core/sleep.c), as importers map these very pages. Cleared by its
             * free (free_ptr_rare), so free blocks and spare structs have it clear. */
            bool exported : 1;
        };
        uint8_t flags;
    };
    bool in_index;   /* in pool->free or pool->unmapped */
    struct block *prev, *next; /* neighbours in the segment, address order */
    struct segrec *seg;    /* the segment it lives in (its pool: block_pool) */
    /* One word, by state: in an index, the GC clock (block_gc_base); else with `sided`, the side
     * struct; else the bytes the caller asked for (block_requested: allocated or pending). */
    union {
        uint64_t gc_count_base;
        size_t requested_size;
        struct block_side *side;
    } u;
};

#define BLOCK_FREE_SLOW 0x47u /* oversize | recorded | sided | exported in `flags` */
#define BLOCK_SEG_BITS 0x38u /* expandable | small_pool | private_pool: what its segment decides */

/* Does the free of @p b need more than the common path (oversize, recorded, a side struct,
 * exported)? */
static inline bool block_free_slow(const struct block *b) { return b->flags & BLOCK_FREE_SLOW; }

/* The live map tags block pointers in their low 4 bits (ptrmap): slabs of this size keep every
 * struct 16-byte aligned. */
_Static_assert(sizeof(struct block) % 16 == 0, "struct block: a multiple of 16 bytes");
/* 80 bytes on LP64: the index's and the neighbour test's fields in the first cache line. */
_Static_assert(sizeof(void *) != 8 || (sizeof(struct block) == 80 && offsetof(struct block, next) == 56),
               "struct block: 80 bytes, key/links/state/neighbours in the first 64");

/* A segment: one cuMemAlloc range (classic) or one expandable VA range (vseg != NULL). */
struct segrec {
    struct block *first; /* lowest-address block; kept current by block_link helpers */
    struct seg *vseg;    /* expandable segment (vmm/segment.h) or NULL */
    struct bpool *pool;
    CUstream stream;
    struct block *last;  /* highest-address block (expandable segments only) */
    size_t size;         /* classic: bytes; expandable: VA bytes covered by blocks */
    bool oversize;       /* counted in oversize_segments */
    struct segrec *prev_seg, *next_seg; /* device's segment list */
    uint64_t seq;        /* expandable: creation order on its device (1, 2, ...), a stable
                          * order where virtual addresses differ from run to run */
    bool handles_out;    /* a chunk handle was handed out (xseg_ipc_export, xseg_block_handles):
                          * its chunks are never re-backed (exp_defragment) */
    bool asleep;         /* its pool sleeps (core/sleep.c): blocks keep their mapped state, the
                          * pages are asleep; no reclaim path touches it */
};

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
    /* Idle reclaim (core/trim.c): free blocks whose gc_count_base is below this have been idle
     * for idle_release_ms (the idle ticks advance get_free_blocks_call_count); 0: none known. */
    uint64_t idle_mark;
    /* The last ticks: at time tick_ns[i] the clock read tick_count[i] (then advanced by one). */
#define BPOOL_IDLE_TICKS 8
    uint64_t tick_ns[BPOOL_IDLE_TICKS], tick_count[BPOOL_IDLE_TICKS];
    unsigned tick_next;
};

static inline bool block_is_split(const struct block *b) { return b->prev || b->next; }
/* Is @p b (NULL: no) in the free index: free and cached, mapped, in_index? */
static inline bool block_in_free_index(const struct block *b) { return b && (b->in_index & b->mapped); }

/* The pool of a block: its segment's (a block never changes pool or segment). */
static inline struct bpool *block_pool(const struct block *b) { return b->seg->pool; }

/* @p b lives in segment @p s (its pool and vseg set): the segment and what it decides
 * (BLOCK_SEG_BITS: expandable and the pool bits) together. */
static inline void block_set_seg(struct block *b, struct segrec *s)
{
    b->seg = s;
    b->expandable = s->vseg != NULL;
    b->small_pool = s->pool->is_small;
    b->private_pool = s->pool->is_private;
}

/* @p b lives in the segment of @p src (a split or a re-tile): the segment and what it decides
 * (expandable and the pool bits, BLOCK_SEG_BITS) copied without reading the segment. */
static inline void block_same_seg(struct block *b, const struct block *src)
{
    b->seg = src->seg;
    b->flags = (uint8_t)((b->flags & ~BLOCK_SEG_BITS) | (src->flags & BLOCK_SEG_BITS));
}

/* The GC clock of a free block (its word while in an index; written just before it enters one). */
static inline uint64_t block_gc_base(const struct block *b)
{
    xseg_assert(!b->sided);
    return b->u.gc_count_base;
}
static inline void block_set_gc_base(struct block *b, uint64_t v)
{
    xseg_assert(!b->sided);
    b->u.gc_count_base = v;
}

/* The requested bytes of an allocated or pending block (inline, or in its side struct). */
static inline size_t block_requested(const struct block *b)
{
    return XSEG_UNLIKELY(b->sided) ? b->u.side->requested_size : b->u.requested_size;
}
static inline void block_set_requested(struct block *b, size_t v)
{
    if (XSEG_UNLIKELY(b->sided))
        b->u.side->requested_size = v;
    else
        b->u.requested_size = v;
}

/* The side struct of @p b, or NULL when it has none. */
static inline struct block_side *block_side(const struct block *b) { return b->sided ? b->u.side : NULL; }
static inline int block_event_count(const struct block *b) { return b->sided ? b->u.side->event_count : 0; }
static inline unsigned block_uses_n(const struct block *b) { return b->sided ? b->u.side->uses.n : 0; }
static inline struct hstack *block_hist_stack(const struct block *b) { return b->sided ? b->u.side->hist_stack : NULL; }

/* The side struct of allocated or pending block @p b, made now if it has none (its requested
 * size moves in). NULL on host OOM, @p b unchanged. */
struct block_side *block_side_get(struct block *b);
/* Give back @p b's side struct when it holds nothing any more (no streams, events or stack): the
 * requested size moves back inline. A no-op without a side or when it still holds something. */
void block_side_drop(struct block *b);
/* Release @p b's side struct whatever it holds (its stream set freed; a stack reference it holds
 * is not released: the caller's). */
void block_side_free(struct block *b);

/* ---- neighbour splicing: the one place the address-ordered block list of a segment is edited.
 * Each keeps the segment's first/last current (the tiling that dev_check verifies). */

/* A block leaves segment @p s's list: its neighbours @p prev and @p next (either may be NULL)
 * now link to each other. The caller has moved or absorbed its bytes. */
static inline void block_splice_out(struct segrec *s, struct block *prev, struct block *next)
{
    if (prev)
        prev->next = next;
    else
        s->first = next;
    if (next)
        next->prev = prev;
    else
        s->last = prev;
}

/* Link @p n (same segment, not yet linked) just before @p b. */
static inline void block_link_before(struct block *b, struct block *n)
{
    n->prev = b->prev;
    n->next = b;
    if (n->prev)
        n->prev->next = n;
    else
        n->seg->first = n;
    b->prev = n;
}

/* Link @p n (same segment, not yet linked) just after @p b. */
static inline void block_link_after(struct block *b, struct block *n)
{
    n->prev = b;
    n->next = b->next;
    if (n->next)
        n->next->prev = n;
    else
        b->seg->last = n;
    b->next = n;
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
    /* The successor in the bin: the leftmost block of the right subtree, else the last ancestor
     * where the descent to b turns left. */
    struct block *succ = NULL;
    if (b->right) {
        for (succ = b->right; succ->left;)
            succ = succ->left;
    } else {
        for (struct block *t = bpool_bins(p, b->stream)->bin[k]; t != b;) {
            if (XSEG_UNLIKELY(!t))
                abort(); /* index corrupted: the block is not where its key says */
            if (zkey_less(b->size, b->addr, t->size, t->addr)) {
                succ = t;
                t = t->left;
            } else {
                t = t->right;
            }
        }
    }
    if (!succ || zkey_less(size, addr, succ->size, succ->addr)) {
        b->addr = addr;
        b->size = size;
    } else {
        bpool_rekey_free(p, b, addr, size);
    }
}

/* Every free block, in index order, into a malloc'd array (*out, *n). Returns false on ENOMEM. */
bool bpool_collect_free(const struct bpool *p, struct block ***out, size_t *n);

/* Unmapped index. */
void bpool_insert_unmapped(struct bpool *p, struct block *b);
void bpool_remove_unmapped(struct bpool *p, struct block *b);
/* The first unmapped block with key >= (stream, addr), or NULL. */
struct block *bpool_unmapped_lower_bound(const struct bpool *p, CUstream stream, uintptr_t addr);

/* Remove @p b from whichever index holds it (no-op when none). */
void bpool_unindex(struct block *b);

/* Stream sets. */
bool stream_set_add(struct stream_set *s, CUstream st); /* false on ENOMEM */
static inline void stream_set_clear(struct stream_set *s)
{
    if (XSEG_UNLIKELY(s->cap > 2))
        xs_free(s->heap);
    *s = (struct stream_set){0};
}
static inline CUstream stream_set_get(const struct stream_set *s, unsigned i)
{
    return s->cap > 2 ? s->heap[i] : s->inl[i];
}
static inline bool stream_set_has(const struct stream_set *s, CUstream st)
{
    for (unsigned i = 0; i < s->n; i++)
        if (stream_set_get(s, i) == st)
            return true;
    return false;
}

/*
 * Live map: allocated address -> block. Open addressing, linear probing, backward-shift
 * deletion. A slot is one word: the block pointer (16-byte aligned: slabs of 16-byte multiples)
 * with its probe distance in the low 4 bits (15: 15 or more) and, on 64-bit hosts, a 16-bit
 * fingerprint of its key in the top 16 bits (user-space pointers lie below 2^48). The key is the
 * block's address (512-byte aligned, never 0, unchanged while the block is in the map), read
 * through the pointer only for an entry whose home slot and fingerprint are the key's: a probe
 * past other entries, and the shift of a deletion, read no block, so a free of a cold pointer
 * misses on its slot and its own block and nothing else. A block struct above 2^48 (a platform
 * that maps user memory there) turns the fingerprints off for good (ptrmap_fp_off): every entry
 * sharing the key's home is then compared through its block, as before.
 * Size: at most 3/4 of the slots used, and a full map grows by half (not a power of two: the home
 * slot is the hash scaled to the capacity), so the map costs 10.7 to 16 bytes a live block rather
 * than the 16 to 32 of a half-full table that doubles. From PTRMAP_HUGE_MIN bytes the table lies on
 * 2 MiB huge pages where the kernel gives them (base/hugemem.h): a free's slot is then a cache
 * miss without a TLB miss.
 */
struct ptrmap {
    uintptr_t *slots; /* 0: empty; else block pointer | min(distance, 15) | fingerprint */
    size_t cap;       /* slots, or 0 */
    size_t count;
    /* The bits of a slot that are its block pointer (ptrmap_block): 0 before the first table,
     * ~(distance | PTRMAP_FP_BITS) with fingerprints, ~distance once they are off for good
     * (ptrmap_fp_off; the first table keeps that too). */
    uintptr_t keep;
    bool huge;        /* the slots are a hugemem_alloc (base/hugemem.h) of cap words */
    /* Tables of at least this many bytes go on huge pages, their capacity rounded to whole 2 MiB
     * pages (ptrmap_grow); 0: PTRMAP_HUGE_MIN (tests set less). */
    size_t huge_min;
};

/* From 4 MiB (~260,000 live blocks) a table takes huge pages: rounded down to whole 2 MiB pages,
 * a growth by half is still a growth (ptrmap_grow). */
#define PTRMAP_HUGE_MIN ((size_t)4 << 20)

#define PTRMAP_DIST_MAX 15u
#if UINTPTR_MAX > 0xFFFFFFFFu
#define PTRMAP_FP_BITS (~(uintptr_t)0 << 48)
#else
#define PTRMAP_FP_BITS ((uintptr_t)0) /* no spare bits in a 32-bit pointer */
#endif
#define PTRMAP_KEEP_NO_FP (~(uintptr_t)PTRMAP_DIST_MAX) /* ptrmap.keep with fingerprints off */

/* The fingerprint's bits in a slot of @p m (a map with a table): PTRMAP_FP_BITS, or 0 off. */
static inline uintptr_t ptrmap_fp_mask(const struct ptrmap *m) { return ~(m->keep | PTRMAP_DIST_MAX); }

/* The multiplicative hash of an address (its low 9 bits are always 0). */
static inline uint64_t ptrmap_mix(uintptr_t key) { return (uint64_t)(key >> 9) * 0x9E3779B97F4A7C15ull; }

/* The home slot of hash @p h in a map of @p cap slots: its top bits scaled to [0, cap). */
static inline size_t ptrmap_home(uint64_t h, size_t cap) { return (size_t)(((unsigned __int128)h * cap) >> 64); }
static inline size_t ptrmap_hash(uintptr_t key, size_t cap) { return ptrmap_home(ptrmap_mix(key), cap); }

/* The fingerprint of hash @p h where a slot keeps it (bits the home slot barely uses: the scaling
 * reads the hash's top bits). */
static inline uintptr_t ptrmap_fp_of(uint64_t h) { return (uintptr_t)(h << 16) & PTRMAP_FP_BITS; }

/* The slot after @p i, wrapping at @p cap. */
static inline size_t ptrmap_next(size_t i, size_t cap) { return XSEG_UNLIKELY(i + 1 == cap) ? 0 : i + 1; }

/* Slots from @p from forward to @p to, wrapping at @p cap. */
static inline size_t ptrmap_span(size_t from, size_t to, size_t cap) { return to >= from ? to - from : to + cap - from; }

static inline struct block *ptrmap_block(const struct ptrmap *m, uintptr_t e) { return (struct block *)(e & m->keep); }

/* The probe distance of entry @p e in slot @p j: from its tag, or from its key once saturated. */
static inline size_t ptrmap_dist(const struct ptrmap *m, uintptr_t e, size_t j)
{
    size_t d = e & PTRMAP_DIST_MAX;
    if (XSEG_UNLIKELY(d == PTRMAP_DIST_MAX))
        d = ptrmap_span(ptrmap_hash(ptrmap_block(m, e)->addr, m->cap), j, m->cap);
    return d;
}

/* Slot word @p e (pointer and fingerprint kept) at probe distance @p dist: an entry that moves
 * (a deletion's shift, a rehash) or a new one (ptrmap_entry). */
static inline uintptr_t ptrmap_retag(uintptr_t e, size_t dist)
{
    return (e & ~(uintptr_t)PTRMAP_DIST_MAX) | (dist < PTRMAP_DIST_MAX ? dist : PTRMAP_DIST_MAX);
}

/* The slot word of @p b (fingerprint @p fp, as ptrmap_find gives it) at probe distance @p dist. */
static inline uintptr_t ptrmap_entry(const struct block *b, uintptr_t fp, size_t dist)
{
    return ptrmap_retag((uintptr_t)b | fp, dist);
}

/* The slot holding @p key, or the empty slot that ends its probe (*@p dist: its distance; *@p fpo:
 * the key's fingerprint as a slot keeps it). An entry is only read through when it shares the
 * key's home and fingerprint. */
static inline size_t ptrmap_find(const struct ptrmap *m, uintptr_t key, size_t *dist, uintptr_t *fpo)
{
    uint64_t h = ptrmap_mix(key);
    size_t cap = m->cap, i = ptrmap_home(h, cap), d = 0;
    /* ~keep is the distance and fingerprint bits: the key's fingerprint (its low bits are 0), and
     * an entry's matches when only distance bits differ. */
    uintptr_t tag = ~m->keep, fp = ptrmap_fp_of(h) & tag;
    *fpo = fp;
    for (uintptr_t e; (e = m->slots[i]) != 0; i = ptrmap_next(i, cap), d++) {
        size_t t = e & PTRMAP_DIST_MAX;
        if ((t == d || (t == PTRMAP_DIST_MAX && d >= PTRMAP_DIST_MAX)) && ((e ^ fp) & tag) <= PTRMAP_DIST_MAX &&
            ptrmap_block(m, e)->addr == key)
            break;
    }
    *dist = d;
    return i;
}

/* Grow the table by half (or create it). False on ENOMEM, the map unchanged. */
bool ptrmap_grow(struct ptrmap *m);
/* A block struct may lie where a fingerprint would go: strip them all and stop keeping them. */
void ptrmap_fp_off(struct ptrmap *m);

/* Room for @p n more entries within the 3/4 bound, growing the table if needed: false on ENOMEM,
 * the map unchanged. */
static inline bool ptrmap_reserve(struct ptrmap *m, size_t n)
{
    while (XSEG_UNLIKELY((m->count + n) * 4 > m->cap * 3))
        if (!ptrmap_grow(m))
            return false;
    return true;
}

/* Map @p key (@p b's address) to @p b (replacing an existing entry) in a map with room for it
 * (ptrmap_reserve): cannot fail. @p b lies below the fingerprint's bits (ptrmap_admit). */
static inline void ptrmap_put_reserved(struct ptrmap *m, uintptr_t key, struct block *b)
{
    xseg_assert(key == b->addr && ((uintptr_t)b & ~m->keep) == 0 &&
                (m->count + 1) * 4 <= m->cap * 3);
    size_t d;
    uintptr_t fp;
    size_t i = ptrmap_find(m, key, &d, &fp);
    if (!m->slots[i])
        m->count++;
    m->slots[i] = ptrmap_entry(b, fp, d);
}

/* Block structs from @p lo to @p hi (a new slab) may enter the map: where they reach into the
 * fingerprint's bits, fingerprints go for good (ptrmap_fp_off). */
static inline void ptrmap_admit(struct ptrmap *m, const void *lo, const void *hi)
{
    if (XSEG_UNLIKELY((((uintptr_t)lo | (uintptr_t)hi) & PTRMAP_FP_BITS) && m->keep != PTRMAP_KEEP_NO_FP))
        ptrmap_fp_off(m);
}

/* Map @p key (@p b's address) to @p b (replacing an existing entry). False on ENOMEM, the map
 * unchanged. */
static inline bool ptrmap_put(struct ptrmap *m, uintptr_t key, struct block *b)
{
    if (!ptrmap_reserve(m, 1))
        return false;
    ptrmap_put_reserved(m, key, b);
    return true;
}

/* Start looking @p key up: its home slot on its way into the cache (the malloc that has chosen
 * its block puts it in the map later: core/device.h, live_pending). */
static inline void ptrmap_prefetch(const struct ptrmap *m, uintptr_t key)
{
    if (XSEG_LIKELY(m->cap))
        __builtin_prefetch(&m->slots[ptrmap_hash(key, m->cap)], 1);
}

static inline struct block *ptrmap_get(const struct ptrmap *m, uintptr_t key)
{
    if (!m->cap || !key)
        return NULL;
    size_t d;
    uintptr_t fp;
    size_t i = ptrmap_find(m, key, &d, &fp);
    return ptrmap_block(m, m->slots[i]); /* NULL for an empty slot */
}

/* Remove @p key; its block, or NULL when absent. */
static inline struct block *ptrmap_take(struct ptrmap *m, uintptr_t key)
{
    if (!m->cap || !key)
        return NULL;
    size_t cap = m->cap, d;
    uintptr_t fp;
    size_t i = ptrmap_find(m, key, &d, &fp);
    struct block *b = ptrmap_block(m, m->slots[i]);
    if (!b)
        return NULL;
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones: an entry
     * after the hole moves into it unless that would put it before its home. Its fingerprint
     * moves with it; only the distance tag changes. */
    for (size_t j = ptrmap_next(i, cap);; j = ptrmap_next(j, cap)) {
        uintptr_t e = m->slots[j];
        if (!e)
            break;
        size_t dj = ptrmap_dist(m, e, j), gap = ptrmap_span(i, j, cap);
        if (dj >= gap) {
            m->slots[i] = ptrmap_retag(e, dj - gap);
            i = j;
        }
    }
    m->slots[i] = 0;
    m->count--;
    return b;
}

void ptrmap_destroy(struct ptrmap *m);

#endif
