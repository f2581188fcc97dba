/*
 * The types of a device allocator's sub-states (jemalloc's _structs.h idea): struct dev_alloc
 * (core/device/device.h) is a short list of these, each written only by the module that owns it
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
#include "vmm/segment.h" /* struct seg_spares */
#include "xseg.h"

struct block;

/* ---- expandable.c: the device's expandable segments (core/policy/expandable.h) ----------------- */

struct segrec;

struct exp_state {
    uint64_t seg_seq; /* expandable segments created so far (segrec.seq) */
    /* Expandable segments ordered by (pool, stream, seq): a growth finds the segments of its
     * (pool, stream) in O(log segments), whatever the number of streams. */
    struct segrec **by_stream;
    size_t nby_stream, capby_stream;
    /* Under pressure (exp_recycle_begin .. exp_recycle_end): the physical handles the reclaim
     * unmaps, kept for the growth that follows; empty whenever the lock is free. */
    struct seg_spares handles;
    bool keep_handles;
    /* Set at the first growth the device refused (exp_recycle_begin), until the memory fraction
     * changes (exp_pressure_reset; an empty_cache between layers does not end the pressure:
     * sqattn_qwen2_calib): growth maps smaller chunks meanwhile (chunk_limit). */
    bool fine_chunks;
};

/* ---- events.c: record_stream's events and the frees deferred to them (core/policy/events.h) ------- */

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

/* ---- the stream slots (dev_fast.slots, below; core/device/fast.h) ------------------------------------ */
/*
 * A stream slot: a depth-one delayed merge per stream for the malloc+free ping-pong, under a lock
 * of its own so that threads on their own streams do not meet on the device lock. Which free
 * leaves its block B in the slot instead of merging it into its free successor R, and which malloc
 * takes B's address again (a hit), is Note [slot rule] in core/device/fast.h; its free puts it
 * back. Neither touches the device lock, the index, the map or the statistics: what they owe is
 * the slot's (core/device/fast.h). Own slots (slots[DEV_STREAM_SLOTS ..]) hold the blocks of a
 * stream several threads use for the freeing thread (owner) in its front (struct dev_front below;
 * blk: one of them, the slot's busy mark; its other fields stay idle). A front's lane slots
 * (struct dev_front.lane) serve one entry each as a stream slot serves B, exact size: min_size
 * its size, span 0. A stream slot or lane slot is idle, holds B freed, or hands B out (enum
 * slot_state, core/device/fast.h).
 * Locking: the slot's fields are guarded by its lock; the fast paths read only B's address and
 * stream and write only the slot, so while the slot is busy B's own `allocated` (false), `size`
 * and `requested_size` are stale and the slot holds their truth (live, cur_size, cur_req), written
 * back at the settle. A slot is filled and settled only with the device lock held too.
 */
#define DEV_STREAM_SLOTS 32
#define DEV_OWN_SLOTS 32
#define DEV_SLOTS (DEV_STREAM_SLOTS + DEV_OWN_SLOTS)
struct dev_slot {
    struct spin lock;
    unsigned gen;          /* the permit (fast_gen) at the fill: a hit needs it current */
    struct dev_alloc *dev; /* the slot's device (set at the fill, read under the slot's lock): a
                            * thread's last slot is tried first (fast_hit), and may be another
                            * device's */
    const void *owner;     /* the thread that filled it (fast_self): a stream slot's, to see another
                            * thread's malloc on its stream; an own slot's, to find it again */
    struct dev_front *front; /* an own or lane slot's front (fast.fronts[k]; set at the fill) */
    struct block *blk;     /* B while the slot is busy, else NULL */
    struct block *freed;   /* B while freed by the user, not merged, else NULL (slot_state); written
                            * through slot_set_freed (peeked at without the lock) */
    uintptr_t live;        /* B's address while a hit has handed it out again, else 0 */
    size_t min_size;       /* the smallest rounded size a hit may take (at most B's size) */
    size_t min_fit;        /* the smallest rounded size eager best fit gives B's place (<= min_size):
                            * a classic slot widens min_size down to it (fast_widen) */
    size_t span;           /* B's size - min_size: a hit's rounded size r has r - min_size <= span */
    size_t base_req;       /* B's requested bytes as the statistics count them (its requested_size) */
    size_t cur_req;        /* the requested bytes of its last malloc (B's true requested_size) */
    size_t cur_size;       /* the rounded size of its last malloc (B's true size while live) */
    uint64_t reps;         /* hits since the fill, each a free + malloc pair not yet counted */
    /* size_sum sits between reps and req_sum, the two counts a lane's hit adds to (fast_take):
     * adjacent, GCC packed those two adds into one vector add of seven instructions. */
    size_t size_sum;       /* the hits' rounded sizes (not a lane's: its hits are reps x cur_size) */
    size_t req_sum;        /* their requested bytes */
#if XSEG_DEBUG_LEVEL >= 1
    uint64_t hits;         /* debug builds: added to dev_alloc.fast.slot_hits at the settle */
    uint64_t misses;       /* debug builds: tries that took the lock and served nothing (fast_hit_at),
                            * added to dev_alloc.fast.slot_misses at the settle */
#endif
} __attribute__((aligned(64))); /* threads on other slots share no cache line */

/*
 * A front (the blocks of own slot DEV_STREAM_SLOTS + k, fast.fronts[k]; core/device/fast.h,
 * "fronts"): up to FRONT_ENTRIES blocks of one thread and stream, each freed (fsize: its rounded
 * size, a hit's key) or handed out again by a hit (flive: its address, a free's key). Every entry
 * is counted allocated by d->acct.stats with its block's size and base_req requested bytes; the
 * sums say what the entries lower that by (low) and what their hits' mallocs counted (reps,
 * size_sum, req_sum), by statistics pool. Guarded by the own slot's lock; filled and settled with
 * the device lock too.
 */
#define FRONT_ENTRIES 64 /* the bits of a word: used, freed and the buckets are masks */
#define FRONT_BUCKETS 16
enum { FRONT_LOW_ALLOC, FRONT_LOW_BYTES, FRONT_LOW_REQ, FRONT_LOWS };
#define FRONT_GRANT_ROWS 3 /* allocation, allocated_bytes, requested_bytes */
#define FRONT_LANES 4      /* a front's lanes: the sizes a thread pairs in turn on the stream */
#define FRONT_LANE_HOLD 64 /* after lanes folded for room, the lanes a front lets pass first */
/* A front's hits between two check-ins: the hit after them goes through the device lock, which
 * looks whether the stream's other fronts were used meanwhile (a mark fades when none was). */
#ifndef FRONT_CHECK_HITS /* a measurement may set it (-DFRONT_CHECK_HITS=...: fronts kept) */
#define FRONT_CHECK_HITS 4096
#endif
struct dev_front {
    uint64_t used;                       /* entries holding a block */
    uint64_t freed;                      /* of them, freed (the others handed out by a hit) */
    uint64_t by_size[FRONT_BUCKETS];     /* freed entries by their size's bucket (front_bucket) */
    uint64_t by_addr[FRONT_BUCKETS];     /* handed-out entries by their address's bucket */
    size_t size[FRONT_ENTRIES];          /* the block's size */
    uintptr_t addr[FRONT_ENTRIES];       /* the block's address */
    struct block *blk[FRONT_ENTRIES];
    size_t base_req[FRONT_ENTRIES];      /* the requested bytes the statistics count for it */
    size_t cur_req[FRONT_ENTRIES];       /* its hit's requested bytes while handed out */
    uint8_t si[FRONT_ENTRIES];           /* its statistics pool (stat_index) */
    uint32_t nclassic;                   /* entries holding classic blocks */
    uint32_t cursor;                     /* where a full front looks for an entry to settle */
    CUstream stream;
    int64_t low[XSEG_STAT_POOLS][FRONT_LOWS];
    /* What its entries count in d->acct.stats (1, the block's size, base_req each), by pool: less
     * low, what its handed-out entries hold (front_grants' floor). */
    int64_t held[XSEG_STAT_POOLS][FRONT_LOWS];
    /* Its grant (how far its hits may raise allocation, allocated_bytes and requested_bytes, by
     * pool and all, without a peak unseen: front_grant) less its debt there. A hit takes from both
     * what it raises and a free gives both back, so only a share-out (front_grants) and an entry's
     * settle write it: a pair keeps one set of books, the debt (low). */
    int64_t gap[FRONT_GRANT_ROWS][XSEG_STAT_POOLS];
    /* Its lanes (Note [front lane], core/device/fast.h): lane[j] serves entry lane_entry[j]
     * (FRONT_ENTRIES: none) as a stream slot serves its B, for the rounded size whose
     * front_lane_index is j. A lane's entry is in used and lane_bits, in neither freed nor a
     * bucket, and owes nothing in low: the lane slot's own fields hold its state and its hits. */
    unsigned lane_entry[FRONT_LANES];
    uint32_t lanes;                   /* the busy lanes: bit j while lane_entry[j] < FRONT_ENTRIES */
    uint32_t locked_lanes;            /* the lanes fast_lock_busy took, until fast_unlock_busy (a fold
                                       * under those locks leaves lanes, never this) */
    uint64_t lane_bits;               /* the entries lanes serve */
    uint64_t lane_seen[FRONT_LANES];  /* each lane's hits (its reps) at the last check-in's look */
    size_t last_r[FRONT_LANES];       /* the rounded size of the last hit outside the lanes, by lane index */
    uint32_t lane_hold;               /* lanes not to enter yet: their blocks did not fit the room under
                                       * the peaks (lane_fold_fits sets FRONT_LANE_HOLD) */
    bool seen;            /* hit or freed into since the last check-in of another front of its stream */
    uint32_t since_check; /* hits since this front's last check-in (FRONT_CHECK_HITS) */
    uint64_t reps[XSEG_STAT_POOLS];
    int64_t size_sum[XSEG_STAT_POOLS], req_sum[XSEG_STAT_POOLS];
#if XSEG_DEBUG_LEVEL >= 1
    uint64_t lane_hits, lane_slot_hits; /* folded lanes' reps and hits, the device's at the settle */
    uint64_t lane_misses;               /* folded lanes' misses, the device's at the settle */
#endif
    /* The lanes' slots, last: a fresh fill clears the fields above and never these, whose locks a
     * thread that hit a lane before a settle may still try (fast_hit). Guarded by their own locks,
     * taken after the own slot's; filled and folded with the own slot's lock too. */
    struct dev_slot lane[FRONT_LANES];
} __attribute__((aligned(64))); /* two threads' fronts share no cache line */

/* ---- capreuse.c: graph_capture_record_stream_reuse (core/policy/capreuse.h) ---------------------- */

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


/* ---- pools.c: private pools and allocate-to-pool routes (core/policy/pools.h) --------------------- */
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


/* ---- sleep.c: sleep and wake (core/services/sleep.h) ------------------------------------------------ */
struct pool_sleep;
/* The default pools' sleep (NULL: awake), how many pools sleep (a rare condition: malloc takes
 * the general path while > 0), and the device's counts. */
/* Copy streams xseg owns for the chunks of sleep and wake (round robin, so chunks overlap). */
#define SLEEP_COPY_STREAMS 2
struct sleep_state {
    struct pool_sleep *sleep_default;
    unsigned nasleep;
    int64_t num_sleeps, num_wakes;
    CUstream copy[SLEEP_COPY_STREAMS]; /* created at the first sleep or wake, destroyed at shutdown */
    unsigned ncopy;
};


/* ---- sleeptags.c: the pools' tags (core/services/sleeptags.h) ------------------------------------ */
struct pool_tag {
    xseg_pool_id pool;
    char tag[XSEG_TAG_MAX]; /* NUL-terminated, never empty */
    bool seen;              /* the pool existed on the device when the tags were last looked at */
};
struct tag_state {
    struct pool_tag *v; /* in the order they were first set */
    size_t n, cap;
};


/* ---- spill.c: live pages moved to host memory out of memory (core/services/spill.h) ------------ */
/* A block the spill module knows (block.spill set): declared cold, or holding host chunks. */
struct spill_rec {
    struct block *b;  /* allocated (the record goes with its free: spill_on_free); NULL: an empty slot */
    uint64_t decl;    /* the epoch of its declaration (xseg_spill_hint COLD); 0: not declared */
    uint64_t seq;     /* when its first chunk moved (promotion goes newest first); 0: none on host */
    size_t host;      /* bytes of its chunks on host memory */
    size_t at;        /* 1 + its place in spill_state.order; 0: not there */
    struct block *older, *newer; /* its neighbours in the host list (seq != 0) */
    bool lives;       /* predicted long-lived at its declaration (spills before the rest) */
    /* While declared: xseg's events recorded at the declaration on the block's stream and its
     * record_stream streams (alive then: the block was), waited for by spill_quiesce instead of
     * the context, which would invalidate a capture another thread may run. */
    CUevent *ev;
    unsigned nev;
};
/* A declared block's place in the spill order (spill.c: ent_before). */
struct spill_ent {
    struct block *b;
    bool lives;
};
struct spill_state {
    struct spill_rec *tab;  /* open addressing on the block pointer, linear probes; cap a power of two */
    size_t cap, n;
    /* The declared blocks that may still give pages, a binary heap in spill order (the next to
     * spill at [0]): a spill takes from its front until the need is covered, whatever the number
     * of declared blocks. ncap >= ndecl, so that a block going back in never allocates. */
    struct spill_ent *order;
    size_t norder, ncap, ndecl;
    /* The records with host chunks, in the order their first chunk moved (promotion goes newest
     * first), linked through spill_rec.older / newer. */
    struct block *newest, *oldest;
    uint64_t seq;
    uint64_t epoch;         /* declarations made so far (each takes the next number) */
    uint64_t synced;        /* the events of every declaration up to `synced` completed (spill_quiesce) */
    size_t host_bytes;      /* spilled_bytes.all.current */
    CUstream copy;          /* spill's own stream for the moves' copies (made at the first move) */
    CUmemLocation where;    /* host memory's location (seg_host_location), once `placed` */
    bool placed;
    char why[256];          /* why the last OOM could not spill ("" : it did, or it is off) */
};

/* ---- device.c: the device's memory accounting (statistics, peaks, fraction) --------------- */
/* Written by device.c's accounting functions and by the malloc, free and segment release paths
 * whose counters move with the block (alloc.c, release.c); read elsewhere (core/index/stats.h). */
struct acct {
    xseg_device_stats stats;
    /* The accumulated values (.allocated, .freed, the num_* counts) at the last
     * devops_reset_accumulated, filled as a copy is: devops_get_stats hands out stats minus these,
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
    /* A memory budget in force (core/services/group.h, group_budget_measure): set by malloc_policy for a
     * growth, measured then, and cleared when the malloc returns, so only growth sees it. */
    bool set_budget;
    size_t budget_limit; /* the most total_allocated_memory may reach */
};


/* ---- placement.{h,c}: the lifetime predictor (core/device/placement.h, L1) ------------------------ */
#define LIFE_KEYS 1024 /* key table entries (a power of two) */
#define LIFE_DEPTH 4   /* blocks remembered a key */
/* One key (requested size, stream, pool) and its last LIFE_DEPTH blocks' addresses: eight words, the
 * n-th word of entry j the table's word 8 j + n (placement.h's tags and slots count words). */
struct life_key {
    size_t req; /* 0: an empty entry */
    CUstream stream;
    const void *pool;
    uintptr_t addr[LIFE_DEPTH]; /* words 3 to 6 */
    uintptr_t unused; /* word 7 (its count of records: placement.h, LIFE_RECS) */
};
struct life_state {
    uint64_t ring;  /* the last mallocs (0) and frees (1) the device lock saw, newest in bit 0, above
                     * them what is left of LIFE_RING_INIT (core/device/placement.h) */
    size_t home_tag; /* the fast path's malloc: its key's home entry's tag (LIFE_HOME_NONE: elsewhere),
                      * from its prediction to its record (core/device/placement.h, place_predict_home) */
    uint8_t l1; /* PLACE_REGIME_L1: L1 predicts (expandable mode with expandable_segments_recycle, not
                 * S1's regime); _S1, _OFF (placement.h, place_refresh_cfg): the fast path's one test */
    bool cls; /* S1 places by class: L1 on, a device under PLACE_CLASS_DEVICE_MAX (placement.h, place_refresh_cfg) */
    uint8_t want; /* S1: the segments a growth may use (PLACE_SEG_*), for its span */
    union {
        struct life_key keys[LIFE_KEYS]; /* allocated with the device (no malloc allocates for it) */
        uintptr_t words[LIFE_KEYS * 8];  /* the same, word by word (placement.h's tags and slots) */
    };
    uint8_t live[LIFE_KEYS * 8]; /* live[w]: the address in the table's word w (an addr slot) is still
                                  * allocated, or not yet recorded past the first two (placement.h,
                                  * LIFE_LIVE_NEW); a byte a word, one index for both; an entry's
                                  * eighth byte counts its records (LIFE_RECS), its first is S1's short
                                  * mark (LIFE_SHORT), its second and third unused */
};

/* ---- quarantine.{h,c}: the stale-access debug mode (core/device/quarantine.h) ------------------- */
struct hstack;
/* A freed block held out of its pool (FIFO order), or a finding (a block found written after its
 * free). Addresses and sizes are copied: a finding outlives its block. */
struct quar_item {
    struct block *b;           /* NULL in a finding */
    uintptr_t addr;
    size_t size, requested;
    CUstream stream;
    int pool;                  /* XSEG_STAT_SMALL_POOL or XSEG_STAT_LARGE_POOL */
    bool expandable;
    bool filled;               /* the pattern was queued at the free: the check means something */
    size_t swap_lo, swap_hi;   /* [lo, hi) of the block (offsets): its chunks given back, one canary
                                * page mapped there instead (equal: none); unmapped when it leaves */
    bool reported;             /* a finding was made for it already */
    CUmemGenericAllocationHandle canary; /* with a swap: the canary page's reference (seg_canary_release) */
    struct block *spare[2];    /* with a swap: the block structs its leave re-tiles with (no allocation then) */
    bool stuck;                /* never checked: a canary could not be mapped whole, or its release
                                * failed (then it stays, tried again at its next exit) */
    struct hstack *alloc_stack, *free_stack; /* one reference each (NULL: none recorded) */
    int64_t freed_us, found_us;
    size_t first_offset;       /* findings: the first byte that lost the pattern */
    const char *when;          /* findings: "quarantine exit", "empty_cache", "snapshot", "xseg_check_stale", "xseg_shutdown" */
    bool delivered;            /* findings: given to the observers (or stderr) */
};
struct quar_state {
    struct quar_item *q;       /* q[head .. head + n): the oldest first */
    size_t head, n, cap;
    size_t bytes;              /* block bytes held */
    struct hstack *free_stack; /* the stack of the free in progress (free_stale), or NULL */
    struct quar_item *found;   /* findings, oldest first, at most QUAR_MAX_FINDINGS */
    size_t nfound, capfound, ndelivered;
    uint64_t dropped;          /* findings beyond the bound (counted, not kept) */
    uint64_t entered, checked, unfilled;
    size_t stuck;              /* items marked stuck */
    unsigned char *buf;        /* the checks' read-back buffer (QUAR_BATCH_BUF), kept for the device's life */
    bool buf_pinned;           /* from vhost_alloc (else host malloc: pinned memory lacked) */
    struct quar_batchbuf *bb;  /* the fill and check batches' host scratch (quarantine.c), or NULL */
    CUstream work;             /* its own stream for fills and checks (NULL: the legacy stream) */
    CUevent join_ev;           /* recorded on a block's stream at its free, waited for by work */
    bool work_tried;           /* work and join_ev were asked for (once a device) */
    bool unjoined;             /* a block was freed without a join: the next flush waits for the context */
    bool join_legacy;          /* a block was freed on the legacy stream: the next flush joins it */
};

/* ---- sharing.h: which streams several threads use at once (core/device/sharing.h) ------------ */
/* One entry a stream slot index (fast_slot_index): the stream marked shared there, and the classic
 * probe of a stream there, its prober and its quiet countdown. The states they make are
 * enum sharing_state's (core/device/sharing.h). */
struct sharing_entry {
    CUstream shared;   /* the stream marked shared here, while any.shared has the entry's bit */
    CUstream stream;   /* the stream of the entry's last probe (free_beside, fast.c) */
    const void *owner; /* its prober (fast_self) */
    uint8_t quiet;     /* frees of owner on stream still to come without a probe (a lone thread) */
};
struct sharing {
    union {
        struct {
            uint32_t shared; /* bit i: entry[i].shared is marked */
            uint32_t probed; /* bit i: entry[i]'s probe is open */
        } any;
        uint64_t any_either; /* both at once: the fast paths' one test (sharing_any) */
    };
    struct sharing_entry entry[DEV_STREAM_SLOTS];
};

/* ---- fast.{h,c}: the fast path's permit and its stream slots (core/device/fast.h) ------------------- */
struct dev_fast {
    /* The permit: equal to cfg_gen while none of the rare conditions the fast paths skip holds
     * (FAST_RARE, core/device/fast.h), else 0 (no generation is 0). One test for all of them;
     * dev_fast_off takes it, dev_fast_update grants it again. */
    unsigned fast_gen;
    /* Bit i is set while slots[i] holds a block (exact under the device lock). */
    uint64_t busy_slots;
    /* Which streams several threads use at once, and the probes that find them out
     * (struct sharing, core/device/sharing.h). */
    struct sharing sharing;
    /* The block of the last malloc through the device lock: only a free of it fills a slot (a
     * ping-pong frees what it just allocated). Compared, never dereferenced. */
    const struct block *last_alloc;
#if XSEG_DEBUG_LEVEL >= 1
    /* Debug builds count, so that tests and bench_slot_counts see the slots used: */
    uint64_t slot_hits;     /* hits of settled slots */
    uint64_t slot_misses;   /* their tries that took the lock and served nothing (a busy slot's
                             * and a busy front's lanes' are still theirs) */
    uint64_t lock_mallocs;  /* mallocs through the device lock (malloc_locked, fast_lock_hit's included) */
    uint64_t lock_frees;    /* frees through the device lock (free_locked) */
    uint64_t settles;       /* slots settled */
    uint64_t settles_cross; /* of them, by an operation on another slot's stream for its statistics */
    uint64_t own_fills;     /* own slots filled (frees on shared streams) */
    uint64_t shared_marks;  /* streams marked shared */
    uint64_t shared_fades;  /* marks faded (front_check_in, fast.c) */
    uint64_t idle_settles;  /* fronts settled unused for a check period, their stream still shared */
    uint64_t lane_hits;     /* lanes' hits, counted at their front's settle (Note [front lane]; a
                             * folded lane's are its front's lane_hits until then, a busy lane's
                             * its lane slot's reps) */
#endif
    /* A stream's is slots[fast_slot_index(stream)]; the own slots follow (DEV_STREAM_SLOTS ..). */
    struct dev_slot slots[DEV_SLOTS];
    /* The own slots' blocks: fronts[k] is slots[DEV_STREAM_SLOTS + k]'s. */
    struct dev_front fronts[DEV_OWN_SLOTS];
};

#endif
