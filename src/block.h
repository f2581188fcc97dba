/*
 * Blocks and block pools: the host-side metadata of the caching allocator.
 *
 * A block is a byte range [addr, addr + size) of one segment. The blocks of a segment form a
 * doubly linked list in address order (prev/next) that tiles the segment exactly. A block is
 * allocated (handed out), pending (freed but waiting for events on other streams), free and
 * mapped (cached, in its pool's free index), or — in an expandable segment only — unmapped (no
 * physical page behind it, in its pool's unmapped index).
 *
 * Indexes are treaps (randomized balanced search trees) threaded through the blocks themselves,
 * so inserting or removing a block never allocates:
 *   - bpool.free:     free mapped blocks ordered by (stream, size, addr): best fit on the same
 *                     stream is one lower_bound (PyTorch's BlockPool::blocks);
 *   - bpool.unmapped: unmapped blocks ordered by (stream, addr) (PyTorch's BlockPool::unmapped).
 * A block is in at most one index at a time.
 *
 * The live map (ptrmap) finds the block of an allocated pointer for free and record_stream.
 *
 * Locking: everything here belongs to one device allocator and is used under its mutex.
 */
#ifndef XSEG_SRC_BLOCK_H
#define XSEG_SRC_BLOCK_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda.h>

#include "src/common.h"

#define BLOCK_MIN_SIZE ((size_t)512)               /* kMinBlockSize: rounding unit */
#define BLOCK_SMALL_SIZE XSEG_MiB                  /* kSmallSize: largest small-pool request */
#define BLOCK_SMALL_BUFFER (2 * XSEG_MiB)          /* kSmallBuffer: small-pool segment/page size */
#define BLOCK_MIN_LARGE_ALLOC (10 * XSEG_MiB)      /* kMinLargeAlloc */
#define BLOCK_ROUND_LARGE (2 * XSEG_MiB)           /* kRoundLarge */

struct segrec;
struct bpool;

/* Streams a block was recorded on besides its own (record_stream). Two inline slots cover
 * almost every use; more spill to a heap array. */
struct stream_set {
    unsigned n, cap;
    CUstream inl[2];
    CUstream *heap; /* when cap > 2 */
};

struct block {
    uintptr_t addr;
    size_t size;
    size_t requested_size; /* bytes the caller asked for, while allocated or pending */
    CUstream stream;       /* the stream it was allocated on; reused only there */
    struct bpool *pool;
    struct segrec *seg;    /* the segment it lives in */
    struct block *prev, *next; /* neighbours in the segment, address order */
    /* index linkage (free or unmapped treap) */
    struct block *left, *right;
    uint32_t prio;
    bool allocated;
    bool mapped;     /* always true in classic segments */
    bool expandable; /* == (seg->vseg != NULL); cached for the hot path */
    bool in_index;   /* in pool->free or pool->unmapped */
    bool oversize;   /* counted in oversize_allocations (decided at allocation time) */
    int event_count; /* events still pending before this block can be freed */
    struct stream_set uses;
    uint64_t gc_count_base;
};

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
};

/* One block pool: small or large (private pools will add more). */
struct bpool {
    struct block *free;     /* treap root, key (stream, size, addr) */
    struct block *unmapped; /* treap root, key (stream, addr) */
    bool is_small;
    int stat_index;         /* XSEG_STAT_SMALL_POOL or XSEG_STAT_LARGE_POOL */
    uint64_t get_free_blocks_call_count; /* garbage-collection clock */
    size_t nfree;           /* blocks in the free index */
};

static inline bool block_is_split(const struct block *b) { return b->prev || b->next; }

/* Free index. */
void bpool_insert_free(struct bpool *p, struct block *b);
void bpool_remove_free(struct bpool *p, struct block *b);
/* The first free block with key >= (stream, size, addr), or NULL. */
struct block *bpool_lower_bound(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr);
/* The next free block after @p b in index order, or NULL. */
struct block *bpool_next_free(const struct bpool *p, const struct block *b);
/* The last free block with key < (stream, size, addr), or NULL. */
struct block *bpool_prev_free(const struct bpool *p, CUstream stream, size_t size, uintptr_t addr);
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
void stream_set_clear(struct stream_set *s);
static inline CUstream stream_set_get(const struct stream_set *s, unsigned i)
{
    return s->cap > 2 ? s->heap[i] : s->inl[i];
}

/*
 * Live map: allocated address -> block. Open addressing, linear probing, backward-shift
 * deletion; keys are 512-byte aligned device addresses (never 0).
 */
struct ptrmap {
    uintptr_t *keys;
    struct block **vals;
    size_t cap;   /* power of two, or 0 */
    size_t count;
};

bool ptrmap_put(struct ptrmap *m, uintptr_t key, struct block *b); /* false on ENOMEM */
struct block *ptrmap_get(const struct ptrmap *m, uintptr_t key);
struct block *ptrmap_take(struct ptrmap *m, uintptr_t key); /* removes; NULL when absent */
void ptrmap_destroy(struct ptrmap *m);

#endif
