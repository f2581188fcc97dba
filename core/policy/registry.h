/*
 * The registration ledger (xseg_register_range): ranges a registrant (NCCL, UCX, an RDMA NIC)
 * pinned, and the before / after callbacks around every unmap or re-backing of their pages.
 * core/policy/registry.c says how the passes are ordered.
 *
 * Two kinds of hook:
 *   - under the device lock, reg_range_registered: the pages of a range still registered
 *     (its registrant has not released it) are never unmapped or re-backed; every unmap site
 *     that does not call back (idle, threshold, OOM retry, give-way, defrag) skips them;
 *   - a classic (cuMemAlloc) segment's pages never move; the only action that takes them is the
 *     segment's release (cuMemFree), so an entry inside one holds the segment instead
 *     (segrec.reg_held, core/index/block.h): every release site skips it while the count is
 *     nonzero, with no walk of the ledger; no callback is asked before a reclaim (nothing is
 *     taken), only at shutdown;
 *   - with no lock held, reg_before_* asks the registrants of the pages an operation may take to
 *     release them, and reg_after asks the released ones whose pages are all mapped again to
 *     register again. An operation runs its "before" pass, its work, then reg_after.
 */
#ifndef XSEG_CORE_REGISTRY_H
#define XSEG_CORE_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device/device.h"

/* What an operation may take (reg_before). */
enum reg_scope {
    REG_SCOPE_FREE,  /* pages that hold no live byte (trim, empty_cache) */
    REG_SCOPE_POOL,  /* every page of one pool's segments (sleep): @p pool, {0, 0} the default */
    REG_SCOPE_ALL,   /* every page (shutdown) */
    REG_SCOPE_RANGE, /* the pages of one range (spill, reg_before_move) */
};

/*
 * xseg_registration_safe: may a registration made outside the ledger now (a NIC's ibv_reg_mr or
 * dma-buf, NCCL's ncclCommRegister) lose its pages to an action xseg takes on its own under
 * configuration @p c? False when one is on that re-backs pages holding live bytes without asking
 * anyone (expandable_segments_defrag, spill_to_host); the text, written to @p buf as
 * xseg_get_config writes (truncated to @p size, *len the full length), names those keys, or says
 * why none can. Reads @p c only: no lock, no driver.
 */
bool reg_config_safe(const struct cfg *c, char *buf, size_t size, size_t *len);

/* Who made an entry: the program (xseg_register_range) or xseg itself when it handed a range
 * to another party, or by register_blocks_above_mb. xseg's own entries have no registrant to
 * ask: their before refuses (the pages stay mapped, as for a registrant that does not release)
 * except at shutdown; a dma-buf's entry goes once its descriptor is closed. */
enum reg_owner {
    REG_OWNER_USER = 0,
    REG_OWNER_DMABUF, /* xseg_range_dmabuf: until the descriptor is closed or a block under it freed */
    REG_OWNER_EXPORT, /* xseg_ipc_export: until the block's free */
    REG_OWNER_BLOCK,  /* register_blocks_above_mb: from malloc to free */
    REG_OWNER_NCCL,   /* xseg_nccl_register: until xseg_nccl_deregister; a free does not end it, nor
                       * does xseg_shutdown (NCCL still holds the pages: shutdown is refused) */
};

/* An entry of xseg's own over [addr, addr + size) of @p d, marking the allocated blocks under
 * it (their free drops it, reg_disown_locked). Device lock held. XSEG_ERROR_OUT_OF_MEMORY with
 * nothing changed when host memory runs out; nothing done for classic memory. @p fd: the
 * dma-buf's descriptor (REG_OWNER_DMABUF), else -1. */
xseg_status reg_own_locked(struct dev_alloc *d, uintptr_t addr, size_t size, enum reg_owner owner, int fd);
/* Who holds the registration in force at [lo, hi) of @p d, in words for an error message: the
 * program's (xseg_register_range, its before callback did not release it) or xseg's own (which
 * hand-out or key). Device lock held. */
const char *reg_span_words(struct dev_alloc *d, uintptr_t lo, uintptr_t hi);
/* Drop xseg's own entries of @p d overlapping [addr, addr + size) (a block under them is freed).
 * Device lock held. */
void reg_disown_locked(struct dev_alloc *d, uintptr_t addr, size_t size);

/* xseg_register_range on device @p d: *mine false (nothing done) when the range is not in one of
 * @p d's segments. A range in a classic segment must lie inside it (INVALID_VALUE otherwise): the
 * entry holds the segment off release until unregistered. Takes the device lock. */
xseg_status reg_add(struct dev_alloc *d, uintptr_t addr, size_t size, const xseg_range_callbacks *cb, void *ctx,
                    bool *mine);
/* xseg_unregister_range; any device. No lock held (may run inside a callback). */
xseg_status reg_remove(uintptr_t addr, size_t size, void *ctx);


/* True when a registration still in force (not released) overlaps [addr, addr + size) on @p d:
 * its pages must stay mapped, with their physical memory. Device lock held; free when no range
 * is registered (one relaxed load). */
bool reg_range_registered(struct dev_alloc *d, uintptr_t addr, size_t size);
/* The first registered span overlapping [lo, hi) on @p d (its start and end, clipped to nothing):
 * false when none. Device lock held. */
bool reg_first_registered(struct dev_alloc *d, uintptr_t lo, uintptr_t hi, uintptr_t *plo, uintptr_t *phi);

/* The before pass: call the before callback of each registration of @p d in @p scope still in
 * force, no lock held on entry (takes the device lock briefly), and wait for each. Those that
 * return 0 are released; the others stay in force (their pages stay mapped): then
 * XSEG_ERROR_ILLEGAL_STATE naming the first, after every callback ran. */
xseg_status reg_before(struct dev_alloc *d, enum reg_scope scope, xseg_pool_id pool, xseg_range_reason why);
/* The after pass: each released registration of @p d whose pages are all mapped (and awake)
 * again hears after (@p why) and is in force again on 0. No lock held. A failure:
 * XSEG_ERROR_ILLEGAL_STATE naming it (the range stays released, asked again next time). */
xseg_status reg_after(struct dev_alloc *d, xseg_range_reason why);

/* reg_before, then @p op, then reg_after (KEPT: what did not go is registered again). The
 * operation's failure comes first, then the before pass's, then the after pass's. */
xseg_status reg_around(struct dev_alloc *d, enum reg_scope scope, xseg_pool_id pool, xseg_range_reason why,
                       xseg_status (*op)(struct dev_alloc *d, void *ctx), void *ctx);

/* For page moves elsewhere (spill to host): before pages [addr, addr + size) of @p d move,
 * reg_before_move (no lock held) asks their registrants to release; where it fails the pages are
 * still registered (reg_range_registered) and must not move. After the move (and again after
 * the pages come back) reg_after_move lets them register the pages again. */
xseg_status reg_before_move(struct dev_alloc *d, uintptr_t addr, size_t size);
xseg_status reg_after_move(struct dev_alloc *d);

/* Whether any registration of @p d is released with its pages mapped again since the last after
 * pass (a malloc mapped them): the caller runs reg_after with no lock held. Inline, a field of
 * the device: a malloc's slow path asks (core/alloc.c, MALLOC_REG_DUE), the only one that maps. */
static inline bool reg_after_due(const struct dev_alloc *d)
{
    return atomic_load_explicit(&d->reg_due, memory_order_relaxed);
}
/* Note under the device lock that pages [addr, addr + size) of @p d were mapped. */
void reg_note_mapped(struct dev_alloc *d, uintptr_t addr, size_t size);

/*
 * NCCL's registrations made through xseg (xseg_nccl_register, api/nccl.c). An entry of xseg's own
 * (REG_OWNER_NCCL) a registered range, all entries of one call sharing one id (the handle handed
 * out): in force from before ncclCommRegister runs until xseg_nccl_deregister removes it after
 * ncclCommDeregister returned, so NCCL never holds pages xseg may unmap. No block is marked: a
 * free inside the range leaves the entry (NCCL registered pages, not a block), and the pages stay.
 */
uint64_t reg_nccl_next_id(void);
/* One entry over [addr, addr + size) of @p d for @p comm under @p id. Takes the device lock.
 * *mine false (nothing done) when the range is in none of @p d's segments; in a classic segment
 * it holds the segment off release (INVALID_VALUE when it runs past the segment's end);
 * INVALID_VALUE for expandable pages not all mapped now, OUT_OF_MEMORY (nothing made). */
xseg_status reg_nccl_own(struct dev_alloc *d, uintptr_t addr, size_t size, void *comm, uint64_t id, bool *mine);
/* An entry under @p id for every run of mapped granules of every expandable segment of @p pool of
 * @p d, and one per classic segment (its whole allocation, held off release) (the segments
 * PyTorch's snapshot lists), *n of them (0 for a pool @p d does not know). Takes the device lock.
 * A failure (a sleeping segment, host memory) makes none. */
xseg_status reg_nccl_own_pool(struct dev_alloc *d, xseg_pool_id pool, void *comm, uint64_t id, size_t *n);
/* One entry of an id, as xseg_nccl_deregister works on it. */
struct reg_nccl_item {
    int device;
    uintptr_t addr;
    size_t size;
    void *nccl; /* NCCL's handle (NULL when NCCL skipped the registration: it says so) */
};
/* Record NCCL's handle of the entry (@p id, @p addr): false when it is gone. No lock held. */
bool reg_nccl_set(uint64_t id, uintptr_t addr, void *nccl);
/* The entries of @p id, claimed for deregistration (another caller sees them as in progress):
 * *items (xs_malloc'd, the caller frees) and *n. INVALID_VALUE naming the fault for an id with no
 * entry, or one registered with another comm; ILLEGAL_STATE when another thread deregisters it.
 * No lock held. */
xseg_status reg_nccl_claim(uint64_t id, void *comm, struct reg_nccl_item **items, size_t *n);
/* Settle a claimed or new entry: @p drop removes it (NCCL let go of the pages, or never took
 * them), else it stays in force, claimable again. No lock held. */
void reg_nccl_settle(uint64_t id, uintptr_t addr, bool drop);

/* xseg_range_dmabuf on @p d: *mine false (nothing done) when the range is in none of @p d's
 * segments. Takes the device lock around the driver call (the pages cannot go meanwhile). */
xseg_status reg_dmabuf(struct dev_alloc *d, uintptr_t addr, size_t size, int *fd, size_t *offset, bool *mine);

/* xseg_registration_stats_get. Takes the device lock. */
void reg_stats(struct dev_alloc *d, xseg_registration_stats *out);

/* xseg_shutdown: the before pass with REG_SCOPE_ALL on every device (@p device_at), then, when
 * every registrant released, the ledger is emptied; else XSEG_ERROR_ILLEGAL_STATE and the
 * released ones hear after (KEPT): nothing changed. */
xseg_status reg_shutdown(dev_peek_fn device_at);

#endif
