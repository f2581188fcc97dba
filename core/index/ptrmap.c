/* The live pointer map's out-of-line half (core/index/ptrmap.h): growth, fingerprints off, destroy.
 * All functions run under the owning device's mutex. */
#include <stdlib.h>
#include <string.h>

#include "core/index/ptrmap.h"

#include "base/hostmem.h"
#include "base/hugemem.h"

/* ---- live pointer map ------------------------------------------------------------------ */

/* The slots of map @p m's table (cap words), given back. */
static void ptrmap_slots_free(struct ptrmap *m)
{
    if (m->huge)
        hugemem_free(m->slots, m->cap * sizeof *m->slots);
    else
        xs_free(m->slots);
}

bool ptrmap_grow(struct ptrmap *m)
{
    size_t ncap = m->cap ? m->cap + m->cap / 2 : 256;
    uintptr_t *slots = NULL;
    bool huge = false;
    if (ncap <= SIZE_MAX / sizeof *slots && ncap * sizeof *slots >= (m->huge_min ? m->huge_min : PTRMAP_HUGE_MIN)) {
        /* Whole huge pages, rounded down (the map's bytes a block stay within those of a table
         * grown by half), the capacity the slots that fill them (the home slot scales to any
         * capacity); calloc's table of ncap words when none can be had. A table that would not
         * grow so stays on calloc until it has grown past the rounding. */
        size_t bytes = hugemem_floor(ncap * sizeof *slots);
        if (bytes / sizeof *slots > m->cap && (slots = hugemem_alloc(bytes)) != NULL) {
            ncap = bytes / sizeof *slots;
            huge = true;
        }
    }
    if (!slots)
        slots = xs_calloc(ncap, sizeof *slots);
    if (!slots)
        return false;
    if (!m->keep) /* the first table keeps fingerprints unless they were turned off before it */
        m->keep = ~((uintptr_t)PTRMAP_DIST_MAX | PTRMAP_FP_BITS);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i])
            continue;
        struct block *b = ptrmap_block(m, m->slots[i]);
        size_t j = ptrmap_hash(b->addr, ncap), d = 0;
        for (; slots[j]; j = ptrmap_next(j, ncap))
            d++;
        slots[j] = ptrmap_retag(m->slots[i], d);
    }
    ptrmap_slots_free(m);
    m->slots = slots;
    m->cap = ncap;
    m->huge = huge;
    return true;
}

void ptrmap_fp_off(struct ptrmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        m->slots[i] &= ~PTRMAP_FP_BITS;
    m->keep = PTRMAP_KEEP_NO_FP;
}

void ptrmap_destroy(struct ptrmap *m)
{
    ptrmap_slots_free(m);
    memset(m, 0, sizeof *m);
}
