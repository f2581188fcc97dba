/* The expensive invariant walk (see check.h). Compiled in at debug_level=2 only. */
#include "core/device/check.h"

#if XSEG_CHECK_EXPENSIVE

#include "base/hostmem.h"
#include "core/device/fast.h"
#include "core/index/stats.h"
#include "vmm/segment.h"

/* Always on inside this file: dev_check exists only at the expensive level. */
#define CHECK(cond) ((cond) ? (void)0 : assert_fail(#cond, __FILE__, __LINE__, __func__))

struct recount {
    int64_t allocation[XSEG_STAT_POOLS], allocated_bytes[XSEG_STAT_POOLS];
    int64_t active[XSEG_STAT_POOLS], active_bytes[XSEG_STAT_POOLS], requested_bytes[XSEG_STAT_POOLS];
    int64_t reserved_bytes[XSEG_STAT_POOLS], segment[XSEG_STAT_POOLS];
    int64_t inactive_split[XSEG_STAT_POOLS], inactive_split_bytes[XSEG_STAT_POOLS];
    int64_t oversize_allocations, oversize_segments;
    size_t driver_bytes, allocated_blocks, free_indexed, unmapped_indexed, slot_freed;
};

static bool pending(const struct block *b) { return !b->allocated && (block_event_count(b) > 0 || block_uses_n(b)); }

/* The front holding @p b (its entry in *@p k), or NULL. */
static const struct dev_front *front_of(const struct dev_alloc *d, const struct block *b, uint32_t *k)
{
    for (uint64_t m = d->fast.busy_slots >> DEV_STREAM_SLOTS; m; m &= m - 1) {
        const struct dev_front *f = &d->fast.fronts[__builtin_ctzll(m)];
        if (f->stream != b->stream)
            continue;
        for (uint64_t u = f->used; u; u &= u - 1)
            if (f->blk[__builtin_ctzll(u)] == b) {
                *k = (uint32_t)__builtin_ctzll(u);
                return f;
            }
    }
    return NULL;
}

/* @p b if it is a busy stream slot's freed block (struct dev_slot), else NULL (also for NULL). */
static const struct block *slot_freed(const struct dev_alloc *d, const struct block *b)
{
    if (!b)
        return NULL;
    unsigned i = fast_slot_index(b->stream);
    const struct dev_slot *s = &d->fast.slots[i];
    return (d->fast.busy_slots >> i & 1) && slot_state(s) == SLOT_FREED && s->freed == b ? b : NULL;
}

/* The lane slot of front @p f serving entry @p k (which holds its state: Note [front lane]), or NULL. */
static const struct dev_slot *front_lane_of(const struct dev_front *f, uint32_t k)
{
    for (uint32_t m = f->lanes; m; m &= m - 1)
        if (f->lane_entry[__builtin_ctz(m)] == k)
            return &f->lane[__builtin_ctz(m)];
    return NULL;
}

/* @p b if it is a front's freed block (its lane's included), else NULL. */
static const struct block *own_freed(const struct dev_alloc *d, const struct block *b)
{
    uint32_t k;
    const struct dev_front *f = b && b->allocated ? front_of(d, b, &k) : NULL;
    const struct dev_slot *l = f ? front_lane_of(f, k) : NULL;
    if (l)
        return l->freed == b ? b : NULL;
    return f && (f->freed >> k & 1) ? b : NULL;
}

/* Is @p b in the live map? */
static bool live_has(const struct dev_alloc *d, const struct block *b) { return ptrmap_get(&d->live, b->addr) == b; }

/* The slot whose hit handed out @p b, or NULL: B's `allocated`, `size` and `requested_size` are
 * the slot's `live`, `cur_size` and `cur_req` then (struct dev_slot). */
static const struct dev_slot *slot_live(const struct dev_alloc *d, const struct block *b)
{
    const struct dev_slot *s = &d->fast.slots[fast_slot_index(b->stream)];
    if ((d->fast.busy_slots >> fast_slot_index(b->stream) & 1) && slot_state(s) == SLOT_HANDED_OUT && s->blk == b)
        return s;
    return NULL;
}

/* Bin treap below @p t (bin @p k of @p sb): ordered by (size, addr) within (lo, hi), heap-ordered
 * by prio, only free mapped blocks of @p pool on the bins' stream whose size is of bin k. Returns
 * the node count. */
static size_t walk_bin(const struct bpool *pool, const struct sbins *sb, unsigned k, const struct block *t,
                       const struct block *lo, const struct block *hi)
{
    if (!t)
        return 0;
    CHECK(block_pool(t) == pool && t->stream == sb->stream && bins_index(t->size) == k);
    CHECK(t->in_index && t->mapped && !t->allocated && !t->sided);
    CHECK(!lo || zkey_less(lo->size, lo->addr, t->size, t->addr));
    CHECK(!hi || zkey_less(t->size, t->addr, hi->size, hi->addr));
    CHECK(!t->left || t->left->prio <= t->prio);
    CHECK(!t->right || t->right->prio <= t->prio);
    return 1 + walk_bin(pool, sb, k, t->left, lo, t) + walk_bin(pool, sb, k, t->right, t, hi);
}

/* The free index of @p pool: its streams' bins in strictly ascending stream order, each found by
 * the hash (and `last` one of them), holding one reference per segment of (pool, stream); every
 * bin the bitmap marks non-empty, the summary word exact; the block count (nfree). Returns the
 * blocks found through the bitmap: the caller compares it with the indexed blocks of the segment
 * walk, so a non-empty bin the bitmap does not mark (its blocks unreachable) fails there. */
static size_t check_free_index(const struct dev_alloc *d, const struct bpool *pool)
{
    size_t total = 0;
    const struct sbins *last = pool->last; /* before the lookups below move it */
    bool last_found = last == NULL;
    CHECK(pool->nstreams <= pool->capstreams);
    CHECK(!pool->nstreams || (pool->hash && 2 * (size_t)pool->nstreams <= pool->hmask + 1));
    size_t hashed = 0;
    for (size_t i = 0; pool->hash && i <= pool->hmask; i++)
        hashed += pool->hash[i] != NULL;
    CHECK(hashed == pool->nstreams);
    /* References: one per segment of (pool, stream), counted in one pass over the segments. */
    unsigned *segs = pool->nstreams ? xs_calloc(pool->nstreams, sizeof *segs) : NULL;
    for (const struct segrec *s = d->segs; s; s = s->next_seg) {
        if (s->pool != pool)
            continue;
        const struct sbins *sb = bpool_bins_lookup(pool, s->stream);
        CHECK(sb != NULL); /* every segment's (pool, stream) has its bins */
        unsigned lo = 0, hi = pool->nstreams;
        while (lo < hi) {
            unsigned mid = lo + (hi - lo) / 2;
            if ((uintptr_t)pool->by_stream[mid]->stream < (uintptr_t)s->stream)
                lo = mid + 1;
            else
                hi = mid;
        }
        CHECK(lo < pool->nstreams && pool->by_stream[lo] == sb);
        if (segs)
            segs[lo]++;
    }
    for (unsigned i = 0; i < pool->nstreams; i++) {
        const struct sbins *sb = pool->by_stream[i];
        CHECK(i == 0 || (uintptr_t)pool->by_stream[i - 1]->stream < (uintptr_t)sb->stream);
        CHECK(bpool_bins_lookup(pool, sb->stream) == sb);
        last_found |= last == sb;
        CHECK(sb->refs > 0 && (!segs || sb->refs == segs[i]));
        for (unsigned w = 0; w < BINS_WORDS; w++) {
            CHECK(!!(sb->summary >> w & 1) == (sb->map[w] != 0));
            for (uint64_t m = sb->map[w]; m; m &= m - 1) {
                unsigned k = w << 6 | (unsigned)__builtin_ctzll(m);
                CHECK(sb->bin[k] != NULL);
                total += walk_bin(pool, sb, k, sb->bin[k], NULL, NULL);
            }
        }
        CHECK(sb->summary >> BINS_WORDS == 0);
    }
    xs_free(segs);
    CHECK(last_found);
    CHECK(total == pool->nfree);
    return total;
}

/* Unmapped treap below @p t: ordered by (stream, addr), only unmapped blocks of @p pool. */
static size_t walk_unmapped(const struct bpool *pool, const struct block *t, const struct block *lo,
                            const struct block *hi)
{
    if (!t)
        return 0;
    CHECK(block_pool(t) == pool);
    CHECK(t->in_index && !t->mapped && !t->allocated && !t->sided);
    CHECK(!lo || (uintptr_t)lo->stream < (uintptr_t)t->stream || (lo->stream == t->stream && lo->addr < t->addr));
    CHECK(!hi || (uintptr_t)t->stream < (uintptr_t)hi->stream || (t->stream == hi->stream && t->addr < hi->addr));
    return 1 + walk_unmapped(pool, t->left, lo, t) + walk_unmapped(pool, t->right, t, hi);
}

/* The block's last word and its side struct (struct block): in an index it is the GC clock, so no
 * side; a side exactly while something needs one (recorded streams, events, a history stack,
 * handle holds); a stack only on a recorded block; `exported` and holds only on an allocated one. */
static void check_block_word(const struct block *b)
{
    const struct block_side *sd = block_side(b);
    CHECK(!(b->in_index && b->sided));
    if (sd) {
        CHECK(sd->uses.n || sd->event_count > 0 || sd->hist_stack || sd->handle_holds || sd->ledger || sd->free_stack);
        CHECK(!sd->handle_holds || b->allocated); /* the holds end with the block's free */
        CHECK(!sd->ledger || b->allocated);       /* so do xseg's own ledger entries over it */
        CHECK(sd->uses.n <= sd->uses.cap && (sd->uses.cap <= 2 || sd->uses.heap));
    }
    CHECK(!block_hist_stack(b) || b->recorded);
    CHECK(!b->exported || b->allocated); /* an export ends with its block's free */
    CHECK(!b->spill || b->allocated);    /* so does the spill module's record */
}

/* block_free_slow tests BLOCK_FREE_SLOW in `flags`: the bit-fields must sit where it says. */
static void check_flag_bits(void)
{
    struct block t = {0};
    t.oversize = true;
    t.recorded = true;
    t.sided = true;
    t.exported = true;
    t.spill = true;
    CHECK(t.flags == BLOCK_FREE_SLOW);
    t = (struct block){0};
    t.expandable = true;
    t.small_pool = true;
    t.private_pool = true;
    CHECK(t.flags == BLOCK_SEG_BITS && !(t.flags & BLOCK_FREE_SLOW));
}

static void check_pool(const struct dev_alloc *d, const struct bpool *pool, size_t *free_nodes,
                       size_t *unmapped_nodes)
{
    *free_nodes += check_free_index(d, pool);
    *unmapped_nodes += walk_unmapped(pool, pool->unmapped, NULL, NULL);
}

/* @p b's true requested bytes: those of the hit that handed it out (stream slot @p sl's, or a
 * front entry's) or its own. */
static size_t requested_now(const struct dev_alloc *d, const struct block *b, const struct dev_slot *sl)
{
    uint32_t k;
    const struct dev_front *f = !sl && b->allocated ? front_of(d, b, &k) : NULL;
    const struct dev_slot *l = f ? front_lane_of(f, k) : NULL;
    if (l)
        return l->cur_req;
    return sl ? sl->cur_req : f ? f->cur_req[k] : block_requested(b);
}

static void check_block(struct dev_alloc *d, const struct segrec *s, const struct block *b, struct recount *rc)
{
    lock_assert_held(&d->lock);
    int si = s->pool->stat_index;
    CHECK(b->seg == s && block_pool(b) == s->pool && b->stream == s->stream);
    CHECK(dev_block_pool(d, b) == s->pool); /* the pool bits (block_set_seg) */
    check_block_word(b);
    /* A slot's freed block (struct dev_slot): B is free but unmerged, its successor R free and
     * indexed at its own key, no free predecessor, its map entry kept; the folded statistics count
     * them as one merged free block, so the recount does too (B's bytes here, R's as the merged
     * block's). */
    if (slot_freed(d, b)) {
        CHECK(!b->allocated && !b->in_index && !pending(b) && b->mapped);
        CHECK(block_in_free_index(b->next) && !block_in_free_index(b->prev));
        CHECK(live_has(d, b));
        rc->slot_freed++;
        rc->reserved_bytes[si] += (int64_t)b->size;
        rc->driver_bytes += b->size;
        return; /* expandable granules: checked with R, whose mapped state it shares */
    }
    /* An own slot's freed block: free, unmerged, in no index, whatever its neighbours (its
     * settle is the eager free); `allocated` to every eager operation, so that none merges it.
     * Only its reserved bytes count: not allocated, and (classic) no inactive split block until
     * its settle merges it (core/device/fast.h), so a free neighbour counts on its own. */
    if (own_freed(d, b)) {
        CHECK(!b->in_index && !pending(b) && b->mapped && !b->sided);
        CHECK(live_has(d, b));
        rc->slot_freed++;
        rc->reserved_bytes[si] += (int64_t)b->size;
        rc->driver_bytes += b->size;
        return;
    }
    const struct dev_slot *sl = slot_live(d, b);
    bool allocated = b->allocated || sl;
    size_t requested = requested_now(d, b, sl);
    size_t size = sl ? sl->cur_size : b->size; /* the rest of a hit's B is R's (below) */
    CHECK(b->expandable == (s->vseg != NULL));
    CHECK(b->size > 0);
    CHECK(!allocated || (!b->in_index && b->mapped));
    CHECK(block_event_count(b) >= 0);
    /* A side struct only while the block is in use (allocated, pending, or a slot's). */
    CHECK(!b->sided || allocated || pending(b) || slot_freed(d, b));
    /* Two free neighbours merge; so do two unmapped ones. */
    CHECK(!(block_in_free_index(b) && block_in_free_index(b->next)));
    CHECK(!(b->next && !b->mapped && !b->next->mapped));
    /* Free, mapped, nothing pending: cached, so in the free index; unmapped: in the unmapped one.
     */
    if (!allocated && !pending(b))
        CHECK(b->in_index);
    if (b->in_index)
        CHECK(!pending(b));
    if (allocated) {
        CHECK(live_has(d, b));
        rc->allocated_blocks++;
        rc->allocation[si]++;
        rc->allocated_bytes[si] += (int64_t)size;
        if (b->oversize)
            rc->oversize_allocations++;
    }
    if (allocated || pending(b)) {
        rc->active[si]++;
        rc->active_bytes[si] += (int64_t)size;
        rc->requested_bytes[si] += (int64_t)requested;
    }
    if (b->mapped && !s->asleep) { /* a sleeping segment's pages count in check_segment */
        rc->reserved_bytes[si] += (int64_t)b->size;
        rc->driver_bytes += b->size;
    }
    if (block_in_free_index(b))
        rc->free_indexed++;
    else if (b->in_index)
        rc->unmapped_indexed++;
    if (!b->expandable) {
        CHECK(b->mapped);
        const struct block *lz = slot_freed(d, b->prev);
        if (lz) { /* the merged block [lz, b) */
            if (lz->prev || b->next) {
                rc->inactive_split[si]++;
                rc->inactive_split_bytes[si] += (int64_t)(lz->size + b->size);
            }
        } else if (b->in_index && block_is_split(b)) {
            /* The rest of a hit's B (a widened classic slot's) is this block's. */
            const struct dev_slot *hit = b->prev ? slot_live(d, b->prev) : NULL;
            rc->inactive_split[si]++;
            rc->inactive_split_bytes[si] += (int64_t)(b->size + (hit ? hit->blk->size - hit->cur_size : 0));
        }
        return;
    }
    /* Granules: an unmapped block covers whole granules; the granules at both ends of a block
     * are mapped exactly when the block is (the ones between follow from the byte count in
     * check_segment), so no chunk reaches into an unmapped block. */
    size_t gran = seg_gran(s->vseg), off = b->addr - (uintptr_t)seg_base(s->vseg);
    if (!b->mapped)
        CHECK(off % gran == 0 && b->size % gran == 0);
    /* In a sleeping segment, "mapped" blocks lie on asleep granules (or ones a failed sleep left). */
    size_t lo = off / gran, hi = (off + b->size - 1) / gran;
    CHECK((seg_gran_is_mapped(s->vseg, lo) || (s->asleep && seg_gran_is_asleep(s->vseg, lo))) == b->mapped);
    CHECK((seg_gran_is_mapped(s->vseg, hi) || (s->asleep && seg_gran_is_asleep(s->vseg, hi))) == b->mapped);
}

/* Every granule of @p b on host memory lies in it whole and @p b is an allocated spill block (or a
 * pending one: quarantined, its host chunks go when it leaves). */
static void check_host_pages(const struct segrec *s, const struct block *b)
{
    size_t gran = seg_gran(s->vseg), off = b->addr - (uintptr_t)seg_base(s->vseg);
    for (size_t g = off / gran; g * gran < off + b->size; g++)
        if (seg_gran_is_host(s->vseg, g))
            CHECK(((b->allocated && b->spill) || pending(b)) && g * gran >= off && (g + 1) * gran <= off + b->size);
}

static void check_segment(struct dev_alloc *d, const struct segrec *s, struct recount *rc)
{
    lock_assert_held(&d->lock);
    CHECK(s->first && s->last && !s->first->prev && !s->last->next);
    if (s->vseg)
        CHECK(s->first->addr == (uintptr_t)seg_base(s->vseg) && s->size <= seg_va_size(s->vseg));
    /* release_floor bounds what this segment can give back (a whole classic segment, a whole
     * granule): release_cached_blocks and trim look at no smaller free block. */
    CHECK(d->release_floor != 0 && d->release_floor <= (s->vseg ? seg_gran(s->vseg) : s->size));
    /* cache_info's largest free block from the index (bpool_largest_free): a free block of the
     * pool, and none is larger. */
    const struct block *largest = bpool_largest_free(s->pool);
    CHECK(!largest || (largest->in_index && largest->mapped && !largest->allocated && block_pool(largest) == s->pool));
    size_t bytes = 0, mapped = 0;
    for (const struct block *b = s->first; b; b = b->next) {
        CHECK(!b->next || (b->next->prev == b && b->addr + b->size == b->next->addr));
        CHECK(b->next || b == s->last);
        check_block(d, s, b, rc);
        if (b->in_index && b->mapped)
            CHECK(largest && largest->size >= b->size);
        bytes += b->size;
        if (b->mapped)
            mapped += b->size;
    }
    CHECK(bytes == s->size);
    CHECK(!s->asleep || s->vseg);
    if (s->vseg && s->asleep) {
        /* Only what a failed sleep left mapped is reserved. */
        CHECK(seg_mapped_bytes(s->vseg) + seg_asleep_bytes(s->vseg) + seg_canary_bytes(s->vseg) == mapped);
        rc->reserved_bytes[s->pool->stat_index] += (int64_t)seg_mapped_bytes(s->vseg);
        rc->driver_bytes += seg_mapped_bytes(s->vseg);
    } else if (s->vseg) {
        /* Host chunks (spill) are mapped blocks' pages but not reserved device memory, and lie
         * inside allocated blocks the spill module knows (free bytes on host are never handed out);
         * so are a quarantined block's canary spans (their chunks were given back). */
        size_t host = seg_host_bytes(s->vseg), canary = seg_canary_bytes(s->vseg);
        CHECK(seg_mapped_bytes(s->vseg) + host + canary == mapped);
        rc->reserved_bytes[s->pool->stat_index] -= (int64_t)(host + canary);
        rc->driver_bytes -= host + canary;
        for (const struct block *b = s->first; host && b; b = b->next)
            check_host_pages(s, b);
        CHECK(seg_asleep_bytes(s->vseg) == 0);
    } else {
        rc->segment[s->pool->stat_index]++;
        if (s->oversize)
            rc->oversize_segments++;
    }
    /* The ledger holds classic segments only (its recount against the entries is the ledger's own
     * check, core/policy/registry.c: the policy wing lies above this one). */
    CHECK(!s->vseg || !segrec_held(s));
}

static void check_counter(const xseg_stat_counter arr[XSEG_STAT_POOLS], const int64_t want[XSEG_STAT_POOLS])
{
    CHECK(arr[XSEG_STAT_SMALL_POOL].current == want[XSEG_STAT_SMALL_POOL]);
    CHECK(arr[XSEG_STAT_LARGE_POOL].current == want[XSEG_STAT_LARGE_POOL]);
}

/* Busy own slot @p sl's lanes (Note [front lane]): an entry each, handed out or freed in the lane
 * slot's own fields, as a stream slot's B, exact size, at its size's lane index. Returns the
 * entries they serve. */
static uint64_t check_lanes(const struct dev_alloc *d, const struct dev_slot *sl, const struct dev_front *f)
{
    uint64_t lane_bits = 0;
    for (unsigned j = 0; j < FRONT_LANES; j++) {
        const struct dev_slot *l = &f->lane[j];
        unsigned k = f->lane_entry[j];
        if (!(f->lanes >> j & 1)) {
            CHECK(k == FRONT_ENTRIES && !l->blk && !l->freed && !l->live && !l->reps);
            continue;
        }
        uint64_t bit = (uint64_t)1 << k;
        CHECK(k < FRONT_ENTRIES && (f->used & bit) && !(f->freed & bit) && !(lane_bits & bit));
        lane_bits |= bit;
        CHECK(front_lane_index(f->size[k]) == j && l->front == f);
        CHECK(l->dev == d && l->gen != 0 && l->owner == sl->owner && l->blk == f->blk[k]);
        CHECK(!!l->freed != !!l->live && (!l->freed || l->freed == l->blk) && (!l->live || l->live == f->addr[k]));
        CHECK(l->base_req == f->base_req[k] && l->cur_req <= l->base_req);
        CHECK(l->cur_size == f->size[k] && l->min_size == l->cur_size && l->span == 0);
        /* A lane's bytes are reps x cur_size; size_sum counts only the hits of the first try
         * (fast_hit's fast_take), of that one size too. */
        CHECK(l->size_sum % l->cur_size == 0 && l->size_sum <= l->reps * l->cur_size);
        CHECK(l->req_sum <= l->reps * l->cur_size);
    }
    return lane_bits;
}

/* Every slot's fields against its block (struct dev_slot). True: a classic stream slot is busy. */
static bool check_slots(const struct dev_alloc *d)
{
    bool split_owed = false;
    for (unsigned i = DEV_STREAM_SLOTS; i < DEV_SLOTS; i++) {
        /* A front: its entries against their blocks, its sums against the entries. */
        const struct dev_slot *sl = &d->fast.slots[i];
        const struct dev_front *f = &d->fast.fronts[i - DEV_STREAM_SLOTS];
        CHECK(!!sl->blk == (d->fast.busy_slots >> i & 1));
        /* The own slot's fields other than its mark stay idle: its lanes hold the pairs. */
        CHECK(!sl->freed && !sl->live && !sl->reps && !sl->size_sum && !sl->req_sum);
        if (!sl->blk) {
            CHECK(!f->lanes);
            continue;
        }
        CHECK(sl->dev == d && sl->gen != 0 && sl->owner != NULL);
        CHECK(f->used && sl->blk == f->blk[__builtin_ctzll(f->used)]);
        uint64_t lane_bits = check_lanes(d, sl, f);
        CHECK(lane_bits == f->lane_bits);
        CHECK(!(f->freed & ~f->used));
        int64_t low[XSEG_STAT_POOLS][FRONT_LOWS] = {{0}};
        uint32_t nclassic = 0;
        uint64_t by_size = 0, by_addr = 0;
        for (unsigned q = 0; q < FRONT_BUCKETS; q++) {
            CHECK(!(by_size & f->by_size[q]) && !(by_addr & f->by_addr[q]));
            by_size |= f->by_size[q];
            by_addr |= f->by_addr[q];
        }
        CHECK(by_size == f->freed && by_addr == (f->used & ~f->freed & ~lane_bits));
        for (uint64_t u = f->used; u; u &= u - 1) {
            unsigned k = (unsigned)__builtin_ctzll(u);
            const struct block *b = f->blk[k];
            bool freed = f->freed >> k & 1;
            CHECK(b && b->allocated && b->stream == f->stream && !b->in_index && b->mapped && !b->sided);
            CHECK(f->si[k] == block_pool(b)->stat_index && !b->private_pool);
            CHECK(f->size[k] == b->size && f->addr[k] == b->addr);
            bool lane = lane_bits >> k & 1;
            CHECK(lane || (freed ? (f->by_size[front_bucket(b->size)] >> k & 1)
                                         : (f->by_addr[front_bucket(b->addr)] >> k & 1)));
            CHECK(block_requested(b) == f->base_req[k] && f->cur_req[k] <= f->base_req[k]);
            nclassic += !b->expandable;
            if (lane) {
                /* owes nothing in low: the slot's fields hold it */
            } else if (freed) {
                low[f->si[k]][FRONT_LOW_ALLOC] += 1;
                low[f->si[k]][FRONT_LOW_BYTES] += (int64_t)b->size;
                low[f->si[k]][FRONT_LOW_REQ] += (int64_t)f->base_req[k];
            } else {
                low[f->si[k]][FRONT_LOW_REQ] += (int64_t)(f->base_req[k] - f->cur_req[k]);
            }
        }
        CHECK(nclassic == f->nclassic);
        for (int p = 1; p < XSEG_STAT_POOLS; p++)
            for (int k = 0; k < FRONT_LOWS; k++)
                CHECK(low[p][k] == f->low[p][k]);
    }
    for (unsigned i = 0; i < DEV_STREAM_SLOTS; i++) {
        const struct dev_slot *sl = &d->fast.slots[i];
        const struct block *b = sl->blk;
        /* slot_state's reading is the only one: idle holds nothing, freed B, handed out B's address. */
        enum slot_state state = slot_state(sl);
        CHECK(state != SLOT_IDLE || (!sl->freed && !sl->live));
        CHECK(state != SLOT_FREED || (sl->freed == b && !sl->live));
        CHECK(state != SLOT_HANDED_OUT || sl->live == b->addr);
        CHECK(!!b == (d->fast.busy_slots >> i & 1));
        if (!b)
            continue;
        CHECK(sl->dev == d);
        CHECK(sl->gen != 0 && sl->owner != NULL);
        CHECK(fast_slot_index(b->stream) == i);
        split_owed |= !b->expandable;
        /* B's own fields stay as the fill left them; the slot holds their truth. */
        CHECK(!b->allocated);
        CHECK(block_requested(b) == sl->base_req && sl->cur_req <= sl->base_req);
        CHECK(BLOCK_MIN_SIZE <= sl->min_size && sl->min_size <= sl->cur_size && sl->cur_size <= b->size);
        /* Classic: min_size is where fast_widen took it, each widening a hit. */
        CHECK(BLOCK_MIN_SIZE <= sl->min_fit && sl->min_fit <= sl->min_size);
        CHECK(b->expandable ? sl->min_fit == sl->min_size : sl->reps || sl->min_size == b->size);
        CHECK(sl->span == b->size - sl->min_size);
        CHECK(sl->reps || (sl->cur_size == b->size && !sl->size_sum));
        CHECK(sl->live || sl->cur_req == sl->base_req || sl->reps);
        CHECK(sl->reps || state != SLOT_HANDED_OUT);
    }
    return split_owed;
}

static void check_walk(struct dev_alloc *d);

/* The walk with every busy slot locked: the fast paths of other threads move their blocks
 * between freed and handed out under those locks alone. */
void dev_check(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    uint64_t busy = d->fast.busy_slots;
    fast_lock_busy(d, busy);
    check_walk(d);
    fast_unlock_busy(d, busy);
}

static void check_walk(struct dev_alloc *d)
{
    check_flag_bits();
    lock_assert_held(&d->lock);
    struct recount rc = {0};
    size_t free_nodes = 0, unmapped_nodes = 0;
    check_pool(d, &d->small, &free_nodes, &unmapped_nodes);
    check_pool(d, &d->large, &free_nodes, &unmapped_nodes);
    for (const struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
        check_pool(d, &pp->small, &free_nodes, &unmapped_nodes);
        check_pool(d, &pp->large, &free_nodes, &unmapped_nodes);
    }
    size_t nexp = 0;
    for (const struct segrec *s = d->segs; s; s = s->next_seg) {
        CHECK(s->prev_seg ? s->prev_seg->next_seg == s : d->segs == s);
        CHECK(!s->next_seg || s->next_seg->prev_seg == s);
        check_segment(d, s, &rc);
        nexp += s->vseg != NULL;
    }
    /* The (pool, stream, seq) order of the expandable segments holds each of them once. */
    CHECK(d->exp.nby_stream == nexp);
    for (size_t i = 0; i < d->exp.nby_stream; i++) {
        const struct segrec *a = d->exp.by_stream[i], *b = i + 1 < d->exp.nby_stream ? d->exp.by_stream[i + 1] : NULL;
        CHECK(a->vseg != NULL);
        if (b)
            CHECK((uintptr_t)a->pool < (uintptr_t)b->pool ||
                  (a->pool == b->pool && ((uintptr_t)a->stream < (uintptr_t)b->stream ||
                                          (a->stream == b->stream && a->seq < b->seq))));
    }
    /* Every indexed block was found in a bin or the unmapped treap, and every node is a block of a
     * segment. */
    CHECK(rc.free_indexed == free_nodes);
    CHECK(rc.unmapped_indexed == unmapped_nodes);
    /* A slot's freed block keeps its map entry, as a hit's block does. */
    CHECK(rc.allocated_blocks + rc.slot_freed == d->live.count);
    bool split_owed = check_slots(d); /* a classic stream slot busy: it owes on the inactive_split rows */
    CHECK(rc.driver_bytes == d->acct.total_allocated_memory);
    /* The invariant of core/device/fast.h: what a reader sees (d->acct.stats plus the slots' debts,
     * dev_stats_copy; active is allocation + pending) is the recount of the eager state. */
    xseg_device_stats folded = d->acct.stats;
    fast_owed(d, &folded);
    dev_stats_fold(d, &folded);
    const xseg_device_stats *st = &folded;
    check_counter(d->acct.stats.active, (const int64_t[XSEG_STAT_POOLS]){0});
    check_counter(d->acct.stats.active_bytes, (const int64_t[XSEG_STAT_POOLS]){0});
    CHECK(d->acct.pending[XSEG_STAT_ALL] == d->acct.pending[XSEG_STAT_SMALL_POOL] + d->acct.pending[XSEG_STAT_LARGE_POOL]);
    CHECK(d->acct.pending_bytes[XSEG_STAT_ALL] ==
          d->acct.pending_bytes[XSEG_STAT_SMALL_POOL] + d->acct.pending_bytes[XSEG_STAT_LARGE_POOL]);
    check_counter(st->allocation, rc.allocation);
    check_counter(st->allocated_bytes, rc.allocated_bytes);
    check_counter(st->active, rc.active);
    check_counter(st->active_bytes, rc.active_bytes);
    check_counter(st->requested_bytes, rc.requested_bytes);
    check_counter(st->reserved_bytes, rc.reserved_bytes);
    check_counter(st->segment, rc.segment);
    check_counter(st->inactive_split, rc.inactive_split);
    check_counter(st->inactive_split_bytes, rc.inactive_split_bytes);
    /* Own slots owe nothing on inactive_split (a classic B is none until its settle frees it):
     * with no stream slot owing there, d->acct.stats holds the recount itself, which an own slot's
     * settle raises and takes the peak from (own_settle, core/device/fast.c). */
    if (!split_owed) {
        check_counter(d->acct.stats.inactive_split, rc.inactive_split);
        check_counter(d->acct.stats.inactive_split_bytes, rc.inactive_split_bytes);
    }
    CHECK(st->oversize_allocations.current == rc.oversize_allocations);
    CHECK(st->oversize_segments.current == rc.oversize_segments);
    /* core/device/fast.h: no hit can take a row past its peak unseen (the guard keeps d->acct.stats's
     * currents at most their peaks, the "all" entry the sum of the pools'). */
    const xseg_stat_counter *rows[] = {d->acct.stats.allocation, d->acct.stats.allocated_bytes,
                                       d->acct.stats.requested_bytes, d->acct.stats.inactive_split,
                                       d->acct.stats.inactive_split_bytes};
    /* A front's debt may keep a current above its peak: what its hits may raise is its grant, and
     * the currents less the fronts' debts plus every grant stay at most the peaks (front_grants). */
    int64_t fr[FAST_ROWS][XSEG_STAT_POOLS] = {{0}};
    for (uint64_t m = d->fast.busy_slots >> DEV_STREAM_SLOTS; m; m &= m - 1) {
        const struct dev_front *f = &d->fast.fronts[__builtin_ctzll(m)];
        for (int k = 0; k < FRONT_GRANT_ROWS; k++)
            for (int p = 0; p < XSEG_STAT_POOLS; p++) {
                CHECK(front_grant(f, k, p) >= 0);
                fr[k][p] += f->gap[k][p];
            }
    }
    for (size_t k = 0; k < sizeof rows / sizeof *rows; k++) {
        CHECK(rows[k][XSEG_STAT_SMALL_POOL].current + fr[k][XSEG_STAT_SMALL_POOL] <= rows[k][XSEG_STAT_SMALL_POOL].peak);
        CHECK(rows[k][XSEG_STAT_LARGE_POOL].current + fr[k][XSEG_STAT_LARGE_POOL] <= rows[k][XSEG_STAT_LARGE_POOL].peak);
        CHECK(stats_all_current(rows[k]) + fr[k][XSEG_STAT_ALL] <= rows[k][XSEG_STAT_ALL].peak);
    }
}

#endif
