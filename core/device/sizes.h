/*
 * The sizes of a request (PyTorch's round_size and get_allocation_size): the rounded size a malloc
 * takes from the cache, and the growth a cache miss asks for. The fast path's rounding is
 * fast_round (core/device/fast.h): it runs only where roundup_power2_divisions is off, the rare
 * condition round_size tests.
 */
#ifndef XSEG_CORE_DEVICE_SIZES_H
#define XSEG_CORE_DEVICE_SIZES_H

#include <stddef.h>

#include "core/device/fast.h"

/* @p size up to the next of @p divisions equal steps between its two powers of two (a power of
 * two stays). */
static inline size_t sizes_next_division(size_t size, unsigned divisions)
{
    if ((size & (size - 1)) == 0)
        return size;
    size_t floor2 = (size_t)1 << (63 - __builtin_clzll((unsigned long long)size));
    size_t step = floor2 >> (31 - __builtin_clz(divisions));
    if (step == 0)
        return floor2 << 1;
    size_t f = size & ~(step - 1);
    return f == size ? size : f + step;
}

/* The rounded size of a request of @p size bytes: BLOCK_MIN_SIZE steps, or the
 * roundup_power2_divisions bucket's. Lock held (the configuration in force). */
static inline size_t sizes_round(const struct dev_alloc *d, size_t size)
{
    lock_assert_held(&d->lock);
    if (size < BLOCK_MIN_SIZE)
        return BLOCK_MIN_SIZE;
    if (XSEG_UNLIKELY(fast_rare_roundup(d))) {
        unsigned div = cfg_roundup_divisions(&d->cfg, size);
        if (div > 1 && size > BLOCK_MIN_SIZE * div)
            return sizes_next_division(size, div);
    }
    return xseg_align_up(size, BLOCK_MIN_SIZE);
}

/* The growth a cache miss of @p size rounded bytes asks for: a small-pool page, a large segment
 * (large_segment_size), or the request in 2 MiB steps. Lock held. */
static inline size_t sizes_growth(const struct dev_alloc *d, size_t size)
{
    lock_assert_held(&d->lock);
    if (size <= BLOCK_SMALL_SIZE)
        return BLOCK_SMALL_BUFFER;
    if (size < BLOCK_MIN_LARGE_ALLOC)
        return d->cfg.large_segment_size;
    return xseg_align_up(size, BLOCK_ROUND_LARGE);
}

#endif
