/*
 * The fast path's owed work (see fast.h): the stream slots' fill, debts and settle, the lock
 * entry's configuration refresh, the statistics as every reader sees them.
 */
#include "core/device/fast.h"

#include "base/fork.h"
#include "core/device/placement.h"

_Thread_local struct dev_slot *fast_tls_slot;

/* A forked child never frees into the parent's devices (core/runtime.c refuses them): forget
 * the forking thread's last hit, whose slot lies in one. */
static void fast_fork_child(void) { fast_tls_slot = NULL; }
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

/* Does busy slot @p s owe on the inactive_split rows (a classic stream slot's)? */
static bool slot_owes_split(const struct dev_slot *s) { return !s->blk->expandable && !slot_is_own(s); }

/* The rows of FAST_ROWS, in its order. */
static xseg_stat_counter *fast_row(xseg_device_stats *st, int k)
{
    xseg_stat_counter *rows[FAST_ROWS] = {st->allocation, st->allocated_bytes, st->requested_bytes,
                                          st->inactive_split, st->inactive_split_bytes};
    return rows[k];
}

/* What busy slot @p s (locked) lowers each current of the FAST_ROWS rows by, in its pool. */
static void slot_lowers(const struct dev_slot *s, int64_t low[FAST_ROWS])
{
    const struct block *b = s->blk;
    int64_t classic = slot_owes_split(s); /* an own slot's B may have no next to read */
    int64_t msize = classic ? (int64_t)(b->size + b->next->size) : 0;
    if (slot_state(s) == SLOT_FREED) {
        low[0] = 1;
        low[1] = (int64_t)b->size;
        low[2] = (int64_t)s->base_req;
        low[3] = classic;
        low[4] = classic * (msize - (int64_t)s->min_size);
    } else {
        low[0] = 0;
        low[1] = (int64_t)(b->size - s->cur_size);
        low[2] = (int64_t)(s->base_req - s->cur_req);
        low[3] = 0;
        low[4] = classic * (int64_t)(s->cur_size - s->min_size);
    }
}

/* The accumulated half of slot_owe: what the hits' mallocs counted. */
static void slot_pay(const struct dev_slot *s, xseg_device_stats *st)
{
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
    int si = block_pool(s->blk)->stat_index;
    int64_t low[FAST_ROWS];
    slot_lowers(s, low);
    for (int k = 0; k < FAST_ROWS; k++)
        stat_down_pool(fast_row(st, k), si, low[k]);
}

void fast_owed(const struct dev_alloc *d, xseg_device_stats *st)
{
    lock_assert_held(&d->lock);
    for (uint64_t m = d->fast.busy_slots; m; m &= m - 1)
        slot_owe(&d->fast.slots[__builtin_ctzll(m)], st);
}

void dev_stats_copy(struct dev_alloc *d, xseg_device_stats *out)
{
    lock_assert_held(&d->lock);
    uint64_t busy = d->fast.busy_slots;
    for (uint64_t m = busy; m; m &= m - 1)
        spin_acquire(&d->fast.slots[__builtin_ctzll(m)].lock);
    *out = d->acct.stats;
    fast_owed(d, out);
    for (uint64_t m = busy; m; m &= m - 1)
        spin_release(&d->fast.slots[__builtin_ctzll(m)].lock);
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

/* Settle busy slot @p i, its lock held (kept): the debt paid, B's truth written back. A freed B
 * merges into R (dev_free_block_inline's keep == next branch: nothing but the slot's own pairs
 * touched B, R or the GC clock since the fill); a B handed out with fewer bytes than its size
 * gives the rest to R, whose key only grows. */
static void slot_settle_locked(struct dev_alloc *d, unsigned i)
{
    lock_assert_held(&d->lock);
    struct dev_slot *s = &d->fast.slots[i];
    lock_assert_held(&s->lock);
    struct block *b = s->blk;
    xseg_assert(b && (d->fast.busy_slots >> i & 1));
    struct block *r = b->next;
    struct bpool *pool = block_pool(b);
    enum slot_state state = slot_state(s);
    if (slot_kind(d, s) == SLOT_OWN && state == SLOT_FREED) {
        /* An own slot's freed block: the eager free, done now (merged with whatever neighbours
         * are free now), its counters as free_cached moves them. */
        slot_pay(s, &d->acct.stats);
        int si = pool->stat_index;
        b->allocated = false;
        (void)ptrmap_take(&d->live, b->addr);
        stat_down_pool(d->acct.stats.allocation, si, 1);
        stat_down_pool(d->acct.stats.allocated_bytes, si, (int64_t)b->size);
        slot_settle_free(d, b);
        dev_free_block_inline(d, b); /* requested_bytes down by its requested_size: base_req */
        goto settled;
    }
    slot_owe(s, &d->acct.stats);
    if (slot_kind(d, s) == SLOT_OWN) { /* an own slot's block handed out: same size (span 0) */
        xseg_assert(state == SLOT_HANDED_OUT && s->cur_size == b->size && b->allocated);
        block_set_requested(b, s->cur_req);
        goto settled;
    }
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
    s->hits = 0;
#endif
    s->blk = s->freed = NULL;
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

/* The busy own slots. */
#define FAST_OWN_MASK (~(uint64_t)0 << DEV_STREAM_SLOTS)

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

/* Settle own slot @p i (no slot's lock held). A classic B's settle is its ordinary free, whose
 * merge may raise inactive_split and take its peak from d->acct.stats: the slots owing on those
 * rows settle first, so that the rows hold the recount's values when it does (own slots owe
 * nothing there). */
static void own_settle(struct dev_alloc *d, unsigned i)
{
    if (!d->fast.slots[i].blk->expandable)
        for (uint64_t m = split_owers(d, d->fast.busy_slots); m; m &= m - 1)
            slot_settle(d, (unsigned)__builtin_ctzll(m));
    slot_settle(d, i);
}

/* Settle the own slots of @p owner (NULL: any thread's) holding a block of @p stream. */
static void own_settle_stream(struct dev_alloc *d, const void *owner, const void *stream)
{
    for (uint64_t m = d->fast.busy_slots & FAST_OWN_MASK; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        const struct dev_slot *s = &d->fast.slots[i];
        if ((!owner || s->owner == owner) && s->blk->stream == stream)
            own_settle(d, i);
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

static void note_thread(struct dev_alloc *d, unsigned i, CUstream stream)
{
    const struct dev_slot *h = &d->fast.slots[i];
    if (h->blk->stream != stream || h->owner == fast_self() || fast_shared(d, stream))
        return;
    mark_shared(d, i, stream);
}

/* What a malloc through the device lock on @p stream settles (some slot busy): the stream's slot,
 * after noting whether another thread filled it (the stream is then shared), and on a shared
 * stream this thread's own slot of it. The other threads' own slots stay. */
static void settle_malloc(struct dev_alloc *d, CUstream stream)
{
    lock_assert_held(&d->lock);
    unsigned i = fast_slot_index(stream);
    if (d->fast.busy_slots >> i & 1) {
        note_thread(d, i, stream);
        slot_settle(d, i);
    }
    if (XSEG_UNLIKELY(d->fast.sharing.any.shared != 0) && fast_shared(d, stream))
        own_settle_stream(d, fast_self(), stream);
}

/* What a free through the device lock of @p b (in the live map; some slot busy) settles: its
 * stream's slot (noting, as settle_malloc, whether another thread filled it) and the own slot that
 * holds @p b, if any. */
static void settle_block(struct dev_alloc *d, const struct block *b)
{
    lock_assert_held(&d->lock);
    unsigned i = fast_slot_index(b->stream);
    if (d->fast.busy_slots >> i & 1) {
        note_thread(d, i, b->stream);
        slot_settle(d, i);
    }
    for (uint64_t m = d->fast.busy_slots & FAST_OWN_MASK; m; m &= m - 1) {
        unsigned k = (unsigned)__builtin_ctzll(m);
        if (d->fast.slots[k].blk == b) {
            own_settle(d, k);
            break;
        }
    }
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
    fast_guard_begin(d, g, d->fast.busy_slots);
}

/* ---- the peaks of an operation beside busy slots ------------------------------------------ */

void fast_guard_save(struct dev_alloc *d, struct fast_guard *g)
{
    lock_assert_held(&d->lock);
    for (int k = 0; k < FAST_ROWS; k++)
        for (int p = 0; p < XSEG_STAT_POOLS; p++)
            g->peak[k][p] = fast_row(&d->acct.stats, k)[p].peak;
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
    bool raised = false;
    for (int k = 0; k < FAST_ROWS; k++)
        for (int p = 0; p < XSEG_STAT_POOLS; p++)
            raised |= fast_row(st, k)[p].peak > g->peak[k][p];
    uint64_t busy = d->fast.busy_slots;
    if (!raised || !busy)
        return;
    int64_t low[DEV_SLOTS][FAST_ROWS], owed[FAST_ROWS][XSEG_STAT_POOLS] = {{0}};
    int pool[DEV_SLOTS];
    for (uint64_t m = busy; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        const struct dev_slot *s = &d->fast.slots[i];
        spin_acquire(&d->fast.slots[i].lock);
        slot_lowers(s, low[i]);
        pool[i] = block_pool(s->blk)->stat_index;
        for (int k = 0; k < FAST_ROWS; k++) {
            owed[k][pool[i]] += low[i][k];
            owed[k][XSEG_STAT_ALL] += low[i][k];
        }
    }
    uint64_t settle = 0;
    for (int k = 0; k < FAST_ROWS; k++)
        for (int p = 0; p < XSEG_STAT_POOLS; p++) {
            xseg_stat_counter *c = &fast_row(st, k)[p];
            if (c->peak <= g->peak[k][p] || !owed[k][p])
                continue;
            int64_t seen = c->peak - owed[k][p];
            c->peak = seen > g->peak[k][p] ? seen : g->peak[k][p];
            for (uint64_t m = busy; m; m &= m - 1) {
                unsigned i = (unsigned)__builtin_ctzll(m);
                if (low[i][k] && (p == XSEG_STAT_ALL || p == pool[i]))
                    settle |= (uint64_t)1 << i;
            }
        }
    /* A classic own slot settles after the slots owing on inactive_split (own_settle's order: the
     * stream slots come first below). */
    for (uint64_t m = settle & FAST_OWN_MASK; m; m &= m - 1)
        if (!d->fast.slots[__builtin_ctzll(m)].blk->expandable) {
            settle |= split_owers(d, busy);
            break;
        }
    for (uint64_t m = busy; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        if (settle >> i & 1) {
            FAST_COUNT(d, settles_cross);
            slot_settle_locked(d, i);
        }
        spin_release(&d->fast.slots[i].lock);
    }
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
 * A classic free of last_alloc that fills no stream slot, its block beside another (as two
 * threads' overlapping pairs on one stream put theirs, whichever frees first): the stream is
 * probed, by this thread. The next free through the device lock on it (fast_fill_probed, or this
 * function) by another thread marks it shared and fills an own slot (true); one by this thread
 * ends the probe. One thread alone never marks a stream. False: the eager free.
 */
static __attribute__((noinline, cold)) bool classic_beside(struct dev_alloc *d, struct block *b)
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
    if (!b->expandable && (prev || (next && next->next))) {
        /* The quiet countdown in line (one thread freeing in LIFO order beside its live blocks,
         * SHARING_QUIET_FREES times out of SHARING_QUIET_FREES + 1): this thread's own probe of
         * this stream lately ended by its own free, so no probe this time; the eager free. */
        if (XSEG_LIKELY(sharing_quiet_tick(&d->fast.sharing, fast_slot_index(b->stream), b->stream, fast_self())))
            return false;
        return classic_beside(d, b);
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
    s->blk = s->freed = b;
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
    fast_tls_slot = s;
    return true;
}

/*
 * An own slot (Note [slot rule] in core/device/fast.h): a hit changes no block but B, and B's
 * settle is the eager free, done late: until then B is no inactive split block (nor merged with a
 * free neighbour), freed or handed out, so its debt has no inactive_split rows (slot_lowers), and
 * a classic B's merge moves those rows at the settle, through the ordinary free's accounting
 * (own_settle: exact, peaks included).
 */
bool fast_fill_own(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct bpool *pool = block_pool(b);
    if (block_free_slow(b) || settings_gen() != d->fast.fast_gen || dev_gc_on(d) || fast_registers(d, b) ||
        dev_pool_owner(d, pool) || (b->size <= BLOCK_SMALL_SIZE) != pool->is_small || b->size >= d->cfg.max_split_size)
        return false;
    const void *me = fast_self();
    /* Allocated to every eager operation, from here (the settle below frees a block that may be
     * B's neighbour) to B's own settle: a free merges only with free blocks (dev_try_merge). */
    b->allocated = true;
    own_settle_stream(d, me, b->stream); /* one own slot a thread and stream */
    uint64_t idle = ~d->fast.busy_slots & FAST_OWN_MASK;
    if (!idle || !ptrmap_put(&d->live, b->addr, b)) {
        b->allocated = false;
        return false; /* every own slot busy: the eager free */
    }
    unsigned i = (unsigned)__builtin_ctzll(idle);
    struct dev_slot *s = &d->fast.slots[i];
    spin_acquire(&s->lock);
    s->blk = s->freed = b;
    s->gen = d->fast.fast_gen;
    s->min_fit = s->min_size = b->size;
    s->span = 0;
    s->base_req = s->cur_req = b->u.requested_size;
    s->cur_size = b->size;
    s->owner = me;
    s->dev = d;
    spin_release(&s->lock);
    d->fast.busy_slots |= (uint64_t)1 << i;
    FAST_COUNT(d, own_fills);
    fast_tls_slot = s;
    return true;
}

/* ---- widen (classic) ---------------------------------------------------------------------- */

bool fast_widen(struct dev_alloc *d, size_t size, CUstream stream, void **out)
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
    *out = fast_take(s, b, size, r);
    spin_release(&s->lock);
    fast_guard_end(d, &g);
    return true;
}
