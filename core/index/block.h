/*
 * Blocks and block pools: the host-side metadata of the caching allocator.
 *
 * A block is a byte range [addr, addr + size) of one segment. The blocks of a segment form a
 * doubly linked list in address order (prev/next) that tiles the segment exactly. A block is
 * allocated (handed out), pending (freed but waiting for events on other streams), free and
 * mapped (cached, in its pool's free index), or — in an expandable segment only — unmapped (no
 * physical page behind it, in its pool's unmapped index).
 *
 * The indexes over the blocks (struct bpool, the free index's size bins and the unmapped treap)
 * are in core/index/bins.h; the live pointer map in core/index/ptrmap.h.
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

#include <stdatomic.h>
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
 * the history stack, and the holds of handed-out handles. The requested size moves here while the side exists (the block's last
 * word points here then). */
struct block_side {
    size_t requested_size;
    int event_count;           /* events still pending before the block can be freed */
    unsigned handle_holds;     /* xseg_block_handles hand-outs not yet released (allocated blocks
                                * only; its pool refuses to sleep while any: core/services/sleep.c) */
    unsigned ledger;           /* entries xseg made in the registration ledger over it (a dma-buf of
                                * it, its IPC export, register_blocks_above_mb): its free drops them
                                * (core/policy/registry.h, reg_disown_locked) */
    struct stream_set uses;    /* streams recorded besides the block's own (record_stream) */
    struct hstack *hist_stack; /* the allocation's stack (history on; valid while `recorded`) */
    struct hstack *free_stack; /* debug_stale_access: the free's stack while record_stream's events
                                * wait (one reference; core/device/quarantine.c takes it) */
};

struct block {
    /* The first 64 bytes hold all an index descent and a neighbour test read (key, links,
     * priority, state), so that a descent touches one cache line a node. */
    uintptr_t addr;
    size_t size;
    CUstream stream;       /* the stream it was allocated on; reused only there */
    /* index linkage (free or unmapped treap) */
    struct block *left, *right;
    uint32_t prio; /* the treap's; while allocated, the lifetime tag (core/device/placement.h) */
    bool allocated;
    bool mapped;     /* always true in classic segments */
    /* What a free must do besides the common work, tested as one byte (block_free_slow):
     * `oversize`, `recorded`, `sided`, `exported` and `spill` (the BLOCK_FREE_SLOW bits; check.c verifies
     * the compiler's bit order). */
    union {
        struct {
            bool oversize : 1; /* counted in oversize_allocations (decided at allocation time) */
            bool recorded : 1; /* allocated or pending while history recorded (core/process/history.h):
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
             * refuses to sleep (core/services/sleep.c), as importers map these very pages. Cleared by its
             * free (free_ptr_rare), so free blocks and spare structs have it clear. */
            bool exported : 1;
            /* Known to core/services/spill.c (declared cold, or some of its chunks on host memory):
             * its free goes through spill_on_free first. Allocated blocks only. */
            bool spill : 1;
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

#define BLOCK_FREE_SLOW 0xC7u /* oversize | recorded | sided | exported | spill in `flags` */
#define BLOCK_SEG_BITS 0x38u /* expandable | small_pool | private_pool: what its segment decides */

/* Does the free of @p b need more than the common path (oversize, recorded, a side struct,
 * exported, spill)? */
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
    bool cls;            /* S1 (core/device/placement.h): holds the requests whose last blocks live */
    bool asleep;         /* its pool sleeps (core/services/sleep.c): blocks keep their mapped state, the
                          * pages are asleep; no reclaim path touches it */
    _Atomic unsigned reg_held; /* classic: ledger entries inside it (core/policy/registry.c sets and
                          * clears it, the last decrement without the device lock); while nonzero
                          * the segment is never cuMemFree'd (segrec_held) */
};

/* Does a ledger entry hold classic segment @p s (it must not be released)? Device lock held. */
static inline bool segrec_held(const struct segrec *s)
{
    return atomic_load_explicit(&((struct segrec *)s)->reg_held, memory_order_relaxed) != 0;
}

static inline bool block_is_split(const struct block *b) { return b->prev || b->next; }
/* Is @p b (NULL: no) in the free index: free and cached, mapped, in_index? */
static inline bool block_in_free_index(const struct block *b) { return b && (b->in_index & b->mapped); }

/* The pool of a block: its segment's (a block never changes pool or segment). */
static inline struct bpool *block_pool(const struct block *b) { return b->seg->pool; }

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
/* Give back @p b's side struct when it holds nothing any more (no streams, events, stack or
 * handle holds): the requested size moves back inline. A no-op without a side or when it still
 * holds something. */
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

#endif
