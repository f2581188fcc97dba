/*
 * Spill (spill_to_host, include/xseg.h, docs/configuration.md): when a malloc would fail after
 * the cache was released and the group asked, whole chunks of live blocks move to host memory at
 * the same addresses (vmm/segment.h: seg_move_chunk), so that their device memory serves the
 * request; promotion moves them back when device memory frees (empty_cache, xseg_promote).
 *
 * Which pages: only chunks lying wholly inside one allocated block move, so every byte on a host
 * chunk belongs to one live block and no free byte on host memory is ever handed out (the block's
 * free drops its host chunks before its bytes join the free index: spill_on_free,
 * spill_after_free). Which blocks: those hinted cold (xseg_spill_hint) first, then those the
 * lifetime predictor calls long-lived (core/device/placement.h, L1), then the rest; largest first in
 * each class. Promotion goes newest spill first (so hinted blocks come back last).
 *
 * Safety before any unmap: the block's streams (its own and record_stream's) are waited for (a
 * stream synchronize each, no device-wide synchronize); nothing moves while a capture is underway
 * or debug_stale_access is on; pinned pages never move (spill_pinned: registered ranges, segments
 * whose handles were handed out, exported blocks, blocks with handle holds, any segment observer
 * attached). A failed driver call rolls the chunk
 * back to where it was (seg_move_chunk), and what spill could not do is said in the OOM message.
 *
 * Books: a host chunk counts in spilled_bytes and num_spills, not in reserved_bytes (device memory
 * given back: num_device_free); promotion counts num_promotions and num_device_alloc.
 *
 * Locking: every function runs under the device lock (held on entry and return).
 */
#ifndef XSEG_CORE_SPILL_H
#define XSEG_CORE_SPILL_H

#include "core/device/device.h"

/* malloc_policy's spill step: move chunks of live blocks to host memory until at least @p need
 * bytes of device memory were given back, or nothing more may move. XSEG_SUCCESS when some moved
 * (allocate again); XSEG_ERROR_OUT_OF_MEMORY when none did, with the reason kept for the OOM
 * message (spill_oom_info). Off (spill_to_host:False): OUT_OF_MEMORY, no reason. */
xseg_status spill_make_room(struct dev_alloc *d, size_t need);

/* Move host chunks back to the device, newest spill first, while the driver and the memory
 * fraction allow: empty_cache, xseg_promote and xseg_trim (@p wait: each block's streams are
 * synchronized), the idle pass (not @p wait: only blocks whose streams are known idle). The
 * first failure (a driver call rolled back, or OUT_OF_MEMORY naming what stays) stops it;
 * XSEG_SUCCESS otherwise (with !wait, blocks still in use may stay on host). */
xseg_status spill_promote(struct dev_alloc *d, bool wait);

/* The free of @p b (b->spill set; allocated already false, before it joins its pool): the record
 * goes; with host chunks, the block's streams are waited for (its recorded streams then need no
 * events) and true is returned: call spill_after_free with the block's segment and address once
 * the free merged it. @p st receives a failed wait's status (the free goes on). */
bool spill_on_free(struct dev_alloc *d, struct block *b, xseg_status *st);
/* Drop the host chunks of the free block now holding @p addr of segment @p s. */
void spill_after_free(struct dev_alloc *d, struct segrec *s, uintptr_t addr);
/* The block of spill_on_free went to debug_stale_access's quarantine instead of its pool: its
 * host chunks were given back with its canary swap, or go when it leaves (quarantine.c counts
 * spilled_bytes down): the spill's own count follows. */
void spill_after_quarantine(struct dev_alloc *d);

/* xseg_spill_hint: mark allocated block @p ptr cold (@p hint XSEG_SPILL_COLD) or not
 * (XSEG_SPILL_NONE). *owned: the block is this device's. */
xseg_status spill_hint(struct dev_alloc *d, void *ptr, int hint, bool *owned);
/* xseg_block_location: where allocated block @p ptr's bytes are (XSEG_LOCATION_*), and how many
 * are on host memory. */
xseg_status spill_location(struct dev_alloc *d, void *ptr, int *location, size_t *host_bytes, bool *owned);
/* Bytes of @p b's chunks on host memory (0 unless b->spill). */
size_t spill_block_host(const struct dev_alloc *d, const struct block *b);

/* Must the pages in [addr, addr + size) of @p d stay where they are? A registration in force
 * overlaps them (xseg_register_range, core/policy/registry.h), their segment's handles were handed
 * out (IPC, xseg_block_handles), the block there is exported or its handles held, or a segment
 * observer is attached. The one predicate every move asks. */
bool spill_pinned(struct dev_alloc *d, uintptr_t addr, size_t size);

/* The OOM message's spill sentence (empty when spill is off), NUL-terminated in @p buf. */
void spill_oom_info(const struct dev_alloc *d, char *buf, size_t n);

#endif
