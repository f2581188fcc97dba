/*
 * Classic segments (PyTorch's alloc_block, its cuMemAlloc branch): one cuMemAlloc a segment, of
 * the size the request's pool asks for, beside expandable segments (core/policy/expandable.h).
 * Their release is core/policy/release.h's (release_block). Device lock held.
 */
#ifndef XSEG_CORE_CLASSIC_H
#define XSEG_CORE_CLASSIC_H

#include "core/device/device.h"

/* Whether @p pool stopped being awake while the lock was given back (core/services/sleep.h, above
 * this wing, answers): then *@p st is the refusal. */
typedef bool (*classic_asleep_fn)(struct dev_alloc *d, struct bpool *pool, xseg_status *st);

/* cuMemAlloc a new segment of @p size bytes for (@p pool, @p stream) (an owned pool's: from its
 * owner's alloc, under the lock): SUCCESS with *@p out its one
 * free block (in no index), OUT_OF_MEMORY (recoverable), or another error; on failure nothing has
 * changed. With release_lock_on_cudamalloc the lock is given back around the cuMemAlloc, and a
 * pool that fell asleep meanwhile (@p asleep) gets nothing (the memory is freed). During a capture
 * cuMemAlloc runs in relaxed capture mode (vmm/classic.h). */
xseg_status classic_grow(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                         classic_asleep_fn asleep, struct block **out);

#endif
