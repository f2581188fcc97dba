/* A free expandable block re-tiled by what its segment maps (retile.h). */
#include "core/device/retile.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/device/blockops.h"
#include "vmm/segment.h"

/* From @p pos in free block @p b: the end of the run with one mapped state (@p m), where the
 * head below @p lo and the tail from @p hi are mapped and [lo, hi) is as the driver left it. */
static uintptr_t retile_run(const struct block *b, uintptr_t end, size_t lo, size_t hi, uintptr_t pos, bool *m)
{
    const struct segrec *s = b->seg;
    uintptr_t base = (uintptr_t)seg_base(s->vseg);
    size_t gran = seg_gran(s->vseg), poff = pos - base;
    if (poff < lo) {
        *m = true;
        return base + lo;
    }
    if (poff >= hi) {
        *m = true;
        return end;
    }
    *m = seg_gran_is_mapped(s->vseg, poff / gran) != 0;
    size_t q = poff + gran;
    while (q < hi && (seg_gran_is_mapped(s->vseg, q / gran) != 0) == *m)
        q += gran;
    return base + q;
}

/* The pieces of retile_free_block, linked in place of @p b. @return the last piece. */
static struct block *retile(struct dev_alloc *d, struct block *b, size_t lo, size_t hi, struct block *spare[2])
{
    uintptr_t end = b->addr + b->size, pos = b->addr;
    struct block *cur = NULL;
    int nspare = 2;
    while (pos < end) {
        bool m;
        uintptr_t run_end = retile_run(b, end, lo, hi, pos, &m);
        if (cur && cur->mapped == m) {
            /* Same state as the piece before (the head, or pages a failed unmap left mapped
             * next to it): one block, or two free neighbours would sit unmerged. */
            cur->size += run_end - pos;
            pos = run_end;
            continue;
        }
        struct block *piece;
        if (!cur) {
            piece = b;
        } else {
            piece = nspare ? spare[--nspare] : NULL;
            if (!piece)
                piece = dev_block_new(d);
            if (!piece)
                abort(); /* host memory exhausted after a partial driver unmap: cannot recover */
            piece->stream = b->stream;
            block_same_seg(piece, b);
            block_link_after(cur, piece);
        }
        piece->addr = pos;
        piece->size = run_end - pos;
        piece->mapped = m;
        block_set_gc_base(piece, 0); /* free: set again as it enters the free index */
        cur = piece;
        pos = run_end;
    }
    while (nspare)
        if (spare[--nspare])
            dev_block_delete(d, spare[nspare]);
    return cur;
}

void retile_free_block(struct dev_alloc *d, struct block *b, size_t lo, size_t hi, struct block *spare[2])
{
    lock_assert_held(&d->lock);
    struct bpool *pool = block_pool(b);
    struct block *orig_prev = b->prev, *orig_next = b->next;
    struct block *first = b, *last = retile(d, b, lo, hi, spare);
    /* Pieces merge with the original neighbours where the states match (an unmapped hole next
     * to an unmapped neighbour); then everything goes into its index. */
    if (orig_prev)
        dev_try_merge(d, first, orig_prev);
    if (orig_next)
        dev_try_merge(d, last, orig_next);
    for (struct block *p = first;; p = p->next) {
        if (p->mapped) {
            block_set_gc_base(p, pool->get_free_blocks_call_count);
            bpool_insert_free(pool, p);
        } else {
            bpool_insert_unmapped(pool, p);
        }
        if (p == last)
            break;
    }
}
