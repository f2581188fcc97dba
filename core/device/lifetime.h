/*
 * The lifetime predictor of large requests in expandable mode (docs/design.md, placement): does a
 * request look long-lived from what the allocator sees at its malloc? The rule, found with
 * benchmarks/lifetime_probe.py on the pytorch/ traces and checked on the public/ ones
 * (size-live+frees, docs/benchmarks-replay.md): frees outnumbered mallocs over the last 64
 * mallocs and frees the device lock saw, AND the last blocks of this (requested size, stream,
 * pool), at least 2 and up to LIFE_DEPTH, are all still allocated. A training step's optimizer
 * states and kept gradients match it (allocated while the backward pass frees activations,
 * same-size twins kept); a forward pass's activations do not.
 *
 * O(1) a malloc or free, no host allocation (the key table is part of the device's state), no
 * driver call. A slot's block (core/device/fast.h) is seen at its malloc and at the free that settles it.
 *
 * Locking: the device lock.
 */
#ifndef XSEG_CORE_LIFETIME_H
#define XSEG_CORE_LIFETIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "base/common.h"
#include "core/device/state.h"

/* A malloc (@p is_free 0) or a free (1) enters the window. */
static inline __attribute__((always_inline)) void life_note(struct life_state *l, unsigned is_free)
{
    l->ring = l->ring << 1 | is_free;
    l->events++; /* not saturated here: one instruction (the window's count is min(events, 64)) */
}

/* Predicted long: frees lead the window, and the key's last blocks (2 to LIFE_DEPTH) are live. */
bool life_predict_long(const struct life_state *l, size_t req, CUstream stream, const void *pool);

/* A block at @p addr was handed out for the key: it replaces the key's oldest (a full table
 * replaces an entry; never fails). */
void life_record(struct life_state *l, size_t req, CUstream stream, const void *pool, uintptr_t addr);

/* The block at @p addr of the key was freed: no longer live (nothing when it is not recorded). */
void life_forget(struct life_state *l, size_t req, CUstream stream, const void *pool, uintptr_t addr);

#endif
