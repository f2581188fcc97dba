/* Placement (core/device/placement.h): L1's window and key table, C1-C3's chunk sizes, S1's class. */
#include "core/device/placement.h"

#include "base/assert.h"

#ifndef XSEG_PLACEMENT_OFF
/* The key's entry's tag, or LIFE_HOME_NONE. */
static size_t life_find(const struct life_state *l, size_t req, CUstream stream, const void *pool)
{
    size_t h = life_hash(req, stream, pool);
    for (unsigned i = 0; i < PLACE_LIFE_PROBES; i++) {
        size_t tag = LIFE_TAG((h + i) & (LIFE_KEYS - 1));
        if (life_is_at(l, tag, req, stream, pool))
            return tag;
        if (!l->keys[tag / 8].req)
            return LIFE_HOME_NONE;
    }
    return LIFE_HOME_NONE;
}

bool life_twins_live(const struct life_state *l, size_t req, CUstream stream, const void *pool)
{
    _Static_assert(PLACE_LIFE_WINDOW == 64, "the window is the 64 bits of life_state.ring");
    size_t tag = life_find(l, req, stream, pool);
    return tag != LIFE_HOME_NONE && life_key_live(l, tag);
}

bool place_twins_live(const struct dev_alloc *d, size_t req, CUstream stream, const void *pool)
{
    return life_twins_live(&d->life, req, stream, pool);
}

void life_record_slow(struct life_state *l, size_t req, CUstream stream, const void *pool, struct block *b)
{
    if (!req)
        return; /* 0 marks an empty entry; no block has a 0-byte request in the large pool */
    size_t h = life_hash(req, stream, pool), j = h;
    bool found = false;
    for (unsigned i = 0; i < PLACE_LIFE_PROBES && !found; i++) {
        j = (h + i) & (LIFE_KEYS - 1);
        found = life_is(&l->keys[j], req, stream, pool) || !l->keys[j].req;
    }
    if (!found) /* full around its home: the home entry is reused */
        j = h;
    if (!life_is(&l->keys[j], req, stream, pool)) {
        l->keys[j] = (struct life_key){.req = req, .stream = stream, .pool = pool};
        memcpy(&l->live[LIFE_TAG(j) + LIFE_ADDR0], LIFE_LIVE_NEW, LIFE_DEPTH);
        l->live[LIFE_TAG(j) + LIFE_RECS] = 0;
        l->live[LIFE_TAG(j) + LIFE_SHORT] = 0;
    }
    life_put(l, j, b);
}

void place_record_slow(struct dev_alloc *d, size_t req, CUstream stream, const void *pool, struct block *b)
{
    life_record_slow(&d->life, req, stream, pool, b);
}

#endif

unsigned place_class_of(struct dev_alloc *d, size_t requested, CUstream stream, const void *pool)
{
    lock_assert_held(&d->lock);
#ifdef XSEG_PLACEMENT_OFF
    (void)d, (void)requested, (void)stream, (void)pool;
    return PLACE_SEG_PLAIN;
#else
    size_t tag = life_find(&d->life, requested, stream, pool);
    return tag == LIFE_HOME_NONE ? PLACE_SEG_PLAIN : place_class_at(&d->life, tag);
#endif
}

/* C2: xseg's reserved memory is within the last 1/PLACE_NEAR_FULL_DIV of the device (or of the
 * memory fraction's limit). Other processes' memory is not counted (no driver call here): near the
 * limit a refusal says the rest. */
static bool near_full(const struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    size_t limit = d->acct.set_fraction ? d->acct.allowed_memory_maximum : d->info.total_mem;
    return limit && d->acct.total_allocated_memory >= limit - limit / PLACE_NEAR_FULL_DIV;
}

/* C1: a page, or 1/PLACE_DEVICE_CHUNK_DIV of the device's memory in granules where that is less
 * (under 10 GiB with 20 MiB pages). The device's size, not the memory fraction, which may change at
 * any time. */
static size_t device_chunk(const struct dev_alloc *d, size_t page, size_t gran)
{
    lock_assert_held(&d->lock);
    size_t chunk = d->info.total_mem / PLACE_DEVICE_CHUNK_DIV / gran * gran;
    if (!d->cfg.expandable_segments_recycle || !d->info.total_mem || chunk >= page)
        return page; /* 0: the size is unknown */
    return XSEG_MAX(chunk, gran);
}

size_t place_chunk_limit(const struct dev_alloc *d, const struct bpool *pool, size_t page, size_t gran, size_t size)
{
    lock_assert_held(&d->lock);
    if (pool->is_small)
        return page;
    size_t chunk = page;
    if (d->cfg.expandable_chunk && d->cfg.expandable_chunk < page)
        chunk = XSEG_MAX(d->cfg.expandable_chunk / gran * gran, gran);
    if (!d->exp.fine_chunks && !(d->cfg.expandable_segments_recycle && near_full(d)))
        return d->cfg.expandable_chunk ? chunk : device_chunk(d, page, gran);
    /* C3. A kept handle is a whole chunk of its size: chunks of the largest one's size, so that they
     * are mapped again (with a page here, eornn_cnn_small's granule handles went back). */
    if (!d->exp.handles.n)
        return XSEG_MIN(chunk, XSEG_MAX(size / PLACE_FINE_CHUNK_DIV / gran * gran, gran));
    size_t spare = gran;
    for (size_t i = 0; i < d->exp.handles.n; i++)
        spare = XSEG_MAX(spare, d->exp.handles.v[i].bytes);
    return XSEG_MIN(chunk, spare);
}
