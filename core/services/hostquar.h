/*
 * debug_stale_access for the pinned host cache (issue 50, seed 003's third case: a CPU tensor
 * freed under a captured H2D copy). A block of xseg_host_malloc whose free completed (its
 * recorded streams' events done: when the cache would hand it out again) is filled with all-ones
 * bytes by the host (memset: no driver call) and held in a FIFO of at most debug_quarantine_mb
 * bytes of its own (the device quarantines keep theirs: pinned host memory is another resource).
 * A replay's H2D copy from it then copies poison (NaN on the device), never another tensor's
 * data; a stale D2H write into it changes bytes, found by a host compare when it leaves the FIFO,
 * at xseg_host_empty_cache, at snapshot time, by xseg_check_stale and at xseg_shutdown. A
 * finding is a quarantine.h finding (pool QUAR_POOL_HOST, device -1), delivered by quar_deliver
 * with no lock held, with the allocation's and the free's stacks (history).
 *
 * State: struct hq_state, inside the host cache's state (xseg_rt.host.quar), owned by
 * hostalloc.c, which calls these functions holding its lock. The blocks are hostalloc's: an
 * entry keeps an opaque pointer and hands it back through @p release when it leaves.
 */
#ifndef XSEG_CORE_HOSTQUAR_H
#define XSEG_CORE_HOSTQUAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/device/quarantine.h"
#include "core/process/procstate.h"

/* A quarantined host block. */
struct hq_item {
    void *blk;                               /* hostalloc's block, for release */
    uintptr_t addr;
    size_t size, requested;
    struct hstack *alloc_stack, *free_stack; /* one reference each (NULL: none recorded) */
    int64_t freed_us;
    bool reported;                           /* a finding was made for it already */
};

/* Hands a block that left the quarantine back to the cache (hostalloc's lock held). */
typedef void (*hq_release_fn)(void *blk);

/* Block @p blk at [@p addr, + @p size) enters the quarantine, filled with the pattern, taking
 * the references of @p alloc_stack and @p free_stack: true. false (nothing changed, the stacks
 * still the caller's): larger than @p bound, or no host memory for its record. Older blocks leave
 * (checked, then released) down to 7/8 of @p bound. */
bool hostquar_enter(struct hq_state *q, size_t bound, void *blk, void *addr, size_t size, size_t requested,
                    struct hstack *alloc_stack, struct hstack *free_stack, hq_release_fn release);

/* Check every held block (a finding each, once: @p when names the occasion) and, with @p drain,
 * release them all. Returns the findings made. */
size_t hostquar_check_all(struct hq_state *q, const char *when, bool drain, hq_release_fn release);

/* The findings not delivered yet, handed over in @p out (device -1) for quar_deliver. */
void hostquar_take(struct hq_state *q, struct quar_batch *out);

/* Blocks (and *@p bytes) held now. */
static inline size_t hostquar_count(const struct hq_state *q, size_t *bytes)
{
    if (bytes)
        *bytes = q->bytes;
    return q->n;
}

/* Give back the arrays (nothing held). */
void hostquar_destroy(struct hq_state *q);

#endif
