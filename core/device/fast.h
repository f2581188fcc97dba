/*
 * The fast path's owed work: the permit, the slots and the sharing table (struct dev_fast, struct
 * dev_slot and struct sharing, core/device/state.h), written only here, in fast.c and through
 * core/device/sharing.h's transitions (tests/build/layering.sh). A busy slot holds a
 * block B whose free and later mallocs (hits) ran under the slot's lock alone: nothing of the
 * device lock's state moved, and the slot owes it what they did. The invariant, written once and
 * walked by dev_check (core/device/check.c) with every busy slot locked:
 *
 *     statistics read = d->acct.stats + sum over busy slots of fast_owed(slot)
 *                     = the recount of the block state with every stream slot settled (eager),
 *                       an own slot's freed B counted as its thread's (reserved bytes only)
 *
 * Settling a slot (fast_settle) moves its debt into d->acct.stats and B's truth into B (merged
 * into its successor R when freed; its true size and requested bytes when handed out): the sum
 * does not move, but for an own slot's freed classic B, whose settle is its free (Note [slot
 * rule]). A debt lowers every current it touches (a hit takes at most B's size and requested
 * bytes), and every current of d->acct.stats less the fronts' debts is at most its peak, so no
 * stream slot's hit can take a statistic past its peak unseen; a front's hits stay within its
 * grant (Note [front grants]). A classic slot counts the inactive split bytes of its smallest
 * hit (min_size): fast_widen lowers min_size through the device lock, so its hits, larger or
 * smaller, only lower allocated_bytes or inactive_split_bytes.
 *
 * Peaks: a device-lock operation that moves a counter up records its peak from d->acct.stats,
 * which counts every busy slot above what it holds. Where that raised a peak on a row some busy
 * slot owes (the FAST_ROWS rows), the peak is the recount's instead (the operation's highest value
 * less the debts, every busy slot locked: the instant the operation is placed at), and the stream
 * slots owing on it settle, so that the current is at most the peak again (fast_guard_end); the
 * fronts stay, their grants shared out again. A raise
 * that stays under the peak settles no other slot: a thread keeps its slot, however often
 * another thread's stream takes the device lock, once the peaks are where both threads' blocks
 * took them.
 *
 * Locking: the device lock first, then a slot's spin lock; a slot is filled and settled only with
 * both. The hit (fast_hit) and the slot's free (fast_free_hit) take the slot's lock alone.
 *
 * Which slot: a malloc tries this thread's last slot first (fast_tls.slot: the one it hit or
 * filled last, unless its sizes turn among lanes: fast_tls.first), then its stream's, so that
 * threads touch only slots they use. Which free stays in which slot is Note [slot rule] below;
 * alloc.c reaches all of this through one door (Note [the door]).
 *
 * Note [slot rule]
 * ~~~~~~~~~~~~~~~~
 * A free through the device lock of block B may leave B unmerged in a slot only when no reader can
 * tell it from the eager free. The stream slot (fast_fill_stream): B is the block of the last malloc
 * through the device lock (last_alloc: a ping-pong frees what it just allocated), the permit is on,
 * the free is the common one (nothing recorded, not oversize, no side struct, no GC clock to tick,
 * below register_blocks_above_mb), B has a free indexed successor R and no free predecessor (the
 * eager free's one merge, into R as M = [B, R)), that merge moves no counter up (an expandable
 * block, or a classic B + R spanning its segment), and best fit in the eager index would split
 * B's address off M again for every rounded size from min_size to B's size ("fast_fits", fast.c:
 * min_fit; a classic slot starts at B's size and widens towards min_fit through the device lock,
 * fast_widen, its larger inactive split block counted first). A hit then needs the slot's B freed,
 * on its device and stream, the permit of the fill, a rounded size in [min_size, B's size] and at
 * most base_req requested bytes (fast_hit_at); it hands out what the eager free and malloc would,
 * until a device-lock holder settles the slot (every change to the stream's blocks settles it
 * first). On a stream marked shared (core/device/sharing.h) the free fills an own slot of the
 * freeing thread instead (fast_fill_own), its front: any block of a default pool's common free,
 * whatever its neighbours, in either mode, joins the up to FRONT_ENTRIES blocks the thread keeps
 * for the stream (struct dev_front), freed or handed out again; a hit takes a freed one of the
 * request's rounded size (within the front's grant, Note [front grants]), and a free of one it
 * handed out puts it back, each under the slot's lock alone (fast_front_hit_in, fast_front_free); an
 * entry's settle is the eager free, done late. Everything else is the eager free.
 *
 * Why own slots: one slot a stream keeps eager placement, but two threads whose pairs overlap on
 * one stream cannot share it: their blocks lie side by side, the lower one's free has no free
 * successor, and every pair takes the device lock; nor can any slot that keeps eager placement
 * reach 1.5x one thread's pairs there (a hit's eager address depends on whether the other thread's
 * block is free at that instant, so each pair would read a line the other wrote: bench_scale --only
 * floor). So a stream is marked shared when a malloc or free through the device lock finds its slot
 * filled by another thread (settle_malloc, fast.c), or, the blocks side by side filling no stream
 * slot (classic ones in one segment; expandable ones when the other thread's block was freed first,
 * a free predecessor), when the free of last_alloc finds it beside another block or hole, which
 * probes its stream, and the next free through the device lock there is another thread's
 * (free_beside, fast_fill_probed); from then until every slot settles (any FAST_ALL settle:
 * empty_cache, snapshots, stats resets, config changes, capture, sleep, the slow malloc path and so
 * its out-of-memory reclaim) its frees fill own slots (slots[DEV_STREAM_SLOTS ..], one a thread and
 * stream, its front; none left: the eager free; a full front settles one entry, a handed-out one
 * first; a front unused while others of its stream were used settles at a check-in,
 * front_check_in). What that gives up, on shared streams only: a thread's freed blocks are held out
 * of the other threads' best fit until a settle (a per-thread cache of up to FRONT_ENTRIES blocks a
 * stream), and a hit takes one back for its own rounded size whether or not best fit would; a
 * malloc that would grow settles every front first (malloc_slow_body). Own slots owe nothing on the
 * inactive_split rows: a classic B in one is no inactive split block (nor merged with a free
 * neighbour) until its settle, whose ordinary free moves those rows up or down and takes their
 * peaks from d->acct.stats; the stream slots owing on them settle first (own_settle), so those rows
 * are the recount's then, and the peaks exact. Single-threaded use never marks a stream: its
 * placement is the eager one.
 *
 * Note [front grants]
 * ~~~~~~~~~~~~~~~~~~~
 * A front's freed blocks are counted allocated (its debt), so the currents of d->acct.stats may
 * stand above the peaks while it holds them; settling the fronts at every raise would empty them
 * at every malloc through the lock while two threads share a stream. Instead each front has a
 * grant (struct dev_front.grant): how far its hits may raise allocation, allocated_bytes and
 * requested_bytes, in each pool and in all, without the device lock. On every such row, the
 * current less the fronts' debts (what the stream slots' hits may raise it to) plus every grant
 * stays at most the peak (dev_check checks it), so no hit reaches past a peak unseen, and the peaks
 * stay exact. fast_guard_end shares the room under each peak out as budgets: a front's budget on a
 * row is what its handed-out entries hold there plus its grant, at least what they hold and at
 * most what all its entries would (its cap); the room goes to raising the smallest budgets to one
 * level (water-filling, front_share_out), so two threads whose blocks together make the peak get
 * half of it each, whatever either holds at the instant of the share-out (a share in proportion to
 * the debts left a front that held nothing then less than its largest block, and its largest
 * request missed ever after). A front's free gives back what its hit took. A hit past its grant
 * goes through the device lock, where the room is shared out again with that hit counted first
 * (fast_lock_hit): where the room holds it, the front's block is handed out there, no peak moved;
 * else the eager malloc raises the peak.
 *
 * Note [front lane]
 * ~~~~~~~~~~~~~~~~~
 * A front's hit and free cost about twice a stream slot's pair (the grant's test, the buckets, the
 * debt's rows), so a thread whose pairs repeat sizes on a shared stream, one size or several in
 * turn, ran at half speed beside one that had its stream alone. So a front keeps FRONT_LANES lane
 * slots (struct dev_front.lane), each serving one of its entries as a stream slot serves its B,
 * exact size, for the rounded sizes whose front_lane_index is its own: when a hit outside the lanes
 * takes the rounded size of the last such hit of its lane index, whatever other sizes came between,
 * and that lane is idle, the entry becomes its lane (lane_enter) and the thread's last slot. Its
 * free is then fast_free_hit's, inline in xseg_free, and the next malloc of its size fast_hit's,
 * inline in xseg_malloc when the thread's last slot is that lane and its sizes do not turn, else
 * the second try (fast_lane_hit, in malloc_lane: the lane of the request's size, one hash away).
 * A thread whose sizes turn tries no last slot first (fast_tls.first is NULL): its pair takes
 * two slot locks, the lane's and its free's, as a stream slot's does. Sizes that share a lane index
 * share it as the first to come takes it; the others' pairs stay the front's. A lane is counted at
 * its worst, as a stream slot is: it is no debt of the front's (low), so the room the grants share
 * out (front_grants) counts its block as allocated, and its own debt is the lane slot's
 * (slot_lowers and slot_pay add the lanes' to their own slot's, as fast_owed and the guard read
 * them). A lane goes back into its front (lane_fold), which moves its debt into low with the gap
 * unchanged, so every row's sum under its peak stays: all of a front's when a hit of another size
 * finds the grant short (a lane's freed block may hold the room it needs), when a guarded
 * operation raised a peak they owe on (their hits would then reach past the peak unseen:
 * fast_guard_end_slow), and before any entry of the front settles; one alone when a free through
 * the device lock is of its block. Locks: the own slot's, then its lanes' (fast_lock_busy takes
 * every busy slot's and its busy lanes', for the readers that sum the debts: no lane enters while
 * its own slot's lock is held, and an idle lane owes nothing).
 *
 * Note [the door]
 * ~~~~~~~~~~~~~~~
 * core/alloc.c's malloc and free through the device lock each read: lock, fast_lock_begin_malloc
 * or fast_lock_begin_free (the stream's slot settled, and for a free the front entry holding the
 * block; the peaks guarded while other slots stay busy),
 * the eager operation, whose free offers its block to a slot through fast_put (Note [slot rule]),
 * fast_lock_end (the guarded peaks made exact), unlock. The common case, no slot busy and no
 * stream marked or probed, costs one test at each end; the rest is out of line.
 */
#ifndef XSEG_CORE_FAST_H
#define XSEG_CORE_FAST_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/blockops.h"
#include "core/device/placement.h"
#include "core/device/sharing.h"

/* The slot of @p stream: a multiplicative hash of the handle (streams sharing a slot share its
 * one block, never its correctness). */
static inline unsigned fast_slot_index(const void *stream)
{
    return (unsigned)((((uintptr_t)stream >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 59);
}
static inline struct dev_slot *fast_slot_of(struct dev_alloc *d, const void *stream)
{
    return &d->fast.slots[fast_slot_index(stream)];
}

/* Front @p f's debt on grant row @p k (FRONT_LOW_* order) in pool @p p, the "all" entry the sum of
 * the pools'; and its grant there, the debt plus its gap (struct dev_front). */
static inline int64_t front_debt(const struct dev_front *f, int k, int p)
{
    return p == XSEG_STAT_ALL ? f->low[XSEG_STAT_SMALL_POOL][k] + f->low[XSEG_STAT_LARGE_POOL][k] : f->low[p][k];
}
static inline int64_t front_grant(const struct dev_front *f, int k, int p) { return front_debt(f, k, p) + f->gap[k][p]; }

/* A rounded size's lane in a front (struct dev_front.lane; Note [front lane]): four sizes in turn
 * of 512 B steps take four lanes. */
static inline unsigned front_lane_index(size_t r)
{
    /* Fibonacci hashing of r / 512 on 32 bits (K = 0x9E3779B9), with the division folded into the
     * multiplier: r is a multiple of 512, so r * (K >> 9) is (r / 512) * (K with its low 9 bits
     * clear). 32 bits, so that the multiplier is an immediate (the 64-bit one took a movabs of
     * every lane try); sizes past 4 GiB hash by their low 32 bits. Below 1,444 KiB (the small
     * pool's sizes and past them) it gives every size the 64-bit hash's lane, so the same sizes
     * share one: four 512 B steps in turn never do. */
    _Static_assert(FRONT_LANES == 4, "front_lane_index: its shift keeps two bits");
    return ((uint32_t)r * UINT32_C(0x4F1BBC)) >> 30;
}
/* Is @p s one of front @p f's lane slots? */
static inline bool front_lane_slot(const struct dev_front *f, const struct dev_slot *s)
{
    return (uintptr_t)s - (uintptr_t)f->lane < sizeof f->lane;
}

/* A size's or an address's bucket in a front (struct dev_front; FRONT_BUCKETS of them). */
static inline unsigned front_bucket(uintptr_t x)
{
    return (unsigned)(((x >> 9) * UINT64_C(0x9E3779B97F4A7C15)) >> 60);
}

/* What a slot holds (struct dev_slot): nothing, its block B freed by the user (a hit may take
 * it), or B handed out again by a hit (its free puts it back). */
enum slot_state { SLOT_IDLE, SLOT_FREED, SLOT_HANDED_OUT };
static inline enum slot_state slot_state(const struct dev_slot *s)
{
    return !s->blk ? SLOT_IDLE : s->freed ? SLOT_FREED : SLOT_HANDED_OUT;
}
/* Which slots a slot of fast.slots is among: its stream's (slots[fast_slot_index]) or a thread's
 * own (slots[DEV_STREAM_SLOTS ..], Note [slot rule]); a front's lane slots are neither (Note
 * [front lane]). */
enum slot_kind { SLOT_STREAM, SLOT_OWN };
static inline enum slot_kind slot_kind(const struct dev_alloc *d, const struct dev_slot *s)
{
    return s - d->fast.slots >= DEV_STREAM_SLOTS ? SLOT_OWN : SLOT_STREAM;
}

/* Debug builds count what the slots do (struct dev_fast; device lock held). */
#if XSEG_DEBUG_LEVEL >= 1
#define FAST_COUNT(d, field) ((void)(d)->fast.field++)
#else
#define FAST_COUNT(d, field) ((void)0)
#endif

/* The rounding of the fast paths (no roundup_power2_divisions: the permit excludes them). */
static inline size_t fast_round(size_t size)
{
    return size < BLOCK_MIN_SIZE ? BLOCK_MIN_SIZE : xseg_align_up(size, BLOCK_MIN_SIZE);
}

/* What a device-lock taker needs settled. */
enum fast_need {
    FAST_NONE,   /* nothing: the statistics' reads fold the debts, malloc and free settle below */
    FAST_STREAM, /* the slot of the stream a malloc or free touches (its blocks may change); the
                  * other slots stay, the operation's peaks guarded (struct fast_guard) */
    FAST_ALL,    /* every slot: the state is the eager one (every other operation) */
};

/* Settle the busy slots @p need names (@p stream: FAST_STREAM's). Device lock held. */
void fast_settle_slow(struct dev_alloc *d, enum fast_need need, const void *stream);
static inline void fast_settle(struct dev_alloc *d, enum fast_need need, const void *stream)
{
    lock_assert_held(&d->lock);
    if (XSEG_UNLIKELY((d->fast.busy_slots | sharing_any(&d->fast.sharing)) != 0) && need != FAST_NONE)
        fast_settle_slow(d, need, stream);
}

/* Is an own slot busy (device lock held)? */
static inline bool fast_own_busy(const struct dev_alloc *d) { return (d->fast.busy_slots >> DEV_STREAM_SLOTS) != 0; }

/* The rows of the statistics a busy slot's debt lowers (slot_owe): allocation, allocated_bytes,
 * requested_bytes, inactive_split and inactive_split_bytes. */
#define FAST_ROWS 5

/* The peaks of the FAST_ROWS rows before a device-lock operation that may move them up while
 * other slots are busy (on), for fast_guard_end (the peaks paragraph above). */
struct fast_guard {
    bool on;
    int64_t peak[FAST_ROWS][XSEG_STAT_POOLS];
};
void fast_guard_save(struct dev_alloc *d, struct fast_guard *g);
/* Before the operation, its own stream's slot settled: @p others are the busy slots it may
 * leave owing (none: nothing to guard). */
static inline void fast_guard_begin(struct dev_alloc *d, struct fast_guard *g, uint64_t others)
{
    g->on = others != 0;
    if (g->on)
        fast_guard_save(d, g);
}
void fast_guard_end_slow(struct dev_alloc *d, const struct fast_guard *g);
/* After the operation (device lock held, no slot's lock): every peak it raised is exact, and
 * every current at most its peak. */
static inline void fast_guard_end(struct dev_alloc *d, const struct fast_guard *g)
{
    if (XSEG_UNLIKELY(g->on))
        fast_guard_end_slow(d, g);
}

/* What a device-lock taker needs done when dev_lock returns. */
enum dev_need {
    DEV_NEED_NONE,  /* the lock alone: statistics' reads fold the slots' debts; malloc and free settle
                     * their own stream's slot (fast_settle with FAST_STREAM) */
    DEV_NEED_SLOTS, /* every slot settled, the eager state (taking the lock again inside an operation) */
    DEV_NEED_OP,    /* every slot settled and the configuration in force refreshed (an operation's start) */
};

/* Copy the configuration in force again when its generation moved (one load when not). Lock held. */
static inline void dev_refresh_cfg(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    if (XSEG_UNLIKELY(settings_gen() != d->cfg_gen)) {
        dev_refresh_cfg_slow(d);
        place_refresh_cfg(d); /* placement sits above device.c in the wing's order */
    }
}

/* The one way to take the device lock: on return, what @p need names is done. Inline, so that a
 * constant @p need leaves only its own work (DEV_NEED_NONE: the lock's acquire alone). */
static inline void dev_lock(struct dev_alloc *d, enum dev_need need)
{
    lock_acquire(&d->lock);
    if (need != DEV_NEED_NONE)
        fast_settle(d, FAST_ALL, NULL);
    if (need == DEV_NEED_OP)
        dev_refresh_cfg(d);
}

/* A rare condition begins (see dev_fast.fast_gen): malloc takes the general path until it is over,
 * and no slot may wait without the permit. */
static inline void dev_fast_off(struct dev_alloc *d)
{
    fast_settle(d, FAST_ALL, NULL);
    d->fast.fast_gen = 0;
}

/*
 * The rare conditions, one list: while one holds the permit is off (dev_fast_update) and malloc
 * takes the general path, whose work tests the same predicates (fast_rare_NAME: malloc_prepare
 * and malloc_slow_body in core/alloc.c, sizes_round in core/device/sizes.h; the free's quarantine). A new condition is a
 * row here and its work there.
 */
#define FAST_RARE(X)                                                                              \
    X(capture, cap_underway(d))         /* streams seen capturing: routes, capture errors */      \
    X(events, ev_waiting(d))            /* events or deferred frees waiting: processed first */   \
    X(roundup, d->roundup_any)          /* roundup_power2_divisions: sizes_round's rule */        \
    X(history, hist_mode() != 0)        /* history: the stack captured before the lock */         \
    X(idle_tick, d->cfg.idle_release_ms && /* idle reclaim ticks in malloc, unless its thread */ \
                     !(d->cfg.idle_release_thread && settings_idle_thread_running()))            \
    X(asleep, d->sleep.nasleep != 0)    /* a sleeping pool refuses its mallocs (sleep.c) */       \
    X(stale, d->cfg.debug_stale_access) /* every free goes through the quarantine */

#define FAST_RARE_TEST(name, test)                                                                \
    static inline bool fast_rare_##name(const struct dev_alloc *d)                                \
    {                                                                                             \
        (void)d;                                                                                  \
        return test;                                                                              \
    }
FAST_RARE(FAST_RARE_TEST)
#undef FAST_RARE_TEST

/* Grant the permit again when no rare condition holds (config current). */
static inline void dev_fast_update(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
#define FAST_RARE_OR(name, test) || fast_rare_##name(d)
    bool rare = false FAST_RARE(FAST_RARE_OR);
#undef FAST_RARE_OR
    d->fast.fast_gen = rare ? 0 : d->cfg_gen;
}

/* @p b was handed out through the device lock: a free of it may fill its slot. */
static inline void fast_note_alloc(struct dev_alloc *d, const struct block *b) { d->fast.last_alloc = b; }

/* The free of @p b (device lock held; its map entry taken, its counters not yet down) kept in a
 * slot where Note [slot rule] allows: its stream's (fast_fill_stream), or on a shared stream an own
 * slot of this thread (fast_fill_own). True: done, the block is the slot's, and the slot this
 * thread's last. */
bool fast_fill_own(struct dev_alloc *d, struct block *b);
bool fast_fill_stream(struct dev_alloc *d, struct block *b);
/* Is @p stream marked shared (device lock held)? */
static inline bool fast_shared(const struct dev_alloc *d, const void *stream)
{
    return sharing_is_shared(&d->fast.sharing, fast_slot_index(stream), stream);
}
/* The free of @p b on a stream probed (free_beside): by another thread, it marks the stream
 * shared and fills an own slot (true); by the prober, it ends the probe and holds off that
 * thread's next SHARING_QUIET_FREES probes of the stream. Else fast_fill_stream. */
bool fast_fill_probed(struct dev_alloc *d, struct block *b);
/* The door's put (Note [the door]): the free of @p b, as fast_fill_own, fast_fill_probed or
 * fast_fill_stream takes it by its stream's sharing state.
 * XSEG_FRONT_LONE (a measurement's build only, never a shipped one: benchmarks/front_table.py
 * --lone) also gives a lone thread's free that no stream slot keeps to its front, as if every
 * stream were shared: what today's fronts would serve of a real program's mallocs, and at what
 * cost (docs/benchmarks-host.md#front-bound). XSEG_FRONT_LONE_FIT, the same with rules meant to
 * keep the eager placement's fit (fast.c, lone_settle_fits); XSEG_FRONT_LONE_SMALL, those in the
 * small pool only. */
static inline bool fast_put(struct dev_alloc *d, struct block *b)
{
    const struct sharing *t = &d->fast.sharing;
    if (XSEG_UNLIKELY(sharing_any(t) != 0)) {
        unsigned i = fast_slot_index(b->stream);
        if (sharing_is_shared(t, i, b->stream))
            return fast_fill_own(d, b);
        if (sharing_is_probed(t, i))
            return fast_fill_probed(d, b);
    }
#if defined XSEG_FRONT_LONE_FIT
    /* With the fit's rules (fast.c, lone_settle_fits): only a block whose eager free merges with
     * nothing waits, so that its eager self is a free block of its own size; with
     * XSEG_FRONT_LONE_SMALL, only a small pool's (the large pool's placement is no best fit). */
#ifdef XSEG_FRONT_LONE_SMALL
    if (b->size > BLOCK_SMALL_SIZE)
        return fast_fill_stream(d, b);
#endif
    return fast_fill_stream(d, b) ||
           (!block_in_free_index(b->prev) && !block_in_free_index(b->next) && fast_fill_own(d, b));
#elif defined XSEG_FRONT_LONE
    return fast_fill_stream(d, b) || fast_fill_own(d, b);
#else
    return fast_fill_stream(d, b);
#endif
}

/* The door's bracket (Note [the door]), device lock held. A malloc on @p stream, or a free of
 * @p ptr: what it may change is settled first; @p g guards the peaks where other slots stay busy.
 * Out of line when a slot is busy (or, for a free, a stream marked or probed). */
void fast_lock_begin_malloc_slow(struct dev_alloc *d, CUstream stream, struct fast_guard *g);
static inline void fast_lock_begin_malloc(struct dev_alloc *d, CUstream stream, struct fast_guard *g)
{
    g->on = false;
    if (XSEG_UNLIKELY(d->fast.busy_slots != 0))
        fast_lock_begin_malloc_slow(d, stream, g);
}
void fast_lock_begin_free_slow(struct dev_alloc *d, const void *ptr, struct fast_guard *g);
static inline void fast_lock_begin_free(struct dev_alloc *d, const void *ptr, struct fast_guard *g)
{
    g->on = false;
    if (XSEG_UNLIKELY((d->fast.busy_slots | sharing_any(&d->fast.sharing)) != 0))
        fast_lock_begin_free_slow(d, ptr, g);
}
/* The bracket's end, the operation done (device lock held, no slot's lock): fast_guard_end. */
static inline void fast_lock_end(struct dev_alloc *d, const struct fast_guard *g) { fast_guard_end(d, g); }

/* What this thread remembers of the slots, in one object of static TLS (initial-exec: a field
 * is one thread-pointer-relative load, in the shared library too, and every field shares one
 * offset from the GOT; a dlopen of libxseg can always have these 40 bytes; the definition in
 * fast.c carries the model too). Only its thread reads or writes it. */
struct fast_thread {
    /* The slot of this thread's last hit (NULL before the first): where its next free looks
     * first, without the device lock or even the device. */
    struct dev_slot *slot;
    /* The slot the next malloc tries first, inline (fast_hit): slot, or NULL while this thread's
     * sizes turn among its front's lanes (fast_lane_hit), where the last slot is the lane of the
     * last size and would only be missed (a lock taken and dropped, a third of such a pair's
     * cost). Never another slot, so that a hit there need not make it the last slot: the cached
     * pair writes no thread-local (fast_tls_last writes both). */
    struct dev_slot *first;
    /* The own slot whose front this thread filled last (NULL before): where a malloc that the
     * last slot did not serve looks next, and a free that it did not take (fast_front_hit_in,
     * fast_front_free). */
    struct dev_slot *front;
    /* The lane slots of this thread's last front while it had lanes at its last hit or lane's
     * entry (Note [front lane]), else NULL: no lane is tried. A settle may fold them meanwhile
     * (the try then misses), and the front may be another thread's by then (a lane serves
     * whoever hits it, as a stream slot does). */
    struct dev_slot *lanes;
    /* Lane tries left until the last front's check-in is made due (set to FRONT_CHECK_HITS at a
     * lane's entry and at the check-in, 1 once due): a thread whose pairs are all lane hits checks
     * in too (every FRONT_CHECK_HITS tries, one goes to its front, due). A count down, so that the
     * try pays one instruction and a branch for it. */
    uint32_t lane_left;
};
extern XSEG_HIDDEN _Thread_local struct fast_thread fast_tls __attribute__((tls_model("initial-exec")));
/* fast_tls as a value a function can hand to the next (fast_tls_ref): on x86-64 with GCC, its
 * offset from the thread pointer, read through %fs. A shared library finds that offset in its
 * GOT, one load in every function that touches fast_tls; alloc_malloc loads it for its first try
 * and passes it on to malloc_lane in the argument register the load already uses (two
 * instructions of every lane pair: the load and a move of the stream out of that register).
 * Elsewhere it is fast_tls's address: with clang, and in the sanitizer builds, whose checks
 * would take the offset for an address. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__SEG_FS) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
typedef struct fast_thread __seg_fs *fast_tls_ref;
#define FAST_TLS_REF() ((fast_tls_ref)((uintptr_t)&fast_tls - (uintptr_t)__builtin_thread_pointer()))
#else
typedef struct fast_thread *fast_tls_ref;
#define FAST_TLS_REF() (&fast_tls)
#endif
/* A hit in this thread's last front @p s (fast_tls.front, not NULL; @p d, @p stream): a freed
 * block of the request's rounded size whose statistics count at least @p size requested bytes,
 * handed out under the slot's lock alone. False: nothing changed. Called by malloc_front
 * (core/alloc.c) only when the thread has a front: one that has none (every thread of a program
 * whose streams are never shared) pays one load, not a call. */
bool fast_front_hit_in(struct dev_slot *s, struct dev_alloc *d, size_t size, CUstream stream, void **out);
/* xseg_free's second try: @p ptr is a block this thread's last front handed out; it is freed into
 * it under the slot's lock alone (true). False: nothing changed. */
bool fast_front_free_in(struct dev_slot *s, void *ptr);
static inline bool fast_front_free(void *ptr)
{
    struct dev_slot *s = fast_tls.front; /* tested here, as malloc_lane tests it for the malloc */
    return s && fast_front_free_in(s, ptr);
}
/* The calling thread, as the slots' owner field names it (the address of its slot pointer). */
static inline const void *fast_self(void) { return &fast_tls.slot; }

/* Make @p s (NULL: none) this thread's last slot, which the next malloc tries first and the next
 * free (every hit but fast_hit's, whose slot already is). */
static inline void fast_tls_last(struct dev_slot *s) { fast_tls.slot = fast_tls.first = s; }

/* A slot's freed field (struct dev_slot) is peeked at without the slot's lock (slot_peek_freed,
 * malloc_miss's stream slot try): every write of it, in any slot, is this relaxed atomic store (a
 * plain store on x86), every read under the lock a plain load. */
static inline void slot_set_freed(struct dev_slot *s, struct block *b) { __atomic_store_n(&s->freed, b, __ATOMIC_RELAXED); }
/* Is B freed in slot @p s, as far as a look without its lock can tell? False may be stale (a
 * free under its lock alone just put B back): the caller then goes through the device lock,
 * whose settle sees it; true is checked again under the lock (fast_hit_at). The peek spares a
 * thread whose stream slot is idle (a round robin, a real program's miss) the lock's
 * compare-exchange and release. */
static inline bool slot_peek_freed(const struct dev_slot *s) { return __atomic_load_n(&s->freed, __ATOMIC_RELAXED) != NULL; }

/* A hit's bookkeeping, written once for fast_hit and fast_widen: slot @p s (locked, its B @p lz
 * freed in it) hands B out for @p size bytes rounded to @p r; the caller makes s this thread's
 * last slot where it is not (fast_tls_last). @p lane (a constant: fast_lane_hit's try): s is a
 * front's lane, whose rounded size never changes (r == cur_size, tested by the hit), so neither
 * cur_size nor size_sum is written, two instructions of every lane pair where sizes turn. A
 * lane's bytes are therefore reps x cur_size wherever they are read (slot_pay, lane_fold); its
 * size_sum is not one of them (fast_hit's try on a lane, one size paired again, still adds to
 * it: check_lanes). Returns B's address. */
static inline __attribute__((always_inline)) void *fast_take(struct dev_slot *s, const struct block *lz, size_t size,
                                                          size_t r, bool lane)
{
    slot_set_freed(s, NULL);
    s->live = lz->addr;
    s->cur_req = size;
    s->reps++;
    s->req_sum += size;
    if (!lane) {
        s->cur_size = r;
        s->size_sum += r;
    }
#if XSEG_DEBUG_LEVEL >= 1
    s->hits++;
#endif
    return (void *)s->live;
}

/* A hit on slot @p s, under its lock alone, on device @p d and @p stream, where Note [slot rule]
 * allows one, for @p size bytes rounded to @p r. @p lane (a constant): s is a front's lane, whose
 * fields say more (check_lanes: min_size == cur_size, span 0), so its size test is r == cur_size.
 * False: nothing changed (also when another thread holds the slot's lock: no waiting here). */
static inline __attribute__((always_inline)) bool fast_hit_sized(struct dev_alloc *d, struct dev_slot *s, size_t size,
                                                                 size_t r, bool lane, CUstream stream, void **out)
{
    if (!lane) /* a lane's caller pins it in a register of its own */
        __asm__("" : "+r"(s)); /* one base register for every field (GCC would keep three) */
    if (XSEG_UNLIKELY(!spin_try(&s->lock)))
        return false;
    struct block *lz = s->freed;
    if (!lz || s->dev != d || settings_gen() != s->gen || lz->stream != stream || size > s->base_req)
        goto miss;
    if (lane ? r != s->cur_size : r - s->min_size > s->span)
        goto miss;
    *out = fast_take(s, lz, size, r, lane);
    spin_release(&s->lock);
    return true;
miss:
#if XSEG_DEBUG_LEVEL >= 1
    s->misses++;
#endif
    spin_release(&s->lock);
    return false;
}

/* fast_hit_sized on a stream slot or an own slot's B (not a lane). */
static inline __attribute__((always_inline)) bool fast_hit_at(struct dev_alloc *d, struct dev_slot *s, size_t size,
                                                              CUstream stream, void **out)
{
    /* fast_round for size > 0; size 0 rounds to 0, which no slot serves (r - min_size wraps past
     * span): malloc_lane answers it. */
    size_t r = ((size - 1) | (BLOCK_MIN_SIZE - 1)) + 1;
    return fast_hit_sized(d, s, size, r, false, stream, out);
}

/* malloc's first try: this thread's last slot @p s (fast_tls.first, the one it hit or filled last,
 * on device @p d; alloc_malloc loads it and tests it for NULL, which it is while the thread's sizes
 * turn among lanes), so that threads sharing a stream each touch a slot of their own (their own
 * slots); malloc_lane and malloc_miss try the rest, before the device lock. A hit leaves the
 * thread-locals as they are: the slot is the last already. */
static inline __attribute__((always_inline)) bool fast_hit(struct dev_alloc *d, struct dev_slot *s, size_t size,
                                                           CUstream stream, void **out)
{
    return fast_hit_at(d, s, size, stream, out);
}

/* malloc's second try (malloc_lane): the lane of the request's rounded size among @p lanes, this
 * thread's last front's (@p t's lanes, not NULL; Note [front lane]). The lane becomes the last
 * slot, for its free; the next malloc tries it first only when it was the last slot already (one
 * size paired again), not when the size turned (the next will likely turn too). A lane fast_hit
 * just missed (one size, its block not freed) is tried once more: rare, and no test on the rest. */
static inline bool fast_lane_hit(fast_tls_ref t, struct dev_slot *lanes, struct dev_alloc *d, size_t size,
                                 CUstream stream, void **out)
{
    if (XSEG_UNLIKELY(--t->lane_left == 0)) {
        t->lane_left = 1; /* due: the front's hit checks in (fast_front_hit_in) */
        return false;
    }
    /* fast_hit_at's rounding (0 for size 0: no lane's), in a register no argument uses (GCC took
     * d's, and moved d out of its way and back on a miss) */
    register size_t r XSEG_REG("r9") = ((size - 1) | (BLOCK_MIN_SIZE - 1)) + 1;
    __asm__("" : "+r"(r));
    register struct dev_slot *l XSEG_REG("r11") = &lanes[front_lane_index(r)]; /* as alloc_malloc's s */
    __asm__("" : "+r"(l));
    if (!fast_hit_sized(d, l, size, r, true, stream, out))
        return false;
    /* Branches rather than one conditional pair of stores: GCC packs that into a vector store of
     * seven instructions, where sizes in turn (l is not the last slot) take four. */
    if (XSEG_LIKELY(l != t->slot)) {
        t->slot = l;
        t->first = NULL;
    } else {
        t->first = l;
    }
    return true;
}

/* malloc through the device lock, before the door's bracket: a hit the lock makes possible
 * (true), else nothing changed. A classic slot on @p stream whose B is freed widens to a rounded
 * size below min_size and at least min_fit (counting the larger inactive split block first, its
 * peak guarded) and hands B out (fast_widen); or this thread's front of @p stream, which holds a
 * block for the request but whose grant was short, gets the room first (Note [front grants]). */
bool fast_lock_hit(struct dev_alloc *d, size_t size, CUstream stream, void **out);

/* xseg_free's first try: @p ptr is the block this thread's last hit handed out, and it goes back
 * to the slot under the slot's lock alone (true). False: nothing changed. */
static inline bool fast_free_hit(void *ptr)
{
    struct dev_slot *s = fast_tls.slot;
    if (!s || !spin_try(&s->lock))
        return false;
    bool hit = s->live == (uintptr_t)ptr; /* ptr is not NULL (xseg_free's) */
    if (hit) {
        s->live = 0;
        slot_set_freed(s, s->blk);
    }
    spin_release(&s->lock);
    return hit;
}

/* Take (release) the locks of the slots of @p busy (a busy_slots mask; device lock held), an own
 * slot's lanes after it: every debt can then be read at one instant. */
void fast_lock_busy(struct dev_alloc *d, uint64_t busy);
void fast_unlock_busy(struct dev_alloc *d, uint64_t busy);
/* Add to @p st what every busy slot owes it (fast_lock_busy held by the caller). */
void fast_owed(const struct dev_alloc *d, xseg_device_stats *st);
/* What every reader sees: d->acct.stats with the slots' debts (every busy slot locked at once, so
 * the copy is one state they were in together), then the active rows and "all" entries
 * (dev_stats_fold). Accumulated values are not rebased here. */
void dev_stats_copy(struct dev_alloc *d, xseg_device_stats *out);

#endif
