/*
 * The stale-access debug mode (debug_stale_access, debug_quarantine_mb; issue 50, seed 003):
 * freed blocks are held out of their pool in a FIFO of at most debug_quarantine bytes, filled
 * with all-ones bytes (NaN in fp32/fp16/bf16) on the quarantine's own stream, ordered after the
 * block's last use on its stream by an event recorded there at the free (the program may destroy
 * its stream once the block is freed: no call names it afterwards; vmm/stream.h), in batches of
 * debug_stale_fill_batch blocks (one vkern_fill launch;
 * every check and xseg_stale_flush fill the waiting ones first: between a free and its fill a
 * stale write is overwritten, the batch's documented window), and checked when they leave it,
 * at empty_cache, at snapshot time and on demand (xseg_check_stale). Checks go by batches (the
 * blocks leaving together, down to QUAR_EXIT_LOW_EIGHTHS of the bound, or all of them, as when a
 * malloc would grow reserved memory with more than a quarter of the bound held: quar_before_growth):
 * whole blocks compared on the device (one vkern_check and its wait), after a wait for the whole
 * context, so that every write queued before the check lands first. Without the kernels
 * (vkern_ready: NOT_SUPPORTED) a memset per range fills, and checks read back into one host
 * buffer of copies with one wait, sampled unless debug_stale_full_check (a
 * block up to 256 KiB whole, else its first and last 4 KiB and 4 KiB every 4 MiB). In expandable
 * segments the whole chunks inside a block are given back at its free and a canary page mapped
 * there (vmm/segment.h seg_canary_swap; reserved bytes drop); when it leaves, the canary is
 * unmapped and the range left unmapped (free address space, mapped by a later malloc). A block
 * whose canary cannot be unmapped stays quarantined (stuck: never checked again, tried again at
 * its next exit), the failure returned by the check or empty_cache. A byte that lost the pattern
 * is a write after the free: a finding, naming the block, its allocation's and its free's stacks
 * (history), the first changed offset and when it was found, delivered to the stale observers or
 * stderr with no lock held (quar_take / quar_deliver) and kept for snapshots.
 *
 * A quarantined block is pending, like a block waiting for record_stream's events: not
 * allocated, out of every index, one quarantine hold in its side struct's event_count (so no
 * merge takes it and dev_check counts it active), its free_completed recorded when it leaves.
 * Not quarantined (they go straight back): blocks of private pools (a graph's replays own
 * them), blocks larger than the whole quarantine, and any block when host memory for the
 * record is lacking. While a capture is underway nothing is filled, checked or released (a
 * driver call on a capturing stream would join the graph): blocks freed then are held unfilled
 * (never reported) and the FIFO may pass its bound until the capture ends.
 *
 * The mode costs nothing while off: the free path reads settings_stale_on() once before the
 * device lock (core/alloc.c free_stale), and the fast-path permit is off while it is on
 * (dev_fast_update), so every free goes through the quarantine; never on the cached-pair path.
 *
 * Locking: device lock held by every function unless it says otherwise.
 */
#ifndef XSEG_CORE_QUARANTINE_H
#define XSEG_CORE_QUARANTINE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/device.h"

#define QUAR_POISON 0xFFu /* the pattern: all-ones bytes, NaN in fp32, fp16 and bf16 (also the host cache's) */
/* The first byte of host bytes @p p[0, n) that is not QUAR_POISON, or n. No lock. */
size_t quar_first_changed(const unsigned char *p, size_t n);
#define QUAR_MAX_FINDINGS 1024 /* findings kept a device (later ones are counted in `dropped`) */
#define QUAR_MAX_BLOCKS ((size_t)1 << 20) /* blocks held a device: their records' host memory is bounded too */
/* quar_item.pool of a pinned host block's finding (core/services/hostquar.h: batch device -1,
 * no stream): quar_deliver names it as host memory. */
#define QUAR_POOL_HOST (-1)

/* Freed block @p b (not allocated, no events or recorded streams left; @p pending: already
 * counted pending) enters the quarantine when the mode is on and it qualifies: true, and it is
 * now pending with the quarantine's hold; older blocks may leave to keep the bound. false: the
 * caller returns it to its pool as usual (nothing changed). */
bool quar_enter(struct dev_alloc *d, struct block *b, bool pending);
/* The stack of the free in progress (taken by its quarantine entry; released by quar_end_free
 * when no entry took it). */
void quar_begin_free(struct dev_alloc *d, struct hstack *free_stack);
void quar_end_free(struct dev_alloc *d);
/* Freed block @p b waits for record_stream's events: the free's stack moves to its side struct,
 * for quar_enter (from events.c) to take. */
void quar_keep_free_stack(struct dev_alloc *d, struct block *b);
/* Freed block @p b waits for record_stream's events before it enters: order the quarantine's
 * stream after @p b's stream now, at its free, while the program keeps that stream alive. */
void quar_join(struct dev_alloc *d, struct block *b);
/* Check every quarantined block (a finding each, once) and, with @p drain or the mode off,
 * release them all; @p when names the occasion. XSEG_ERROR_ILLEGAL_STATE during a capture
 * (nothing done). *@p found (optional): findings made. */
xseg_status quar_check_all(struct dev_alloc *d, const char *when, bool drain, size_t *found);
/* Queue the fills waiting for their batch (debug_stale_fill_batch) now: one launch per stream,
 * or the driver's memsets when the allocator's kernels do not run; @p when names the caller.
 * XSEG_ERROR_ILLEGAL_STATE during a capture (nothing done: its blocks wait until it ends). */
xseg_status quar_flush(struct dev_alloc *d, const char *when);
/* A malloc found no cached block and is about to grow reserved memory: a quarantine holding more
 * than QUAR_GROW_EIGHTHS of its bound (a quarter) empties first, every block checked (quarantine.c).
 * true: some went back to their pools (search the cache again). Never during a capture. */
bool quar_before_growth(struct dev_alloc *d);
/* Blocks and bytes held now. */
size_t quar_count(const struct dev_alloc *d, size_t *bytes);

/* Undelivered findings, taken under the lock (their stacks referenced) for quar_deliver. */
struct quar_batch {
    int device;
    struct quar_item *v;
    size_t n;
};
void quar_take(struct dev_alloc *d, struct quar_batch *out);
/* Deliver @p b to the observers or stderr and release it. No lock held. */
void quar_deliver(struct quar_batch *b);
/* The findings kept (snapshots: read under the lock). */
static inline const struct quar_item *quar_findings(const struct dev_alloc *d, size_t *n)
{
    *n = d->quar.nfound;
    return d->quar.found;
}
/* The quarantined block records, oldest first: quar_at(d, i) for i < d->quar.n. */
static inline const struct quar_item *quar_at(const struct dev_alloc *d, size_t i)
{
    return &d->quar.q[d->quar.head + i];
}
/* Give back the quarantine's arrays and stacks, and unload the allocator's kernels from the
 * device's context (an emptied device: quar_check_all drained it). */
void quar_destroy(struct dev_alloc *d);

#endif
