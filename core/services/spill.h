/*
 * Spill (spill_to_host, include/xseg.h, docs/configuration.md): when a malloc would fail after
 * the cache was released and the group asked, whole chunks of live blocks the program declared
 * cold move to host memory at the same addresses (vmm/segment.h: seg_move_chunk), so that their
 * device memory serves the request; promotion moves them back when device memory frees.
 *
 * The contract (docs/services.md "Spill to host memory"). A move copies a chunk and then remaps
 * its addresses: anything that touched the chunk in between would be lost (a write) or would
 * fault (a kernel across the remap). So a block moves only while the program has promised that
 * nothing touches it:
 *  - xseg_spill_hint(ptr, XSEG_SPILL_COLD) declares it: from that call on, no work touching it is
 *    queued (any stream, any thread, a graph, a peer) until xseg_spill_hint(ptr, XSEG_SPILL_NONE)
 *    returns. Work queued before the declaration may still run on the block's stream or a stream
 *    recorded on it (xseg_record_stream), as for a free; work on other streams has finished. The
 *    declaration records an event on each of those streams (alive then: the block is); before the
 *    first move of a block declared since the last wait, the events of every declaration are
 *    waited for (spill_quiesce, RELAXED capture mode), never the context: a context synchronize
 *    would invalidate a capture another thread may run, which xseg cannot see (issue 75). The
 *    epochs say which declarations a completed wait covers.
 *  - Spill, and the promotions of empty_cache, trim, xseg_promote and the idle thread, move
 *    declared blocks only; the idle thread never waits (it skips blocks declared after the last
 *    synchronize). A block that is not declared is never moved, except by its own
 *    xseg_spill_hint(ptr, XSEG_SPILL_NONE), which brings its pages back (the promise holds until it
 *    returns): where no device memory is found, they stay on host memory (valid, slower) and the
 *    next NONE tries again.
 *  - Every call runs under the device lock, a move whole inside one hold: the NONE that ends a
 *    declaration waits for a move in flight.
 * Copies go on spill's own stream, never on a program's (it may have destroyed it).
 *
 * Which pages: only chunks lying wholly inside one allocated block move, so every byte on a host
 * chunk belongs to one live block and no free byte on host memory is ever handed out (the block's
 * free drops its host chunks before its bytes join the free index: spill_on_free,
 * spill_after_free). Which blocks: declared ones, those the lifetime predictor called long-lived at
 * their declaration (core/device/placement.h, L1) first, then largest first, lowest address first:
 * an order kept as blocks are declared and freed (a heap), so that a spill costs what it moves and
 * at most SPILL_SKIP_MAX (64) blocks it must leave (pinned, or without a whole page of its own),
 * past which it gives up and says so. Promotion goes newest spill first (a list of the blocks with
 * host pages: it costs what is on host memory, not what is declared). Pinned
 * pages never move either way (spill_pinned: a registration in force, an export or handles of
 * the block alive, a segment observer attached, its pool asleep); nothing moves while a capture is
 * underway or debug_stale_access is on. A failed driver call rolls the chunk back to where it was
 * (seg_move_chunk), and what spill could not do is said in the OOM message.
 *
 * Where: host memory on the device's own NUMA node (seg_host_location), decided at the first move;
 * the stats spill_numa_node and spill_numa_fallback say which rule chose it.
 *
 * Books: a host chunk counts in spilled_bytes and num_spills, not in reserved_bytes (device memory
 * given back: num_device_free); promotion counts num_promotions and num_device_alloc.
 *
 * Locking: every function runs under the device lock (held on entry and return).
 */
#ifndef XSEG_CORE_SPILL_H
#define XSEG_CORE_SPILL_H

#include "core/device/device.h"

/* malloc_policy's spill step: move chunks of declared blocks to host memory until at least @p need
 * bytes of device memory were given back, or nothing more may move. XSEG_SUCCESS when some moved
 * (allocate again); XSEG_ERROR_OUT_OF_MEMORY when none did, with the reason kept for the OOM
 * message (spill_oom_info). Off (spill_to_host:False): OUT_OF_MEMORY, no reason. */
xseg_status spill_make_room(struct dev_alloc *d, size_t need);

/* Move host chunks of declared blocks back to the device, newest spill first, while the driver
 * and the memory fraction allow: empty_cache, xseg_promote and xseg_trim (@p wait: a context
 * synchronize where a declaration is newer than the last one), the idle pass (not @p wait: only
 * blocks whose declaration a synchronize covers already). The first failure (a driver call rolled
 * back, or OUT_OF_MEMORY naming what stays) stops it; XSEG_SUCCESS otherwise. */
xseg_status spill_promote(struct dev_alloc *d, bool wait);

/* The free of @p b (b->spill set; allocated already false, before it joins its pool): the record
 * goes; with host chunks, the work that may touch them is waited for unless the block's
 * declaration promises there is none (its recorded streams then need no events), and true is
 * returned: call spill_after_free with the block's segment and address once the free merged it.
 * @p st receives a failed wait's status (the free goes on). */
bool spill_on_free(struct dev_alloc *d, struct block *b, xseg_status *st);
/* Drop the host chunks of the free block now holding @p addr of segment @p s. */
void spill_after_free(struct dev_alloc *d, struct segrec *s, uintptr_t addr);
/* The block of spill_on_free went to debug_stale_access's quarantine instead of its pool: its
 * host chunks were given back with its canary swap, or go when it leaves (quarantine.c counts
 * spilled_bytes down): the spill's own count follows. */
void spill_after_quarantine(struct dev_alloc *d);

/* xseg_spill_hint: declare allocated block @p ptr cold (@p hint XSEG_SPILL_COLD), or end the
 * declaration and bring its pages back (XSEG_SPILL_NONE; the promise holds until it returns).
 * *owned: the block is this device's. */
xseg_status spill_hint(struct dev_alloc *d, void *ptr, int hint, bool *owned);
/* xseg_block_location: where allocated block @p ptr's bytes are (XSEG_LOCATION_*), how many are on
 * host memory and that memory's NUMA node (-1: none on host, or location HOST). */
xseg_status spill_location(struct dev_alloc *d, void *ptr, int *location, size_t *host_bytes, int *numa_node,
                           bool *owned);
/* Bytes of @p b's chunks on host memory (0 unless b->spill). */
size_t spill_block_host(const struct dev_alloc *d, const struct block *b);
/* The NUMA node of the device's host chunks: >= 0 for HOST_NUMA, -1 for location HOST or before
 * the first spill. */
int spill_numa_node(const struct dev_alloc *d);

/* Must the pages in [addr, addr + size) of @p d stay where they are? A registration in force
 * overlaps them (xseg_register_range, core/policy/registry.h), their pool sleeps, the block there
 * is exported or its handles held (both end with its free, or the last release), or a segment
 * observer is attached. The one predicate every move asks. */
bool spill_pinned(struct dev_alloc *d, uintptr_t addr, size_t size);

/* The OOM message's spill sentence (empty when spill is off), NUL-terminated in @p buf. */
void spill_oom_info(const struct dev_alloc *d, char *buf, size_t n);

/* xseg_shutdown: spill's own stream goes (the device holds no block, so no record). */
void spill_teardown(struct dev_alloc *d);

#endif
