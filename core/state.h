/*
 * The types of a device allocator's sub-states (jemalloc's _structs.h idea): struct dev_alloc
 * (core/device.h) is a short list of these, each written only by the module that owns it
 * (tests/build/layering.sh checks the writes) and read elsewhere through its accessors. A leaf
 * header: types only, no functions, so that device.h embeds a module's state without including
 * the module (the modules sit above device.h and call down into it).
 *
 * Locking: every field is guarded by the device lock (dev_alloc.lock) unless marked otherwise.
 */
#ifndef XSEG_CORE_STATE_H
#define XSEG_CORE_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "base/assert.h"
#include "base/lock.h"
#include "xseg.h"

struct block;

/* ---- events.c: record_stream's events and the frees deferred to them (core/events.h) ------- */

/* A per-stream FIFO of (event, block) pairs recorded by frees of record_stream'ed blocks. */
struct ev_item {
    CUevent event;
    struct block *block;
};
struct ev_queue {
    CUstream stream;
    struct ev_item *items;
    size_t head, count, cap; /* ring buffer */
};

struct ev_state {
    struct ev_queue *evq;
    size_t nevq, capevq;
    size_t pending_events;    /* events in all queues: the fast path polls only when > 0 */
    CUevent *event_pool;
    size_t nevent_pool, capevent_pool;
    struct block **deferred;  /* freed during a capture: events recorded once it ends */
    size_t ndeferred, capdeferred;
};

/* ---- the stream slots (dev_fast.slots, below) ----------------------------------------------- */
/*
 * The stream slots: a depth-one delayed merge per stream for the malloc+free ping-pong
 * (core/README.md, "Locking and the fast path"), each under a lock of its own so that threads on
 * their own streams do not meet on the device lock. A free on the common path whose block B has
 * a free successor R and no free predecessor (and whose merge would move no counter up) leaves B
 * in its stream's slot instead of merging it into R: B stays out of the free index, R keeps its
 * own key.
 * A malloc of B's rounded size on B's stream that best fit would serve by splitting exactly B off
 * the merged block (lazy_fits, tested when the slot is filled) hands B out again (a lazy hit).
 * Neither touches the device lock, the index, the live map or the statistics: while a slot is
 * busy the statistics count B as allocated with base_req requested bytes, the slot tallies the
 * pairs it served, and the fold (dev_slot_fold) adds what the eager frees and mallocs would have
 * added. Every pair leaves each counter where it was or lower (a hit asks for at most base_req),
 * so no peak can be missed; a counter that would move up (a free that makes a split block) keeps
 * the eager path.
 * Locking: a slot's fields are guarded by the slot's lock. The fast paths only read B (its
 * address, size and stream never change while it is in the slot) and write only the slot, so
 * threads on other slots share no written cache line: while the slot is busy, B's own
 * `allocated` (false) and `requested_size` (base_req) are stale and the slot holds their truth
 * (live, cur_req), written back when it settles. A slot is filled and emptied (settled) only with
 * the device lock held too (device lock first), so a busy slot stays busy until a device-lock
 * holder settles it, and busy_slots is exact under the device lock.
 */
#define DEV_SLOTS 32
struct dev_slot {
    struct spin lock;
    unsigned gen;          /* the fast path's permit (fast_gen) at the fill: a hit needs it current */
    struct block *lazy;    /* B freed by the user, not merged; NULL while handed out (live) */
    struct block *live;    /* B handed out again by a hit: allocated, still in `live` */
    size_t base_req;       /* B's requested bytes as the statistics count them (its requested_size) */
    size_t cur_req;        /* the requested bytes of its last malloc (B's true requested_size) */
    uint64_t reps;         /* hits since the fill, each a free + malloc pair not yet counted */
    size_t req_sum;        /* the requested bytes of those hits */
#if XSEG_DEBUG_LEVEL >= 1
    uint64_t hits;         /* debug builds: added to dev_alloc.fast.lazy_hits at the settle */
#endif
} __attribute__((aligned(64))); /* one cache line each: threads on other slots do not share it */

/* ---- capreuse.c: graph_capture_record_stream_reuse (core/capreuse.h) ---------------------- */

/* An open-addressing map from graph nodes to a pointer (NULL: present with no value). */
struct cr_nodemap {
    uintptr_t *keys; /* 0 = empty */
    void **vals;
    size_t cap, count;
};

/* A block freed during the capture, with its markers, waiting on markers[next]. */
struct cr_entry {
    struct block *block;
    size_t deferred_slot;     /* its index in the device's deferred list */
    CUgraphNode *markers;
    size_t nmarkers, next;
    struct cr_entry *link;    /* next waiter on the same node, or next ready entry */
};

/* A dependency of the stream at its last walk, and whether the current walk reached it again. */
struct cr_term {
    CUgraphNode node;
    bool hit;
};

/* Per (capture, stream): the nodes known to precede the stream's dependency set, and the
 * entries of that stream, each filed under the first of its markers not yet reached (so a node
 * reached by the walk wakes exactly the entries waiting on it: the check costs O(markers) per
 * block over the whole capture, not O(blocks) per allocation). */
struct cr_walk {
    unsigned long long capture_id;
    CUstream stream;
    struct cr_nodemap seen;     /* reached nodes (values unused) */
    struct cr_nodemap waiting;  /* node -> list of entries waiting on it */
    struct cr_entry *ready;     /* entries whose markers were all reached */
    size_t nentries;
    size_t nwaiting;            /* entries filed in `waiting` (not ready) */
    CUgraphNode *frontier;      /* reached nodes whose dependencies were not read yet */
    size_t nfrontier, capfrontier;
    struct cr_term *terms;      /* the stream's dependencies at the last walk */
    size_t nterms, capterms, nhit;
};

struct capreuse {
    struct cr_walk *walks;
    size_t nwalks, capwalks;
    size_t n;                 /* entries in all walks */
    CUgraphNode *queue;       /* the walk's work list (first in, first out) */
    size_t capqueue;
    struct cr_entry *collected; /* found reusable by capreuse_collect, for capreuse_take */
    uint64_t nodes_read;      /* dependency lists read from the driver */
    uint64_t reused;          /* blocks returned to their pool during a capture */
};


/* ---- device.c: the capture state (dev_capture_note, dev_capture_underway) ----------------- */
/* Streams seen capturing. While non-empty every malloc re-checks them (and its own stream): this
 * is how the allocator "knows a capture might be underway" without a driver call on the fast path
 * otherwise. */
struct cap_state {
    CUstream *capturing;
    size_t ncapturing, capcapturing;
};


/* ---- pools.c: private pools and allocate-to-pool routes (core/pools.h) --------------------- */
struct priv_pool;
struct pool_route;
/* Private pools and the allocate-to-pool routes in force, oldest first (PyTorch's graph_pools and
 * captures_underway). While nroutes > 0 a capture is taken to be underway: no event is queried,
 * frees with recorded streams are deferred, nothing is released. */
struct pool_state {
    struct priv_pool *pools;
    struct pool_route *routes;
    size_t nroutes, caproutes;
};


/* ---- sleep.c: sleep and wake (core/sleep.h) ------------------------------------------------ */
struct pool_sleep;
/* The default pools' sleep (NULL: awake), how many pools sleep (a rare condition: malloc takes
 * the general path while > 0), and the device's counts. */
struct sleep_state {
    struct pool_sleep *sleep_default;
    unsigned nasleep;
    int64_t num_sleeps, num_wakes;
};


/* ---- device.c: the device's memory accounting (statistics, peaks, fraction) --------------- */
/* Written by device.c's accounting functions and by the malloc, free and segment release paths
 * whose counters move with the block (alloc.c, release.c); read elsewhere (core/stats.h). */
struct acct {
    xseg_device_stats stats;
    /* The accumulated values (.allocated, .freed, the num_* counts) at the last
     * alloc_reset_accumulated, filled as a copy is: alloc_get_stats hands out stats minus these,
     * so the internal counters keep freed == allocated - current. */
    xseg_device_stats acc_base;
    /*
     * The `active` rows are folded at query time (dev_stats_copy), so malloc and free leave them
     * alone: d->acct.stats.active and .active_bytes stay zero. A block is active while allocated or
     * pending (freed by the user, waiting for its events or a capture's end), so per pool
     * active = allocation + pending, in blocks and in bytes (both count block sizes), and
     * active's allocated is allocation's (both count at malloc). The peaks: active rises only at
     * a malloc, where allocation rises by as much, and equals it while nothing is pending, so
     * active.peak = max(active_peak, allocation.peak), with active_peak raised at every malloc
     * made while something is pending (dev_track_active_peak, from malloc_slow: the fast paths
     * never run then, their permit being off while events or deferred frees exist) and set to
     * active.current at a peak reset. [XSEG_STAT_ALL] of pending holds the sum of the pools.
     */
    int64_t pending[XSEG_STAT_POOLS], pending_bytes[XSEG_STAT_POOLS];
    int64_t active_peak[XSEG_STAT_POOLS], active_bytes_peak[XSEG_STAT_POOLS];
    size_t total_allocated_memory; /* bytes reserved from the driver (mapped or cuMemAlloc'd) */
    size_t allowed_memory_maximum;
    bool set_fraction;
    double fraction;
};


/* ---- device.{h,c} and alloc.c: the fast path's state (step 1 of issue 32 merges its four
 * deferral mechanisms: the permit, the stream slots, the deferred merge and the deferred insert) */
struct dev_fast {
    /* The fast path's permit: equal to cfg_gen while none of the rare conditions it skips holds
     * (streams seen capturing, routes, pending events, deferred frees, roundup divisions), else
     * 0 (no generation is 0). alloc_malloc compares it with the global generation: one test for
     * all of them. Every place that starts a rare condition calls dev_fast_off; malloc_prepare
     * grants it again once they are all over (dev_fast_update). */
    unsigned fast_gen;
    /* Bit i is set while slots[i] holds a block (exact under the device lock). */
    uint32_t busy_slots;
    /* The live map's insert of the last fast-path malloc, left to the next holder of the lock: the
     * malloc prefetched the slot and reserved room for it, so the caller's own work until its next
     * call hides the slot's cache miss (at a million live blocks, one DRAM latency a malloc), and
     * the insert cannot fail. NULL when none; every lock taker settles it first (dev_lock_raw,
     * dev_acquire), so nothing but the rest of that malloc ever sees the map without it. */
    struct block *live_pending;
    /* The last fast-path free's merge and index insert, left to the next holder of the lock (the
     * free's counters but inactive_split are down already). The free prefetched the block's
     * neighbours, whose state the merge reads (at a million live blocks, one DRAM latency), so
     * the caller's work and the next malloc's search hide it. Every lock taker settles it first
     * (dev_lock_raw, dev_acquire), except the fast-path malloc (malloc_locked): a pending block
     * no larger than the request is settled before the search; a larger one after the malloc
     * when it cannot change what the search found (free_pending_keeps_fit), else before a second
     * search. */
    struct block *free_pending;
    /* Live blocks from which a fast-path free defers its merge (free_pending). Below, the blocks'
     * structs stay cached and the deferral's bookkeeping would cost more than it hides: ~2-3 % of
     * the churn pair at 10^4 blocks and ~6 % at 10^3 (benchmarks/bench_scale.c --only live,
     * docs/benchmarks-host.md). Debug builds defer always, so that every test runs the deferred
     * path under dev_check. */
    size_t free_defer_min;
    /* The block of the last malloc that went through malloc_finish: only a free of it fills a slot
     * from free_locked (a ping-pong frees what it just allocated; a free of an older block rarely
     * sees its size asked for next). Compared, never dereferenced: a stale value only sends a free
     * down one path or the other, both exact. */
    const struct block *last_alloc;
#if XSEG_DEBUG_LEVEL >= 1
    uint64_t lazy_hits; /* debug builds: lazy hits of settled slots, so a test can see them used */
#endif
    /* The stream slots (struct dev_slot): a stream's is slots[dev_slot_index(stream)]; bit i of
     * busy_slots is set while slots[i] holds a block. */
    struct dev_slot slots[DEV_SLOTS];
};

#endif
