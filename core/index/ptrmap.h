/*
 * The live pointer map: allocated address -> block, for free and record_stream (one per device,
 * dev_alloc.live). A general open-addressing table; it reads a block only for its key (addr).
 *
 * Locking: one device allocator's, used under its mutex.
 */
#ifndef XSEG_CORE_PTRMAP_H
#define XSEG_CORE_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/assert.h"
#include "base/common.h"
#include "core/index/block.h"

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

/* From 4 MiB (524,288 slots: ~260,000 live blocks, half full after a growth) a table takes huge pages: rounded down to whole 2 MiB pages,
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

/* Start looking @p key up: its home slot on its way into the cache while the malloc that has
 * chosen its block splits it and counts. */
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
