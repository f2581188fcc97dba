/* Side structs and stream sets of blocks. All functions run under the owning device's mutex. */
#include <stdlib.h>
#include <string.h>

#include "core/index/block.h"
#include "base/hostmem.h"

/* ---- side structs --------------------------------------------------------------------- */

struct block_side *block_side_get(struct block *b)
{
    if (b->sided)
        return b->u.side;
    xseg_assert(!b->in_index);
    struct block_side *sd = xs_calloc(1, sizeof *sd);
    if (!sd)
        return NULL;
    sd->requested_size = b->u.requested_size;
    b->u.side = sd;
    b->sided = true;
    return sd;
}

void block_side_drop(struct block *b)
{
    if (!b->sided)
        return;
    struct block_side *sd = b->u.side;
    if (sd->uses.n || sd->event_count || sd->hist_stack || sd->handle_holds || sd->ledger || sd->free_stack)
        return;
    size_t requested = sd->requested_size;
    stream_set_clear(&sd->uses);
    xs_free(sd);
    b->sided = false;
    b->u.requested_size = requested;
}

void block_side_free(struct block *b)
{
    if (!b->sided)
        return;
    struct block_side *sd = b->u.side;
    size_t requested = sd->requested_size;
    stream_set_clear(&sd->uses);
    xs_free(sd);
    b->sided = false;
    b->u.requested_size = requested;
}

/* ---- stream sets ----------------------------------------------------------------------- */

bool stream_set_add(struct stream_set *s, CUstream st)
{
    for (unsigned i = 0; i < s->n; i++)
        if (stream_set_get(s, i) == st)
            return true;
    if (s->cap == 0)
        s->cap = 2;
    if (s->n == s->cap) {
        unsigned ncap = s->cap * 2;
        CUstream *h = xs_malloc(ncap * sizeof *h);
        if (!h)
            return false;
        for (unsigned i = 0; i < s->n; i++)
            h[i] = stream_set_get(s, i);
        xs_free(s->heap);
        s->heap = h;
        s->cap = ncap;
    }
    if (s->cap > 2)
        s->heap[s->n++] = st;
    else
        s->inl[s->n++] = st;
    return true;
}
