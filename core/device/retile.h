/*
 * A free expandable block re-tiled by what its segment maps (retile.c): after chunks inside it
 * were unmapped (expandable.c's unmap_pages, seg_drop_host; the quarantine's canary release), the
 * block becomes pieces of one mapped state each, merged with its neighbours where the states
 * match, each in its index. Device lock held.
 */
#ifndef XSEG_CORE_RETILE_H
#define XSEG_CORE_RETILE_H

#include <stddef.h>

#include "core/device/device.h"

/*
 * Re-tile free expandable block @p b (in no index) by granule state: its bytes below segment
 * offset @p lo and from @p hi are mapped, [lo, hi) (granule multiples inside it) is as the
 * segment has it (seg_gran_is_mapped: all unmapped after a successful unmap). b becomes the first
 * piece; the others come from @p spare (two: enough for head, hole, tail; those left over are
 * deleted). A NULL spare, or a piece more (only a partly failed unmap leaves one), is allocated:
 * abort() if host memory is exhausted then. The pieces merge with b's former neighbours where the mapped states
 * match (an unmapped hole next to an unmapped neighbour); free pieces enter the free index, with
 * the GC clock started, unmapped ones the unmapped index.
 */
void retile_free_block(struct dev_alloc *d, struct block *b, size_t lo, size_t hi, struct block *spare[2]);

#endif
