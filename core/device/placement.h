/*
 * Placement (issue 48 item 4): where a large request in expandable mode goes, and how large the
 * chunks are that back it. Every rule and the constant it turns on is in the table below, with what
 * the constant trades, the record that measured it (docs/benchmarks-replay.md, the row named) and
 * the test that guards it (tests/alloc/test_fit.c). A rule changes by its row, re-measured on the
 * row's benchmark and test, never for one trace.
 *
 *  rule  constant (value)            trades                           record row; test
 *  ----  --------------------------  -------------------------------  --------------------------------
 *  L1    PLACE_LIFE_WINDOW (64)      a longer window reacts later to  #lifetime-placement,
 *        PLACE_LIFE_TWINS (2)        a new phase; fewer twins put     "size-live+frees";
 *        LIFE_DEPTH (4, state.h)     more short blocks on top         fit_training_step,
 *        LIFE_KEYS (1024, state.h),  host memory (in the device's     fit_top_placement(_off)
 *        PLACE_LIFE_PROBES (8)       state) against forgotten keys
 *  L2    PLACE_TOP_WALK_MAX (4096)   host time under the lock against #lifetime-placement, "highest
 *                                    a lower block taken              fitting block, its top end";
 *                                                                     fit_top_placement
 *  C1    PLACE_DEVICE_CHUNK_DIV      smaller chunks give more back    "The 1 % bar", Small devices
 *        (512)                       around live blocks; at most      (bcrafton); fit_small_device,
 *                                    1,024 chunks a device            fit_small_device_pages,
 *                                                                     fit_large_device_pages
 *  C2    PLACE_NEAR_FULL_DIV (8)     driver calls near a full device  "The 1 % bar" (codeloc_qwen3_
 *                                    against what a refusal can give  gnn_3gpu-dev2); fit_fragmented
 *  C3    PLACE_FINE_CHUNK_DIV (16)   granule chunks fit as well but   #chunk-size (sqattn_qwen2_calib:
 *                                    cost 5x the calls                33,093 calls against 176,842);
 *                                                                     fit_fragmented_after_refusal,
 *                                                                     fit_kept_handles
 *
 *  L1  A large request is predicted long-lived when frees outnumbered mallocs among the last
 *      PLACE_LIFE_WINDOW the device lock saw and the last 2 to LIFE_DEPTH blocks of its (requested
 *      size, stream, pool) are all still allocated (a training step's gradients and optimizer
 *      states match, a forward pass's activations do not).
 *  L2  A predicted-long request takes the top end of the highest fitting free block (newer
 *      segment, then higher address), everything else best fit: long-lived blocks collect above
 *      the holes best fit reuses.
 *  C1  On a device under 10 GiB a chunk is at most 1/PLACE_DEVICE_CHUNK_DIV of the device (in
 *      granules): a page shared with a long-lived block can still give back its freed part.
 *  C2  Within the device's (or fraction's) last 1/PLACE_NEAR_FULL_DIV, memory is mapped as under
 *      pressure (C3): a later refusal has to give back what is mapped there first.
 *  C3  After a refused growth a chunk is 1/PLACE_FINE_CHUNK_DIV of its request (granules to a
 *      page), or the largest kept handle's size while handles wait to be mapped again.
 *
 * All with expandable_segments_recycle only (off: PyTorch's layout, one chunk a page, best fit);
 * an explicit expandable_chunk_mb replaces C1. A run that never meets pressure on a device of
 * 10 GiB or more (the six pytorch/ traces on 80 GiB) makes the same driver calls without C1-C3.
 * L1 is O(1) a malloc or free, allocates nothing, calls no driver; a slot's block
 * (core/device/fast.h) is seen at its malloc and at the free that settles it. Locking: the device
 * lock, for all of it.
 */
#ifndef XSEG_CORE_PLACEMENT_H
#define XSEG_CORE_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "base/common.h"
#include "core/device/device.h"

#define PLACE_LIFE_WINDOW 64     /* L1: mallocs and frees in the window (the bits of life_state.ring) */
#define PLACE_LIFE_TWINS 2       /* L1: live blocks of the key needed, at least */
#define PLACE_LIFE_PROBES 8      /* L1: key entries probed from a key's home before one is replaced */
#define PLACE_TOP_WALK_MAX 4096  /* L2: free blocks a top-fit search looks at, at most */
#define PLACE_DEVICE_CHUNK_DIV 512 /* C1 */
#define PLACE_NEAR_FULL_DIV 8    /* C2 */
#define PLACE_FINE_CHUNK_DIV 16  /* C3 */

/* L1: a malloc (@p is_free 0) or a free (1) enters the window. */
static inline __attribute__((always_inline)) void life_note(struct life_state *l, unsigned is_free)
{
    l->ring = l->ring << 1 | is_free;
    l->events++; /* not saturated here: one instruction (the window's count is min(events, 64)) */
}

/* L1: predicted long: frees lead the window, and the key's last blocks (2 to LIFE_DEPTH) are live. */
bool life_predict_long(const struct life_state *l, size_t req, CUstream stream, const void *pool);

/* L1 for a malloc of @p size rounded bytes (@p requested asked): large requests in expandable
 * mode with expandable_segments_recycle only; without it, PyTorch's layout. */
static inline bool place_predict_long(const struct dev_alloc *d, size_t size, size_t requested, CUstream stream,
                                      const void *pool)
{
    return size > BLOCK_SMALL_SIZE && d->use_expandable && d->cfg.expandable_segments_recycle &&
           life_predict_long(&d->life, requested, stream, pool);
}

/* A block at @p addr was handed out for the key: it replaces the key's oldest (a full table
 * replaces an entry; never fails). */
void life_record(struct life_state *l, size_t req, CUstream stream, const void *pool, uintptr_t addr);

/* The block at @p addr of the key was freed: no longer live (nothing when it is not recorded). */
void life_forget(struct life_state *l, size_t req, CUstream stream, const void *pool, uintptr_t addr);

/* L2: is free block @p a higher than @p best (NULL: yes)? A newer segment (expandable.c's
 * seg_order_less), else a higher address in the same one. (The oldest segment's top instead
 * changed nothing that counts: docs/benchmarks-replay.md#lifetime-placement.) */
static inline bool place_top_higher(const struct block *a, const struct block *best)
{
    if (!best)
        return true;
    if (a->seg != best->seg && a->seg->seq != best->seg->seq)
        return a->seg->seq > best->seg->seq;
    return a->addr > best->addr;
}

/* C1-C3: the largest chunk (one physical allocation, vmm/segment.h) of a growth of @p size bytes in
 * @p pool whose segment has pages of @p page and granules of @p gran: the page (PyTorch's layout,
 * one handle a page) unless expandable_chunk_mb asks for smaller chunks, the device is small (C1),
 * near full (C2) or has refused a growth (C3). A chunk is given back only whole, so smaller chunks
 * let the OOM path give back more of what freed blocks leave between live ones. Mappings still
 * cover whole pages (reserved memory is PyTorch's). The small pool's chunks are its 2 MiB pages.
 * Device lock held. */
size_t place_chunk_limit(const struct dev_alloc *d, const struct bpool *pool, size_t page, size_t gran, size_t size);

#endif
