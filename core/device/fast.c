/*
 * The fast path's owed work (see fast.h): the stream slots' fill, debts and settle, the lock
 * entry's configuration refresh, the statistics as every reader sees them.
 */
#include "core/device/fast.h"

#include <string.h>

#include "base/fork.h"
#include "core/device/placement.h"

_Thread_local struct fast_thread fast_tls __attribute__((tls_model("initial-exec")));

/* A forked child never frees into the parent's devices (core/runtime.c refuses them): forget
 * the forking thread's last hit, whose slot lies in one. */
static void fast_fork_child(void)
{
    fast_tls = (struct fast_thread){0};
}
FORK_CHILD(FORK_RANK_RUNTIME, fast_fork_child)

/* register_blocks_above_mb: a slot keeps no block whose requested size reaches the key, so no hit
 * (which serves at most that size, fast_hit_at) hands out a block the ledger must enter: every
 * such malloc goes through malloc_miss (core/alloc.c), which registers it. */
static bool fast_registers(const struct dev_alloc *d, const struct block *b)
{
    return d->cfg.register_blocks_above && b->u.requested_size >= d->cfg.register_blocks_above;
}

/* ---- the debt of a slot ------------------------------------------------------------------ */

/*
 * Add to @p st what busy slot @p s (locked) owes it. Each hit stands for an eager free of B (B
 * merged into R as M) and an eager malloc that split its rounded size off M again, and the
 * statistics count B allocated with its own size and base_req requested bytes while it is freed
 * or holds less. Every change below moves a current down or an accumulated count up (freed is
 * derived, core/index/stats.h). A classic stream slot's B + R spans its segment (fast_fill), so each
 * pair makes one inactive split block of |M| - its size, and the statistics count |M| - min_size
 * (fast_widen raised them to it): a hit of s owes min_size - s there, a freed B all of it. An own
 * slot's B is no inactive split block while the slot holds it, freed or handed out (its free,
 * merge included, is done at the settle), so it owes nothing there, in either mode.
 */

/* Is @p s an own slot (its dev set once the slot was filled)? */
static bool slot_is_own(const struct dev_slot *s) { return slot_kind(s->dev, s) == SLOT_OWN; }

/* The front of own slot @p s (its blocks, struct dev_front). */
static struct dev_front *slot_front(const struct dev_slot *s)
{
    return &s->dev->fast.fronts[s - s->dev->fast.slots - DEV_STREAM_SLOTS];
}

/* What front @p f's lanes (Note [front lane]; their locks held) lower each current by, added to
 * @p low in their entries' pools: a freed block all it counts, a handed-out one its unused
 * requested bytes (its size is exact). */
static void lane_lowers(const struct dev_front *f, int64_t low[XSEG_STAT_POOLS][FAST_ROWS])
{
    for (uint32_t m = f->lanes; m; m &= m - 1) {
        unsigned j = (unsigned)__builtin_ctz(m);
        const struct dev_slot *s = &f->lane[j];
        int64_t *l = low[f->si[f->lane_entry[j]]];
        if (s->freed) {
            l[FRONT_LOW_ALLOC] += 1;
            l[FRONT_LOW_BYTES] += (int64_t)s->cur_size;
            l[FRONT_LOW_REQ] += (int64_t)s->base_req;
        } else {
            l[FRONT_LOW_REQ] += (int64_t)(s->base_req - s->cur_req);
        }
    }
}

/* Does busy slot @p s owe on the inactive_split rows (a classic stream slot's)? */
static bool slot_owes_split(const struct dev_slot *s) { return !slot_is_own(s) && !s->blk->expandable; }

/* The rows of FAST_ROWS, in its order. */
static xseg_stat_counter *fast_row(xseg_device_stats *st, int k)
{
    xseg_stat_counter *rows[FAST_ROWS] = {st->allocation, st->allocated_bytes, st->requested_bytes,
                                          st->inactive_split, st->inactive_split_bytes};
    return rows[k];
}

/* What busy slot @p s (locked) lowers each current of the FAST_ROWS rows by, by statistics pool
 * (the "all" entries left 0): a stream slot's in its block's pool, a front's in each of its
 * entries' pools. */
static void slot_lowers(const struct dev_slot *s, int64_t low[XSEG_STAT_POOLS][FAST_ROWS])
{
    memset(low, 0, sizeof(int64_t) * XSEG_STAT_POOLS * FAST_ROWS);
    if (slot_is_own(s)) {
        const struct dev_front *f = slot_front(s);
        for (int p = 1; p < XSEG_STAT_POOLS; p++)
            for (int k = 0; k < FRONT_LOWS; k++)
                low[p][k] = f->low[p][k];
        lane_lowers(f, low);
        return;
    }
    const struct block *b = s->blk;
    int64_t *l = low[block_pool(b)->stat_index];
    int64_t classic = slot_owes_split(s);
    int64_t msize = classic ? (int64_t)(b->size + b->next->size) : 0;
    if (slot_state(s) == SLOT_FREED) {
        l[0] = 1;
        l[1] = (int64_t)b->size;
        l[2] = (int64_t)s->base_req;
        l[3] = classic;
        l[4] = classic * (msize - (int64_t)s->min_size);
    } else {
        l[0] = 0;
        l[1] = (int64_t)(b->size - s->cur_size);
        l[2] = (int64_t)(s->base_req - s->cur_req);
        l[3] = 0;
        l[4] = classic * (int64_t)(s->cur_size - s->min_size);
    }
}

/* The accumulated half of slot_owe: what the hits' mallocs counted. */
static void slot_pay(const struct dev_slot *s, xseg_device_stats *st)
{
    if (slot_is_own(s)) {
        const struct dev_front *f = slot_front(s);
        for (int p = 1; p < XSEG_STAT_POOLS; p++) {
            st->allocation[p].allocated += (int64_t)f->reps[p];
            st->allocated_bytes[p].allocated += f->size_sum[p];
            st->requested_bytes[p].allocated += f->req_sum[p];
        }
        for (uint32_t m = f->lanes; m; m &= m - 1) { /* its lanes' hits (lane_fold moves them) */
            const struct dev_slot *l = &f->lane[__builtin_ctz(m)];
            int si = f->si[f->lane_entry[__builtin_ctz(m)]];
            st->allocation[si].allocated += (int64_t)l->reps;
            st->allocated_bytes[si].allocated += (int64_t)(l->reps * l->cur_size); /* fast_take */
            st->requested_bytes[si].allocated += (int64_t)l->req_sum;
        }
        return;
    }
    const struct block *b = s->blk;
    int si = block_pool(b)->stat_index;
    int64_t n = (int64_t)s->reps;
    st->allocation[si].allocated += n;
    st->allocated_bytes[si].allocated += (int64_t)s->size_sum;
    st->requested_bytes[si].allocated += (int64_t)s->req_sum;
    if (slot_owes_split(s)) {
        int64_t msize = (int64_t)(b->size + b->next->size);
        st->inactive_split[si].allocated += n;
        st->inactive_split_bytes[si].allocated += n * msize - (int64_t)s->size_sum;
    }
}

static void slot_owe(const struct dev_slot *s, xseg_device_stats *st)
{
    slot_pay(s, st);
    int64_t low[XSEG_STAT_POOLS][FAST_ROWS];
    slot_lowers(s, low);
    for (int p = 1; p < XSEG_STAT_POOLS; p++)
        for (int k = 0; k < FAST_ROWS; k++)
            if (low[p][k])
                stat_down_pool(fast_row(st, k), p, low[p][k]);
}

void fast_owed(const struct dev_alloc *d, xseg_device_stats *st)
{
    lock_assert_held(&d->lock);
    for (uint64_t m = d->fast.busy_slots; m; m &= m - 1)
        slot_owe(&d->fast.slots[__builtin_ctzll(m)], st);
}

void fast_lock_busy(struct dev_alloc *d, uint64_t busy)
{
    for (uint64_t m = busy; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        spin_acquire(&d->fast.slots[i].lock);
        if (i < DEV_STREAM_SLOTS)
            continue;
        /* The busy lanes only: with the own slot's lock held no lane enters (lane_enter takes it),
         * so an idle one owes nothing until fast_unlock_busy; a fold under these locks leaves
         * lanes, so the ones taken are kept apart. */
        struct dev_front *f = &d->fast.fronts[i - DEV_STREAM_SLOTS];
        f->locked_lanes = f->lanes;
        for (uint32_t l = f->lanes; l; l &= l - 1)
            spin_acquire_lane(&f->lane[__builtin_ctz(l)].lock);
    }
}

void fast_unlock_busy(struct dev_alloc *d, uint64_t busy)
{
    for (uint64_t m = busy; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        if (i >= DEV_STREAM_SLOTS) {
            struct dev_front *f = &d->fast.fronts[i - DEV_STREAM_SLOTS];
            for (uint32_t l = f->locked_lanes; l; l &= l - 1)
                spin_release_lane(&f->lane[__builtin_ctz(l)].lock);
            f->locked_lanes = 0;
        }
        spin_release(&d->fast.slots[i].lock);
    }
}

void dev_stats_copy(struct dev_alloc *d, xseg_device_stats *out)
{
    lock_assert_held(&d->lock);
    uint64_t busy = d->fast.busy_slots;
    fast_lock_busy(d, busy);
    *out = d->acct.stats;
    fast_owed(d, out);
    fast_unlock_busy(d, busy);
    dev_stats_fold(d, out);
}

/* ---- settle ------------------------------------------------------------------------------ */

/* A slot's block freed and settled: the free the lifetime predictor sees (core/device/placement.h, L1; the
 * slot's own pairs were not seen), through the tag of the malloc that filled the slot. */
static void slot_settle_free(struct dev_alloc *d, const struct block *b)
{
    life_note(&d->life, 1);
    if (b->expandable && !b->small_pool)
        life_forget(&d->life, b);
}

/* ---- fronts ------------------------------------------------------------------------------ */

/* The busy own slots. */
#define FAST_OWN_MASK (~(uint64_t)0 << DEV_STREAM_SLOTS)

/* The busy own slot of @p owner's front of @p stream, or DEV_SLOTS (device lock held). */
static unsigned front_find(const struct dev_alloc *d, const void *owner, const void *stream)
{
    for (uint64_t m = d->fast.busy_slots & FAST_OWN_MASK; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        if (d->fast.slots[i].owner == owner && d->fast.fronts[i - DEV_STREAM_SLOTS].stream == stream)
            return i;
    }
    return DEV_SLOTS;
}

/* Own slot @p s's busy mark (its lock held): its front's first block, else none. */
static void front_mark(struct dev_slot *s, const struct dev_front *f)
{
    s->blk = f->used ? f->blk[__builtin_ctzll(f->used)] : NULL;
}

/* Take entry @p k (no lane's) out of front @p f of own slot @p s (both locks held). */
static void front_remove(struct dev_slot *s, struct dev_front *f, unsigned k)
{
    xseg_assert(!(f->lane_bits >> k & 1));
    uint64_t bit = (uint64_t)1 << k;
    f->used &= ~bit;
    f->freed &= ~bit;
    f->by_size[front_bucket(f->size[k])] &= ~bit;
    f->by_addr[front_bucket(f->addr[k])] &= ~bit;
    f->blk[k] = NULL;
    front_mark(s, f);
}

/*
 * Lane @p j back into its front @p f (the own slot's lock and the lane's held): its entry freed or
 * handed out there as the lane left it, its hits counted with the front's. The debt moves from
 * the lane to low and the gap stays, so the grant rises by what the recount's current falls (the
 * lane was counted at its worst, Note [front lane]): every row's sum is unchanged.
 */
static void lane_fold(struct dev_front *f, unsigned j)
{
    struct dev_slot *l = &f->lane[j];
    unsigned k = f->lane_entry[j];
    xseg_assert(f->lanes >> j & 1 && k < FRONT_ENTRIES);
    int si = f->si[k];
    uint64_t bit = (uint64_t)1 << k;
    f->reps[si] += l->reps;
    f->size_sum[si] += (int64_t)(l->reps * l->cur_size); /* a lane's bytes (fast_take) */
    f->req_sum[si] += (int64_t)l->req_sum;
    f->seen |= l->reps != f->lane_seen[j];
#if XSEG_DEBUG_LEVEL >= 1
    f->lane_hits += l->reps; /* the device's counters at the own slot's settle (device lock) */
    f->lane_slot_hits += l->hits;
    f->lane_misses += l->misses;
    l->hits = l->misses = 0;
#endif
    if (l->freed) {
        f->freed |= bit;
        f->by_size[front_bucket(f->size[k])] |= bit;
        f->low[si][FRONT_LOW_ALLOC] += 1;
        f->low[si][FRONT_LOW_BYTES] += (int64_t)f->size[k];
        f->low[si][FRONT_LOW_REQ] += (int64_t)f->base_req[k];
    } else {
        f->cur_req[k] = l->cur_req;
        f->by_addr[front_bucket(f->addr[k])] |= bit;
        f->low[si][FRONT_LOW_REQ] += (int64_t)(f->base_req[k] - l->cur_req);
    }
    l->blk = NULL;
    slot_set_freed(l, NULL);
    l->live = 0;
    l->reps = 0;
    l->req_sum = l->size_sum = 0;
    f->lane_entry[j] = FRONT_ENTRIES;
    f->lanes &= ~(1u << j);
    f->lane_bits &= ~bit;
    f->lane_seen[j] = 0;
}

/* Lane @p j of front @p f back into it, taking the lane's lock (the own slot's held). */
static void lane_fold_locked(struct dev_front *f, unsigned j)
{
    spin_acquire_lane(&f->lane[j].lock);
    lane_fold(f, j);
    spin_release_lane(&f->lane[j].lock);
}

/* Every lane of front @p f back into it (its own slot's lock held, no lane's). */
static void front_fold_lanes(struct dev_front *f)
{
    for (uint32_t m = f->lanes; m; m &= m - 1)
        lane_fold_locked(f, (unsigned)__builtin_ctz(m));
}

/* The hits' mallocs, counted now (both locks held). */
static void front_pay(struct dev_alloc *d, const struct dev_slot *s, struct dev_front *f)
{
    xseg_assert(!f->lanes && !s->reps); /* front_fold_lanes first */
    slot_pay(s, &d->acct.stats);
    memset(f->reps, 0, sizeof f->reps);
    memset(f->size_sum, 0, sizeof f->size_sum);
    memset(f->req_sum, 0, sizeof f->req_sum);
}

/*
 * Settle entry @p k of front @p f (own slot @p s; the device lock and the slot's held; the stream's
 * slot settled, and for a classic block the slots owing on inactive_split: front_before_settle): a
 * freed block's eager free, merged with whatever neighbours are free now, its counters as
 * free_cached moves them; a handed-out block's true requested bytes written back.
 */
static void front_settle_entry(struct dev_alloc *d, struct dev_slot *s, struct dev_front *f, unsigned k)
{
    front_fold_lanes(f);
    struct block *b = f->blk[k];
    int si = f->si[k];
    f->nclassic -= !b->expandable;
    f->held[si][FRONT_LOW_ALLOC] -= 1;
    f->held[si][FRONT_LOW_BYTES] -= (int64_t)b->size;
    f->held[si][FRONT_LOW_REQ] -= (int64_t)f->base_req[k];
    if (f->freed >> k & 1) {
        /* The debt goes, the grant stays: the gap takes it. */
        int64_t paid[FRONT_GRANT_ROWS] = {1, (int64_t)b->size, (int64_t)f->base_req[k]};
        for (int r = 0; r < FRONT_GRANT_ROWS; r++) {
            f->gap[r][si] += paid[r];
            f->gap[r][XSEG_STAT_ALL] += paid[r];
        }
        f->low[si][FRONT_LOW_ALLOC] -= 1;
        f->low[si][FRONT_LOW_BYTES] -= (int64_t)b->size;
        f->low[si][FRONT_LOW_REQ] -= (int64_t)f->base_req[k];
        front_remove(s, f, k);
        b->allocated = false;
        (void)ptrmap_take(&d->live, b->addr);
        stat_down_pool(d->acct.stats.allocation, si, 1);
        stat_down_pool(d->acct.stats.allocated_bytes, si, (int64_t)b->size);
        slot_settle_free(d, b);
        dev_free_block_inline(d, b); /* requested_bytes down by its requested_size: base_req */
        return;
    }
    int64_t gap = (int64_t)(f->base_req[k] - f->cur_req[k]);
    f->low[si][FRONT_LOW_REQ] -= gap;
    f->gap[FRONT_LOW_REQ][si] += gap;
    f->gap[FRONT_LOW_REQ][XSEG_STAT_ALL] += gap;
    stat_down_pool(d->acct.stats.requested_bytes, si, gap);
    block_set_requested(b, f->cur_req[k]);
    front_remove(s, f, k);
}

/* Every entry of own slot @p s's front (both locks held). */
static void front_settle_all(struct dev_alloc *d, struct dev_slot *s)
{
    struct dev_front *f = slot_front(s);
    front_fold_lanes(f);
    front_pay(d, s, f);
    while (f->used)
        front_settle_entry(d, s, f, (unsigned)__builtin_ctzll(f->used));
}

/* Settle busy slot @p i, its lock held (kept): the debt paid, B's truth written back. A freed B
 * merges into R (dev_free_block_inline's keep == next branch: nothing but the slot's own pairs
 * touched B, R or the GC clock since the fill); a B handed out with fewer bytes than its size
 * gives the rest to R, whose key only grows. */
static void slot_settle_locked(struct dev_alloc *d, unsigned i)
{
    lock_assert_held(&d->lock);
    struct dev_slot *s = &d->fast.slots[i];
    lock_assert_held(&s->lock);
    xseg_assert(d->fast.busy_slots >> i & 1);
    if (i >= DEV_STREAM_SLOTS) { /* a front: each entry's eager free or malloc, done now */
        front_settle_all(d, s);
        goto settled;
    }
    struct block *b = s->blk;
    xseg_assert(b);
    struct block *r = b->next;
    struct bpool *pool = block_pool(b);
    enum slot_state state = slot_state(s);
    slot_owe(s, &d->acct.stats);
    xseg_assert(block_in_free_index(r) && !block_in_free_index(b->prev));
    /* What the slot's pairs used and gave back enters the index now, stamped after every record
     * of its stream's event so far (struct sbins: uncovered until a later one). */
    if (state == SLOT_HANDED_OUT) {
        if (s->cur_size != b->size) {
            size_t rest = b->size - s->cur_size;
            bpool_free_grow(pool, r, r->addr - rest, r->size + rest);
            b->size = s->cur_size;
        }
        b->allocated = true;
        block_set_requested(b, s->cur_req);
    } else {
        struct block *prev = b->prev;
        xseg_assert(!b->allocated && !b->in_index && !block_uses_n(b) && !block_event_count(b));
        (void)ptrmap_take(&d->live, b->addr);
        slot_settle_free(d, b);
        bpool_free_grow(pool, r, b->addr, r->size + b->size);
        block_splice_out(r->seg, prev, r);
        dev_block_delete(d, b);
    }
    block_set_gc_base(r, pool->get_free_blocks_call_count);
settled:
    FAST_COUNT(d, settles);
#if XSEG_DEBUG_LEVEL >= 1
    d->fast.slot_hits += s->hits;
    d->fast.slot_misses += s->misses;
    s->hits = s->misses = 0;
    if (i >= DEV_STREAM_SLOTS) {
        struct dev_front *f = slot_front(s);
        d->fast.lane_hits += f->lane_hits;
        d->fast.slot_hits += f->lane_slot_hits;
        d->fast.slot_misses += f->lane_misses;
        f->lane_hits = f->lane_slot_hits = f->lane_misses = 0;
    }
#endif
    s->blk = NULL;
    slot_set_freed(s, NULL);
    s->owner = NULL;
    s->live = 0;
    s->reps = 0;
    s->req_sum = s->size_sum = 0;
    d->fast.busy_slots &= ~((uint64_t)1 << i);
}

static void slot_settle(struct dev_alloc *d, unsigned i)
{
    struct dev_slot *s = &d->fast.slots[i];
    spin_acquire(&s->lock);
    slot_settle_locked(d, i);
    spin_release(&s->lock);
}

void fast_settle_slow(struct dev_alloc *d, enum fast_need need, const void *stream)
{
    lock_assert_held(&d->lock);
    uint64_t m = d->fast.busy_slots;
    if (need == FAST_STREAM)
        m &= (uint64_t)1 << fast_slot_index(stream);
    else
        sharing_reset_all(&d->fast.sharing); /* every slot settled: sharing is seen again (settle_malloc) */
    for (; m; m &= m - 1) /* the stream slots first, so before any own slot's free (own_settle) */
        slot_settle(d, (unsigned)__builtin_ctzll(m));
}


/* The busy stream slots owing on the inactive_split rows (classic ones, slot_owes_split) of @p busy. */
static uint64_t split_owers(const struct dev_alloc *d, uint64_t busy)
{
    uint64_t owe = 0;
    for (uint64_t m = busy & ~FAST_OWN_MASK; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        if (!d->fast.slots[i].blk->expandable)
            owe |= (uint64_t)1 << i;
    }
    return owe;
}

/* Before a front's entries of @p stream settle (no slot's lock held): the stream's slot, whose
 * block's predecessor may be one of them (a stream slot's B has no free predecessor), and for a
 * @p classic block the slots owing on inactive_split (own_settle). */
static void front_before_settle(struct dev_alloc *d, const void *stream, bool classic)
{
    unsigned j = fast_slot_index(stream);
    if (d->fast.busy_slots >> j & 1)
        slot_settle(d, j);
    if (classic)
        for (uint64_t m = split_owers(d, d->fast.busy_slots); m; m &= m - 1)
            slot_settle(d, (unsigned)__builtin_ctzll(m));
}

/* The busy own slots whose front holds a classic block. */
static bool own_classic(const struct dev_alloc *d, unsigned i) { return slot_front(&d->fast.slots[i])->nclassic != 0; }

/* Settle own slot @p i (no slot's lock held). A classic block's settle is its ordinary free, whose
 * merge may raise inactive_split and take its peak from d->acct.stats: the slots owing on those
 * rows settle first, so that the rows hold the recount's values when it does (own slots owe
 * nothing there). */
static void own_settle(struct dev_alloc *d, unsigned i)
{
    front_before_settle(d, slot_front(&d->fast.slots[i])->stream, own_classic(d, i));
    slot_settle(d, i);
}

/* Settle the own slots of @p owner (NULL: any thread's) holding blocks of @p stream. */
static void own_settle_stream(struct dev_alloc *d, const void *owner, const void *stream)
{
    for (uint64_t m = d->fast.busy_slots & FAST_OWN_MASK; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        const struct dev_slot *s = &d->fast.slots[i];
        if ((!owner || s->owner == owner) && slot_front(s)->stream == stream)
            own_settle(d, i);
    }
}

/* Settle entry @p k of own slot @p i's front (no slot's lock held): what must settle before it
 * first (front_before_settle), and the slot itself when the front is empty then. True: it was. */
static bool front_settle_at(struct dev_alloc *d, unsigned i, unsigned k)
{
    struct dev_slot *s = &d->fast.slots[i];
    struct dev_front *f = slot_front(s);
    const struct block *b = f->blk[k]; /* blk[] moves only under the device lock, held */
    front_before_settle(d, b->stream, !b->expandable);
    spin_acquire(&s->lock);
    front_settle_entry(d, s, f, k);
    bool empty = !f->used;
    if (empty)
        slot_settle_locked(d, i); /* empty: the slot's accumulated counts paid, idle */
    spin_release(&s->lock);
    return empty;
}

/* Settle the front entry holding @p b, if any (a free through the device lock of a block a hit
 * handed out, or of one freed into a front: the user's double free is then seen as such). */
static void front_settle_block(struct dev_alloc *d, const struct block *b)
{
    for (uint64_t m = d->fast.busy_slots & FAST_OWN_MASK; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        struct dev_slot *s = &d->fast.slots[i];
        struct dev_front *f = slot_front(s);
        if (f->stream != b->stream)
            continue;
        /* Its entry is in its address's bucket while handed out, its size's while freed (the
         * masks read under the slot's lock: the owner's hits and frees move entries between them;
         * blk[] moves only under the device lock, held here). */
        spin_acquire(&s->lock);
        for (uint32_t l = f->lanes; l; l &= l - 1) { /* the block may be a lane's */
            unsigned j = (unsigned)__builtin_ctz(l);
            if (f->blk[f->lane_entry[j]] == b)
                lane_fold_locked(f, j);
        }
        uint64_t cand = f->by_addr[front_bucket(b->addr)] | f->by_size[front_bucket(b->size)];
        spin_release(&s->lock);
        for (uint64_t u = cand; u; u &= u - 1) {
            unsigned k = (unsigned)__builtin_ctzll(u);
            if (f->blk[k] == b) {
                (void)front_settle_at(d, i, k);
                return;
            }
        }
    }
}

/*
 * A stream is shared when a malloc or free through the device lock finds its slot filled by
 * another thread (which single-threaded use never does): the threads' pairs meet on it. From then
 * until every slot settles, the stream's frees fill own slots (Note [slot rule]). A stream marked
 * at the same index before gives its mark up, its own slots settled (they are found by the mark).
 */
static void mark_shared(struct dev_alloc *d, unsigned i, CUstream stream)
{
    CUstream displaced = sharing_displaced(&d->fast.sharing, i);
    if (displaced)
        own_settle_stream(d, NULL, displaced);
    sharing_mark(&d->fast.sharing, i, stream);
    FAST_COUNT(d, shared_marks);
}

/* The stream slot of @p stream, which a malloc or free through the device lock on it settles,
 * noting first whether another thread filled it (the stream is then shared: mark_shared). The mark
 * may settle the slot itself: it displaces the stream that held the sharing entry of the slot's
 * index, and settling that stream's fronts settles its stream slot first (front_before_settle),
 * which is this one, the two streams sharing the index. So the slot settles here only if it is
 * still busy after the note (settled twice, it faulted on its NULL block:
 * test_threads_shared_index_*). */
static void settle_stream_slot(struct dev_alloc *d, CUstream stream)
{
    unsigned i = fast_slot_index(stream);
    if (!(d->fast.busy_slots >> i & 1))
        return;
    const struct dev_slot *h = &d->fast.slots[i];
    if (h->blk->stream == stream && h->owner != fast_self() && !fast_shared(d, stream))
        mark_shared(d, i, stream);
    if (d->fast.busy_slots >> i & 1)
        slot_settle(d, i);
}

/*
 * A malloc through the device lock on shared @p stream by a thread whose front of it is due a
 * check-in (FRONT_CHECK_HITS hits since the last): when no other thread's front of the stream was
 * hit or freed into since that front's last look, the threads stopped meeting there and the mark
 * fades (sharing_fade): every front of the stream settles and its frees fill its stream slot
 * again, as before the other thread came. Else the others' marks of use are cleared for the next
 * look, and the fronts unused since their last look settle: their threads left the stream or
 * exited (a thread's front has no other end), and each held up to FRONT_ENTRIES blocks out of
 * best fit and one of the DEV_OWN_SLOTS own slots, which threads that come later on a busy
 * stream then lacked. One device-lock malloc per FRONT_CHECK_HITS pairs.
 */
static void front_check_in(struct dev_alloc *d, CUstream stream)
{
    const void *me = fast_self();
    unsigned own = front_find(d, me, stream);
    struct dev_front *mine = own < DEV_SLOTS ? &d->fast.fronts[own - DEV_STREAM_SLOTS] : NULL;
    if (!mine)
        return;
    /* Hits count since_check under the slot's lock (another thread's too, whose last front this
     * slot was before a settle). */
    struct dev_slot *ms = &d->fast.slots[own];
    spin_acquire(&ms->lock);
    bool due = mine->since_check >= FRONT_CHECK_HITS;
    if (due)
        mine->since_check = 0;
    spin_release(&ms->lock);
    if (!due)
        return;
    bool others = false;
    uint64_t idle = 0;
    for (uint64_t m = d->fast.busy_slots & FAST_OWN_MASK; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        struct dev_slot *s = &d->fast.slots[i];
        struct dev_front *f = &d->fast.fronts[i - DEV_STREAM_SLOTS];
        if (f == mine || f->stream != stream)
            continue;
        spin_acquire(&s->lock);
        bool used = f->seen;
        for (uint32_t l = f->lanes; l; l &= l - 1) { /* the lanes' hits count their slots' reps */
            unsigned j = (unsigned)__builtin_ctz(l);
            struct dev_slot *ls = &f->lane[j];
            spin_acquire_lane(&ls->lock);
            used |= ls->reps != f->lane_seen[j];
            f->lane_seen[j] = ls->reps;
            spin_release_lane(&ls->lock);
        }
        others |= used;
        idle |= (uint64_t)!used << i;
        f->seen = false;
        spin_release(&s->lock);
    }
    if (others) {
        for (; idle; idle &= idle - 1) {
            own_settle(d, (unsigned)__builtin_ctzll(idle));
            FAST_COUNT(d, idle_settles);
        }
        return;
    }
    own_settle_stream(d, NULL, stream);
    sharing_fade(&d->fast.sharing, fast_slot_index(stream));
    FAST_COUNT(d, shared_fades);
}

/* What a malloc through the device lock on @p stream settles (some slot busy): the stream's slot,
 * after noting whether another thread filled it (the stream is then shared), and on a shared
 * stream this thread's own slot of it. The other threads' own slots stay. */
static void settle_malloc(struct dev_alloc *d, CUstream stream)
{
    lock_assert_held(&d->lock);
    settle_stream_slot(d, stream);
    /* The thread's front of the stream stays: its blocks wait for their size (a miss that would
     * grow settles every front first: malloc_slow_body). */
    if (XSEG_UNLIKELY(d->fast.sharing.any.shared != 0) && fast_shared(d, stream))
        front_check_in(d, stream);
}

/* What a free through the device lock of @p b (in the live map; some slot busy) settles: its
 * stream's slot (noting, as settle_malloc, whether another thread filled it) and the own slot that
 * holds @p b, if any. */
static void settle_block(struct dev_alloc *d, const struct block *b)
{
    lock_assert_held(&d->lock);
    settle_stream_slot(d, b->stream);
    if (b->allocated)
        front_settle_block(d, b);
}

/* ---- the door (Note [the door]) ---------------------------------------------------------- */

/* A malloc beside busy slots: its stream's settled, the peaks guarded while others stay busy. */
void fast_lock_begin_malloc_slow(struct dev_alloc *d, CUstream stream, struct fast_guard *g)
{
    settle_malloc(d, stream);
    fast_guard_begin(d, g, d->fast.busy_slots); /* malloc_slow settles every slot before it raises a counter */
}

/* A free beside busy slots or a stream marked or probed: the block's stream's slot and the own
 * slot holding it settled first (either may hold this very block, freed or handed out), the
 * peaks guarded while others stay busy (a merge into a split block moves inactive_split_bytes up;
 * a fill moves no counter). */
void fast_lock_begin_free_slow(struct dev_alloc *d, const void *ptr, struct fast_guard *g)
{
    lock_assert_held(&d->lock);
    const struct block *x = ptrmap_get(&d->live, (uintptr_t)ptr);
    if (x && d->fast.busy_slots)
        settle_block(d, x);
#ifdef XSEG_FRONT_LONE_FIT
    /* A front's freed neighbour of x is freed first, so that x's free merges as the eager one. */
    if (x && (d->fast.busy_slots & FAST_OWN_MASK)) {
        if (x->prev && x->prev->allocated)
            front_settle_block(d, x->prev);
        if (x->next && x->next->allocated)
            front_settle_block(d, x->next);
    }
#endif
    fast_guard_begin(d, g, d->fast.busy_slots);
}

/* ---- the peaks of an operation beside busy slots ------------------------------------------ */

void fast_guard_save(struct dev_alloc *d, struct fast_guard *g)
{
    lock_assert_held(&d->lock);
    const xseg_device_stats *st = &d->acct.stats;
    const xseg_stat_counter *rows[FAST_ROWS] = {st->allocation, st->allocated_bytes, st->requested_bytes,
                                                st->inactive_split, st->inactive_split_bytes};
    for (int k = 0; k < FAST_ROWS; k++)
        for (int p = 0; p < XSEG_STAT_POOLS; p++)
            g->peak[k][p] = rows[k][p].peak;
}

/*
 * Budgets shared out by level (water-filling): item i may count between @p lo[i] (what it holds
 * already) and @p hi[i] (all it could ever raise the row to); @p total (at least the sum of lo) is
 * shared so that each gets min(hi, max(lo, L)) for the largest level L the total allows, the few
 * units rounding leaves to the first items still below their hi. @p c gets the budgets. n <= 32.
 */
static void front_share_out(unsigned n, const int64_t *lo, const int64_t *hi, int64_t total, int64_t *c)
{
    int64_t sum_lo = 0, sum_hi = 0;
    for (unsigned i = 0; i < n; i++) {
        xseg_assert(lo[i] <= hi[i]);
        sum_lo += lo[i];
        sum_hi += hi[i];
    }
    if (sum_hi <= total || total <= sum_lo) {
        for (unsigned i = 0; i < n; i++)
            c[i] = sum_hi <= total ? hi[i] : lo[i];
        return;
    }
    /* The sum at level L rises by one per unit of L for each item with lo <= L < hi: walk the
     * sorted breakpoints (an item's lo: +1, its hi: -1) to where it reaches total. */
    int64_t at[2 * DEV_OWN_SLOTS];
    int step[2 * DEV_OWN_SLOTS];
    unsigned m = 0;
    for (unsigned i = 0; i < n; i++) {
        int64_t v[2] = {lo[i], hi[i]};
        for (int e = 0; e < 2; e++) { /* insertion sort: a handful of fronts */
            unsigned j = m++;
            for (; j > 0 && at[j - 1] > v[e]; j--) {
                at[j] = at[j - 1];
                step[j] = step[j - 1];
            }
            at[j] = v[e];
            step[j] = e ? -1 : 1;
        }
    }
    int64_t sum = sum_lo, level = at[0];
    int slope = 0;
    for (unsigned j = 0; j < m; j++) {
        if (slope > 0 && sum + slope * (at[j] - level) >= total)
            break;
        sum += slope * (at[j] - level);
        level = at[j];
        slope += step[j];
    }
    /* sum_hi > total: the walk stops inside a segment of positive slope. */
    level += (total - sum) / slope;
    int64_t left = total;
    for (unsigned i = 0; i < n; i++) {
        c[i] = level < lo[i] ? lo[i] : level > hi[i] ? hi[i] : level;
        left -= c[i];
    }
    for (unsigned i = 0; i < n && left > 0; i++)
        if (level >= lo[i] && c[i] < hi[i]) { /* on the level, below its cap */
            c[i]++;
            left--;
        }
    xseg_assert(left >= 0);
}

/* A hit front_grants is asked to make room for first: own slot @p slot's front takes one block
 * of r bytes and req requested bytes in statistics pool si. */
struct front_want {
    unsigned slot;
    int si;
    size_t r, req;
};

/*
 * The fronts' grants (the device lock and every busy own slot's lock held; @p fronts the busy own
 * slots).
 * A front's hit raises a current without the device lock, so it may raise it only within its
 * grant: on each FRONT_GRANT_ROWS row and pool, the current the statistics would show if every
 * front's debt were paid (the stream slots' hits may raise it that far, each within its own
 * debt) plus every grant stays at most the peak, so no hit reaches past a peak unseen. The room
 * under each peak is shared out as budgets (Note [front grants]); a front's free gives back what
 * its hit took. With @p want, that hit's front counts it held first; false where some room is
 * smaller than the hit (every grant unchanged).
 */
static bool front_grants_shared(struct dev_alloc *d, uint64_t fronts, const struct front_want *want)
{
    const xseg_device_stats *st = &d->acct.stats;
    const xseg_stat_counter *rows[FRONT_GRANT_ROWS] = {st->allocation, st->allocated_bytes, st->requested_bytes};
    unsigned idx[DEV_OWN_SLOTS], n = 0, wj = DEV_OWN_SLOTS;
    for (uint64_t m = fronts; m; m &= m - 1) {
        if (want && (unsigned)__builtin_ctzll(m) == want->slot)
            wj = n;
        idx[n++] = (unsigned)__builtin_ctzll(m);
    }
    int64_t grant[FRONT_GRANT_ROWS][XSEG_STAT_POOLS][DEV_OWN_SLOTS];
    for (int k = 0; k < FRONT_GRANT_ROWS; k++) {
        /* Per pool: each front's floor (what its handed-out entries hold: held less its debt;
         * the wanted hit's front, that hit too) and cap (held); the current without the fronts'
         * debts, and the room under the peak. */
        int64_t lo[XSEG_STAT_POOLS][DEV_OWN_SLOTS], hi[XSEG_STAT_POOLS][DEV_OWN_SLOTS];
        int64_t owed[XSEG_STAT_POOLS] = {0}, floor_sum[XSEG_STAT_POOLS] = {0};
        for (unsigned j = 0; j < n; j++) {
            const struct dev_front *f = &d->fast.fronts[idx[j] - DEV_STREAM_SLOTS];
            lo[XSEG_STAT_ALL][j] = hi[XSEG_STAT_ALL][j] = 0;
            for (int p = 1; p < XSEG_STAT_POOLS; p++) {
                hi[p][j] = f->held[p][k];
                lo[p][j] = f->held[p][k] - f->low[p][k];
                owed[p] += f->low[p][k];
                floor_sum[p] += lo[p][j];
                lo[XSEG_STAT_ALL][j] += lo[p][j];
                hi[XSEG_STAT_ALL][j] += hi[p][j];
            }
        }
        owed[XSEG_STAT_ALL] = owed[XSEG_STAT_SMALL_POOL] + owed[XSEG_STAT_LARGE_POOL];
        floor_sum[XSEG_STAT_ALL] = floor_sum[XSEG_STAT_SMALL_POOL] + floor_sum[XSEG_STAT_LARGE_POOL];
        int64_t need = !want ? 0 : k == 0 ? 1 : k == 1 ? (int64_t)want->r : (int64_t)want->req;
        int64_t cur[XSEG_STAT_POOLS];
        cur[XSEG_STAT_SMALL_POOL] = rows[k][XSEG_STAT_SMALL_POOL].current - owed[XSEG_STAT_SMALL_POOL];
        cur[XSEG_STAT_LARGE_POOL] = rows[k][XSEG_STAT_LARGE_POOL].current - owed[XSEG_STAT_LARGE_POOL];
        cur[XSEG_STAT_ALL] = cur[XSEG_STAT_SMALL_POOL] + cur[XSEG_STAT_LARGE_POOL];
        for (int p = 0; p < XSEG_STAT_POOLS; p++) {
            int64_t room = rows[k][p].peak - cur[p], c[DEV_OWN_SLOTS];
            room = room > 0 ? room : 0;
            bool wanted = want && (p == XSEG_STAT_ALL || p == want->si);
            int64_t floor0 = wanted ? lo[p][wj] : 0;
            if (wanted) {
                if (need > room)
                    return false; /* the hit would raise a peak: the eager malloc raises it */
                lo[p][wj] += need; /* a freed entry's: within its cap */
            }
            front_share_out(n, lo[p], hi[p], floor_sum[p] + room, c);
            for (unsigned j = 0; j < n; j++)
                grant[k][p][j] = c[j] - (wanted && j == wj ? floor0 : lo[p][j]);
        }
    }
    for (unsigned j = 0; j < n; j++)
        for (int k = 0; k < FRONT_GRANT_ROWS; k++)
            for (int p = 0; p < XSEG_STAT_POOLS; p++)
                d->fast.fronts[idx[j] - DEV_STREAM_SLOTS].gap[k][p] =
                    grant[k][p][j] - front_debt(&d->fast.fronts[idx[j] - DEV_STREAM_SLOTS], k, p);
    return true;
}

/*
 * front_grants with one busy front (fronts has one bit): front_share_out with one item gives it
 * the whole room, so on each row and pool its grant is its debt capped by the room under the peak
 * and its gap min(0, room - debt); the wanted hit needs the room to hold it. The general share-out
 * cost every device-lock operation beside a single front about 1,100 instructions, this about 300
 * (callgrind, a lone thread's front: benchmarks/front_table.py --lone on hanmin_fullstep).
 * At debug level 2 the general one runs first and the two must agree.
 */
static bool front_grants_one(struct dev_alloc *d, unsigned i, const struct front_want *want)
{
    struct dev_front *f = &d->fast.fronts[i - DEV_STREAM_SLOTS];
#if XSEG_DEBUG_LEVEL >= 2
    int64_t was[FRONT_GRANT_ROWS][XSEG_STAT_POOLS];
    memcpy(was, f->gap, sizeof was);
    bool general = front_grants_shared(d, (uint64_t)1 << i, want);
    int64_t expect[FRONT_GRANT_ROWS][XSEG_STAT_POOLS];
    memcpy(expect, f->gap, sizeof expect);
    memcpy(f->gap, was, sizeof was);
#endif
    const xseg_device_stats *st = &d->acct.stats;
    const xseg_stat_counter *rows[FRONT_GRANT_ROWS] = {st->allocation, st->allocated_bytes, st->requested_bytes};
    int64_t gap[FRONT_GRANT_ROWS][XSEG_STAT_POOLS];
    bool fits = true;
    for (int k = 0; k < FRONT_GRANT_ROWS; k++) {
        int64_t debt[XSEG_STAT_POOLS], cur[XSEG_STAT_POOLS];
        debt[XSEG_STAT_SMALL_POOL] = f->low[XSEG_STAT_SMALL_POOL][k];
        debt[XSEG_STAT_LARGE_POOL] = f->low[XSEG_STAT_LARGE_POOL][k];
        debt[XSEG_STAT_ALL] = debt[XSEG_STAT_SMALL_POOL] + debt[XSEG_STAT_LARGE_POOL];
        cur[XSEG_STAT_SMALL_POOL] = rows[k][XSEG_STAT_SMALL_POOL].current - debt[XSEG_STAT_SMALL_POOL];
        cur[XSEG_STAT_LARGE_POOL] = rows[k][XSEG_STAT_LARGE_POOL].current - debt[XSEG_STAT_LARGE_POOL];
        cur[XSEG_STAT_ALL] = cur[XSEG_STAT_SMALL_POOL] + cur[XSEG_STAT_LARGE_POOL];
        int64_t need = !want ? 0 : k == 0 ? 1 : k == 1 ? (int64_t)want->r : (int64_t)want->req;
        for (int p = 0; p < XSEG_STAT_POOLS; p++) {
            int64_t room = rows[k][p].peak - cur[p];
            room = room > 0 ? room : 0;
            if (want && (p == XSEG_STAT_ALL || p == want->si) && need > room)
                fits = false;
            gap[k][p] = room < debt[p] ? room - debt[p] : 0;
        }
    }
#if XSEG_DEBUG_LEVEL >= 2
    xseg_assert(general == fits);
    if (fits)
        xseg_assert(!memcmp(expect, gap, sizeof gap));
#endif
    if (fits)
        memcpy(f->gap, gap, sizeof gap); /* a refusal leaves every grant as it was */
    return fits;
}

/* The fronts' grants (front_grants_shared), in closed form for a single front. */
static bool front_grants(struct dev_alloc *d, uint64_t fronts, const struct front_want *want)
{
    if (!fronts)
        return true;
    if (!(fronts & (fronts - 1)))
        return front_grants_one(d, (unsigned)__builtin_ctzll(fronts), want);
    return front_grants_shared(d, fronts, want);
}

/*
 * A peak the operation raised was taken from d->acct.stats, which counts each busy slot above what
 * it holds by its debt; every busy slot is locked here, so the operation takes place at this
 * instant, where the recount is d->acct.stats less the debts. The peak becomes the larger of the
 * one before and the operation's highest value less the debts on that row (the "all" entry: of
 * both pools). The slots owing on such a row settle, so that its current is at most its peak
 * again: what a later hit raises, the peak has seen.
 */
void fast_guard_end_slow(struct dev_alloc *d, const struct fast_guard *g)
{
    lock_assert_held(&d->lock);
    xseg_device_stats *st = &d->acct.stats;
    const xseg_stat_counter *rows[FAST_ROWS] = {st->allocation, st->allocated_bytes, st->requested_bytes,
                                                st->inactive_split, st->inactive_split_bytes};
    bool raised = false;
    for (int k = 0; k < FAST_ROWS; k++)
        for (int p = 0; p < XSEG_STAT_POOLS; p++)
            raised |= rows[k][p].peak > g->peak[k][p];
    uint64_t busy = d->fast.busy_slots;
    if ((!raised && !(busy & FAST_OWN_MASK)) || !busy)
        return;
    /* low[i][p][k]: slot i's debt on row k in pool p; p = XSEG_STAT_ALL holds its sum over pools. */
    int64_t low[DEV_SLOTS][XSEG_STAT_POOLS][FAST_ROWS];
    int64_t lane_low[DEV_OWN_SLOTS][XSEG_STAT_POOLS][FAST_ROWS]; /* of that, an own slot's lane's */
    int64_t owed[FAST_ROWS][XSEG_STAT_POOLS] = {{0}};
    fast_lock_busy(d, busy);
    for (uint64_t m = busy; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        const struct dev_slot *s = &d->fast.slots[i];
        slot_lowers(s, low[i]);
        if (i >= DEV_STREAM_SLOTS) {
            memset(lane_low[i - DEV_STREAM_SLOTS], 0, sizeof lane_low[0]);
            lane_lowers(slot_front(s), lane_low[i - DEV_STREAM_SLOTS]);
        }
        for (int k = 0; k < FAST_ROWS; k++) {
            low[i][XSEG_STAT_ALL][k] = 0;
            for (int p = 1; p < XSEG_STAT_POOLS; p++) {
                owed[k][p] += low[i][p][k];
                low[i][XSEG_STAT_ALL][k] += low[i][p][k];
            }
            owed[k][XSEG_STAT_ALL] += low[i][XSEG_STAT_ALL][k];
        }
    }
    uint64_t settle = 0, fold = 0;
    for (int k = 0; raised && k < FAST_ROWS; k++)
        for (int p = 0; p < XSEG_STAT_POOLS; p++) {
            xseg_stat_counter *c = (xseg_stat_counter *)&rows[k][p];
            if (c->peak <= g->peak[k][p] || !owed[k][p])
                continue;
            int64_t seen = c->peak - owed[k][p];
            c->peak = seen > g->peak[k][p] ? seen : g->peak[k][p];
            /* The stream slots owing on it settle; a front stays, its hits bounded by its grant. */
            for (uint64_t m = busy & ~FAST_OWN_MASK; m; m &= m - 1) {
                unsigned i = (unsigned)__builtin_ctzll(m);
                if (low[i][p][k])
                    settle |= (uint64_t)1 << i;
            }
            /* Lanes owing on it go back to their front, whose grant bounds them from now. */
            for (uint64_t m = busy & FAST_OWN_MASK; m; m &= m - 1) {
                unsigned i = (unsigned)__builtin_ctzll(m);
                int64_t *ll = lane_low[i - DEV_STREAM_SLOTS][p == XSEG_STAT_ALL ? XSEG_STAT_SMALL_POOL : p];
                bool owes = ll[k] || (p == XSEG_STAT_ALL && lane_low[i - DEV_STREAM_SLOTS][XSEG_STAT_LARGE_POOL][k]);
                if (owes)
                    fold |= (uint64_t)1 << i;
            }
        }
    for (uint64_t m = fold; m; m &= m - 1) {
        struct dev_front *f = slot_front(&d->fast.slots[__builtin_ctzll(m)]);
        for (uint32_t l = f->lanes; l; l &= l - 1)
            lane_fold(f, (unsigned)__builtin_ctz(l)); /* every lane's lock held */
    }
    for (uint64_t m = settle; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        FAST_COUNT(d, settles_cross);
        slot_settle_locked(d, i);
    }
    (void)front_grants(d, busy & ~settle & FAST_OWN_MASK, NULL);
    fast_unlock_busy(d, busy);
}

/* ---- fill -------------------------------------------------------------------------------- */

/*
 * Note [slot rule]'s best-fit test (core/device/fast.h), at the fill: the smallest rounded size s
 * (returned; 0: none) such that, for every s from it to B's size, the eager state -- B merged into
 * its free successor R as M = [B, R) at key (stream, |M|, B's address) -- makes bops_find_free
 * (core/device/blockops.h) pick M for a request of s on B's pool and stream, and alloc_found_block
 * split s off it.
 */
static __attribute__((noinline)) size_t fast_fits(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct block *r = b->next;
    struct bpool *pool = block_pool(b);
    size_t size = b->size, msize = b->size + r->size, msplit = d->cfg.max_split_size;
    /* The fast path's pool for this size is a default one; an oversize allocation is left to
     * the eager path (so the hit never sets `oversize`). */
    if (dev_pool_owner(d, pool) || (size <= BLOCK_SMALL_SIZE) != pool->is_small || size >= msplit)
        return 0;
    /* bops_find_free's max_split_size rule for every s <= size (all below msplit, so one test
     * of M), then should_split (its remainder holds R, so it only grows as s shrinks). */
    if (!BOPS_FITS(d, size, msize))
        return 0;
    if (pool->is_small || d->use_expandable) {
        if (r->size < BLOCK_MIN_SIZE)
            return 0;
    } else if (!(r->size > BLOCK_SMALL_SIZE)) {
        return 0;
    }
    /* Best fit in the eager index: the index without R (it sits there at its own key), plus M.
     * x: the first block without R at or above B's size; M comes first iff x is above M, and then
     * x is M's successor (bops_find_free's `next`). */
    struct block *pred, *x;
    struct block *first = bpool_fit(pool, b->stream, size, &pred, &x);
    if (first != r)
        x = first;
    else if (!x)
        x = bpool_fit_next_bin(pool, r); /* R is the last of its bin (only a successor on the stream counts) */
    bool same = x && x->stream == b->stream;
    if (same && bkey_less((uintptr_t)x->stream, x->size, x->addr, (uintptr_t)b->stream, msize, b->addr))
        return 0;
    if (b->expandable) {
        /* bops_find_free leaves an expandable first fit for the next one when expandable segments
         * are off or the next one counts less with its unmapped tail: not M, so no hit. */
        if (!d->use_expandable)
            return 0;
        size_t mexp = msize + (r->next && !r->next->mapped ? r->next->size : 0);
        if (same && bops_expandable_size(x) < mexp)
            return 0;
    }
    /* Smaller sizes: M stays the first fit above the largest block of the stream below M's key
     * (R aside), and in B's pool. */
    struct block *y = bpool_prev_free(pool, b->stream, msize, b->addr);
    if (y == r)
        y = bpool_prev_free(pool, b->stream, r->size, r->addr);
    size_t lo = pool->is_small ? BLOCK_MIN_SIZE : BLOCK_SMALL_SIZE + BLOCK_MIN_SIZE;
    if (y && y->stream == b->stream && y->size + BLOCK_MIN_SIZE > lo)
        lo = y->size + BLOCK_MIN_SIZE;
    return lo <= size ? lo : size;
}

/* Mark @p b's stream shared (its stream slot, whatever stream's, settled first) and fill an own
 * slot with @p b. */
static bool classic_mark(struct dev_alloc *d, struct block *b)
{
    unsigned i = fast_slot_index(b->stream);
    if (d->fast.busy_slots >> i & 1)
        slot_settle(d, i);
    mark_shared(d, i, b->stream);
    return fast_fill_own(d, b);
}

/*
 * A free of last_alloc that fills no stream slot for its neighbours, its block beside another
 * (as two threads' overlapping pairs on one stream put theirs): the stream is probed, by this
 * thread. The next free through the device lock on it (fast_fill_probed, or this function) by
 * another thread marks it shared and fills an own slot (true); one by this thread ends the probe.
 * One thread alone never marks a stream. False: the eager free.
 */
static __attribute__((noinline, cold)) bool free_beside(struct dev_alloc *d, struct block *b)
{
    unsigned i = fast_slot_index(b->stream);
    const void *me = fast_self();
    const struct sharing_entry *e = &d->fast.sharing.entry[i];
    if (sharing_is_probed(&d->fast.sharing, i) && e->stream == b->stream && e->owner != me)
        return classic_mark(d, b);
    /* Its own quiet frees (this thread alone on the stream lately) never get here: fast_fill_stream
     * ticks the countdown in line before the call. */
    sharing_probe(&d->fast.sharing, i, b->stream, me);
    return false;
}

bool fast_fill_probed(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    unsigned i = fast_slot_index(b->stream);
    const struct sharing_entry *e = &d->fast.sharing.entry[i];
    if (e->stream == b->stream) {
        if (e->owner != fast_self())
            return classic_mark(d, b);
        sharing_probe_end(&d->fast.sharing, i);
    }
    return fast_fill_stream(d, b);
}

bool fast_fill_stream(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    const struct block *prev = b->prev, *next = b->next;
    /* Note [slot rule] in core/device/fast.h, the stream slot's half (dev_free_block_inline's
     * keep == next case), the cheap tests first. */
    if (b != d->fast.last_alloc)
        return false;
    /* Beside another block: a classic one in its segment (a segment of its own, merged whole
     * with its successor, is what a slot keeps), an expandable one with a free predecessor or
     * a live successor. Two threads whose pairs overlap on a stream put their blocks side by
     * side, and whichever of them frees first, the other's free of last_alloc meets the first's
     * block or its hole: no slot can keep it. Without the probe an expandable stream whose
     * threads free in the order they allocated was never marked (every pair locked: 8 runs in
     * 140 of threads_one_stream_pairs_mixed_expandable under TSan and load; threads_fifo_*). */
    if (b->expandable ? block_in_free_index(prev) || !block_in_free_index(next) : prev || (next && next->next)) {
        /* The quiet countdown in line (one thread freeing beside its live blocks or holes,
         * SHARING_QUIET_FREES times out of SHARING_QUIET_FREES + 1): this thread's own probe of
         * this stream lately ended by its own free, so no probe this time; the eager free. */
        if (XSEG_LIKELY(sharing_quiet_tick(&d->fast.sharing, fast_slot_index(b->stream), b->stream, fast_self())))
            return false;
        return free_beside(d, b);
    }
    if (block_free_slow(b) || !block_in_free_index(next) || block_in_free_index(prev) ||
        settings_gen() != d->fast.fast_gen || dev_gc_on(d) || fast_registers(d, b))
        return false;
    size_t min_fit = fast_fits(d, b);
    /* Counted allocated while in the slot: its map entry stays (the debt and the settle count it). */
    if (!min_fit || !ptrmap_put(&d->live, b->addr, b))
        return false;
    unsigned i = fast_slot_index(b->stream);
    struct dev_slot *s = &d->fast.slots[i];
    xseg_assert(!(d->fast.busy_slots >> i & 1));
    spin_acquire(&s->lock);
    s->blk = b;
    slot_set_freed(s, b);
    s->gen = d->fast.fast_gen;
    s->min_fit = min_fit;
    s->min_size = b->expandable ? min_fit : b->size; /* classic: what the statistics count */
    s->span = b->size - s->min_size;
    s->base_req = s->cur_req = b->u.requested_size; /* no side: not block_free_slow */
    s->cur_size = b->size;
    s->owner = fast_self();
    s->dev = d;
    spin_release(&s->lock);
    d->fast.busy_slots |= (uint64_t)1 << i;
    fast_tls_last(s);
    return true;
}

/* Does a hit's rise fit front @p f's grant (slot locked): 1 allocation, @p r bytes and @p req
 * requested bytes in pool @p si and in all? (Taking it is the hit's lowering of the debt.) */
static inline __attribute__((always_inline)) bool front_grant_fits(const struct dev_front *f, int si, size_t r,
                                                                   size_t req)
{
    /* Written out row by row: the loop over an array of the three rises cost a hit about 30
     * instructions (callgrind, bench_scale --only after-shared with fronts kept). */
    const int64_t *lo = f->low[si], *sm = f->low[XSEG_STAT_SMALL_POOL], *lg = f->low[XSEG_STAT_LARGE_POOL];
    return lo[FRONT_LOW_ALLOC] + f->gap[FRONT_LOW_ALLOC][si] >= 1 &&
           lo[FRONT_LOW_BYTES] + f->gap[FRONT_LOW_BYTES][si] >= (int64_t)r &&
           lo[FRONT_LOW_REQ] + f->gap[FRONT_LOW_REQ][si] >= (int64_t)req &&
           sm[FRONT_LOW_ALLOC] + lg[FRONT_LOW_ALLOC] + f->gap[FRONT_LOW_ALLOC][XSEG_STAT_ALL] >= 1 &&
           sm[FRONT_LOW_BYTES] + lg[FRONT_LOW_BYTES] + f->gap[FRONT_LOW_BYTES][XSEG_STAT_ALL] >= (int64_t)r &&
           sm[FRONT_LOW_REQ] + lg[FRONT_LOW_REQ] + f->gap[FRONT_LOW_REQ][XSEG_STAT_ALL] >= (int64_t)req;
}

/*
 * A front (own slot): any block of a default pool's common free (the permit on, no GC clock to
 * tick, not oversize), whatever its neighbours, in either mode, joins the freeing thread's front
 * of its stream (Note [slot rule] in core/device/fast.h). Its hits take a block for its own rounded size only, so a hit changes no block,
 * and a freed block's settle is the eager free, done late: until then it is no inactive split
 * block (nor merged with a free neighbour), so its debt has no inactive_split rows, and a classic
 * block's merge moves those rows at the settle, through the ordinary free's accounting (exact,
 * peaks included). A full front settles one entry first (its first freed one, else its first).
 */
bool fast_fill_own(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct bpool *pool = block_pool(b);
    if (block_free_slow(b) || b->private_pool || settings_gen() != d->fast.fast_gen || dev_gc_on(d) ||
        fast_registers(d, b) || dev_pool_owner(d, pool) || (b->size <= BLOCK_SMALL_SIZE) != pool->is_small ||
        b->size >= d->cfg.max_split_size)
        return false;
    const void *me = fast_self();
    unsigned i = front_find(d, me, b->stream);
    if (i == DEV_SLOTS) {
        uint64_t idle = ~d->fast.busy_slots & FAST_OWN_MASK;
        if (!idle)
            return false; /* every own slot busy: the eager free */
        i = (unsigned)__builtin_ctzll(idle);
    }
    /* Allocated to every eager operation, from here to its entry's settle: a free merges only
     * with free blocks (dev_try_merge). */
    b->allocated = true;
    if (!ptrmap_put(&d->live, b->addr, b)) {
        b->allocated = false;
        return false;
    }
    struct dev_slot *s = &d->fast.slots[i];
    struct dev_front *f = &d->fast.fronts[i - DEV_STREAM_SLOTS];
    bool fresh = !(d->fast.busy_slots >> i & 1);
    if (!fresh && f->used == ~(uint64_t)0) {
        /* Full: a handed-out entry leaves first (its free goes through the device lock then), the
         * next one from a cursor that goes round; a freed one only when none is handed out. */
        uint64_t live = f->used & ~f->freed, pick = live ? live : f->used;
        uint64_t from = pick & (~(uint64_t)0 << (f->cursor & 63));
        unsigned k = (unsigned)__builtin_ctzll(from ? from : pick);
        f->cursor = k + 1;
        front_before_settle(d, f->stream, !f->blk[k]->expandable);
        spin_acquire(&s->lock);
        front_settle_entry(d, s, f, k);
        spin_release(&s->lock);
    }
    spin_acquire(&s->lock);
    if (fresh) {
        xseg_assert(!f->lanes);
        memset(f, 0, offsetof(struct dev_front, lane)); /* never the lane slots (struct dev_front) */
        for (unsigned j = 0; j < FRONT_LANES; j++)
            f->lane_entry[j] = FRONT_ENTRIES;
        f->stream = b->stream;
        s->owner = me;
        s->dev = d;
        s->front = f;
    }
    s->gen = d->fast.fast_gen;
    unsigned k = (unsigned)__builtin_ctzll(~f->used);
    uint64_t bit = (uint64_t)1 << k;
    int si = pool->stat_index;
    f->used |= bit;
    f->freed |= bit;
    f->size[k] = b->size;
    f->addr[k] = b->addr;
    f->by_size[front_bucket(b->size)] |= bit;
    f->blk[k] = b;
    f->base_req[k] = f->cur_req[k] = b->u.requested_size; /* no side: not block_free_slow */
    f->si[k] = (uint8_t)si;
    f->nclassic += !b->expandable;
    f->low[si][FRONT_LOW_ALLOC] += 1;
    f->low[si][FRONT_LOW_BYTES] += (int64_t)b->size;
    f->low[si][FRONT_LOW_REQ] += (int64_t)f->base_req[k];
    f->held[si][FRONT_LOW_ALLOC] += 1;
    f->held[si][FRONT_LOW_BYTES] += (int64_t)b->size;
    f->held[si][FRONT_LOW_REQ] += (int64_t)f->base_req[k];
    /* This free lowered the currents: debt and grant rise alike (the gap stays). */
    front_mark(s, f);
    spin_release(&s->lock);
    d->fast.busy_slots |= (uint64_t)1 << i;
    FAST_COUNT(d, own_fills);
    fast_tls.front = s;
    /* This thread's pairs on the stream are the front's now: a lane of it first, no other line. */
    if (!front_lane_slot(f, fast_tls.slot))
        fast_tls_last(NULL);
    return true;
}

/* ---- front hits ---------------------------------------------------------------------------- */

/* A freed entry of front @p f for a malloc of @p size bytes rounded to @p r (its slot locked), or
 * FRONT_ENTRIES: one of size r whose statistics count at least @p size requested bytes. */
static unsigned front_pick(const struct dev_front *f, size_t size, size_t r)
{
    for (uint64_t m = f->by_size[front_bucket(r)]; m; m &= m - 1) {
        unsigned k = (unsigned)__builtin_ctzll(m);
        if (f->size[k] == r && size <= f->base_req[k])
            return k;
    }
    return FRONT_ENTRIES;
}

/* Entry @p k of front @p f (own slot @p s locked) handed out for @p size bytes rounded to @p r in
 * statistics pool @p si, within its grant (the debt it lowers is what the grant gives: the gap
 * stays). Returns its address. */
static inline __attribute__((always_inline)) void *front_take(struct dev_slot *s, struct dev_front *f, unsigned k,
                                                              size_t size, size_t r, int si)
{
    (void)s;
    xseg_assert(f->si[k] == si && f->size[k] == r && (f->freed >> k & 1));
    f->seen = true;
    uint64_t bit = (uint64_t)1 << k;
    f->freed &= ~bit;
    f->by_size[front_bucket(r)] &= ~bit;
    f->by_addr[front_bucket(f->addr[k])] |= bit;
    f->cur_req[k] = size;
    f->low[si][FRONT_LOW_ALLOC] -= 1;
    f->low[si][FRONT_LOW_BYTES] -= (int64_t)r;
    f->low[si][FRONT_LOW_REQ] -= (int64_t)size;
    f->reps[si]++;
    f->size_sum[si] += (int64_t)r;
    f->req_sum[si] += (int64_t)size;
#if XSEG_DEBUG_LEVEL >= 1
    s->hits++;
#endif
    return (void *)f->addr[k];
}

static int front_pool(size_t r) { return r <= BLOCK_SMALL_SIZE ? XSEG_STAT_SMALL_POOL : XSEG_STAT_LARGE_POOL; }

/* A hit of front @p f (its own slot locked) past its grant while it has lanes: a lane counted at
 * its worst may hold the room the hit needs, so they go back into the front (giving their rows
 * back to the grant) and the grant is tried again. */
static __attribute__((noinline)) bool lane_fold_fits(struct dev_front *f, int si, size_t r, size_t req)
{
    if (!f->lanes)
        return false;
    front_fold_lanes(f);
    f->lane_hold = FRONT_LANE_HOLD; /* the room is tight: lanes would fold again at once */
    return front_grant_fits(f, si, r, req);
}

/*
 * Entry @p k, just handed out by a hit of front @p f (own slot @p s locked), becomes lane @p j
 * (idle) of its size (Note [front lane]): its free and the next malloc of its size are then a
 * stream slot's pair (fast_free_hit, fast_hit). The lane is counted at its worst (its unused
 * requested bytes leave low) and the gap stays, so the grant falls by them: where that would take
 * a requested-bytes grant below 0 the entry stays the front's.
 */
static __attribute__((noinline)) void lane_enter(struct dev_slot *s, struct dev_front *f, unsigned k, unsigned j)
{
    int si = f->si[k];
    int64_t unused = (int64_t)(f->base_req[k] - f->cur_req[k]);
    if (XSEG_UNLIKELY(unused != 0) &&
        (f->low[si][FRONT_LOW_REQ] - unused + f->gap[FRONT_LOW_REQ][si] < 0 ||
         f->low[XSEG_STAT_SMALL_POOL][FRONT_LOW_REQ] + f->low[XSEG_STAT_LARGE_POOL][FRONT_LOW_REQ] - unused +
                 f->gap[FRONT_LOW_REQ][XSEG_STAT_ALL] < 0))
        return;
    f->low[si][FRONT_LOW_REQ] -= unused;
    f->by_addr[front_bucket(f->addr[k])] &= ~((uint64_t)1 << k);
    f->lane_entry[j] = k;
    f->lanes |= 1u << j;
    f->lane_bits |= (uint64_t)1 << k;
    f->lane_seen[j] = 0;
    struct dev_slot *l = &f->lane[j];
    spin_acquire_lane(&l->lock); /* after the own slot's: a stale try of another thread may hold it */
    xseg_assert(!l->blk && !l->reps);
    l->gen = s->gen;
    l->dev = s->dev;
    l->owner = s->owner;
    l->front = f;
    l->blk = f->blk[k];
    slot_set_freed(l, NULL);
    l->live = f->addr[k];
    l->base_req = f->base_req[k];
    l->cur_req = f->cur_req[k];
    l->cur_size = l->min_size = l->min_fit = f->size[k];
    l->span = 0;
    spin_release_lane(&l->lock);
    fast_tls_last(l);
    fast_tls.lanes = f->lane;
    fast_tls.lane_left = FRONT_CHECK_HITS;
}

/* A thread's front is its own: its lock is held by others only for a device-lock holder's short
 * work (a fill, a settle, fast_guard_end_slow's grants, dev_check), so a hit or free waits for it.
 * A try that gave up sent the thread through the device lock, whose guard then held the other
 * thread's front lock and failed its try in turn: two threads on one stream kept each other off
 * their fronts (bench_slot_counts --same-stream --mixed, up to 2.4 % of pairs locked). */
bool fast_front_hit_in(struct dev_slot *s, struct dev_alloc *d, size_t size, CUstream stream, void **out)
{
    spin_acquire_leaf(&s->lock);
    bool hit = false;
    if (s->dev == d && s->blk && s->gen == settings_gen()) {
        struct dev_front *f = s->front;
        xseg_assert(f == slot_front(s));
        size_t r = fast_round(size);
        int si = front_pool(r); /* a default pool's */
        if (f->stream == stream) {
            /* Every FRONT_CHECK_HITS hits, one goes through the device lock: its check-in
             * (front_check_in). The lane of r, if any, was tried first (fast_lane_hit), unless
             * this thread's lane tries came to FRONT_CHECK_HITS: the check-in is then due. */
            if (XSEG_UNLIKELY(fast_tls.lane_left <= 1) && fast_tls.lanes) {
                fast_tls.lane_left = FRONT_CHECK_HITS;
                f->since_check = FRONT_CHECK_HITS;
            }
            if (++f->since_check < FRONT_CHECK_HITS &&
                (front_grant_fits(f, si, r, size) || lane_fold_fits(f, si, r, size))) {
                unsigned k = front_pick(f, size, r), j = front_lane_index(r);
                if (k < FRONT_ENTRIES) {
                    *out = front_take(s, f, k, size, r, si);
                    hit = true;
                    /* The second hit of a size since its lane index's last other size: pairs of
                     * it are likely, whatever sizes come between (Note [front lane]). */
                    if (XSEG_UNLIKELY(r == f->last_r[j]) && !(f->lanes >> j & 1)) {
                        if (XSEG_LIKELY(!f->lane_hold))
                            lane_enter(s, f, k, j);
                        else
                            f->lane_hold--; /* lanes folded for room lately (lane_fold_fits) */
                    }
                }
                f->last_r[j] = r;
            }
            /* This thread's last slot is a lane of this front while it has lanes, else none: a
             * stream slot hit before the mark (or a block it still held), or a lane folded since,
             * would be tried first by every later malloc and free, and missed. */
            struct dev_slot *last = fast_tls.slot;
            if (XSEG_UNLIKELY(last != NULL) && (!f->lanes || !front_lane_slot(f, last)))
                fast_tls_last(NULL);
            if (XSEG_UNLIKELY(fast_tls.lanes != NULL) && !f->lanes) /* folded by a device-lock holder */
                fast_tls.lanes = NULL;
        }
    }
    spin_release(&s->lock);
    return hit;
}

/*
 * A hit past its grant, through the device lock (held): this thread's front of @p stream holds a
 * freed block for the request, so the room under the peaks is shared out again with this front's
 * need counted first (front_grants), and where the room holds it the block is handed out as a hit
 * would, no peak moved. Without this the malloc took another block from the index and its free
 * a second trip through the lock, the front one entry fuller each time (two threads whose
 * blocks together make the peak: every largest request missed).
 */
static bool front_hit_locked(struct dev_alloc *d, size_t size, CUstream stream, void **out)
{
    lock_assert_held(&d->lock);
    struct dev_slot *s = fast_tls.front;
    uintptr_t at = (uintptr_t)s, own = (uintptr_t)&d->fast.slots[DEV_STREAM_SLOTS];
    if (!s || at < own || at >= (uintptr_t)&d->fast.slots[DEV_SLOTS]) /* none, or another device's */
        return false;
    unsigned i = (unsigned)(s - d->fast.slots);
    struct dev_front *f = &d->fast.fronts[i - DEV_STREAM_SLOTS];
    if (!(d->fast.busy_slots >> i & 1) || s->owner != fast_self() || f->stream != stream || s->gen != settings_gen())
        return false;
    /* A request its front holds no block for locks no other front. Under the front's lock: a
     * thread whose last front this slot was before a settle may still hit in it. */
    size_t r = fast_round(size);
    spin_acquire(&s->lock);
    bool held = front_pick(f, size, r) < FRONT_ENTRIES, due = f->since_check >= FRONT_CHECK_HITS;
    spin_release(&s->lock);
    if (!held)
        return false;
    if (due) { /* the hit that checks in: the check-in, then the hit */
        front_check_in(d, stream);
        if (!(d->fast.busy_slots >> i & 1)) /* the mark faded: the stream's fronts settled */
            return false;
    }
    uint64_t fronts = d->fast.busy_slots & FAST_OWN_MASK;
    for (uint64_t m = fronts; m; m &= m - 1)
        spin_acquire(&d->fast.slots[__builtin_ctzll(m)].lock);
    unsigned k = front_pick(f, size, r); /* the check-in settles no entry of a front it keeps */
    struct front_want want = {.slot = i, .si = front_pool(r), .r = r, .req = size};
    bool hit = k < FRONT_ENTRIES && front_grants(d, fronts, &want);
    if (hit) {
        xseg_assert(front_grant_fits(f, want.si, r, size));
        f->since_check++;
        *out = front_take(s, f, k, size, r, want.si);
    }
    for (uint64_t m = fronts; m; m &= m - 1)
        spin_release(&d->fast.slots[__builtin_ctzll(m)].lock);
    return hit;
}

bool fast_front_free_in(struct dev_slot *s, void *ptr)
{
    spin_acquire_leaf(&s->lock); /* as fast_front_hit_in's */
    bool hit = false;
    if (s->blk) {
        struct dev_front *f = s->front;
        xseg_assert(f == slot_front(s));
        uintptr_t a = (uintptr_t)ptr;
        for (uint64_t m = f->by_addr[front_bucket(a)]; m; m &= m - 1) {
            unsigned k = (unsigned)__builtin_ctzll(m);
            if (f->addr[k] != a)
                continue;
            uint64_t bit = (uint64_t)1 << k;
            int si = f->si[k];
            f->seen = true;
            f->freed |= bit;
            f->by_addr[front_bucket(a)] &= ~bit;
            f->by_size[front_bucket(f->size[k])] |= bit;
            f->low[si][FRONT_LOW_ALLOC] += 1;
            f->low[si][FRONT_LOW_BYTES] += (int64_t)f->size[k];
            f->low[si][FRONT_LOW_REQ] += (int64_t)f->cur_req[k];
            hit = true;
            break;
        }
        /* A lane's block whose free came after another lane's hit (fast_free_hit tried that one). */
        for (uint32_t m = hit ? 0 : f->lanes; m; m &= m - 1) {
            struct dev_slot *l = &f->lane[__builtin_ctz(m)];
            spin_acquire_lane(&l->lock);
            hit = l->live == a;
            if (hit) {
                l->live = 0;
                slot_set_freed(l, l->blk);
            }
            spin_release_lane(&l->lock);
            if (hit)
                break;
        }
    }
    spin_release(&s->lock);
    return hit;
}

/* ---- widen (classic) ---------------------------------------------------------------------- */

static bool fast_widen(struct dev_alloc *d, size_t size, CUstream stream, void **out)
{
    lock_assert_held(&d->lock);
    unsigned i = fast_slot_index(stream);
    struct dev_slot *s = &d->fast.slots[i];
    if (!(d->fast.busy_slots >> i & 1) || size == 0)
        return false;
    spin_acquire(&s->lock);
    struct block *b = s->freed;
    size_t r = fast_round(size);
    if (!b || b->expandable || b->stream != stream || s->gen != settings_gen() || size > s->base_req ||
        r >= s->min_size || r < s->min_fit) {
        spin_release(&s->lock);
        return false;
    }
    /* The peak taken below counts the other busy slots above what they hold: guarded. */
    struct fast_guard g;
    fast_guard_begin(d, &g, d->fast.busy_slots & ~((uint64_t)1 << i));
    /* The eager malloc of r leaves |M| - r inactive split bytes where min_size's left |M| -
     * min_size: count the rise (current and peak; it accumulates with the hit in slot_owe). */
    int si = block_pool(b)->stat_index;
    xseg_stat_counter *isb = d->acct.stats.inactive_split_bytes; /* the settle's books, as slot_owe's */
    stat_up_pool(isb, si, (int64_t)(s->min_size - r));
    isb[si].allocated -= (int64_t)(s->min_size - r);
    s->min_size = r;
    s->span = b->size - r;
    *out = fast_take(s, b, size, r, false);
    spin_release(&s->lock);
    fast_tls_last(s);
    fast_guard_end(d, &g);
    return true;
}

#ifdef XSEG_FRONT_LONE_FIT
/* Before a device-lock malloc of @p size on @p stream that no front served: every freed front
 * entry of the stream that best fit would pick before the index's own fit (at least the
 * request's rounded size, less than that fit's, of its pool) is freed into the index, so that
 * the search sees what the eager state would hold. */
static void lone_settle_fits(struct dev_alloc *d, size_t size, CUstream stream)
{
    size_t r = fast_round(size);
    /* The index's first fit for r (its size; none: every entry from r up), so that only entries
     * that fit better leave the front. */
    struct block *pred, *next;
    const struct bpool *pool = r <= BLOCK_SMALL_SIZE ? &d->small : &d->large;
    const struct block *fit = bpool_fit(pool, stream, r, &pred, &next);
    size_t below = fit && fit->stream == stream ? fit->size : SIZE_MAX;
    for (uint64_t m = d->fast.busy_slots & FAST_OWN_MASK; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        struct dev_slot *s = &d->fast.slots[i];
        struct dev_front *f = slot_front(s);
        if (f->stream != stream)
            continue;
        for (;;) {
            spin_acquire(&s->lock);
            front_fold_lanes(f);
            unsigned k = FRONT_ENTRIES;
            for (uint64_t u = f->freed & f->used; u; u &= u - 1) {
                unsigned e = (unsigned)__builtin_ctzll(u);
                if (f->size[e] >= r && f->size[e] < below && (f->size[e] <= BLOCK_SMALL_SIZE) == pool->is_small) {
                    k = e;
                    break;
                }
            }
            spin_release(&s->lock);
            if (k == FRONT_ENTRIES || front_settle_at(d, i, k))
                break;
        }
    }
}
#endif

/* malloc through the device lock, before the door: a classic stream slot widened (fast_widen),
 * or this thread's front past its grant (front_hit_locked). */
bool fast_lock_hit(struct dev_alloc *d, size_t size, CUstream stream, void **out)
{
    if (!d->fast.busy_slots || !size)
        return false;
    bool hit = fast_widen(d, size, stream, out) ||
               (d->fast.busy_slots & FAST_OWN_MASK && front_hit_locked(d, size, stream, out));
#ifdef XSEG_FRONT_LONE_FIT
    if (!hit && (d->fast.busy_slots & FAST_OWN_MASK))
        lone_settle_fits(d, size, stream);
#endif
    return hit;
}
